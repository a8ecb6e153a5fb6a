"""One speculative step: a prologue on the event loop, then one lane program.

Host functions of every lane run one at a time on one thread on CUDA (the driver's), so anything
the forward waits for that sits on a lane as a host function may queue behind the mask fill, the
work the design exists to hide. So the step's inputs are ready before its program is launched:

    prologue (event loop, when the Scheduler launches the step; the previous step has ended)
      assign each sampling request its lane; grammar.begin: forced tokens; draft.begin: the
      chain's drafts; draft.finish; grammar.check: cut drafts at the first one the grammar
      refuses (host runner only, see below); verifier.begin + stage: the step's inputs written
      to the runner's buffers

    program (K = draft length; a draft model adds the part in brackets, see below)
      grammar lane                               model lane
      fill: the last step's pending commits,     forward (device work: reads the staged inputs)
      K+1 mask rows -> mask_ready
                                                 wait mask_ready; verify (device work)
                                                 -> tokens_ready
      wait tokens_ready; tail: verifier.finish,
      draft.commit, grammar.commit (the matchers
      the next prologue reads), publish

The forward depends on no host function of its program, and the verification on the fill (a test
over a recorded program's dependencies pins both). The tail is one host function: on CUDA each
costs a callback's latency, and they would run one after another anyway. The tail runs with the
model lane idle, so it keeps only what the next step needs before its forward: the results (its
input tokens), the drafters (its lookup drafts) and the matchers its prologue reads (forced tokens,
the draft check); the other matchers are advanced by the next fill (actors/grammar_actor.py).

The check saves the host runner's forward the rows after a refused draft. The device runner's
forward has fixed rows (`VerifyPart.fixed_rows`: a padded bucket, or K draft rows per request), so
there the check would only be host work with the device idle: its verification takes the drafts the
fill reached (the fill stops at the first refused draft too, and `kernels/verify.valid_drafts` cuts
the drafts at the rows filled), so the cut happens in the fill, under the forward
(benchmarks/overlap_bench.py measures it). Rows after a refused draft are computed and never read.

With a draft model the drafts come from inside the program (K draft forwards, each waiting for
the grammar's draft-side mask row), so the check and the staging follow them as host functions:

    model lane: [draft forward j -> draft_token]; grammar lane: [wait; draft mask row j ->
    draft_mask]; model lane: [wait; mask + sample draft j]; draft.finish -> drafts_ready;
    grammar lane: wait drafts_ready; check + verifier.stage (one host function) ->
    drafts_checked; fill -> mask_ready; model lane: wait drafts_checked; forward; ... as above

The forward then depends on host functions of its step, but on none that may queue behind the
fill: each of them is also something the fill waits for.

The op list depends only on the shape (K, draft model or not, and the verifier's `StepShape`),
never on the step's data, so `StepProgram` captures it once per shape and replays it. The device
runner lays a decode step out in a padded bucket (actors/device/verifier.py): a bucket is
captured on its second step (its first runs eagerly: kernels compile, and a CUDA graph must not
capture that); other shapes run eagerly. The host runner's verifier has no shape (None): its ops
read everything from what the prologue stored, and one program per (K, draft model) serves.

Steps are serial: a step is launched when the previous one's outcome reached the loop (its
prologue needs the committed tokens), and `launch` refuses a second step in flight.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from interlock.actors.device.feature_staging import FeatureShape
from interlock.actors.step.state import SlotState, StepState
from interlock.actors.step.watchdog import StepWatchdog
from interlock.kernels.verify import Mode
from interlock.protocol.messages import SlotResult, StepPlan, TokenEvent
from interlock.protocol.errors import EngineError
from interlock.logs import get_logger
from interlock.streams.errors import DeviceFaultError, TimelineClosedError
from interlock.streams.timeline import DeviceEvent, Lane, Program, Timeline

__all__ = ["SlotState", "StepEvents", "StepProgram", "StepShape", "StepState"]

log = get_logger(__name__)


@dataclass(frozen=True)
class StepShape:
    """The device runner's step shape: what its device work is sized by (module docstring)."""

    rows: int               # forward rows
    batch: int              # verified requests (padded to a bucket when `graph`)
    mode: Mode              # the verification the step's requests need
    graph: bool             # a bucket shape: captured and replayed
    updates: int = 0        # block-table entries the step writes on the device
    rounds: int = 0         # draft-model rounds inside the step (drafters/device_draft.py); 0: none
    draft_q: bool = False   # some lane samples its model drafts: verification reads their law
    draft_rows: bool = False    # some model lane draws under the grammar: a host function per round
    features: FeatureShape = FeatureShape()     # guidance, penalties, logprobs: only those used


@dataclass(frozen=True)
class StepEvents:
    """The timeline events one step's parts wait on (reused every step: fresh generations)."""

    draft_token: DeviceEvent
    draft_mask: DeviceEvent
    drafts_ready: DeviceEvent
    drafts_checked: DeviceEvent
    mask_ready: DeviceEvent
    tokens_ready: DeviceEvent

    @classmethod
    def new(cls, timeline: Timeline) -> StepEvents:
        return cls(*(timeline.new_event() for _ in range(6)))


class GrammarPart(Protocol):
    def begin(self, plan: StepPlan) -> None: ...
    def fill_draft_rows(self) -> None: ...
    def check(self) -> None: ...
    def fill(self) -> None: ...
    def commit(self, prologue_checks: bool = False) -> None: ...


class DraftPart(Protocol):
    def begin(self, plan: StepPlan) -> None: ...
    def draft_forward(self, j: int = 0, shape: StepShape | None = None) -> None: ...
    def draft_sample(self, j: int = 0, shape: StepShape | None = None) -> None: ...
    def finish(self) -> None: ...
    def commit(self) -> None: ...


class VerifyPart(Protocol):
    fixed_rows: bool        # its forward's rows do not shrink with a draft cut (module docstring)

    def begin(self, plan: StepPlan) -> None: ...
    def stage(self) -> None: ...
    def shape_of(self, plan: StepPlan) -> StepShape | None: ...
    def forward(self, shape: StepShape | None = None) -> None: ...
    def verify(self, shape: StepShape | None = None) -> None: ...
    def finish(self) -> None: ...


class Peers(Protocol):
    """Other processes that run the step's forwards with this one (the device runner's tensor-parallel
    ranks: parallel/device_group.py). Eager device work tells them as it is issued; a captured
    program's part is recorded and announced again at each replay, from here, never from a lane."""

    def recording(self) -> AbstractContextManager[list]: ...
    def announce(self, recorded: list) -> None: ...
    def explain(self, fault: BaseException) -> BaseException:
        """The error to report for a device fault: the peer's own failure where it is why."""
        ...


Publish = Callable[[TokenEvent], None]
OnError = Callable[[BaseException], None]


class StepProgram:
    """Runs each step's prologue and enqueues its program; captures one program per shape."""

    def __init__(self, timeline: Timeline, state: StepState, grammar: GrammarPart, draft: DraftPart,
                 verifier: VerifyPart, *, max_draft_len: int, draft_model: bool, capture: bool = True,
                 step_timeout_s: float = 300.0, watchdog_poll_s: float = 0.25, peers: Peers | None = None) -> None:
        self.timeline = timeline
        self.peers = peers
        self.state = state
        self.events = StepEvents.new(timeline)
        self.grammar, self.draft, self.verifier = grammar, draft, verifier
        self.k = max_draft_len
        self.draft_model = draft_model
        self.capture = capture
        self._plan: StepPlan | None = None
        self._programs: dict[tuple[int, bool, StepShape | None], Program] = {}
        self._announced: dict[tuple[int, bool, StepShape | None], list] = {}     # peers' part of each program
        self._warm: set[StepShape] = set()          # bucket shapes that ran once: captured next time
        self._publish: Publish | None = None
        self._on_error: OnError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch = (step_timeout_s, watchdog_poll_s)
        self.watchdog: StepWatchdog | None = None
        self._capturing = False
        self._eager_only: set[tuple[int, bool, StepShape | None]] = set()    # shapes whose capture failed
        self.counts = {"steps": 0, "replayed": 0, "captured": 0, "eager": 0, "wakeups": 0, "capture_failed": 0}
        self._waited = 0.0              # the model lane's wait time when the step in flight was launched

    def bind(self, publish: Publish, on_error: OnError) -> None:
        """Where the finished step's TokenEvent goes (called on this loop, once per step), and where
        an exception of any part goes (the timeline is failed for good then: the engine must stop)."""
        self._publish, self._on_error = publish, on_error
        self._loop = asyncio.get_running_loop()
        self.watchdog = StepWatchdog(self, on_error, timeout_s=self._watch[0], poll_s=self._watch[1])

    def launch(self, plan: StepPlan) -> None:
        """Run the step's prologue, then enqueue (or replay) its program. One event-loop entry."""
        self.state.begin_step()                 # refuses a second step in flight
        try:
            self._plan = plan
            self._waited = self._model_waits()
            self.counts["steps"] += 1
            self.counts["wakeups"] += 1
            self._prologue(plan)
            shape = self.verifier.shape_of(plan)
            self._enqueue_step(shape)
            if self.watchdog is not None:
                self.watchdog.arm(plan.step)
        except BaseException as exc:
            self.state.in_flight = False
            fault = self._fault(exc)
            if fault is not exc:
                # what replaces an EngineError (a peer's failure explaining a fault) must not have
                # it underneath: the engine reports the innermost EngineError of a chain
                raise fault from (None if isinstance(exc, EngineError) else exc)
            raise

    def _prologue(self, plan: StepPlan) -> None:
        b = self.state
        for state in b.slots:
            state.lane = -1
        for lane, s in enumerate(s for s in plan.snapshots if s.sample):
            b[s.slot].lane = lane
        self.grammar.begin(plan)
        self.draft.begin(plan)
        self.verifier.begin(plan)
        if self.draft_model:
            return
        if not b.draft_rounds:      # device draft rounds: the drafts come from inside the program
            self.draft.finish()
            if self._checks_in_prologue:
                self.grammar.check()
        self.verifier.stage()

    @property
    def _checks_in_prologue(self) -> bool:
        """The prologue cuts lookup drafts by the grammar: the host runner's (a fixed-rows forward
        leaves the cut to the fill; a draft model's drafts are checked in the program)."""
        return bool(self.k) and not self.verifier.fixed_rows and not self.draft_model

    def _enqueue_step(self, shape: StepShape | None) -> None:
        key = (self.k, self.draft_model, shape)
        program = self._programs.get(key)
        if program is None and (key in self._eager_only or not self._capturable(shape)):
            self.enqueue(self.timeline, shape)
            self.counts["eager"] += 1
            return
        if program is None:
            program = self._capture(key, shape)
            if program is None:                 # that shape runs eagerly from now on
                self.enqueue(self.timeline, shape)
                self.counts["eager"] += 1
                return
        if self.peers is not None:
            self.peers.announce(self._announced[key])
        self.timeline.replay(program)
        self.counts["replayed"] += 1

    def _capture(self, key: tuple[int, bool, StepShape | None], shape: StepShape | None) -> Program | None:
        """Capture the step's program; None when the capture failed but the timeline did not (a CUDA
        capture invalidated by an op it cannot record, a host sync): the shape is marked eager-only
        and counted, and the step goes on eagerly. A failed timeline's error propagates."""
        self._capturing = True          # what a part raises now reaches this caller, not on_error
        try:
            with self.timeline.capture() as program, self._recording() as announced:
                self.enqueue(self.timeline, shape)
        except Exception as exc:
            if self.timeline.health() is not None:
                raise
            self._eager_only.add(key)
            self.counts["capture_failed"] += 1
            log.warning("step_capture_failed", shape=repr(shape), error=repr(exc))
            return None
        finally:
            self._capturing = False
        self._programs[key], self._announced[key] = program, announced
        self.counts["captured"] += 1
        return program

    def _capturable(self, shape: StepShape | None) -> bool:
        """Capture now? Host-runner steps always (their ops read the prologue's state); a device
        bucket shape from its second step on (module docstring); any other device shape never."""
        if not self.capture:
            return False
        if shape is None:
            return True
        if not shape.graph:
            return False
        if shape in self._warm:
            return True
        self._warm.add(shape)
        return False

    def _recording(self) -> AbstractContextManager[list]:
        return self.peers.recording() if self.peers is not None else nullcontext([])

    def close(self) -> None:
        """Free the captured programs; after a device fault they are dropped unfreed: on CUDA a
        graph's free syncs on its last replay, which re-raises the sticky error (or never returns
        on a hung stream), and nothing of a faulted context can be freed anyway."""
        programs = list(self._programs.values())
        self._programs.clear()
        self._announced.clear()
        health = self.timeline.health()
        if health is not None and not isinstance(health, TimelineClosedError):
            log.warning("captured_programs_dropped", programs=len(programs), error=repr(health))
            return
        for program in programs:
            program.close()

    def enqueue(self, timeline: Timeline, shape: StepShape | None = None) -> None:
        """The step's lane ops in host order (see the module docstring). Data-independent."""
        g, m, ev = timeline.grammar, timeline.model, self.events
        if self.draft_model:
            for _ in range(self.k):
                self._draft_iteration(g, m, ev)
            m.launch_host(self._guard(self.draft.finish))
            m.record(ev.drafts_ready)
            g.wait(ev.drafts_ready)
            g.launch_host(self._guard(self._check_and_stage))
            g.record(ev.drafts_checked)
        fill = self.grammar.fill
        if shape is not None and shape.rounds:
            self._device_rounds(g, m, ev, shape)
            fill = self._finish_and_fill
        g.launch_host(self._guard(fill))
        g.record(ev.mask_ready)
        if self.draft_model:
            m.wait(ev.drafts_checked)
        sized = () if shape is None else (shape,)      # device work is sized by the shape (module docstring)
        m.launch(self._guard(self.verifier.forward), *sized)
        m.wait(ev.mask_ready)
        m.launch(self._guard(self.verifier.verify), *sized)
        m.record(ev.tokens_ready)
        g.wait(ev.tokens_ready)
        g.launch_host(self._guard(self._tail))

    def _draft_iteration(self, g: Lane, m: Lane, ev: StepEvents) -> None:
        m.launch(self._guard(self.draft.draft_forward))
        m.record(ev.draft_token)
        g.wait(ev.draft_token)
        g.launch_host(self._guard(self.grammar.fill_draft_rows))
        g.record(ev.draft_mask)
        m.wait(ev.draft_mask)
        m.launch(self._guard(self.draft.draft_sample))

    def _device_rounds(self, g: Lane, m: Lane, ev: StepEvents, shape: StepShape) -> None:
        """The device runner's draft rounds (drafters/device_draft.py): per round j a draft forward,
        ONE host function for the grammar's draft-side rows (when a lane draws under them), and the
        draft sample; then a last forward that only feeds the K-th draft to the draft cache."""
        d = self.draft
        m.launch(self._guard(d.start), shape)  # type: ignore[attr-defined]
        for j in range(1, shape.rounds + 1):
            if shape.draft_rows:
                if j > 1:
                    g.wait(ev.draft_token)
                g.launch_host(self._guard(self._draft_rows), j)
                g.record(ev.draft_mask)
            m.launch(self._guard(d.draft_forward), j, shape)
            if shape.draft_rows:
                m.wait(ev.draft_mask)
            m.launch(self._guard(d.draft_sample), j, shape)
            m.record(ev.draft_token)
        g.wait(ev.draft_token)                  # the fill reads the final drafts
        m.launch(self._guard(d.draft_forward), shape.rounds + 1, shape)

    def _draft_rows(self, j: int) -> None:
        """Round j's host function: the drafts so far, the grammar's rows after them, into the round's buffer."""
        d = self.draft
        d.publish(j)  # type: ignore[attr-defined]
        self.grammar.fill_draft_rows()
        d.collect(j)  # type: ignore[attr-defined]

    def _finish_and_fill(self) -> None:
        """After device draft rounds: the drafts to the grammar, then its K+1 verify rows (one host function)."""
        self.draft.finish()
        self.grammar.fill()

    def _check_and_stage(self) -> None:
        """With a draft model: what the prologue does after the drafts, as one host function that
        the forward waits for and the fill follows (so the fill never delays the forward)."""
        if self.k:
            self.grammar.check()
        self.verifier.stage()

    def _tail(self) -> None:
        """The step's last host function: results settled, drafters and the matchers the next
        prologue reads advanced by the committed tokens (the other matchers' commits run in the next
        step's fill, under its forward: actors/grammar_actor.py), the outcome handed to the event
        loop (one wake-up)."""
        self.verifier.finish()
        self.draft.commit()
        self.grammar.commit(self._checks_in_prologue)
        plan = self._plan
        b = self.state
        results = []
        assert plan is not None
        for s in plan.snapshots:
            error = b[s.slot].error
            r = b[s.slot].result if s.sample else None
            if error is not None:
                results.append(SlotResult(s.request_id, s.slot, (), 0, 0, error))
            elif r is not None:
                results.append(r)
        assert self._loop is not None and self._publish is not None, "bind() before launch()"
        self.counts["wakeups"] += 1
        try:
            self._loop.call_soon_threadsafe(self._deliver, plan.step, tuple(results))
        except RuntimeError:
            pass  # the loop is closed: the engine is shutting down

    def _deliver(self, step: int, results: tuple[SlotResult, ...]) -> None:
        """On the loop: the step is over; what waited for its end runs, then the Scheduler hears."""
        if self.watchdog is not None:
            self.watchdog.disarm()
        event = TokenEvent(step, results, self._model_waits() - self._waited, self.state.timing["forward_s"])
        self.state.end_step()
        assert self._publish is not None
        self._publish(event)

    def _model_waits(self) -> float:
        """The model lane's time blocked on the grammar lane so far: a step's share is its exposed
        grammar time, whichever runner, as the timeline measures it (on the loop: a host function
        may ask the timeline nothing). Every model-lane wait of a step is on the grammar lane's work
        (the masks, a draft model's mask rows and checked drafts); a replay's own joins are not
        counted. CUDA cannot see a stream wait from the host: there it reads 0 (streams/cuda_timeline.py)."""
        return self.timeline.statistics().model.wait_seconds

    def health(self) -> BaseException | None:
        """The timeline's sticky error (what the watchdog asks), explained by the peers where they
        are why (a dead tensor-parallel rank: WorkerError)."""
        error = self.timeline.health()
        return error if error is None or self.peers is None else self.peers.explain(error)

    def _report(self, exc: BaseException) -> None:
        """On the loop: a step part's exception, typed (`_fault`), to the engine."""
        assert self._on_error is not None
        self._on_error(self._fault(exc))

    def _fault(self, exc: BaseException) -> BaseException:
        """The timeline's device fault when `exc` is its echo (on CUDA, every call after a fault
        raises the sticky error as a plain RuntimeError), else `exc`; explained by the peers."""
        health = self.health() if isinstance(exc, RuntimeError) else None
        if health is None and self.peers is not None and isinstance(exc, DeviceFaultError):
            return self.peers.explain(exc)
        return health if health is not None else exc

    def _guard(self, fn: Callable[..., None]) -> Callable[..., None]:
        """fn, reporting an exception to the loop before it fails the timeline. The exception goes as
        it is and the loop types it (`_report`): fn may be a host function, where asking the timeline
        (a stream query on CUDA) is a CUDA call in a host function, which CUDA forbids."""
        def guarded(*args: object) -> None:
            try:
                fn(*args)
            except BaseException as exc:
                if self._loop is not None and self._on_error is not None and not self._capturing:
                    try:
                        self._loop.call_soon_threadsafe(self._report, exc)
                    except RuntimeError:
                        pass
                raise
        guarded.__qualname__ = getattr(fn, "__qualname__", "step_part")
        return guarded
