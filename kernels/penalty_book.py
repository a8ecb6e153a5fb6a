"""PenaltyBook: the VerifierActor's per-request token counts for repetition remedies.

Only requests whose SamplingParams ask for a penalty get an entry (`add`, when the Scheduler admits
them): their prompt ids (a bool row, from the whole prompt: with prefix caching the verifier never
forwards the cached part, so the chunks it sees are not the prompt) and their output counts (an
int row, updated from the verifier's own results, which are exactly the tokens the request
commits). The book belongs to the VerifierActor and is used only on its model lane;
its entries go on Release.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interlock.kernels.penalties import apply_penalties, draft_counts
from interlock.protocol.messages import RequestSnapshot, SlotResult
from interlock.protocol.types import RequestId, TokenId


@dataclass
class _Entry:
    prompt: torch.Tensor          # [V] bool: ids in the prompt
    counts: torch.Tensor          # [V] int32: occurrences in the output so far


class PenaltyBook:
    def __init__(self, vocab: int) -> None:
        self.vocab = vocab        # the model's (padded) vocabulary: the logits' width
        self.entries: dict[RequestId, _Entry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, request_id: RequestId, prompt: Sequence[TokenId]) -> None:
        """A penalized request and its whole prompt (ids past the vocabulary are clamped: never sampled)."""
        e = self.entries[request_id] = _Entry(torch.zeros(self.vocab, dtype=torch.bool),
                                              torch.zeros(self.vocab, dtype=torch.int32))
        if prompt:
            e.prompt[torch.tensor(prompt, dtype=torch.long).clamp(0, self.vocab - 1)] = True

    def apply_(self, logits: torch.Tensor, snaps: Sequence[RequestSnapshot], drafts: Sequence[tuple[TokenId, ...]],
               num_drafts: torch.Tensor) -> None:
        """Penalize the verify logits [B, K+1, V] in place: position j counts the output + drafts[:j]."""
        rows = [i for i, s in enumerate(snaps) if s.sampling.penalized]
        if not rows:
            return
        k = logits.shape[1] - 1
        entries = [self.entries[snaps[i].request_id] for i in rows]
        d = torch.zeros(len(rows), k, dtype=torch.long)
        for r, i in enumerate(rows):
            if drafts[i]:
                d[r, : len(drafts[i])] = torch.tensor(drafts[i], dtype=torch.long)
        counts = draft_counts(torch.stack([e.counts for e in entries]), d, num_drafts[rows])   # [P, K+1, V]
        prompt = torch.stack([e.prompt for e in entries]).unsqueeze(1).expand(-1, k + 1, -1)  # [P, K+1, V]
        per_row = lambda name: torch.tensor([getattr(snaps[i].sampling, name) for i in rows]).repeat_interleave(k + 1)  # noqa: E731
        v = logits.shape[2]
        logits[rows] = apply_penalties(logits[rows].reshape(-1, v), counts.reshape(-1, v), prompt.reshape(-1, v),
                                       per_row("presence_penalty"), per_row("frequency_penalty"),
                                       per_row("repetition_penalty")).view(len(rows), k + 1, v)

    def commit(self, results: Sequence[SlotResult]) -> None:
        """Count each penalized request's new tokens (accepted drafts and the sampled token)."""
        for r in results:
            e = self.entries.get(r.request_id)
            if e is not None and r.new_tokens:
                ids = torch.tensor(r.new_tokens, dtype=torch.long)
                ok = (ids >= 0) & (ids < self.vocab)
                e.counts.index_add_(0, ids[ok], torch.ones(int(ok.sum()), dtype=torch.int32))

    def release(self, request_id: RequestId) -> None:
        self.entries.pop(request_id, None)
