"""Tensor parallelism over real processes: 2 gloo ranks on the CPU, the tiny preset.

TP=2 logits equal TP=1 within fp32 round-off; int8 TP stays batch-invariant; a worker that is
killed or hangs becomes WorkerError within the step timeout, and no worker process is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.llama import random_transformer
from interlock.parallel.shard_sources import open_source
from interlock.parallel.group import TensorParallelGroup, TensorParallelModel, TPConfig
from interlock.protocol.errors import EngineError, UnsupportedModelError, WorkerError
from interlock.protocol.messages import BlockTables

BLOCKS = 32


def tables(kv: PagedKVCache) -> BlockTables:
    return BlockTables(kv.block_size, tuple((s, kv.block_table(s)) for s in sorted(kv.sequences)))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def tp_float() -> Iterator[TensorParallelGroup]:
    config = TPConfig(world=2, num_blocks=BLOCKS, draft_cache=(BLOCKS, 1))
    with TensorParallelGroup("tiny", config, weights="float") as tp:
        yield tp
    assert all(gone(pid) for pid in tp.pids)


def prompt_and_steps(kv: PagedKVCache) -> list[list[SeqChunk]]:
    """A long prompt (SDPA path) next to a short one (row path), then two verify-like steps."""
    steps: list[list[SeqChunk]] = []
    p0, p1 = tuple(range(5, 45)), tuple(range(100, 107))
    for seq, p in ((0, p0), (1, p1)):
        kv.add_sequence(seq)
        kv.reserve(seq, len(p))
    steps.append([SeqChunk(0, p0, 0, (len(p0) - 1,)), SeqChunk(1, p1, 0, tuple(range(len(p1))))])
    for i, drafts in enumerate([(7, 8, 9, 10), (11, 12)]):
        chunks = []
        for seq in (0, 1):
            start = kv.length(seq)
            kv.reserve(seq, len(drafts))
            chunks.append(SeqChunk(seq, tuple(d + seq + i for d in drafts), start, tuple(range(len(drafts)))))
        steps.append(chunks)
    return steps


def test_tp2_logits_equal_tp1_within_fp32_roundoff(tp_float: TensorParallelGroup) -> None:
    config, _, _ = open_source("tiny")
    ref = random_transformer(config, seed=0).build("float")
    kv = PagedKVCache(config, BLOCKS, 16)
    as_model = TensorParallelModel.on(tp_float, "float")
    for i, chunks in enumerate(prompt_and_steps(kv)):
        want = ref(build_batch(chunks, kv), kv)
        # both entry points: chunks + block tables, and a packed batch as a Transformer takes it
        got = tp_float.forward(chunks, tables(kv)) if i % 2 else as_model(build_batch(chunks, kv), kv)
        assert got.shape == want.shape == (sum(len(c.logit_rows) for c in chunks), config.vocab_size)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert tp_float.stats.steps >= 3
    assert 0 < tp_float.stats.last_broadcast_bytes < 4096       # tokens and tables, not tensors


def test_a_self_draft_runs_on_its_own_kv_pool(tp_float: TensorParallelGroup) -> None:
    """The first layer as a draft model, on the ranks' second pool: the target's K/V are untouched
    (a target step after the draft steps still equals TP=1)."""
    config, _, _ = open_source("tiny")
    ref = random_transformer(config, seed=0).build("float")
    target_kv, draft_kv = PagedKVCache(config, BLOCKS, 16), PagedKVCache(config.replace(n_layers=1), BLOCKS, 16)
    draft = TensorParallelModel.on(tp_float, "float", cache=1)
    for kv in (target_kv, draft_kv):
        for seq in (0, 1):
            kv.add_sequence(seq)
        kv.reserve(0, 9)
        kv.reserve(1, 3)
    chunks = [SeqChunk(0, tuple(range(20, 29)), 0, (8,)), SeqChunk(1, (3, 4, 5), 0, (0, 1, 2))]
    target_want = ref(build_batch(chunks, target_kv), target_kv)
    torch.testing.assert_close(tp_float.forward(chunks, tables(target_kv)), target_want, rtol=1e-5, atol=1e-4)
    # other tokens at the same slots: had the draft written into the target's pool, the last step would differ
    drafts = [SeqChunk(0, tuple(range(60, 69)), 0, (8,)), SeqChunk(1, (9, 9, 9), 0, (0, 1, 2))]
    draft_want = ref(build_batch(drafts, draft_kv), draft_kv, n_layers=1)
    torch.testing.assert_close(draft(build_batch(drafts, draft_kv), draft_kv, n_layers=1), draft_want,
                               rtol=1e-5, atol=1e-4)
    for kv in (target_kv, draft_kv):
        kv.reserve(0, 2)
    step = [SeqChunk(0, (40, 41), 9, (0, 1))]
    torch.testing.assert_close(tp_float.forward(step, tables(target_kv)), ref(build_batch(step, target_kv), target_kv),
                               rtol=1e-5, atol=1e-4)


def test_int8_tp_is_batch_invariant() -> None:
    """A sequence's verify rows are bitwise the same alone or beside another sequence: the
    all-reduce adds the same two partials whatever the batch holds."""
    config, _, _ = open_source("tiny")
    with TensorParallelGroup("tiny", TPConfig(world=2, num_blocks=BLOCKS), weights="int8") as tp:
        kv = PagedKVCache(config, BLOCKS, 16)
        steps = prompt_and_steps(kv)
        for chunks in steps[:-1]:
            tp.forward(chunks, tables(kv))
        both = tp.forward(steps[-1], tables(kv))
        alone = tp.forward(steps[-1][:1], tables(kv))     # same positions rewritten with the same K/V
        assert torch.equal(alone, both[: alone.shape[0]])
    # And it is the model's forward: close to one process's int8 model (the shards' row scales
    # differ from the whole matrix's, so not equal). A rank that skipped its all-reduces is far off.
    ref = random_transformer(config, seed=0).build("int8")
    kv = PagedKVCache(config, BLOCKS, 16)
    steps = prompt_and_steps(kv)
    for chunks in steps[:-1]:
        ref(build_batch(chunks, kv), kv)
    want = ref(build_batch(steps[-1], kv), kv)
    torch.testing.assert_close(both, want, rtol=0.05, atol=0.5)     # measured: <= 0.17 here, ~20 without them


def test_a_model_that_does_not_split_is_refused_before_any_process_starts() -> None:
    with pytest.raises(UnsupportedModelError, match="tensor_parallel=4"):
        TensorParallelGroup("tiny", TPConfig(world=4, num_blocks=8))


def test_a_group_is_silent_until_logging_is_configured() -> None:
    """The library's promise holds for its ranks too: `tp_started` is an info event, not a print."""
    program = ("from interlock.parallel.group import TensorParallelGroup, TPConfig\n"
               "with TensorParallelGroup('tiny', TPConfig(world=2, num_blocks=8)):\n    pass\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_dead_or_hung_worker_is_a_typed_error_and_leaves_no_process(sig: signal.Signals) -> None:
    config, _, _ = open_source("tiny")
    tp = TensorParallelGroup("tiny", TPConfig(world=2, num_blocks=BLOCKS, step_timeout_s=3.0), weights="float")
    with tp:
        kv = PagedKVCache(config, BLOCKS, 16)
        steps = prompt_and_steps(kv)
        tp.forward(steps[0], tables(kv))
        os.kill(tp.pids[1], sig)
        with pytest.raises(WorkerError) as info:
            tp.forward(steps[1], tables(kv))
        assert isinstance(info.value, EngineError)
        with pytest.raises(WorkerError):                  # every later step too, at once
            tp.forward(steps[2], tables(kv))
    assert all(gone(pid) for pid in tp.pids)
    assert tp._store_dir is not None and not tp._store_dir.exists()     # nor its shared-memory files


@pytest.mark.parametrize(("kv_dtype", "stored"), [(None, None), ("float32", "float32"), ("float16", "float16")])
def test_the_ranks_are_told_the_engines_kv_cache_type(kv_dtype: str | None, stored: str | None) -> None:
    """The cache type reaches every rank's WorkerSpec (their caches are built from it); nothing starts here."""
    from interlock.models.loader import default_kv_dtype

    stored = stored or default_kv_dtype("int8", "float32")
    model = TensorParallelModel("tiny", 2, kv_dtype=kv_dtype)     # type: ignore[arg-type]
    group = TensorParallelGroup("tiny", TPConfig(world=2, num_blocks=8), kv_dtype=model.config.kv_dtype)
    assert model.config.cache_dtype == group._spec.config.cache_dtype == stored
