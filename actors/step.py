"""One speculative step as one lane program: the host order in which every actor's part is enqueued.

The Scheduler stages a step's StepPlan in each actor's bounded `StepQueue` and then enqueues the
whole step on the two lanes before any of it runs; inside the step the parts wait on each other
only through timeline events. Each actor's first host function of a step takes the plan from its
own queue, so step i's host work never reads step i+1's state, however far ahead the Scheduler is.

The program, for draft length K (a draft model adds the K iterations in brackets):

    grammar lane                               model lane
    take plan; forced tokens -> forced_ready
                                               wait forced_ready; take plan; chain drafts
                                             [ draft forward j; record draft_token          ]
    [ wait draft_token; draft mask row j;      ]
    [ record draft_mask                        ]
                                             [ wait draft_mask; mask + sample draft j       ]
                                               drafts -> drafts_ready
    wait drafts_ready; cut drafts at the first
    one the grammar refuses -> drafts_checked;
    K+1 mask rows; record mask_ready
                                               wait drafts_checked;
                                               take plan; target forward; wait mask_ready;
                                               mask + verify; finish; record tokens_ready;
                                               commit drafters (n-gram, draft KV, budgets)
    wait tokens_ready; matchers accept;
    publish the TokenEvent to the event loop

The op list depends only on the shape (K, draft model or not), never on the step's data, so
`StepProgram` captures it once per shape and replays it (`timeline.capture()` / `replay()`).

The verifier's device work (forward, verify) may have a shape of its own (`StepShape`: the
device runner lays a decode step out in a padded batch bucket, actors/device_verifier.py); it is
passed to that work as an argument, so a program is captured per (K, draft model, shape). A
shape that is not a bucket runs eagerly, and a bucket is captured on its second step (its first
runs eagerly: kernels compile, and a CUDA graph must not capture that). `counts` says how many
steps replayed a program and how many ran eagerly. The host runner's verifier has no shape
(None): its ops read everything from the plan, and one program per (K, draft model) serves.

Why the forward waits for drafts_checked: a lookup draft the grammar refuses can never be accepted,
and the rows after it are never read, yet each costs the forward a row (18% of the verify rows of
12 JME requests with ngram+forced). Checking the drafts takes the grammar lane a validate call per
request, well under the rows it saves; filling the masks still overlaps the forward.
"""
from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from interlock.protocol.messages import SlotResult, StepPlan, TokenEvent
from interlock.protocol.types import TokenId
from interlock.streams.timeline import DeviceEvent, Lane, Program, Timeline


class StepQueue:
    """A bounded FIFO of StepPlans, filled on the event loop, emptied by lane host functions."""

    def __init__(self, name: str, maxsize: int = 2) -> None:
        self.name = name
        self._q: queue.Queue[StepPlan] = queue.Queue(maxsize=maxsize)
        self.total_put = 0

    def put(self, plan: StepPlan) -> None:
        """Stage a step; raises RuntimeError when more steps are staged than may be in flight."""
        try:
            self._q.put_nowait(plan)
        except queue.Full:
            raise RuntimeError(f"{self.name} step queue is full: more steps staged than in flight") from None
        self.total_put += 1

    def take(self) -> StepPlan:
        """The oldest staged step (lane side). Empty means a program ran without its plan: a bug."""
        try:
            return self._q.get_nowait()
        except queue.Empty:
            raise RuntimeError(f"{self.name} step queue is empty: a step ran that was never staged") from None

    def __len__(self) -> int:
        return self._q.qsize()


@dataclass
class SlotState:
    """One slot's values in the step in flight, written by one part and read by a later one (the
    timeline's events order them):

    forced: grammar -> drafter; drafts / probs: drafter -> grammar (which cuts refused drafts) and
    verifier; prefix / masking / refused: the draft-model loop's handshake with the grammar lane;
    result: verifier -> grammar commit and publish; error: any part -> publish (the request fails,
    the others go on).
    """

    forced: tuple[TokenId, ...] = ()
    drafts: tuple[TokenId, ...] = ()
    probs: torch.Tensor | None = None
    prefix: tuple[TokenId, ...] = ()
    masking: bool = False
    refused: bool = False
    result: SlotResult | None = None
    error: BaseException | None = None


@dataclass
class StepState:
    """The step's per-slot state, one `SlotState` per slot, and its timings. Host values: what
    the device reads lives in the runner's step buffers (actors/staging.py on the device runner,
    pinned where it crosses), written from these by the verifier's first host function."""

    slots: list[SlotState]
    timing: dict[str, float] = field(default_factory=lambda: {"forward_s": 0.0, "exposed_s": 0.0})

    @classmethod
    def allocate(cls, max_batch: int) -> StepState:
        return cls([SlotState() for _ in range(max_batch)])

    def __getitem__(self, slot: int) -> SlotState:
        return self.slots[slot]

    def __len__(self) -> int:
        return len(self.slots)

    def fail(self, slot: int, error: BaseException) -> None:
        """Record the first per-request error of this step for `slot`."""
        if self.slots[slot].error is None:
            self.slots[slot].error = error


@dataclass(frozen=True)
class StepShape:
    """The device runner's step shape: what its device work is sized by (module docstring)."""

    rows: int               # forward rows
    batch: int              # verified requests (padded to a bucket when `graph`)
    mode: str               # kernels.verify.Mode
    graph: bool             # a bucket shape: captured and replayed


@dataclass(frozen=True)
class StepEvents:
    """The timeline events one step's parts wait on (reused every step: fresh generations)."""

    forced_ready: DeviceEvent
    draft_token: DeviceEvent
    draft_mask: DeviceEvent
    drafts_ready: DeviceEvent
    drafts_checked: DeviceEvent
    mask_ready: DeviceEvent
    tokens_ready: DeviceEvent

    @classmethod
    def new(cls, timeline: Timeline) -> StepEvents:
        return cls(*(timeline.new_event() for _ in range(7)))


class GrammarPart(Protocol):
    queue: StepQueue

    def begin(self) -> None: ...
    def fill_draft_rows(self) -> None: ...
    def check(self) -> None: ...
    def fill(self) -> None: ...
    def commit(self) -> None: ...


class DraftPart(Protocol):
    queue: StepQueue

    def begin(self) -> None: ...
    def draft_forward(self) -> None: ...
    def draft_sample(self) -> None: ...
    def finish(self) -> None: ...
    def commit(self) -> None: ...


class VerifyPart(Protocol):
    queue: StepQueue

    def shape_of(self, plan: StepPlan) -> StepShape | None: ...
    def begin(self) -> None: ...
    def forward(self, shape: StepShape | None = None) -> None: ...
    def verify(self, shape: StepShape | None = None) -> None: ...
    def finish(self) -> None: ...


Publish = Callable[[TokenEvent], None]
OnError = Callable[[BaseException], None]


class StepProgram:
    """Stages and enqueues steps; captures one program per shape and replays it (`capture=True`)."""

    def __init__(self, timeline: Timeline, state: StepState, grammar: GrammarPart, draft: DraftPart,
                 verifier: VerifyPart, *, max_draft_len: int, draft_model: bool, capture: bool = True) -> None:
        self.timeline = timeline
        self.state = state
        self.events = StepEvents.new(timeline)
        self.grammar, self.draft, self.verifier = grammar, draft, verifier
        self.k = max_draft_len
        self.draft_model = draft_model
        self.capture = capture
        self.queue = StepQueue("publish")
        self._programs: dict[tuple[int, bool, StepShape | None], Program] = {}
        self._warm: set[StepShape] = set()          # bucket shapes that ran once: captured next time
        self._publish: Publish | None = None
        self._on_error: OnError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.counts = {"steps": 0, "staged": 0, "replayed": 0, "captured": 0, "eager": 0, "wakeups": 0}

    def bind(self, publish: Publish, on_error: OnError) -> None:
        """Where the finished step's TokenEvent goes (called on this loop, once per step), and where
        an exception of any part goes (the timeline is failed for good then: the engine must stop)."""
        self._publish, self._on_error = publish, on_error
        self._loop = asyncio.get_running_loop()

    def _guard(self, fn: Callable[..., None]) -> Callable[..., None]:
        """fn, reporting an exception to the loop before it fails the timeline."""
        def guarded(*args: object) -> None:
            try:
                fn(*args)
            except BaseException as exc:
                if self._loop is not None and self._on_error is not None:
                    try:
                        self._loop.call_soon_threadsafe(self._on_error, exc)
                    except RuntimeError:
                        pass
                raise
        guarded.__qualname__ = getattr(fn, "__qualname__", "step_part")
        return guarded

    def launch(self, plan: StepPlan) -> None:
        """Stage `plan` in every part's queue, then enqueue the whole step (one event-loop entry)."""
        for q in (self.grammar.queue, self.draft.queue, self.verifier.queue, self.queue):
            q.put(plan)
            self.counts["staged"] += 1
        self.counts["steps"] += 1
        self.counts["wakeups"] += 1
        shape = self.verifier.shape_of(plan)
        key = (self.k, self.draft_model, shape)
        program = self._programs.get(key)
        if program is None and not self._capturable(shape):
            self.enqueue(self.timeline, shape)
            self.counts["eager"] += 1
            return
        if program is None:
            with self.timeline.capture() as program:
                self.enqueue(self.timeline, shape)
            self._programs[key] = program
            self.counts["captured"] += 1
        self.timeline.replay(program)
        self.counts["replayed"] += 1

    def _capturable(self, shape: StepShape | None) -> bool:
        """Capture now? Host-runner steps always (their ops read the plan); a device bucket shape
        from its second step on (module docstring); any other device shape never."""
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

    def close(self) -> None:
        for program in self._programs.values():
            program.close()
        self._programs.clear()

    def enqueue(self, timeline: Timeline, shape: StepShape | None = None) -> None:
        """The step's lane ops in host order (see the module docstring). Data-independent."""
        g, m, ev = timeline.grammar, timeline.model, self.events
        g.launch_host(self._guard(self.grammar.begin))
        g.record(ev.forced_ready)
        m.wait(ev.forced_ready)
        m.launch_host(self._guard(self.draft.begin))
        if self.draft_model:
            for _ in range(self.k):
                self._draft_iteration(g, m, ev)
        m.launch_host(self._guard(self.draft.finish))
        m.record(ev.drafts_ready)
        g.wait(ev.drafts_ready)
        if self.k:              # without speculation there are no drafts to check: no hand-off either
            g.launch_host(self._guard(self.grammar.check))
            g.record(ev.drafts_checked)
        g.launch_host(self._guard(self.grammar.fill))
        g.record(ev.mask_ready)
        if self.k:
            m.wait(ev.drafts_checked)
        sized = () if shape is None else (shape,)      # device work is sized by the shape (module docstring)
        m.launch_host(self._guard(self.verifier.begin))
        m.launch(self._guard(self.verifier.forward), *sized)
        m.wait(ev.mask_ready)
        m.launch(self._guard(self.verifier.verify), *sized)
        if shape is not None:
            m.launch_host(self._guard(self.verifier.finish))
        m.record(ev.tokens_ready)
        m.launch_host(self._guard(self.draft.commit))
        g.wait(ev.tokens_ready)
        g.launch_host(self._guard(self.grammar.commit))
        g.launch_host(self._guard(self._publish_step))

    def _draft_iteration(self, g: Lane, m: Lane, ev: StepEvents) -> None:
        m.launch(self._guard(self.draft.draft_forward))
        m.record(ev.draft_token)
        g.wait(ev.draft_token)
        g.launch_host(self._guard(self.grammar.fill_draft_rows))
        g.record(ev.draft_mask)
        m.wait(ev.draft_mask)
        m.launch(self._guard(self.draft.draft_sample))

    def _publish_step(self) -> None:
        """Grammar lane, last op of a step: hand the outcome to the event loop (one wake-up)."""
        plan = self.queue.take()
        b = self.state
        results = []
        for s in plan.snapshots:
            error = b[s.slot].error
            r = b[s.slot].result if s.sample else None
            if error is not None:
                results.append(SlotResult(s.request_id, s.slot, (), 0, 0, error))
            elif r is not None:
                results.append(r)
        event = TokenEvent(plan.step, tuple(results), b.timing["exposed_s"], b.timing["forward_s"])
        assert self._loop is not None and self._publish is not None, "bind() before launch()"
        self.counts["wakeups"] += 1
        try:
            self._loop.call_soon_threadsafe(self._publish, event)
        except RuntimeError:
            pass  # the loop is closed: the engine is shutting down
