"""Scheduler: owns requests, slots, the waiting and running queues, and the output streams.

Between steps it admits requests (a free slot and the KV blocks the request can ever need),
plans one step (decode steps first, then prompt chunks up to the token budget), has the KVActor
reserve the positions, and sends the StepPlan down the chain. On the TokenEvent it rewinds
rejected positions, streams the new text, checks stop conditions and frees what finished.
One step is in flight at a time; everything else waits for the TokenEvent.

Prompt chunks sit at fixed boundaries (multiples of `prefill_chunk`) so a request's prefill is
computed the same way whatever else shares its steps: with the batch-invariant forward, a
request produces exactly the tokens it produces alone.

A request with classifier-free guidance owns a second KV sequence, its unconditional companion
(RequestSnapshot.guide). The pair is one request here: admitted with the blocks both can ever
need (both or neither), prefilled side by side, sampled only when both prefills are done, fed the
same tokens, rewound by the same amount and freed together.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.actors.base import Actor, Handler
from interlock.models.detokenize import IncrementalText
from interlock.models.tokenizer import Tokenizer
from interlock.grammars.validate import validate_output
from interlock.protocol.errors import EngineClosedError, GrammarError, KVCacheExhaustedError
from interlock.protocol.messages import (
    AddRequest, BindGrammar, BlockTables, Cancel, Count, EngineMetrics, Free, GetMetrics, GrammarReady, GuideChunk,
    Release, RequestSnapshot, RequestSpec,
    Reserve, Rewind, StepPlan, Submit, TokenEvent, Wake,
)
from interlock.protocol.sampling import Delta, RequestStats
from interlock.protocol.types import FinishReason, RequestId, SlotId
from interlock.streams.output import OutputStream
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int
    max_draft_len: int              # K; 0 without speculation
    prefill_chunk: int = 256
    max_step_tokens: int = 512      # token budget of one step (decode rows + prompt chunks)
    max_position: int = 2048
    block_size: int = 16
    num_blocks: int = 1024

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.prefill_chunk < 1 or self.max_draft_len < 0:
            raise ValueError("max_batch_size and prefill_chunk must be >= 1, max_draft_len >= 0")
        if self.max_step_tokens < self.max_batch_size * (self.max_draft_len + 1):
            raise ValueError("max_step_tokens must fit one decode step of a full batch")


@dataclass
class _Request:
    """The scheduler's private, mutable view of one request (nobody else sees it)."""

    spec: RequestSpec
    stream: OutputStream[Delta]
    seq: int
    text: IncrementalText
    submitted: float
    slot: SlotId = -1
    computed: int = 0                       # positions with K/V written (committed)
    guide_seq: int | None = None            # the CFG companion's KV sequence
    guide_computed: int = 0                 # its committed positions
    output: list[int] = field(default_factory=list)
    grammar: str = "none"                   # "none" | "pending" | "ready"
    blocks: int = 0                         # KV blocks promised at admission
    steps: int = 0
    step_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    exposed_s: float = 0.0
    compile_ms: float = 0.0
    first_token: float = 0.0
    pending: deque[Delta] = field(default_factory=deque)
    finished: bool = False                  # final delta queued; waiting only to flush / free
    cancelled: bool = False
    released: bool = False                  # every owner was told to free its part

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.spec.prompt[-1]

    @property
    def guide_last_token(self) -> int:
        """What the CFG companion feeds next: the same output token, or its own prompt's last one before any."""
        assert self.spec.uncond_prompt is not None
        return self.output[-1] if self.output else self.spec.uncond_prompt[-1]

    @property
    def prefilling(self) -> bool:
        """Some prompt position (of the request or its companion) has no K/V yet."""
        guide = self.spec.uncond_prompt
        return self.computed < len(self.spec.prompt) - 1 or (guide is not None and self.guide_computed < len(guide) - 1)

    @property
    def seqs(self) -> tuple[int, ...]:
        return (self.seq,) if self.guide_seq is None else (self.seq, self.guide_seq)


class Scheduler(Actor[object]):
    def __init__(self, config: SchedulerConfig, tokenizer: Tokenizer, kv: Actor[object], grammar: Actor[object],
                 draft: Actor[object], verifier: Actor[object], on_done: Callable[[RequestId], None]) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.kv, self.grammar, self.draft, self.verifier = kv, grammar, draft, verifier
        self.on_done = on_done
        self.requests: dict[RequestId, _Request] = {}
        self.waiting: deque[_Request] = deque()
        self.running: dict[SlotId, _Request] = {}
        self.free_slots = list(range(config.max_batch_size - 1, -1, -1))
        self.free_blocks = config.num_blocks      # blocks not promised to an admitted request
        self.step = 0
        self.in_flight: StepPlan | None = None
        self.draining: list[_Request] = []
        self._launched = 0.0
        self._totals = {"steps": 0, "step_s": 0.0, "forward_s": 0.0, "exposed_grammar_s": 0.0, "output_tokens": 0}      # released, final deltas not yet taken by the consumer
        self._next_seq = 0
        self._compiled: dict[RequestId, Any] = {}  # grammars that compiled before their request got a slot
        super().__init__("scheduler", inbox_size=max(64, 4 * config.max_batch_size))

    def handlers(self) -> Mapping[type, Handler]:
        return {Submit: self.on_submit, GrammarReady: self.on_grammar, Cancel: self.on_cancel,
                Wake: self.on_wake, TokenEvent: self.on_tokens, GetMetrics: self.on_metrics, Count: self.on_count}

    async def on_count(self, msg: Count) -> None:
        """(free slots, requests held) for leak checks."""
        msg.reply.set_result((len(self.free_slots), len(self.requests)))

    async def on_metrics(self, msg: GetMetrics) -> None:
        msg.reply.set_result(EngineMetrics(**self._totals))

    # --- messages ------------------------------------------------------------------------------

    async def on_submit(self, msg: Submit) -> None:
        spec = msg.spec
        req = _Request(spec, msg.stream, self._next_seq, IncrementalText(self.tokenizer, spec.sampling.stop),
                       time.perf_counter(), grammar="pending" if spec.grammar is not None else "none")
        self._next_seq += 1
        if spec.uncond_prompt is not None:
            req.guide_seq = self._next_seq
            self._next_seq += 1
        need = self._blocks_for(req)
        if need > self.config.num_blocks:
            guide = f", CFG companion prompt {len(spec.uncond_prompt)}" if spec.uncond_prompt is not None else ""
            msg.stream.fail(KVCacheExhaustedError(
                f"request needs {need} KV blocks (prompt {len(spec.prompt)}{guide} + max_tokens "
                f"{spec.sampling.max_tokens}), the pool has {self.config.num_blocks}: lower max_tokens "
                "or give the engine more KV blocks"))
            self.on_done(spec.request_id)
            return
        self.requests[spec.request_id] = req
        self.waiting.append(req)
        log.debug("request_submitted", request_id=spec.request_id, prompt_tokens=len(spec.prompt),
                  grammar=type(spec.grammar).__name__ if spec.grammar else None)
        await self._advance()

    async def on_grammar(self, msg: GrammarReady) -> None:
        req = self.requests.get(msg.request_id)
        if req is None or req.finished:
            return
        req.compile_ms = msg.compile_ms
        if msg.error is not None:
            await self._finish(req, "error", msg.error)
        else:
            req.grammar = "ready"
            if req.slot >= 0:
                await self.grammar.send(BindGrammar(req.slot, msg.compiled))
            else:
                self._compiled[msg.request_id] = msg.compiled
        await self._advance()

    async def on_cancel(self, msg: Cancel) -> None:
        req = self.requests.get(msg.request_id)
        if req is not None:
            req.cancelled = True
        await self._advance()

    async def on_wake(self, msg: Wake) -> None:
        await self._advance()

    async def on_tokens(self, event: TokenEvent) -> None:
        plan, self.in_flight = self.in_flight, None
        assert plan is not None and plan.step == event.step, "token event for a step not in flight"
        t = self._totals
        t["steps"] += 1
        t["step_s"] += time.perf_counter() - self._launched
        t["forward_s"] += event.forward_s
        t["exposed_grammar_s"] += event.exposed_grammar_s
        t["output_tokens"] += sum(len(r.new_tokens) for r in event.results)
        await self.grammar.send(event)
        await self.draft.send(event)
        rewinds, emits = [], []
        by_id = {r.request_id: r for r in event.results}
        for s in plan.snapshots:
            req = self.requests.get(s.request_id)
            if req is None:         # failed while this step prefilled it (its grammar did not compile): gone
                continue
            result = by_id.get(s.request_id)
            if result is None:                                    # a prefill chunk
                req.computed += len(s.chunk)
                req.guide_computed += len(s.guide.chunk) if s.guide is not None else 0
                continue
            # KV kept: the last token + accepted drafts but the final new token (fed next step; a stop
            # token that was an accepted draft ends the request, so it never is). The companion was
            # fed the same tokens: it keeps as many.
            used = len(result.new_tokens)
            rewinds.extend((seq, 1 + plan.max_draft_len - used) for seq in req.seqs)
            req.computed += used
            req.guide_computed += used if req.guide_seq is not None else 0
            req.steps += 1
            req.step_tokens += len(result.new_tokens)
            req.drafted += result.drafted
            req.accepted += result.accepted
            req.exposed_s += event.exposed_grammar_s
            emits.append((req, list(result.new_tokens)))
        if rewinds:                                                # before any Free that _emit may send
            await self.kv.send(Rewind(tuple(rewinds)))
        for req, tokens in emits:
            await self._emit(req, tokens)
        await self._advance()

    # --- the loop body -----------------------------------------------------------------------

    async def _advance(self) -> None:
        """Between steps: retire finished/cancelled requests, admit, plan and launch the next step."""
        if self.in_flight is not None:
            return
        for req in list(self.requests.values()):
            if req.cancelled or req.stream.state == "cancelled":
                await self._release(req)
            elif req.pending:
                self._flush(req)
        for req in list(self.draining):
            self._flush(req)
            if not req.pending or req.stream.state != "open":
                self.draining.remove(req)
        await self._admit()
        plan = self._plan()
        if plan is None:
            return
        # Admission promised every request its blocks, so this reservation cannot run out.
        items = []
        for s in plan.snapshots:
            drafts = plan.max_draft_len if s.sample else 0
            items.append((s.seq, len(s.chunk) + drafts))
            if s.guide is not None:
                items.append((s.guide.seq, len(s.guide.chunk) + drafts))
        tables: BlockTables = await self.kv.ask(lambda reply: Reserve(tuple(items), reply))
        self.in_flight = StepPlan(plan.step, plan.snapshots, plan.max_draft_len, tables)
        self._launched = time.perf_counter()
        log.debug("step_planned", step=plan.step, requests=len(plan.snapshots),
                  sampling=sum(s.sample for s in plan.snapshots),
                  prompt_tokens=sum(len(s.chunk) + (len(s.guide.chunk) if s.guide else 0)
                                    for s in plan.snapshots if not s.sample))
        await self.grammar.send(self.in_flight)

    async def _admit(self) -> None:
        while self.waiting and self.free_slots:
            req = self.waiting[0]
            if req.cancelled or req.stream.state == "cancelled":
                self.waiting.popleft()
                self.requests.pop(req.spec.request_id, None)
                self.on_done(req.spec.request_id)
                continue
            need = self._blocks_for(req)
            if need > self.free_blocks:
                return                        # FIFO: wait for blocks rather than starve big requests
            self.waiting.popleft()
            req.slot, req.blocks = self.free_slots.pop(), need
            self.free_blocks -= need
            self.running[req.slot] = req
            log.debug("request_admitted", request_id=req.spec.request_id, slot=req.slot, step=self.step,
                      kv_blocks=need)
            await self.draft.send(AddRequest(req.spec.request_id, req.spec.prompt))
            compiled = self._compiled.pop(req.spec.request_id, None)
            if compiled is not None:
                await self.grammar.send(BindGrammar(req.slot, compiled))

    def _plan(self) -> StepPlan | None:
        k = self.config.max_draft_len
        budget = self.config.max_step_tokens
        snaps: list[RequestSnapshot] = []
        for slot in sorted(self.running):           # decode rows first: they keep latency low
            req = self.running[slot]
            if req.prefilling or req.finished or req.pending or not req.stream.has_room():
                continue
            if req.grammar == "pending":
                continue                            # prefilled; sampled once its grammar is ready
            guide = None if req.guide_seq is None else GuideChunk(req.guide_seq, req.guide_computed,
                                                                  (req.guide_last_token,))
            snaps.append(RequestSnapshot(req.spec.request_id, slot, req.seq, req.computed, (req.last_token,),
                                         True, req.grammar == "ready", req.spec.sampling, guide))
            budget -= (1 + k) * len(req.seqs)
        for slot in sorted(self.running):           # then prompt chunks, whole chunks only
            req = self.running[slot]
            if not req.prefilling or req.finished:
                continue
            chunk = self._next_chunk(req.spec.prompt, req.computed)
            guide = None
            if req.guide_seq is not None:
                assert req.spec.uncond_prompt is not None
                guide = GuideChunk(req.guide_seq, req.guide_computed,
                                   self._next_chunk(req.spec.uncond_prompt, req.guide_computed))
            n = len(chunk) + (len(guide.chunk) if guide is not None else 0)
            if n > budget and snaps:
                break
            snaps.append(RequestSnapshot(req.spec.request_id, slot, req.seq, req.computed, chunk, False,
                                         req.grammar != "none", req.spec.sampling, guide))
            budget -= n
        if not snaps:
            return None
        self.step += 1
        return StepPlan(self.step, tuple(snaps), k)

    def _next_chunk(self, prompt: tuple[int, ...], computed: int) -> tuple[int, ...]:
        """The prompt's next prefill chunk (up to the next multiple of prefill_chunk; never its last token)."""
        c = self.config.prefill_chunk
        return tuple(prompt[computed: min((computed // c + 1) * c, len(prompt) - 1)])

    # --- output --------------------------------------------------------------------------------

    async def _emit(self, req: _Request, tokens: list[int]) -> None:
        if not req.output and tokens:
            req.first_token = time.perf_counter()
        sampling = req.spec.sampling
        reason: FinishReason | None = None
        for i, t in enumerate(tokens):
            if t in self.tokenizer.eos_token_ids and not sampling.ignore_eos:
                tokens, reason = tokens[:i], "stop"
                break
        room = sampling.max_tokens - len(req.output)
        if len(tokens) > room:
            tokens, reason = tokens[:room], "length"
        elif len(tokens) == room and reason is None:
            reason = "length"
        req.output.extend(tokens)
        if reason is None and max(req.computed, req.guide_computed) + 1 + self.config.max_draft_len >= \
                self.config.max_position:
            reason = "length"
        text = req.text.push(tokens, final=reason is not None)
        if req.text.stop_hit:
            reason = "stop"
        if reason == "stop" and req.spec.grammar is not None and (bad := self._check_output(req)) is not None:
            await self._finish(req, "error", bad)        # never a silent invalid document
            return
        if reason is None:
            req.pending.append(Delta(text, tuple(tokens)))
        else:
            stats = self._stats(req)
            req.pending.append(Delta(text, tuple(tokens), reason, stats))
            req.finished = True
            log.debug("request_finished", request_id=req.spec.request_id, step=self.step, reason=reason,
                      output_tokens=stats.output_tokens, acceptance_length=round(stats.mean_acceptance_length, 3))
            # Free first, deliver after: once the caller sees the end, every Free is already queued.
            await self._release(req)
        self._flush(req)

    def _check_output(self, req: _Request) -> GrammarError | None:
        """The end-of-request check of a constrained output that ends with "stop": the error, or None."""
        delivered = self.tokenizer.decode(req.text.ids, skip_special_tokens=True)[: req.text.emitted]
        try:
            validate_output(req.spec.grammar, delivered)
        except GrammarError as exc:
            log.error("invalid_constrained_output", request_id=req.spec.request_id, step=self.step,
                      grammar=type(req.spec.grammar).__name__, error=str(exc), output=delivered[:200])
            return exc
        return None

    def _flush(self, req: _Request) -> None:
        while req.pending and req.stream.try_put(req.pending[0]):
            delta = req.pending.popleft()
            if delta.finish_reason is not None:
                req.stream.finish()

    def _stats(self, req: _Request) -> RequestStats:
        now = time.perf_counter()
        return RequestStats(
            prompt_tokens=len(req.spec.prompt), output_tokens=len(req.output), steps=req.steps,
            step_tokens=req.step_tokens,
            drafted=req.drafted, accepted=req.accepted,
            ttft_s=(req.first_token or now) - req.submitted, elapsed_s=now - req.submitted,
            exposed_grammar_ms=req.exposed_s * 1e3, grammar_compile_ms=req.compile_ms)

    async def _finish(self, req: _Request, reason: FinishReason, error: BaseException | None = None) -> None:
        log.info("request_failed" if error else "request_finished", request_id=req.spec.request_id, step=self.step,
                 reason=reason, error=repr(error) if error else None)
        req.finished = True
        if error is not None:
            req.stream.fail(error)
        else:
            req.stream.finish()
        req.pending.clear()
        await self._release(req)

    async def _release(self, req: _Request) -> None:
        """Free everything the request holds, in every actor. Never while its step is in flight.

        Deltas the consumer has not taken yet stay queued (`draining`) and are delivered later.
        """
        rid = req.spec.request_id
        if req.released:
            return
        req.released = True
        if req.pending and req.stream.state == "open":
            self.draining.append(req)
        elif req.stream.state == "open":
            req.stream.fail(EngineClosedError("request dropped"))
        if req in self.waiting:
            self.waiting.remove(req)
        if req.slot >= 0:
            self.running.pop(req.slot, None)
            await self.grammar.send(Release(rid, req.slot))
            await self.draft.send(Release(rid, req.slot))
            await self.verifier.send(Release(rid, req.slot))
            await self.kv.send(Free(req.seqs))
            self.free_slots.append(req.slot)
            self.free_blocks += req.blocks
        self._compiled.pop(rid, None)
        # Last: once a request is gone from `requests`, every Free for it is already queued.
        self.requests.pop(rid, None)
        self.on_done(rid)

    def _blocks_for(self, req: _Request) -> int:
        """Blocks the request (and its CFG companion) can ever hold: promised at admission, all at once."""
        prompts = [req.spec.prompt] + ([req.spec.uncond_prompt] if req.spec.uncond_prompt is not None else [])
        total = 0
        for prompt in prompts:
            positions = min(len(prompt) + req.spec.sampling.max_tokens + self.config.max_draft_len + 1,
                            self.config.max_position + self.config.max_draft_len + 1)
            total += -(-positions // self.config.block_size)
        return total
