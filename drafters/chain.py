"""DraftChain: the one place that decides each request's drafts from every drafter it has.

Members, in priority order: grammar-forced tokens (free drafts), the n-gram and suffix lookups
(which continue past the forced tokens), a user drafter. Every member implements the Drafter
protocol (drafters/base.py); the chain applies the same rules to all of their answers: an answer
is cut where it disagrees with a forced token or leaves the vocabulary, and the longest one is
verified (the earlier member on a tie). The draft model comes after the lookups: it is asked only
where their best draft falls short of the request's budget k (`ChainDraft.model`), continues
after the forced tokens, and its draft replaces the others whatever its length (see the
DraftActor: keeping it only when longer would condition it on its own samples, and q would no
longer be its law). The chain holds every per-request thing the drafters keep, through their
`Tracked` hooks, plus the adaptive budgets and, for a member that keeps no state of its own, the
request's tokens.

Forced tokens are accepted whatever the model says, so they never count against a budget: a
request's k is its forced tokens plus its lookup budget (K, or the adaptive one below), at most
`step_drafts` = K + forced_extra (the rows the step has for it). The suffix drafter alone may go
past K, up to SuffixConfig.max_long_draft, where its match is as long as its draft (drafters/suffix.py);
it is asked with that larger k while the request's budget is whole.

Adaptive draft length: each request has a lookup budget (1..K). A step that accepts every draft
raises it by one; a rejection sets it to accepted + 1. It changes how much is verified, never what is
emitted: verification is exact for any draft.

A member that raises (or answers with the wrong number of drafts) is retried one request at a
time; the requests it still fails for get a DrafterError (`ChainDraft.error`), the others keep
their drafts. Only user code is expected to fail, but the rule is the same for every member.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from interlock.drafters.base import Drafter, Tracked
from interlock.drafters.combine import combine_drafts, consistent_prefix
from interlock.drafters.forced import ForcedDrafter
from interlock.drafters.model import ModelDrafter
from interlock.drafters.ngram import NGramDrafter
from interlock.drafters.suffix import SuffixDrafter
from interlock.logs import get_logger
from interlock.protocol.errors import DrafterError
from interlock.protocol.speculative import DraftRequest, SpeculativeConfig
from interlock.protocol.types import RequestId, TokenId

if TYPE_CHECKING:                       # the device runner's drafter: its import pulls in the device model
    from interlock.drafters.device_draft import DeviceDrafter

log = get_logger(__name__)

# engine.resources() reports each of these, 0 when the drafter is absent.
_ZERO_COUNTS = {"ngram_requests": 0, "suffix_requests": 0, "suffix_request_nodes": 0, "suffix_global_tokens": 0,
                "suffix_global_nodes": 0, "draft_requests": 0, "draft_generators": 0, "draft_kv_free_blocks": 0,
                "draft_kv_total_blocks": 0}


@dataclass(frozen=True)
class ChainRequest:
    """One sampling request as the chain sees it this step."""

    request_id: RequestId
    forced: tuple[TokenId, ...]       # the grammar's forced tokens (up to K), () when none


@dataclass(frozen=True)
class ChainDraft:
    """The chain's answer for one request: drafts, the budget k, whether the draft model should
    continue after the forced tokens (replacing `drafts`), and an error if a drafter failed."""

    drafts: tuple[TokenId, ...]
    k: int
    error: BaseException | None = None
    model: bool = False


class DraftChain:
    """Forced -> n-gram / suffix -> draft model -> user drafter, with adaptive budgets."""

    def __init__(self, config: SpeculativeConfig | None, vocab_size: int,
                 model: ModelDrafter | DeviceDrafter | None = None) -> None:
        self.config = config
        self.vocab_size = vocab_size            # drafts outside [0, vocab_size) are cut
        self.max_draft_len = config.max_draft_len if config is not None else 0      # K: the lookup budget
        self.step_drafts = config.step_drafts if config is not None else 0          # K + forced rows
        self.use_forced = config is not None and "forced" in config.drafters
        members: list[Drafter] = []
        if self.use_forced:
            members.append(ForcedDrafter())
        if config is not None and "ngram" in config.drafters:
            members.append(NGramDrafter(config.ngram, config.step_drafts))
        if config is not None and "suffix" in config.drafters:
            members.append(SuffixDrafter(config.suffix, config.step_drafts, lookup_len=config.max_draft_len))
        if config is not None and config.user_drafter is not None:
            members.append(config.user_drafter)
        self.members = members
        self.model = model
        self.tracked: list[Tracked] = [m for m in [*members, model] if isinstance(m, Tracked)]
        self.budget: dict[RequestId, int] = {}
        # prompt + output, kept only when a member keeps no state of its own (DraftRequest.tokens)
        self.contexts: dict[RequestId, list[TokenId]] | None = (
            {} if any(not isinstance(m, Tracked) for m in members) else None)

    # --- per-request state (model lane) ---------------------------------------------------------

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        for m in self.tracked:
            m.add(request_id, prompt)
        if self.contexts is not None:
            self.contexts[request_id] = list(prompt)

    def remove(self, request_id: RequestId) -> None:
        for m in self.tracked:
            m.remove(request_id)
        self.budget.pop(request_id, None)
        if self.contexts is not None:
            self.contexts.pop(request_id, None)

    def commit(self, request_id: RequestId, new_tokens: tuple[TokenId, ...], drafted: int, accepted: int) -> None:
        """A step's outcome for one request: every drafter learns its tokens; its budget adapts."""
        for m in self.tracked:
            m.commit(request_id, new_tokens)
        if self.contexts is not None and request_id in self.contexts:
            self.contexts[request_id].extend(new_tokens)
        if self.config is not None and self.config.adaptive and drafted:
            k = self.max_draft_len
            budget = self.budget.get(request_id, k)
            self.budget[request_id] = min(k, budget + 1 if accepted == drafted else max(1, accepted + 1))

    def counts(self) -> dict[str, int]:
        """Per-request state (0 when idle), the draft model's KV pool and the bounded global suffix trie."""
        counts = dict(_ZERO_COUNTS)
        for m in self.tracked:
            counts.update(m.counts())
        counts["adaptive_budgets"] = len(self.budget)
        counts["user_contexts"] = len(self.contexts) if self.contexts is not None else 0
        return counts

    # --- drafting -------------------------------------------------------------------------------

    def forced(self, forced: tuple[TokenId, ...]) -> tuple[TokenId, ...]:
        """The forced tokens the chain uses (none unless "forced" is a drafter)."""
        return forced if self.use_forced else ()

    def propose(self, requests: Sequence[ChainRequest]) -> list[ChainDraft]:
        """Drafts for each request, in order."""
        if self.config is None:
            return [ChainDraft((), 0) for _ in requests]
        asks = [DraftRequest(r.request_id, (), self.forced(r.forced)[: self.step_drafts]) for r in requests]
        ks = [self._budget(a) for a in asks]
        long_ks = [self._budget(a, long=True) for a in asks]
        answers: list[list[Sequence[TokenId]]] = [[] for _ in requests]
        errors: list[BaseException | None] = [None] * len(requests)
        for member in self.members:
            with_tokens = not isinstance(member, Tracked)
            member_ks = long_ks if isinstance(member, SuffixDrafter) else ks
            for k, idx in _by_budget(member_ks).items():
                batch = [self._with_tokens(asks[i]) if with_tokens else asks[i] for i in idx]
                for i, answer in zip(idx, self._ask(member, batch, k)):
                    if isinstance(answer, BaseException):
                        errors[i] = answer
                    else:
                        answers[i].append(consistent_prefix(answer, asks[i].forced, self.vocab_size)[:k])
        out = []
        for k, long_k, cands, error in zip(ks, long_ks, answers, errors):
            drafts = tuple(combine_drafts(cands, long_k))
            out.append(ChainDraft(drafts, k, error, model=self.model is not None and len(drafts) < k))
        return out

    def _budget(self, a: DraftRequest, long: bool = False) -> int:
        """The request's k: its lookup budget on top of its forced tokens (which are free). long: the
        suffix drafter's, whose long matches may draft up to lookup_drafts while the budget is whole."""
        lookup = self.max_draft_len
        if self.config is not None and self.config.adaptive:
            lookup = self.budget.get(a.request_id, lookup)
        if long and self.config is not None and lookup == self.max_draft_len:
            lookup = self.config.lookup_drafts
        return min(self.step_drafts, len(a.forced) + lookup)

    def _with_tokens(self, a: DraftRequest) -> DraftRequest:
        assert self.contexts is not None
        return DraftRequest(a.request_id, tuple(self.contexts[a.request_id]), a.forced)

    def _ask(self, member: Drafter, requests: list[DraftRequest], k: int) -> list[Sequence[TokenId] | BaseException]:
        try:
            return list(_call(member, requests, k))
        except Exception as exc:  # noqa: BLE001 - user code: find the request(s) it fails for
            log.warning("drafter_failed_batch", drafter=type(member).__name__, requests=len(requests), error=repr(exc))
        answers: list[Sequence[TokenId] | BaseException] = []
        for r in requests:
            try:
                answers.append(_call(member, [r], k)[0])
            except Exception as exc:  # noqa: BLE001
                log.error("drafter_failed", drafter=type(member).__name__, request_id=r.request_id, error=repr(exc))
                error = DrafterError(f"the {type(member).__name__} drafter failed for this request: {exc!r}")
                error.__cause__ = exc
                answers.append(error)
        return answers


def _call(member: Drafter, requests: list[DraftRequest], k: int) -> list[Sequence[TokenId]]:
    proposals = list(member.propose(requests, k))
    if len(proposals) != len(requests):
        raise ValueError(f"{type(member).__name__} returned {len(proposals)} drafts for {len(requests)} requests")
    return proposals


def _by_budget(ks: list[int]) -> dict[int, list[int]]:
    """Request indices grouped by budget k (a member is asked once per distinct k)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, k in enumerate(ks):
        if k > 0:
            groups[k].append(i)
    return groups
