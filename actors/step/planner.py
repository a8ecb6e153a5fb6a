"""Planning, as functions of the Scheduler's request views: what one step holds, what a request is
promised at admission, what the KV cache reserves for a step, and (`account`, the one function
here that updates the views) what a finished step changes. The Scheduler owns the `Request`
objects; nothing else sees them.

Prompt chunks sit at fixed boundaries (multiples of `prefill_chunk`) so a request's prefill is
computed the same way whatever else shares its steps: with the batch-invariant forward, a request
produces exactly the tokens it produces alone. A CFG request's companion prefills side by side and
the pair samples only when both prefills are done. A prompt whose start is in the prefix cache
begins prefilling at the cached count (a multiple of the prefix granularity, engine.py): its first
chunk runs to the next boundary, so the chunks it computes are the ones it would compute without
the cache, or, on the rows path, compute the same bits as those.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from interlock.output.delivery import Output
from interlock.protocol.messages import GuideChunk, RequestSnapshot, RequestSpec, SlotResult, StepPlan, TokenEvent
from interlock.protocol.types import RequestId, SlotId, TokenId


def decode_rows(batch: int, max_drafts: int) -> int:
    """Rows a decode step of `batch` requests forwards: each one's last token and its K draft rows."""
    return batch * (max_drafts + 1)


def guided_rows(batch: int, max_drafts: int) -> int:
    """Rows a decode step of `batch` requests forwards at most: every one guided (CFG), with its
    companion's K+1 rows beside its own."""
    return 2 * decode_rows(batch, max_drafts)


def sequence_blocks(positions: int, max_drafts: int, block_size: int) -> int:
    """KV blocks of a sequence that commits `positions` positions: those and the K+1 rows a step
    writes past the last of them, in whole blocks."""
    return -(-(positions + max_drafts + 1) // block_size)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int
    max_drafts: int                 # draft rows a request may verify in a step (SpeculativeConfig.step_drafts); 0: none
    prefill_chunk: int = 256
    max_step_tokens: int = 512      # token budget asked for; a step gets `step_budget`
    max_position: int = 2048
    block_size: int = 16
    num_blocks: int = 1024

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.prefill_chunk < 1 or self.max_drafts < 0 or self.max_step_tokens < 1:
            raise ValueError("max_batch_size, prefill_chunk and max_step_tokens must be >= 1, max_drafts >= 0")

    @property
    def step_budget(self) -> int:
        """Token budget of one step (decode rows + prompt chunks): max_step_tokens, raised to one
        decode step of a full batch so that every running request can decode in every step."""
        return max(self.max_step_tokens, decode_rows(self.max_batch_size, self.max_drafts))

    @property
    def max_blocks(self) -> int:
        """KV blocks one sequence can ever hold: a full context and a step's draft rows past it."""
        return sequence_blocks(self.max_position, self.max_drafts, self.block_size)


class Phase(enum.Enum):
    """A request's lifecycle here: WAITING -> RUNNING -> (DRAINING ->) gone."""

    WAITING = "waiting"       # no slot yet
    RUNNING = "running"       # holds a slot; prefilling, waiting for its grammar, or decoding
    DRAINING = "draining"     # released everywhere; its final deltas wait for a slow consumer


@dataclass
class Request:
    """The scheduler's private, mutable view of one request (nobody else sees it)."""

    out: Output
    seq: int
    guide_seq: int | None
    blocks: int                             # KV blocks it can ever hold (promised at admission)
    phase: Phase = Phase.WAITING
    grammar: str = "none"                   # "none" | "pending" | "ready"
    slot: SlotId = -1
    computed: int = 0                       # positions with K/V written (committed)
    guide_computed: int = 0
    compiled: Any = None                    # a grammar that compiled before the request had a slot

    @property
    def spec(self) -> RequestSpec:
        return self.out.spec

    @property
    def last_token(self) -> int:
        return self.out.output[-1] if self.out.output else self.spec.prompt[-1]

    @property
    def prefilling(self) -> bool:
        guide = self.spec.uncond_prompt
        return self.computed < len(self.spec.prompt) - 1 or (guide is not None and self.guide_computed < len(guide) - 1)

    @property
    def seqs(self) -> tuple[int, ...]:
        return (self.seq,) if self.guide_seq is None else (self.seq, self.guide_seq)

    @property
    def seq_prompts(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Each KV sequence with the prompt it starts from (the CFG companion's second)."""
        if self.guide_seq is None or self.spec.uncond_prompt is None:
            return ((self.seq, self.spec.prompt),)
        return ((self.seq, self.spec.prompt), (self.guide_seq, self.spec.uncond_prompt))


def plan_step(running: dict[SlotId, Request], config: SchedulerConfig) -> tuple[RequestSnapshot, ...]:
    """The snapshots of the next step: decode rows first, then whole prompt chunks within the budget."""
    k = config.max_drafts
    budget = config.step_budget
    snaps: list[RequestSnapshot] = []
    for slot in sorted(running):           # decode rows first: they keep latency low
        req = running[slot]
        # The last step's delta may still be queued (it is delivered while this step runs); more
        # than that, or a full stream, means a slow consumer: the request pauses.
        if req.prefilling or len(req.out.pending) > 1 or not req.out.stream.has_room() or req.grammar == "pending":
            continue                            # a pending grammar: prefilled, sampled once ready
        guide = None
        if req.guide_seq is not None:
            assert req.spec.uncond_prompt is not None
            last = req.out.output[-1] if req.out.output else req.spec.uncond_prompt[-1]
            guide = GuideChunk(req.guide_seq, req.guide_computed, (last,))
        snaps.append(RequestSnapshot(req.spec.request_id, slot, req.seq, req.computed, (req.last_token,),
                                     True, req.grammar == "ready", req.spec.sampling, guide, req.spec.trie))
        budget -= decode_rows(len(req.seqs), k)
    for slot in sorted(running):           # then prompt chunks, whole chunks only
        req = running[slot]
        if not req.prefilling:
            continue
        chunk = next_chunk(config, req.spec.prompt, req.computed)
        guide = None
        if req.guide_seq is not None:
            assert req.spec.uncond_prompt is not None
            guide = GuideChunk(req.guide_seq, req.guide_computed,
                               next_chunk(config, req.spec.uncond_prompt, req.guide_computed))
        n = len(chunk) + (len(guide.chunk) if guide is not None else 0)
        if n > budget and snaps:
            break
        snaps.append(RequestSnapshot(req.spec.request_id, slot, req.seq, req.computed, chunk, False,
                                     req.grammar != "none", req.spec.sampling, guide))
        budget -= n
    return tuple(snaps)


def next_chunk(config: SchedulerConfig, prompt: tuple[int, ...], computed: int) -> tuple[int, ...]:
    """The prompt's next prefill chunk (up to the next multiple of prefill_chunk; never its last token)."""
    c = config.prefill_chunk
    return tuple(prompt[computed: min((computed // c + 1) * c, len(prompt) - 1)])


def blocks_for(spec: RequestSpec, config: SchedulerConfig) -> int:
    """Blocks the request (and its CFG companion) can ever hold: promised at admission, all at once."""
    prompts = [spec.prompt] + ([spec.uncond_prompt] if spec.uncond_prompt is not None else [])
    return sum(sequence_blocks(min(len(p) + spec.sampling.max_tokens, config.max_position), config.max_drafts,
                               config.block_size) for p in prompts)


def reservations(plan: StepPlan) -> tuple[tuple[int, int], ...]:
    """(KV sequence, positions) the step writes: each chunk, plus K draft rows where it samples.
    Admission promised every request its blocks, so this reservation cannot run out."""
    items = []
    for s in plan.snapshots:
        drafts = plan.max_drafts if s.sample else 0
        items.append((s.seq, len(s.chunk) + drafts))
        if s.guide is not None:
            items.append((s.guide.seq, len(s.guide.chunk) + drafts))
    return tuple(items)


@dataclass
class StepOutcome:
    """What a finished step asks of the Scheduler."""

    rewinds: list[tuple[int, int]]                       # (seq, positions) of rejected draft rows
    commits: list[tuple[int, tuple[TokenId, ...]]]      # (seq, tokens) whose K/V is now committed
    emits: list[tuple[Request, SlotResult]]              # each request's step result (new tokens, logprobs)
    failed: list[tuple[Request, BaseException]]          # per-request faults of the step


def account(plan: StepPlan, event: TokenEvent, requests: dict[RequestId, Request]) -> StepOutcome:
    """Apply a finished step to the requests it held: positions computed and per-request counts."""
    out = StepOutcome([], [], [], [])
    by_id = {r.request_id: r for r in event.results}
    for s in plan.snapshots:
        req = requests.get(s.request_id)
        result = by_id.get(s.request_id)
        if req is None or req.phase is not Phase.RUNNING:
            continue                                          # failed (its grammar) while in flight
        if result is None:                                    # a prefill chunk
            req.computed += len(s.chunk)
            req.guide_computed += len(s.guide.chunk) if s.guide is not None else 0
            out.commits.append((s.seq, s.chunk))
            if s.guide is not None:
                out.commits.append((s.guide.seq, s.guide.chunk))
        elif result.error is not None:
            out.failed.append((req, result.error))
        else:
            # KV kept: the last token + accepted drafts (the final new token is fed next step).
            used = len(result.new_tokens)
            out.rewinds.extend((seq, 1 + plan.max_drafts - used) for seq in req.seqs)
            req.computed += used
            req.guide_computed += used if req.guide_seq is not None else 0
            out.commits.append((s.seq, (s.chunk + result.new_tokens)[:used]))    # fed + accepted
            if s.guide is not None:
                out.commits.append((s.guide.seq, (s.guide.chunk + result.new_tokens)[:used]))
            o = req.out
            o.steps, o.step_tokens = o.steps + 1, o.step_tokens + used
            o.drafted, o.accepted = o.drafted + result.drafted, o.accepted + result.accepted
            o.exposed_s += event.exposed_grammar_s
            out.emits.append((req, result))
    return out
