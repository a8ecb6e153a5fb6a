"""Scheduler: owns requests, slots, the waiting and running queues, and the output streams.

Between steps it admits requests (a free slot and the KVActor's promise of every block the request
can ever need), plans one step (decode rows first, then prompt chunks up to the token budget), has
the KVActor reserve the positions and launches the step: `StepProgram.launch` stages the plan in
every part's queue and enqueues the whole step on the lanes (one event-loop entry). When the step's
token event reaches the loop (the second entry) it updates each request, launches the next step at
once, and only then delivers the finished step's outputs, which the next step's lanes hide.

With prefix caching, admission starts a request's sequences on the cached blocks of their prompts and
its prefill begins at the cached count (the chunks keep their fixed boundaries); after each step the
KVActor is told the committed tokens (prefill chunks; the fed token and the accepted drafts), which
makes the blocks they fill shareable.

What a step holds, and what a request is promised, is planned in actors/planner.py. A request
with classifier-free guidance owns a second KV sequence (its companion): admitted with the blocks
both can ever need, fed the same tokens, rewound by the same amount and freed together.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Callable

from interlock.actors.base import Actor, Handler
from interlock.output.delivery import Output
from interlock.actors.planner import Phase, SchedulerConfig, account, blocks_for, plan_step, reservations
from interlock.actors.planner import Request as _Request
from interlock.actors.step import StepProgram
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import EngineClosedError, KVCacheExhaustedError
from interlock.protocol.messages import (
    AddRequest, BindGrammar, BlockTables, Cancel, Count, EngineMetrics, Free, GetMetrics, GrammarReady, Promise,
    Release, Reserve, Rewind, SlotResult, StepPlan, Submit, TokenEvent, Wake,
)
from interlock.protocol.types import FinishReason, RequestId, SlotId
from interlock.logs import get_logger

log = get_logger(__name__)


class Scheduler(Actor[object]):
    def __init__(self, config: SchedulerConfig, tokenizer: Tokenizer, kv: Actor[object], grammar: Actor[object],
                 draft: Actor[object], verifier: Actor[object], program: StepProgram,
                 on_done: Callable[[RequestId], None]) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.kv, self.grammar, self.draft, self.verifier = kv, grammar, draft, verifier
        self.program = program
        self.on_done = on_done
        self.requests: dict[RequestId, _Request] = {}
        self.waiting: deque[_Request] = deque()
        self.running: dict[SlotId, _Request] = {}
        self.free_slots = list(range(config.max_batch_size - 1, -1, -1))
        self.step = 0
        self.in_flight: StepPlan | None = None
        self._done: deque[TokenEvent] = deque(maxlen=2)   # token events the lanes handed to the loop
        self._failure: BaseException | None = None
        self._launched = 0.0
        self._totals = {"steps": 0, "step_s": 0.0, "forward_s": 0.0, "exposed_grammar_s": 0.0, "output_tokens": 0,
                        "host_s": 0.0, "prompt_tokens": 0, "cached_prompt_tokens": 0}
        self._next_seq = 0
        super().__init__("scheduler", inbox_size=max(64, 4 * config.max_batch_size))

    def handlers(self) -> Mapping[type, Handler]:
        return {Submit: self.on_submit, GrammarReady: self.on_grammar, Cancel: self.on_cancel,
                Wake: self.on_wake, GetMetrics: self.on_metrics, Count: self.on_count}

    async def on_start(self) -> None:
        self.program.bind(self._step_done, self._step_failed)

    def _step_failed(self, error: BaseException) -> None:
        """On the loop: a part of the step raised (not a per-request fault): the engine fails."""
        self._failure = error
        try:
            self.send_nowait(Wake())
        except Exception:  # noqa: BLE001 - a full inbox: the next message handled raises it
            pass

    def _step_done(self, event: TokenEvent) -> None:
        """On the loop, called by the lane's last host function: the token event fired."""
        self._done.append(event)
        try:
            self.send_nowait(Wake())
        except Exception:  # noqa: BLE001 - a full inbox: the next message handled sees _done anyway
            pass

    async def on_count(self, msg: Count) -> None:
        # steps_in_flight: releases that arrive during a step wait for its end (StepState.between_steps)
        msg.reply.set_result({"slots_free": len(self.free_slots), "requests": len(self.requests),
                              "steps_in_flight": int(self.program.state.in_flight),
                              "output_streams": sum(r.out.stream.state == "open" for r in self.requests.values()),
                              "compiled_grammars": sum(r.compiled is not None for r in self.requests.values())})

    async def on_metrics(self, msg: GetMetrics) -> None:
        actors = (self, self.kv, self.grammar, self.draft, self.verifier)
        messages = sum(a.inbox.statistics().total_sent for a in actors) + self.program.counts["steps"]
        msg.reply.set_result(EngineMetrics(**self._totals, messages=messages,
                                           loop_wakeups=self.program.counts["wakeups"],
                                           replayed_steps=self.program.counts["replayed"],
                                           eager_steps=self.program.counts["eager"],
                                           captured_programs=self.program.counts["captured"],
                                           failed_captures=self.program.counts["capture_failed"]))

    # --- messages ------------------------------------------------------------------------------

    async def on_submit(self, msg: Submit) -> None:
        spec = msg.spec
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        guide_seq = None
        if spec.uncond_prompt is not None:
            guide_seq, self._next_seq = self._next_seq, self._next_seq + 1
        req = _Request(Output.new(spec, msg.stream, self.tokenizer), seq, guide_seq, 0,
                       grammar="pending" if spec.grammar is not None else "none")
        req.blocks = blocks_for(req.spec, self.config)
        if req.blocks > self.config.num_blocks:
            guide = f", CFG companion prompt {len(spec.uncond_prompt)}" if spec.uncond_prompt is not None else ""
            msg.stream.fail(KVCacheExhaustedError(
                f"request needs {req.blocks} KV blocks (prompt {len(spec.prompt)}{guide} + max_tokens "
                f"{spec.sampling.max_tokens}), the pool has {self.config.num_blocks}: lower max_tokens "
                "or give the engine more KV blocks"))
            self.on_done(spec.request_id)
            return
        self.requests[spec.request_id] = req
        self.waiting.append(req)
        log.debug("request_submitted", request_id=spec.request_id, prompt_tokens=len(spec.prompt))
        await self._advance()

    async def on_grammar(self, msg: GrammarReady) -> None:
        req = self.requests.get(msg.request_id)
        if req is not None and req.phase is not Phase.DRAINING:
            req.out.compile_ms = msg.compile_ms
            if msg.error is not None:
                await self._finish(req, "error", msg.error)
            else:
                req.grammar = "ready"
                if req.slot >= 0:
                    await self._bind(req.slot, msg.compiled)
                else:
                    req.compiled = msg.compiled
        await self._advance()

    async def on_cancel(self, msg: Cancel) -> None:
        await self._advance()       # the stream is already cancelled; _advance releases it

    async def on_wake(self, msg: Wake) -> None:
        await self._advance()

    async def _on_tokens(self, event: TokenEvent) -> None:
        """Apply a finished step: KV kept/rewound, per-request counts, finishes; then launch the next."""
        start = time.perf_counter()
        plan, self.in_flight = self.in_flight, None
        assert plan is not None and plan.step == event.step, "token event for a step not in flight"
        t = self._totals
        t["steps"] += 1
        t["step_s"] += start - self._launched
        t["forward_s"] += event.forward_s
        t["exposed_grammar_s"] += event.exposed_grammar_s
        t["output_tokens"] += sum(len(r.new_tokens) for r in event.results)
        done = account(plan, event, self.requests)
        if done.rewinds or done.commits:                           # before any Free
            await self.kv.send(Rewind(tuple(done.rewinds), tuple(done.commits)))
        for req, error in done.failed:
            await self._finish(req, "error", error)
        finished = [(req, self._emit(req, result)) for req, result in done.emits]
        for req, reason in finished:
            if req.out.invalid is not None:
                await self._finish(req, "error", req.out.invalid)
            elif reason is not None:
                await self._release(req)       # free first, deliver after
        t["host_s"] += time.perf_counter() - start
        await self._advance()                 # the next step runs while we deliver this one's output
        for req, _ in finished:
            req.out.flush()

    def _emit(self, req: _Request, result: SlotResult) -> FinishReason | None:
        at_limit = max(req.computed, req.guide_computed) + 1 + self.config.max_drafts >= self.config.max_position
        reason = req.out.emit(list(result.new_tokens), self.tokenizer.eos_token_ids, at_limit, result.logprobs)
        stats = req.out.pending[-1].stats if reason is not None and req.out.pending else None
        if stats is not None:       # a refused output has none: _finish logs it as request_failed
            # One line per request at info: what `--log-level info` is for (the level is checked first).
            log.info("request_finished", request_id=req.spec.request_id, step=self.step, reason=reason,
                     prompt_tokens=stats.prompt_tokens, output_tokens=stats.output_tokens, steps=stats.steps,
                     ttft_s=round(stats.ttft_s, 3), elapsed_s=round(stats.elapsed_s, 3))
        return reason

    # --- the loop body -----------------------------------------------------------------------

    async def _advance(self) -> None:
        """Between steps: apply a finished step, retire cancelled requests, admit, plan and launch."""
        if self._failure is not None:
            raise RuntimeError(f"a step failed on the lanes: {self._failure!r}") from self._failure
        while self._done:
            await self._on_tokens(self._done.popleft())
        if self.in_flight is not None:
            return
        start = time.perf_counter()
        for req in list(self.requests.values()):
            if req.out.stream.state == "cancelled" and req.phase is not Phase.DRAINING:
                await self._release(req)
            elif req.out.pending:
                req.out.flush()
            if req.phase is Phase.DRAINING and (not req.out.pending or req.out.stream.state != "open"):
                self._forget(req)
        await self._admit()
        snaps = plan_step(self.running, self.config)
        if not snaps:
            return
        self.step += 1
        plan = StepPlan(self.step, snaps, self.config.max_drafts)
        tables: BlockTables = await self.kv.ask(lambda reply: Reserve(reservations(plan), reply))
        self.in_flight = StepPlan(plan.step, plan.snapshots, plan.max_drafts, tables)
        self._launched = time.perf_counter()
        self.program.launch(self.in_flight)
        log.debug("step_planned", step=plan.step, requests=len(snaps), sampling=sum(s.sample for s in snaps))
        self._totals["host_s"] += time.perf_counter() - start

    async def _admit(self) -> None:
        while self.waiting and self.free_slots:
            req = self.waiting[0]
            seqs = req.seq_prompts
            cached = await self.kv.ask(lambda reply: Promise(req.blocks, reply, seqs))
            if cached is None:
                return                        # FIFO: wait for blocks rather than starve big requests
            self.waiting.popleft()
            # Prefill starts after the cached prefix (never past the prompt's last token).
            req.computed = cached[0]
            req.guide_computed = cached[1] if len(cached) > 1 else 0
            req.out.cached_prompt_tokens = sum(cached)
            self._totals["prompt_tokens"] += sum(len(p) for _, p in seqs)
            self._totals["cached_prompt_tokens"] += sum(cached)
            req.slot, req.phase = self.free_slots.pop(), Phase.RUNNING
            self.running[req.slot] = req
            log.debug("request_admitted", request_id=req.spec.request_id, slot=req.slot, kv_blocks=req.blocks)
            # Asked, not sent: the add (and bind) must be on the lanes before the next step (a sent one
            # may wait in a busy actor's inbox, and a fully cached prompt decodes in its first step).
            rid, prompt = req.spec.request_id, req.spec.prompt
            await self.draft.ask(lambda reply: AddRequest(rid, prompt, reply))
            if req.spec.sampling.penalized:     # repetition penalties read the whole prompt, cached or not
                await self.verifier.ask(lambda reply: AddRequest(rid, prompt, reply))
            if req.compiled is not None:
                await self._bind(req.slot, req.compiled)
                req.compiled = None

    async def _bind(self, slot: SlotId, compiled: object) -> None:
        await self.grammar.ask(lambda reply: BindGrammar(slot, compiled, reply))

    # --- the finish path ----------------------------------------------------------------------

    async def _finish(self, req: _Request, reason: FinishReason, error: BaseException | None = None) -> None:
        """End a request now (an error, or a finish outside a step's outputs) and free everything."""
        log.info("request_failed" if error else "request_finished", request_id=req.spec.request_id, step=self.step,
                 reason=reason, error=repr(error) if error else None)
        if error is not None:
            req.out.stream.fail(error)
        else:
            req.out.stream.finish()
        req.out.pending.clear()
        await self._release(req)

    async def _release(self, req: _Request) -> None:
        """Free everything the request holds, in every actor. Never while its step is in flight.

        Deltas the consumer has not taken yet stay queued (DRAINING) and are delivered later.
        """
        if req.phase is Phase.DRAINING:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req.phase is Phase.RUNNING:
            rid = req.spec.request_id
            self.running.pop(req.slot, None)
            await self.grammar.send(Release(rid, req.slot))
            await self.draft.send(Release(rid, req.slot))
            await self.verifier.send(Release(rid, req.slot))
            await self.kv.send(Free(req.seqs, req.blocks))
            self.free_slots.append(req.slot)
        req.phase = Phase.DRAINING
        req.out.flush()
        if not req.out.pending or req.out.stream.state != "open":
            self._forget(req)

    def _forget(self, req: _Request) -> None:
        """The request is gone: every Free for it is queued and its stream has everything."""
        if req.spec.request_id not in self.requests:
            return
        if req.out.stream.state == "open":
            req.out.stream.fail(EngineClosedError("request dropped"))
        self.requests.pop(req.spec.request_id, None)
        self.on_done(req.spec.request_id)
