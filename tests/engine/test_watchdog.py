"""The engine never hangs on a device fault or a hung step: the watchdog fails every in-flight request
with a typed error within a bounded time, and the engine refuses new work saying why. Planted on
the CUDA-rules timeline (the device runner on the CPU), where, as on CUDA, a faulting kernel
stops every later host function and tells nobody."""
from __future__ import annotations

import threading

import anyio
import pytest

from interlock.actors.grammar_actor import GrammarActor
from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import EngineError, StepOverdueError
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig
from interlock.streams.errors import DeviceFaultError, HostFunctionCallError

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def config(runner: str = "device", **kw) -> EngineConfig:
    return EngineConfig(speculative=SpeculativeConfig.parse("ngram", max_draft_len=2), runner=runner, device="cpu",
                        max_batch_size=2, **kw)


async def fail_all(engine: Engine, n: int) -> list[BaseException]:
    errors: list[BaseException] = []

    async def one(i: int) -> None:
        try:
            await engine.complete(f"Once upon a time {i}", sampling=GREEDY)
        except EngineError as exc:
            errors.append(exc)

    with anyio.fail_after(60):                     # bounded: a hang fails the test here
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    return errors


async def test_a_device_fault_fails_every_request_and_the_engine_refuses_new_work(tiny_float) -> None:
    engine = Engine(tiny_float, config())
    model = engine.model.model
    model.embed = model.embed[:10].clone()          # a kernel indexes past it: a device fault, not a Python error
    async with engine:
        errors = await fail_all(engine, 2)
        assert len(errors) == 2 and all(isinstance(e, DeviceFaultError) for e in errors), errors
        with pytest.raises(DeviceFaultError, match="faulted"):
            await engine.complete("Hello", sampling=GREEDY)


@pytest.mark.parametrize("runner", ["device", "host"])
async def test_a_hung_step_is_declared_overdue(tiny, tiny_float, runner: str, monkeypatch) -> None:
    release = threading.Event()
    fill = GrammarActor.fill

    def hangs(self) -> None:
        release.wait(30)                            # a host function that never returns (until the test ends)
        fill(self)

    monkeypatch.setattr(GrammarActor, "fill", hangs)
    model = tiny_float if runner == "device" else tiny
    try:
        async with Engine(model, config(runner, step_timeout_s=0.5, watchdog_poll_s=0.05)) as engine:
            errors = await fail_all(engine, 2)
            assert len(errors) == 2 and all(isinstance(e, StepOverdueError) for e in errors), errors
            assert "step_timeout_s" in str(errors[0])
            release.set()
            with pytest.raises(StepOverdueError):
                await engine.complete("Hello", sampling=GREEDY)
    finally:
        release.set()


def chain(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None and len(out) < 10:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


async def test_a_fault_in_a_replayed_step_shuts_down_cleanly(tiny_float, monkeypatch) -> None:
    """Planted: a bad token id staged for the third bucket step (captured on its second, replayed from
    then on), so the fault is in a replay, with a captured program alive. As on CUDA, every later
    sync and query re-raises the fault (streams/cuda_rules.py, rule 6): the engine must still exit
    cleanly, in bounded time, with every request failed by the typed error."""
    from interlock.actors.device.verifier import DeviceVerifier

    stage, bucket_steps = DeviceVerifier.stage, []

    def planted(self) -> None:
        stage(self)
        if self._dwork.shape.graph:
            bucket_steps.append(1)
            if len(bucket_steps) == 3:
                self.staging.np["input_ids"][0] = 10 ** 9      # the embedding gathers past its end

    monkeypatch.setattr(DeviceVerifier, "stage", planted)
    engine = Engine(tiny_float, config(step_timeout_s=20.0, watchdog_poll_s=0.05))
    with anyio.fail_after(60):
        async with engine:
            errors = await fail_all(engine, 2)
            counts = dict(engine._rt.program.counts)
    assert counts["captured"] >= 1 and counts["replayed"] >= 2, counts
    assert len(errors) == 2 and all(isinstance(e, DeviceFaultError) for e in errors), errors


async def test_a_host_function_error_is_reported_as_itself(tiny_float, monkeypatch) -> None:
    """Planted: the mask fill (a host function) raises. Typing the error by asking the timeline from
    inside the host function is a CUDA call in a host function (rule 7): the error goes to the loop
    as it is, and every request fails with it underneath."""
    def broken(self) -> None:
        raise RuntimeError("planted fill failure")

    monkeypatch.setattr(GrammarActor, "fill", broken)
    async with Engine(tiny_float, config(step_timeout_s=20.0, watchdog_poll_s=0.05)) as engine:
        errors = await fail_all(engine, 2)
    assert len(errors) == 2, errors
    for error in errors:
        causes = chain(error)
        assert any("planted fill failure" in str(c) for c in causes), causes
        assert not any(isinstance(c, HostFunctionCallError) for c in causes), causes
