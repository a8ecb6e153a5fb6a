"""Scheduler: owns requests, slots, the waiting and running queues, and the output streams.

Between steps it admits requests (a free slot and the KVActor's promise of every block the request
can ever need), plans one step (decode rows first, then prompt chunks up to the token budget), has
the KVActor reserve the positions and launches the step: `StepProgram.launch` runs the step's
prologue and enqueues the whole step on the lanes (one event-loop entry). When the step's token
event reaches the loop (the second entry, `_step_done`) it updates each request, launches the next
step at once, and only then delivers the finished step's outputs, which the next step's lanes hide.

It calls the other actors, on the loop, rather than sending to them: the KVActor's `promise`,
`reserve`, `rewind` and `free`, and the grammar, draft and verifier actors' `bind`, `add` and
`release`, which take effect between steps (`StepState.between_steps`). None needs an inbox: the
Scheduler is their only caller, on the same loop, and the owner's method makes the owner's decision
(the pool refuses a promise it cannot keep). So a step sends no message; messages are what other
tasks send (docs/architecture.md, "Messages"), and a step's outcome is handled in the callback that
delivers it. That is sound because no handler here awaits: the callback can only run while the
Scheduler's task waits for its inbox, never in the middle of a handler.

With prefix caching, admission starts a request's sequences on the cached blocks of their prompts and
its prefill begins at the cached count (the chunks keep their fixed boundaries); after each step the
KVActor is told the committed tokens (prefill chunks; the fed token and the accepted drafts), which
makes the blocks they fill shareable.

What a step holds, and what a request is promised, is planned in actors/step/planner.py. A request
with classifier-free guidance owns a second KV sequence (its companion): admitted with the blocks
both can ever need, fed the same tokens, rewound by the same amount and freed together.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Callable, TypedDict

from interlock.actors.framework.base import Actor, Handler
from interlock.actors.draft_actor import DraftActor
from interlock.actors.grammar_actor import GrammarActor
from interlock.actors.kv_actor import KVActor
from interlock.output.delivery import Output
from interlock.actors.step.planner import Phase, SchedulerConfig, account, blocks_for, plan_step, reservations
from interlock.actors.step.planner import Request as _Request
from interlock.actors.step.program import StepProgram
from interlock.actors.verifier_actor import VerifierActor
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import EngineClosedError, KVCacheExhaustedError
from interlock.protocol.messages import (
    Cancel, Count, EngineMetrics, GetMetrics, GrammarReady, SlotResult, StepPlan, Submit, TokenEvent, Wake,
)
from interlock.protocol.types import FinishReason, RequestId, SlotId
from interlock.logs import get_logger

log = get_logger(__name__)


class _Totals(TypedDict):
    """The Scheduler's running totals: EngineMetrics' fields of the same names (it is built from them)."""

    steps: int
    step_s: float
    forward_s: float
    exposed_grammar_s: float
    output_tokens: int
    host_s: float
    prompt_tokens: int
    cached_prompt_tokens: int


class Scheduler(Actor[object]):
    def __init__(self, config: SchedulerConfig, tokenizer: Tokenizer, kv: KVActor, grammar: GrammarActor,
                 draft: DraftActor, verifier: VerifierActor, program: StepProgram,
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
        self._failure: BaseException | None = None        # what the next message handled raises
        self._launched = 0.0
        self._totals: _Totals = {"steps": 0, "step_s": 0.0, "forward_s": 0.0, "exposed_grammar_s": 0.0,
                                 "output_tokens": 0, "host_s": 0.0, "prompt_tokens": 0, "cached_prompt_tokens": 0}
        self._next_seq = 0
        super().__init__("scheduler", inbox_size=max(64, 4 * config.max_batch_size))

    def handlers(self) -> Mapping[type, Handler]:
        return {Submit: self.on_submit, GrammarReady: self.on_grammar, Cancel: self.on_cancel,
                Wake: self.on_wake, GetMetrics: self.on_metrics, Count: self.on_count}

    async def on_start(self) -> None:
        self.program.bind(self._step_done, self._step_failed)

    def _step_failed(self, error: BaseException) -> None:
        """On the loop: a part of the step raised (not a per-request fault): the engine fails."""
        failure = RuntimeError(f"a step failed on the lanes: {error!r}")
        failure.__cause__ = error
        self._fail(failure)

    def _step_done(self, event: TokenEvent) -> None:
        """On the loop (the step's tail handed it over): apply the step and launch the next one.

        A callback, not a message to itself: no handler awaits (module docstring), so this never
        runs in the middle of one. What it raises fails the Scheduler as a handler's would."""
        if self._failure is not None or self.inbox.closed:
            return                              # failed or stopping: no step is launched any more
        try:
            self._on_tokens(event)
        except Exception as exc:  # noqa: BLE001 - re-raised by the Scheduler's task (_fail)
            self._fail(exc)

    def _fail(self, failure: BaseException) -> None:
        """From a callback: the Scheduler's task raises `failure` at its next message (Wake: one, or
        a full inbox, whose next message raises it as well), and the runtime fails the engine."""
        if self._failure is not None:
            return
        self._failure = failure
        try:
            self.send_nowait(Wake())
        except Exception:  # noqa: BLE001 - full: the next message handled raises it; closed: stopping
            pass

    async def on_count(self, msg: Count) -> None:
        # steps_in_flight: releases made during a step wait for its end (StepState.between_steps)
        msg.reply.set_result({"slots_free": len(self.free_slots), "requests": len(self.requests),
                              "steps_in_flight": int(self.program.state.in_flight),
                              "output_streams": sum(r.out.stream.state == "open" for r in self.requests.values()),
                              "compiled_grammars": sum(r.compiled is not None for r in self.requests.values())})

    async def on_metrics(self, msg: GetMetrics) -> None:
        actors = (self, self.kv, self.grammar, self.draft, self.verifier)
        messages = sum(a.inbox.statistics().total_sent for a in actors)
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
        self._advance()

    async def on_grammar(self, msg: GrammarReady) -> None:
        req = self.requests.get(msg.request_id)
        if req is not None and req.phase is not Phase.DRAINING:
            req.out.compile_ms = msg.compile_ms
            if msg.error is not None:
                self._finish(req, "error", msg.error)
            else:
                req.grammar = "ready"
                if req.slot >= 0:               # admitted: its matcher is there for the next step
                    self.grammar.bind(msg.request_id, msg.compiled)
                else:
                    req.compiled = msg.compiled
        self._advance()

    async def on_cancel(self, msg: Cancel) -> None:
        self._advance()       # the stream is already cancelled; _advance releases it

    async def on_wake(self, msg: Wake) -> None:
        self._advance()

    def _on_tokens(self, event: TokenEvent) -> None:
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
        if done.rewinds or done.commits:                           # before any free
            self.kv.rewind(tuple(done.rewinds), tuple(done.commits))
        for req, error in done.failed:
            self._finish(req, "error", error)
        finished = [(req, self._emit(req, result)) for req, result in done.emits]
        for req, reason in finished:
            if req.out.invalid is not None:
                self._finish(req, "error", req.out.invalid)
            elif reason is not None:
                self._release(req)       # free first, deliver after
        t["host_s"] += time.perf_counter() - start
        self._advance()                 # the next step runs while we deliver this one's output
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

    def _advance(self) -> None:
        """Between steps: retire cancelled requests, admit, plan and launch."""
        if self._failure is not None:
            raise self._failure
        if self.in_flight is not None:
            return
        start = time.perf_counter()
        for req in list(self.requests.values()):
            if req.out.stream.state == "cancelled" and req.phase is not Phase.DRAINING:
                self._release(req)
            elif req.out.pending:
                req.out.flush()
            if req.phase is Phase.DRAINING and (not req.out.pending or req.out.stream.state != "open"):
                self._forget(req)
        self._admit()
        snaps = plan_step(self.running, self.config)
        if not snaps:
            return
        self.step += 1
        plan = StepPlan(self.step, snaps, self.config.max_drafts)
        self.in_flight = replace(plan, kv=self.kv.reserve(reservations(plan)))
        self._launched = time.perf_counter()
        self.program.launch(self.in_flight)
        log.debug("step_planned", step=plan.step, requests=len(snaps), sampling=sum(s.sample for s in snaps))
        self._totals["host_s"] += time.perf_counter() - start

    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            req = self.waiting[0]
            seqs = req.seq_prompts
            cached = self.kv.promise(req.blocks, seqs)
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
            # No step is in flight here: the drafters, the penalty book and the matcher have the
            # request before the next step (a fully cached prompt decodes in its first step).
            rid, prompt = req.spec.request_id, req.spec.prompt
            self.draft.add(rid, prompt)
            if req.spec.sampling.penalized:     # repetition penalties read the whole prompt, cached or not
                self.verifier.add(rid, prompt)
            if req.compiled is not None:
                self.grammar.bind(rid, req.compiled)
                req.compiled = None

    # --- the finish path ----------------------------------------------------------------------

    def _finish(self, req: _Request, reason: FinishReason, error: BaseException | None = None) -> None:
        """End a request now (an error, or a finish outside a step's outputs) and free everything."""
        log.info("request_failed" if error else "request_finished", request_id=req.spec.request_id, step=self.step,
                 reason=reason, error=repr(error) if error else None)
        if error is not None:
            req.out.stream.fail(error)
        else:
            req.out.stream.finish()
        req.out.pending.clear()
        self._release(req)

    def _release(self, req: _Request) -> None:
        """Free everything the request holds, in every actor. The matcher, the drafters' entries and
        the verifier's are freed between steps (a step in flight may still read them); the KV blocks
        now (a step in flight never reads the pool, and its outcome skips a released request).

        Deltas the consumer has not taken yet stay queued (DRAINING) and are delivered later.
        """
        if req.phase is Phase.DRAINING:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req.phase is Phase.RUNNING:
            rid = req.spec.request_id
            self.running.pop(req.slot, None)
            self.grammar.release(rid)
            self.draft.release(rid)
            self.verifier.release(rid)
            self.kv.free(req.seqs, req.blocks)
            self.free_slots.append(req.slot)
        req.phase = Phase.DRAINING
        req.out.flush()
        if not req.out.pending or req.out.stream.state != "open":
            self._forget(req)

    def _forget(self, req: _Request) -> None:
        """The request is gone: everything it held is freed (or will be, between steps) and its stream
        has everything."""
        if req.spec.request_id not in self.requests:
            return
        if req.out.stream.state == "open":
            req.out.stream.fail(EngineClosedError("request dropped"))
        self.requests.pop(req.spec.request_id, None)
        self.on_done(req.spec.request_id)
