"""StepProgram: a prologue on the event loop, then one lane program; steps are serial; loop-side
changes wait for the step boundary; and the program's dependencies keep the mask fill off the
forward's path even though one thread runs every host function (the CUDA-rules timeline)."""
from __future__ import annotations

import threading

import anyio
import pytest

from interlock.actors.step.program import StepProgram, StepState
from interlock.protocol.errors import SamplingError
from interlock.protocol.messages import RequestSnapshot, SlotResult, StepPlan, TokenEvent
from interlock.protocol.sampling import SamplingParams
from interlock.streams.cuda_rules import CudaRulesTimeline
from interlock.streams.program_graph import ancestors, find, host_functions

PROLOGUE = {"begin", "stage", "check", "finish"}


class Part:
    """A fake part that notes each call (part, function, thread)."""

    fixed_rows = False          # as the host runner's verifier

    def __init__(self, name: str, seen: list[tuple[str, str, str]]) -> None:
        self.name, self.seen = name, seen

    def _note(self, what: str) -> None:
        self.seen.append((self.name, what, threading.current_thread().name))

    def begin(self, plan: StepPlan) -> None: self._note("begin")
    def stage(self) -> None: self._note("stage")
    def check(self) -> None: self._note("check")
    def fill(self) -> None: self._note("fill")
    def commit(self, prologue_checks: bool = False) -> None: self._note("commit")
    def fill_draft_rows(self) -> None: self._note("draft_rows")
    def draft_forward(self) -> None: self._note("draft_forward")
    def draft_sample(self) -> None: self._note("draft_sample")
    def finish(self) -> None: self._note("finish")
    def forward(self) -> None: self._note("forward")
    def verify(self) -> None: self._note("verify")
    def shape_of(self, plan) -> None: return None      # the host runner's: no shape of its own


def make(timeline, seen, *, k: int = 2, draft_model: bool = False, capture: bool = True) -> StepProgram:
    parts = [Part("grammar", seen), Part("draft", seen), Part("verifier", seen)]
    return StepProgram(timeline, StepState.allocate(2), *parts, max_draft_len=k, draft_model=draft_model,
                       capture=capture)


async def run_steps(program: StepProgram, n: int) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    program.bind(events.append, lambda exc: None)
    with anyio.fail_after(10):
        for step in range(1, n + 1):
            program.launch(StepPlan(step, (), 2))
            while len(events) < step:
                await anyio.sleep(0.001)
    return events


@pytest.mark.parametrize("capture", [True, False], ids=["replayed", "eager"])
async def test_the_prologue_runs_on_the_loop_and_two_host_functions_on_the_host_thread(capture: bool) -> None:
    seen: list[tuple[str, str, str]] = []
    loop = threading.current_thread().name
    with CudaRulesTimeline() as timeline:
        program = make(timeline, seen, capture=capture)
        events = await run_steps(program, 3)
        drained = timeline.new_event()           # the last step's outcome can arrive before its second
        timeline.grammar.record(drained)         # host function has finished: wait for the lane
        await drained.wait_async()
        host_calls = timeline.statistics().grammar.host_calls
    assert [e.step for e in events] == [1, 2, 3]
    starts = [i for i, (p, w, _) in enumerate(seen) if (p, w) == ("grammar", "begin")]
    steps = [seen[a:b] for a, b in zip(starts, starts[1:] + [len(seen)])]
    prologue = [("grammar", "begin"), ("draft", "begin"), ("verifier", "begin"), ("draft", "finish"),
                ("grammar", "check"), ("verifier", "stage")]
    device_python = [("verifier", "forward"), ("verifier", "verify")]     # device work's Python: at enqueue
    tail = [("grammar", "fill"), ("verifier", "finish"), ("draft", "commit"), ("grammar", "commit")]
    for i, step in enumerate(steps):
        on_loop = [(p, w) for p, w, t in step if t == loop]
        on_host = [(p, w) for p, w, t in step if t == "interlock-host-functions"]
        replayed = capture and i > 0              # a replay runs the recorded ops, not their Python
        assert on_loop == prologue + ([] if replayed else device_python)
        assert on_host == tail
        assert len(on_loop) + len(on_host) == len(step)
    assert host_calls == 2 * 3                    # the grammar lane's two host functions, per step


async def test_a_fixed_rows_verifier_leaves_the_draft_cut_to_the_fill() -> None:
    """The device runner's forward has fixed rows: its prologue runs no grammar check (host work with
    the device idle); the fill, under the forward, is the step's one grammar pass before the tail."""
    seen: list[tuple[str, str, str]] = []
    with CudaRulesTimeline() as timeline:
        program = make(timeline, seen)
        program.verifier.fixed_rows = True          # type: ignore[misc]
        await run_steps(program, 2)
    grammar = [w for p, w, _ in seen if p == "grammar"]
    assert grammar == ["begin", "fill", "commit"] * 2


def test_a_second_step_is_refused_while_one_is_in_flight() -> None:
    with CudaRulesTimeline() as timeline:
        program = make(timeline, [])
        program.state.begin_step()                # step 1 launched, its outcome not yet delivered
        with pytest.raises(RuntimeError, match="in flight"):
            program.launch(StepPlan(2, (), 2))
        assert program.state.in_flight            # the refused launch left step 1 in flight


def test_loop_side_changes_wait_for_the_step_boundary() -> None:
    state = StepState.allocate(2)
    done: list[str] = []
    state.between_steps(done.append, "now")
    state.begin_step()
    state.between_steps(done.append, "later")
    assert done == ["now"]
    state.end_step()
    assert done == ["now", "later"] and not state.in_flight


@pytest.mark.parametrize("draft_model", [False, True], ids=["lookup-drafts", "draft-model"])
def test_the_mask_fill_never_sits_on_the_forwards_path(draft_model: bool) -> None:
    """On the recorded program's dependency graph: the verification depends on the fill; the forward
    depends on no host function (lookup drafts, the device runner's layout) or only on host functions
    that the fill depends on too (a draft model's check + staging), so that the one host thread never
    has the forward wait behind the fill."""
    with CudaRulesTimeline() as timeline:
        program = make(timeline, [], draft_model=draft_model)
        with timeline.capture() as recorded:
            program.enqueue(timeline, None)
        deps = ancestors(recorded)
        (forward,) = find(recorded, "Part.forward", "device")
        (verify,) = find(recorded, "Part.verify", "device")
        (fill,) = find(recorded, "Part.fill", "host")
        assert fill in deps[verify]
        assert fill not in deps[forward]
        before_forward = {i for i in deps[forward] if recorded.entries[i].kind == "host"}
        if draft_model:
            assert before_forward and before_forward <= deps[fill]
        else:
            assert host_functions(recorded, deps[forward]) == []


def test_the_graph_catches_a_forward_that_waits_behind_the_fill() -> None:
    """The layout this replaces (the verifier's staging as a host function after the drafts were
    checked, ready together with the fill) fails the check above: the test can fail."""
    with CudaRulesTimeline() as timeline:
        seen: list = []
        grammar, verifier = Part("grammar", seen), Part("verifier", seen)
        ready = timeline.new_event()
        with timeline.capture() as recorded:
            timeline.grammar.launch_host(grammar.check)
            timeline.grammar.record(ready)
            timeline.grammar.launch_host(grammar.fill)
            timeline.model.wait(ready)
            timeline.model.launch_host(verifier.stage)
            timeline.model.launch(verifier.forward)
        deps = ancestors(recorded)
        (forward,) = find(recorded, "Part.forward", "device")
        (fill,) = find(recorded, "Part.fill", "host")
        before_forward = {i for i in deps[forward] if recorded.entries[i].kind == "host"}
        assert not before_forward <= deps[fill]           # staging is ready alongside the fill


async def test_the_tail_reports_results_and_per_request_errors() -> None:
    with CudaRulesTimeline() as timeline:
        program = make(timeline, [])
        buffers = program.state
        snaps = tuple(RequestSnapshot(f"r{i}", i, i, 5, (7,), True, False, SamplingParams()) for i in range(2))
        events: list[TokenEvent] = []
        program.bind(events.append, lambda exc: None)

        def results(plan: StepPlan) -> None:          # what the verifier writes in its part
            buffers[0].result = SlotResult("r0", 0, (1, 2), 2, 1)
            buffers[1].result = SlotResult("r1", 1, (3,), 2, 0)
            buffers.fail(1, SamplingError("nan"))

        program.verifier.begin = results
        program.launch(StepPlan(1, snaps, 2))
        with anyio.fail_after(5):
            while not events:
                await anyio.sleep(0.001)
    (event,) = events
    assert event.results[0] == SlotResult("r0", 0, (1, 2), 2, 1)
    assert event.results[1].new_tokens == () and isinstance(event.results[1].error, SamplingError)
    assert [buffers[s.slot].lane for s in snaps] == [0, 1]
