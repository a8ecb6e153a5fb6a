"""On a GPU: a kernel that faults (a device-side assert) ends in DeviceFaultError for every request
within the watchdog's poll, never a hang. Its own file, so its own process: the fault poisons the
CUDA context for the rest of the process (make gpu-check runs one pytest process per file)."""
from __future__ import annotations

import anyio
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from interlock.engine import Engine, EngineConfig  # noqa: E402
from interlock.protocol.errors import EngineError  # noqa: E402
from interlock.protocol.sampling import SamplingParams  # noqa: E402
from interlock.protocol.speculative import SpeculativeConfig  # noqa: E402
from interlock.streams.errors import DeviceFaultError  # noqa: E402


async def test_a_device_assert_fails_every_request_instead_of_hanging(tiny_float) -> None:
    config = EngineConfig(speculative=SpeculativeConfig.parse("ngram", max_draft_len=2), device="cuda",
                          max_batch_size=2, step_timeout_s=30.0, watchdog_poll_s=0.1)
    engine = Engine(tiny_float, config)
    model = engine.model.model
    model.embed = model.embed[:10].clone()          # token ids past 10 index out of range: a device assert
    errors: list[BaseException] = []

    async def one(i: int) -> None:
        try:
            await engine.complete(f"Once upon a time {i}", sampling=SamplingParams(max_tokens=8))
        except EngineError as exc:
            errors.append(exc)

    async with engine:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(one, i)
    assert len(errors) == 2 and all(isinstance(e, DeviceFaultError) for e in errors), errors
