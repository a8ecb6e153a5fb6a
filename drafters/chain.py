"""DraftChain: the one place that decides each request's drafts from every drafter it has.

Per request and step: grammar-forced tokens come first (free drafts), then the n-gram and/or
suffix-trie continuation past them (the longer one; the suffix drafter's length is set by its match
length, and its global trie learns every finished request's output in `remove`), then a user
drafter's proposal where the grammar forces nothing (the longer of the two is kept); a draft model is asked only where these fall short of the request's
budget k (`wants_model`), and continues after the forced tokens (its draft replaces the others
whatever its length, see DraftActor). The chain holds every per-request thing these drafters
keep: n-gram entries, suffix tries, adaptive budgets, user-drafter contexts.

Adaptive draft length: each request has a lookup budget k (1..K). A step that accepts every draft
raises it by one; a rejection sets it to accepted + 1. Forced tokens are accepted whatever the
model says, so they never count against it. It changes how much is verified, never what is
emitted: verification is exact for any draft.

A user drafter that raises (or answers with the wrong number of proposals) is retried one request
at a time; the requests it still fails for get a DrafterError (`propose` returns it per request),
the others keep their drafts.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


from interlock.drafters.combine import combine_drafts, forced_then_ngram
from interlock.drafters.ngram import NGramDrafter
from interlock.drafters.suffix import SuffixDrafter
from interlock.protocol.errors import DrafterError
from interlock.protocol.speculative import DraftRequest, SpeculativeConfig
from interlock.protocol.types import RequestId, TokenId
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class ChainRequest:
    """One sampling request as the chain sees it this step."""

    request_id: RequestId
    forced: tuple[TokenId, ...]       # the grammar's forced tokens (up to K), () when none


@dataclass(frozen=True)
class ChainDraft:
    """The chain's answer for one request: drafts, the budget k, and an error if its drafter failed."""

    drafts: tuple[TokenId, ...]
    k: int
    error: BaseException | None = None


class DraftChain:
    """Forced -> n-gram / suffix -> user drafter, with adaptive budgets (see the module docstring)."""

    def __init__(self, config: SpeculativeConfig | None, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size            # drafts outside [0, vocab_size) are cut (no tokens)
        self.max_draft_len = config.max_draft_len if config is not None else 0
        use_ngram = config is not None and "ngram" in config.drafters
        self.ngram = NGramDrafter(config.ngram, config.max_draft_len) if use_ngram else None
        use_suffix = config is not None and "suffix" in config.drafters
        self.suffix = SuffixDrafter(config.suffix, config.max_draft_len) if use_suffix else None
        self.use_forced = config is not None and "forced" in config.drafters
        self.user = config.user_drafter if config is not None else None
        self.budget: dict[RequestId, int] = {}
        self.contexts: dict[RequestId, list[TokenId]] = {}    # prompt + output, kept only for a user drafter

    # --- per-request state ----------------------------------------------------------------------

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        if self.ngram is not None:
            self.ngram.add_request(request_id, prompt)
        if self.suffix is not None:
            self.suffix.add_request(request_id, prompt)
        if self.user is not None:
            self.contexts[request_id] = list(prompt)

    def remove(self, request_id: RequestId) -> None:
        if self.ngram is not None:
            self.ngram.remove(request_id)
        if self.suffix is not None:
            self.suffix.remove(request_id)      # its output joins the global trie
        self.budget.pop(request_id, None)
        self.contexts.pop(request_id, None)

    def commit(self, request_id: RequestId, new_tokens: tuple[TokenId, ...], drafted: int, accepted: int) -> None:
        """A step's outcome for one request: index its tokens, adapt its budget."""
        if request_id in self.contexts:
            self.contexts[request_id].extend(new_tokens)
        if self.config is None:
            return
        if self.ngram is not None:
            self.ngram.extend(request_id, new_tokens)
        if self.suffix is not None:
            self.suffix.extend(request_id, new_tokens)
        if self.config.adaptive and drafted:
            k = self.max_draft_len
            budget = self.budget.get(request_id, k)
            self.budget[request_id] = min(k, budget + 1) if accepted == drafted else max(1, accepted + 1)

    def counts(self) -> dict[str, int]:
        """Per-request state (0 when idle), and the bounded global suffix trie (kept across requests)."""
        suffix = self.suffix.stats() if self.suffix is not None else None
        return {"ngram_requests": self.ngram.stats().requests if self.ngram is not None else 0,
                "suffix_requests": suffix.requests if suffix else 0,
                "suffix_request_nodes": suffix.request_nodes if suffix else 0,
                "suffix_global_tokens": suffix.global_tokens if suffix else 0,
                "suffix_global_nodes": suffix.global_nodes if suffix else 0,
                "adaptive_budgets": len(self.budget), "user_contexts": len(self.contexts)}

    # --- drafting -------------------------------------------------------------------------------

    def forced(self, forced: tuple[TokenId, ...]) -> tuple[TokenId, ...]:
        """The forced tokens the chain uses (none unless "forced" is a drafter)."""
        return forced if self.use_forced else ()

    def propose(self, requests: Sequence[ChainRequest]) -> list[ChainDraft]:
        """Drafts for each request, in order."""
        out: list[ChainDraft] = []
        for r in requests:
            k = self.max_draft_len
            if self.config is None:
                out.append(ChainDraft((), 0))
                continue
            forced = self.forced(r.forced)
            if self.config.adaptive:
                k = min(k, len(forced) + self.budget.get(r.request_id, k))
            drafts = tuple(forced[:k])
            if len(drafts) < k and (self.ngram is not None or self.suffix is not None):
                drafts = tuple(self._continue(r.request_id, forced[:k], k))
            out.append(ChainDraft(drafts, k))
        if self.user is not None:
            out = self._with_user_drafts(requests, out)
        return out

    def _continue(self, request_id: RequestId, head: tuple[TokenId, ...], k: int) -> list[TokenId]:
        """head (the forced tokens), then the longer of the n-gram and suffix continuations past it."""
        cands = []
        if self.ngram is not None:
            cands.append(forced_then_ngram(head, self.ngram, request_id, k))
        if self.suffix is not None:
            cands.append(list(head) + self.suffix.propose(request_id, k - len(head), after=head))
        return combine_drafts(cands, k)

    def _with_user_drafts(self, requests: Sequence[ChainRequest], drafts: list[ChainDraft]) -> list[ChainDraft]:
        """Ask the user drafter for requests the grammar forces nothing on; keep the longer draft."""
        asked = [i for i, r in enumerate(requests) if not self.forced(r.forced)]
        if not asked:
            return drafts
        k = self.max_draft_len
        answers = self._ask_user([requests[i].request_id for i in asked], k)
        out = list(drafts)
        for i, answer in zip(asked, answers):
            if isinstance(answer, BaseException):
                out[i] = ChainDraft(drafts[i].drafts, drafts[i].k, answer)
                continue
            ids = [int(t) for t in answer]
            valid = next((j for j, t in enumerate(ids) if not 0 <= t < self.vocab_size), len(ids))
            out[i] = ChainDraft(tuple(combine_drafts([drafts[i].drafts, ids[:valid]], k)), drafts[i].k)
        return out

    def _ask_user(self, ids: list[RequestId], k: int) -> list[Sequence[TokenId] | BaseException]:
        assert self.user is not None
        try:
            return list(self._user_call(ids, k))
        except Exception as exc:  # noqa: BLE001 - user code: find the request(s) it fails for
            log.warning("user_drafter_failed_batch", requests=len(ids), error=repr(exc))
        answers: list[Sequence[TokenId] | BaseException] = []
        for rid in ids:
            try:
                answers.append(self._user_call([rid], k)[0])
            except Exception as exc:  # noqa: BLE001
                log.error("user_drafter_failed", request_id=rid, error=repr(exc))
                error = DrafterError(f"the user drafter failed for this request: {exc!r}")
                error.__cause__ = exc
                answers.append(error)
        return answers

    def _user_call(self, ids: list[RequestId], k: int) -> list[Sequence[TokenId]]:
        assert self.user is not None
        proposals = self.user.propose([DraftRequest(rid, tuple(self.contexts[rid])) for rid in ids], k)
        if len(proposals) != len(ids):
            raise ValueError(f"user drafter returned {len(proposals)} proposals for {len(ids)} requests")
        return list(proposals)
