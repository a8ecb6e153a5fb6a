"""PenaltyBook: per-request token counts for repetition remedies, one book for both runners.

Only requests whose SamplingParams ask for a penalty get an entry (`add`, when the Scheduler admits
them): a row of `PenaltyCounts` (kernels/verify_features.py) holding their prompt ids (a bool row,
from the whole prompt: with prefix caching the verifier never forwards the cached part, so the
chunks it sees are not the prompt) and their output counts (an int row, updated from the
verification's own tokens, which are exactly the tokens the request commits). The rows are
allocated on the first penalized request (rows x V: nothing for an engine that never sees one),
where the logits live; a row is reset and given its prompt by `run`, which on the device runner
enqueues the work on the model lane between steps (so it precedes every step that reads it in
stream order) and on the host runner runs it at once. Its entries go when the request is released.

Both runners apply the same law with it: `penalize_lanes` and `count_tokens_`. The device runner
stages `PenaltyInputs` for a whole bucket (actors/device/feature_staging.py) and counts on the device;
the host runner's `apply_` and `commit` do the same for the step's penalized requests alone.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from interlock.kernels.verify_features import PenaltyCounts, PenaltyInputs, count_tokens_, penalize_lanes
from interlock.protocol.messages import RequestSnapshot, SlotResult
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.types import RequestId, TokenId

Run = Callable[..., None]       # run(fn, *args): where the book's own tensor work runs


def _now(fn: Callable[..., None], *args: object) -> None:
    fn(*args)


class PenaltyBook:
    def __init__(self, rows: int, vocab: int, device: torch.device | None = None, run: Run = _now) -> None:
        self.vocab = vocab        # the model's (padded) vocabulary: the logits' width
        self.device = device or torch.device("cpu")
        self.run = run
        self.zero_row = rows      # PenaltyCounts' all-zero row: what an unpenalized lane reads
        self.free = list(range(rows - 1, -1, -1))
        self.entries: dict[RequestId, int] = {}
        self.counts: PenaltyCounts | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, request_id: RequestId, prompt: Sequence[TokenId]) -> None:
        """Between steps: a penalized request's row, reset to its prompt (ids past the vocabulary clamped)."""
        if not self.free:
            raise RuntimeError(f"no penalty row left for request {request_id}: more penalized requests than slots")
        row = self.entries[request_id] = self.free.pop()
        ids = torch.tensor(sorted({min(max(int(t), 0), self.vocab - 1) for t in prompt}), dtype=torch.long)
        self.run(self._reset, row, ids)

    def _reset(self, row: int, ids: torch.Tensor) -> None:
        """Tensor work (`run`: on the device runner, the model lane outside any step)."""
        if self.counts is None:
            self.counts = PenaltyCounts.allocate(self.zero_row, self.vocab, self.device)
        self.counts.counts[row].zero_()
        self.counts.prompt[row].zero_()
        if ids.numel():
            self.counts.prompt[row].index_fill_(0, ids.to(self.device, non_blocking=True), True)

    def release(self, request_id: RequestId) -> None:
        row = self.entries.pop(request_id, None)
        if row is not None:
            self.free.append(row)                              # reset by its next add

    def row(self, request_id: RequestId) -> int:
        return self.entries[request_id]

    def inputs(self, request_ids: Sequence[RequestId], params: Sequence[SamplingParams]) -> PenaltyInputs:
        """The penalized requests' PenaltyInputs (on the host: the host runner's)."""
        return PenaltyInputs(torch.tensor([self.entries[r] for r in request_ids], dtype=torch.long),
                             torch.ones(len(params), dtype=torch.bool),
                             torch.tensor([p.presence_penalty for p in params], dtype=torch.float32),
                             torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32),
                             torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32))

    # --- the host runner's calls (its counts live on the CPU) ------------------------------------

    def apply_(self, logits: torch.Tensor, snaps: Sequence[RequestSnapshot], drafts: torch.Tensor,
               valid: torch.Tensor) -> None:
        """Penalize the verify logits [B, K+1, V] in place (`penalize_lanes` on the penalized
        requests' rows alone): position j counts the output + drafts[:, :j] ([B, K], `valid` [B] of them)."""
        rows = [i for i, s in enumerate(snaps) if s.sampling.penalized]
        if not rows:
            return
        assert self.counts is not None, "a penalized request's add precedes its steps"
        b, k1, v = len(rows), logits.shape[1], logits.shape[2]
        at = torch.tensor(rows, dtype=torch.long)
        p = self.inputs([snaps[i].request_id for i in rows], [snaps[i].sampling for i in rows])
        x = penalize_lanes(logits[at].view(b * k1, v), p, self.counts, drafts[at], valid[at])
        logits[at] = x.view(b, k1, v)

    def commit(self, results: Sequence[SlotResult]) -> None:
        """Count each penalized request's new tokens (accepted drafts and the sampled token)."""
        mine = [r for r in results if r.request_id in self.entries and r.new_tokens]
        if not mine or self.counts is None:
            return
        width = max(len(r.new_tokens) for r in mine)
        tokens = torch.tensor([list(r.new_tokens) + [-1] * (width - len(r.new_tokens)) for r in mine],
                              dtype=torch.long)
        p = PenaltyInputs(torch.tensor([self.entries[r.request_id] for r in mine], dtype=torch.long),
                          torch.ones(len(mine), dtype=torch.bool), *(torch.zeros(len(mine)),) * 3)
        count_tokens_(self.counts, p, tokens)
