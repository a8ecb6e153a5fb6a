"""StepProgram: a step is staged in every part's bounded queue and enqueued whole; step i's host
work reads step i's plan even when step i+1 is already staged (the per-actor queues)."""
from __future__ import annotations

import threading

import anyio
import pytest

from interlock.actors.step import StepState, StepProgram, StepQueue
from interlock.protocol.messages import SlotResult, StepPlan, TokenEvent
from interlock.streams.cpu_timeline import CpuTimeline


def plan(step: int) -> StepPlan:
    return StepPlan(step, (), 2)


class Part:
    """A fake part: `begin` takes its plan from its queue; its later functions use that plan. With
    `shared` set it reads a 'latest plan' attribute instead (what the queue replaces)."""

    def __init__(self, name: str, seen: list[tuple[str, str, int]], shared: dict | None = None,
                 gate: threading.Event | None = None) -> None:
        self.name, self.seen, self.shared, self.gate = name, seen, shared, gate
        self.queue = StepQueue(name)
        self.plan: StepPlan | None = None

    def _current(self) -> int:
        if self.shared is not None:
            return self.shared["latest"].step
        assert self.plan is not None
        return self.plan.step

    def begin(self) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        self.plan = self.queue.take()
        self.seen.append((self.name, "begin", self._current()))

    def _note(self, what: str) -> None:
        self.seen.append((self.name, what, self._current()))

    def check(self) -> None: self._note("check")
    def fill(self) -> None: self._note("fill")
    def commit(self) -> None: self._note("commit")
    def fill_draft_rows(self) -> None: self._note("draft_rows")
    def draft_forward(self) -> None: self._note("draft_forward")
    def draft_sample(self) -> None: self._note("draft_sample")
    def finish(self) -> None: self._note("finish")
    def forward(self) -> None: self._note("forward")
    def verify(self) -> None: self._note("verify")
    def shape_of(self, plan) -> None: return None      # the host runner's: no shape of its own


async def run_two_steps(shared: dict | None, *, capture: bool, draft_model: bool, k: int = 2
                        ) -> tuple[list[tuple[str, str, int]], list[TokenEvent], StepProgram]:
    seen: list[tuple[str, str, int]] = []
    events: list[TokenEvent] = []
    gate = threading.Event()
    with CpuTimeline() as timeline:
        # The grammar part's first function blocks until both steps are staged and enqueued.
        parts = [Part("grammar", seen, shared, gate), Part("draft", seen, shared), Part("verifier", seen, shared)]
        program = StepProgram(timeline, StepState.allocate(2), *parts, max_draft_len=k, draft_model=draft_model,
                              capture=capture)
        program.bind(events.append, lambda exc: None)
        for step in (1, 2):
            p = plan(step)
            if shared is not None:
                shared["latest"] = p          # what a 'latest plan' field would hold by now
            program.launch(p)
        gate.set()
        with anyio.fail_after(5):
            while len(events) < 2:
                await anyio.sleep(0.001)
    return seen, events, program


@pytest.mark.parametrize("capture", [True, False], ids=["replayed", "eager"])
@pytest.mark.parametrize("draft_model", [True, False], ids=["draft-model", "no-draft-model"])
async def test_each_steps_host_work_sees_its_own_plan(capture: bool, draft_model: bool) -> None:
    seen, events, program = await run_two_steps(None, capture=capture, draft_model=draft_model)
    assert [e.step for e in events] == [1, 2]
    per_step = {1: [], 2: []}
    for name, what, step in seen:
        per_step[step].append((name, what))
    assert per_step[1] == per_step[2] and len(per_step[1]) == len(seen) // 2
    # Step 1's work all ran before step 2's on each lane, and nothing of step 1 saw step 2.
    first_two = [i for i, (_, _, step) in enumerate(seen) if step == 2]
    assert all(seen[i][2] == 1 for i in range(first_two[0]) if seen[i][0] == "grammar")
    draft_ops = sum(what.startswith("draft_") for _, what in per_step[1])
    assert draft_ops == (2 * 2 + 2 if draft_model else 0)     # K forwards, K samples, K mask rows
    assert program.counts["replayed"] == (2 if capture else 0)
    assert program.counts["captured"] == (1 if capture else 0)


@pytest.mark.parametrize("k", [0, 2])
async def test_drafts_are_checked_before_the_forward_only_with_speculation(k: int) -> None:
    seen, events, _ = await run_two_steps(None, capture=True, draft_model=False, k=k)
    assert [e.step for e in events] == [1, 2]
    for step in (1, 2):
        ops = [(name, what) for name, what, s in seen if s == step]
        if k:       # the check runs after the drafts are done and before the verifier's part
            assert ops.index(("grammar", "check")) < ops.index(("verifier", "begin"))
            assert ops.index(("draft", "finish")) < ops.index(("grammar", "check"))
        else:
            assert ("grammar", "check") not in ops


async def test_without_the_queues_step_1_reads_step_2s_plan() -> None:
    """The hazard the per-part queues remove: read from one 'latest plan' field, step 1's host work
    (run after step 2 was staged) sees step 2."""
    seen, _, _ = await run_two_steps({"latest": None}, capture=False, draft_model=False)
    assert {step for _, _, step in seen} == {2}


def test_the_queue_is_bounded_and_refuses_a_step_never_staged() -> None:
    q = StepQueue("x", maxsize=2)
    q.put(plan(1))
    q.put(plan(2))
    with pytest.raises(RuntimeError, match="full"):
        q.put(plan(3))
    assert q.take().step == 1 and q.take().step == 2
    with pytest.raises(RuntimeError, match="empty"):
        q.take()


async def test_publish_reports_results_and_per_request_errors() -> None:
    from interlock.protocol.errors import SamplingError
    from interlock.protocol.messages import RequestSnapshot
    from interlock.protocol.sampling import SamplingParams

    events: list[TokenEvent] = []
    seen: list = []
    with CpuTimeline() as timeline:
        buffers = StepState.allocate(2)
        parts = [Part("grammar", seen), Part("draft", seen), Part("verifier", seen)]
        program = StepProgram(timeline, buffers, *parts, max_draft_len=2, draft_model=False)
        program.bind(events.append, lambda exc: None)
        snaps = tuple(RequestSnapshot(f"r{i}", i, i, 5, (7,), True, False, SamplingParams()) for i in range(2))
        buffers[0].result = SlotResult("r0", 0, (1, 2), 2, 1)
        buffers[1].result = SlotResult("r1", 1, (3,), 2, 0)
        buffers.fail(1, SamplingError("nan"))
        program.launch(StepPlan(1, snaps, 2))
        with anyio.fail_after(5):
            while not events:
                await anyio.sleep(0.001)
    (event,) = events
    assert event.results[0] == SlotResult("r0", 0, (1, 2), 2, 1)
    assert event.results[1].new_tokens == () and isinstance(event.results[1].error, SamplingError)
