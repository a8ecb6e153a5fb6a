"""The device runner's per-step host work is sized to the step (actors/device/staging.py): block tables are
written where they changed, the mask copy covers the step's lanes only, the forward returns logits
for the verify rows only, and the prologue's staging issues no tensor op but the seeded draws."""
from __future__ import annotations

import anyio
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from interlock.actors.device.verifier import DeviceVerifier
from interlock.actors.device.staging import StepStaging, TableMirror
from interlock.engine import Engine, EngineConfig
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig


def test_table_updates_cover_what_changed_only() -> None:
    mirror = TableMirror(slots=3, max_blocks=8)
    out: list[tuple[int, int]] = []
    mirror.updates(1, seq=5, table=(10, 11), out=out)
    assert out == [(8, 10), (9, 11)]                         # a new sequence: its whole table
    out.clear()
    mirror.updates(1, seq=5, table=(10, 11), out=out)
    assert out == []                                         # unchanged: nothing
    mirror.updates(1, seq=5, table=(10, 11, 12), out=out)
    assert out == [(10, 12)]                                 # one block appended: one entry
    out.clear()
    mirror.updates(1, seq=5, table=(10, 13), out=out)
    assert out == [(9, 13)]                                  # rewound past a block, then a new one there
    out.clear()
    mirror.updates(1, seq=6, table=(10, 13), out=out)
    assert out == [(8, 10), (9, 13)]                         # another sequence in the slot: rewritten


def test_the_mask_copy_covers_the_steps_lanes_only() -> None:
    k, slots, words = 2, 4, 3
    bitmask = torch.full((slots * (k + 1), words), 7, dtype=torch.int32)
    rows, free = torch.ones(slots, dtype=torch.int32), torch.zeros(slots * (k + 1), dtype=torch.bool)
    st = StepStaging(rows=16, batch=slots, k=k, slots=slots, max_blocks=4, updates=8, pad_block=9,
                     device=torch.device("cpu"), bitmask=bitmask, rows_filled=rows, free=free)
    st.dev_masks.bitmask.fill_(-1)
    _, masks = st.upload_verify(2)
    assert masks.bitmask.shape[0] == 2 * (k + 1) and torch.equal(masks.bitmask, bitmask[: 2 * (k + 1)])
    assert bool((st.dev_masks.bitmask[2 * (k + 1):] == -1).all())       # the other lanes' rows were not copied


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


async def test_staging_builds_no_tensor_and_logits_are_the_verify_rows_only(tiny_float, monkeypatch) -> None:
    staged: list[list[str]] = []
    logits: list[tuple[int, int]] = []
    stage, forward = DeviceVerifier.stage, DeviceVerifier.forward

    def counted_stage(self) -> None:
        with CountOps() as mode:
            stage(self)
        staged.append(mode.ops)

    def recorded_forward(self, shape=None) -> None:
        forward(self, shape)
        logits.append((tuple(self._logits.shape)[0], shape.batch * (self.k + 1)))

    monkeypatch.setattr(DeviceVerifier, "stage", counted_stage)
    monkeypatch.setattr(DeviceVerifier, "forward", recorded_forward)
    config = EngineConfig(speculative=SpeculativeConfig.parse("ngram", max_draft_len=2), runner="device",
                          device="cpu", max_batch_size=2, capture_steps=False, prefill_chunk=8)
    async with Engine(tiny_float, config) as engine:
        with anyio.fail_after(120):
            greedy = SamplingParams(temperature=0.0, max_tokens=6)
            seeded = SamplingParams(temperature=0.7, seed=1, max_tokens=6)
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: engine.complete("a fairly long prompt " * 3, sampling=greedy))
                tg.start_soon(lambda: engine.complete("Once upon a time", sampling=seeded))
    draws = {"aten.select.int", "aten.resize_.default", "aten.uniform_.default"}   # rand(out=its row): no storage
    assert staged and all(set(ops) <= draws for ops in staged), staged
    assert any(ops for ops in staged)                          # the seeded request's draws
    assert logits and all(n == want for n, want in logits)     # prompt-only steps: no logits at all
    assert any(n == 0 for n, _ in logits)
