"""TensorParallelGroup: W worker processes that together run one model's forward, supervised.

    with TensorParallelGroup("tiny", TPConfig(world=2, num_blocks=64)) as tp:
        logits = tp.forward(chunks, block_tables)           # [R, V] fp32, like Transformer.forward
        logits = TensorParallelModel.on(tp, "int8")(batch, kv)   # stands in for a Transformer

The engine's process is no rank: it owns the block tables, the grammar and the sampler, and talks to
the ranks through one connection each (the ranks are `python -m` processes: process.py). A step
(its packed batch as ints: tokens with the drafts, positions, KV slots, block tables; parallel/wire.py)
is pickled once and the same bytes go down every connection: the one broadcast per step, under a
kilobyte for a decode step. Rank 0 writes the gathered logits into a shared-memory buffer (a file
both processes map) and answers with the row count, so logits are never pickled. torch.distributed
stays inside the workers: a failed collective cannot leave the engine's process with a broken
global process group.

Supervision: every wait is bounded (`start_timeout_s` for loading, `step_timeout_s` per step) and
watches the workers' process sentinels. A worker that dies, raises, or hangs past the timeout
turns into WorkerError; the group then kills every worker (SIGKILL after a short grace) and joins
them, so no process is left behind; every later call raises the same WorkerError.
"""
from __future__ import annotations

import copy
import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from interlock.logs import get_logger
from interlock.models.batch import ForwardBatch, SeqChunk, build_batch
from interlock.models.config import ModelConfig
from interlock.models.loader import default_kv_dtype, model_config
from interlock.models.linear import Weights
from interlock.parallel.sharded import Shard
from interlock.parallel.process import RankProcess, reap, start_rank
from interlock.parallel.worker import SharedLogits, Start, Step, Stop, WorkerSpec
from interlock.parallel.wire import to_wire
from interlock.protocol.errors import EngineClosedError, WorkerError
from interlock.protocol.messages import BlockTables
from interlock.protocol.types import Dtype

if TYPE_CHECKING:
    from interlock.models.loader import LoadedModel

log = get_logger(__name__)


@dataclass(frozen=True)
class TPConfig:
    """How many ranks and how long to wait for them."""

    world: int
    num_blocks: int
    block_size: int = 16
    max_rows: int = 256                 # logit rows one step may return (the shared buffer's height)
    start_timeout_s: float = 120.0      # start + import + load a shard
    step_timeout_s: float = 30.0        # one forward, collectives included
    threads_per_rank: int = 1
    draft_cache: tuple[int, int] | None = None  # (blocks, layers) of the ranks' second KV pool (a self-draft)

    def __post_init__(self) -> None:
        if self.world < 1 or self.num_blocks < 1 or self.max_rows < 1:
            raise ValueError("world, num_blocks and max_rows must be >= 1")
        if self.start_timeout_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError("timeouts must be positive")


@dataclass
class TPStats:
    steps: int = 0
    broadcast_bytes: int = 0            # step bytes sent to *each* rank, summed over steps
    last_broadcast_bytes: int = 0
    collective_s: float = 0.0           # rank 0's time inside all-reduce / gather, summed over steps


class TensorParallelGroup:
    """W supervised worker processes holding one shard each. Not thread-safe: one caller (the model lane)."""

    def __init__(self, model: str, config: TPConfig, *, weights: Weights = "int8", dtype: Dtype = "float32",
                 kv_dtype: Dtype | None = None, seed: int = 0) -> None:
        self.config = config
        self.model_config = _model_config(model, weights, dtype, kv_dtype)
        Shard(0, config.world).check(self.model_config)
        self._store_dir: Path | None = None
        self._spec = WorkerSpec(model, self.model_config, config.world, "", weights, dtype, seed,
                                config.num_blocks, config.block_size,
                                collective_timeout_s=config.step_timeout_s, threads=config.threads_per_rank,
                                draft_cache=config.draft_cache)
        self._logits = torch.empty(0)       # rank 0's output buffer, mapped at start
        self._procs: list[RankProcess] = []
        self._conns: list[Connection] = []
        self._failure: WorkerError | None = None
        self._closed = False
        self.stats = TPStats()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> TensorParallelGroup:
        """Start the ranks (`python -m interlock.parallel.worker` processes: parallel/process.py) and
        wait until each has loaded its shard. Raises WorkerError."""
        self._store_dir = Path(tempfile.mkdtemp(prefix="interlock-tp-", dir=_shm_dir()))
        self._spec = replace(self._spec, store=f"file://{self._store_dir / 'store'}")
        logits = SharedLogits(str(self._store_dir / "logits"), self.config.max_rows, self.model_config.vocab_size)
        self._logits = logits.open()
        try:
            for rank in range(self.config.world):
                proc, conn = start_rank(rank, Start(rank, self._spec, logits if rank == 0 else None))
                self._procs.append(proc)
                self._conns.append(conn)
        except OSError as exc:
            raise self._fail(f"starting the ranks: {exc}") from None
        deadline = time.monotonic() + self.config.start_timeout_s
        for rank, conn in enumerate(self._conns):
            self._expect(conn, "ready", deadline, f"starting rank {rank}")
        os.unlink(logits.path)      # both ends have it mapped; unnamed, it cannot outlive a crash of this process
        log.info("tp_started", world=self.config.world, pids=self.pids)
        return self

    def __enter__(self) -> TensorParallelGroup:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self, grace_s: float = 5.0) -> None:
        """Stop every rank (Stop, then SIGTERM, then SIGKILL) and join them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        reap(self._procs, self._conns, grace_s, pickle.dumps(Stop()))
        self._remove_store()

    def _remove_store(self) -> None:
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)

    # --- steps -------------------------------------------------------------------------------

    def forward(self, chunks: list[SeqChunk] | tuple[SeqChunk, ...], kv: BlockTables,
                n_layers: int | None = None, cache: int = 0) -> torch.Tensor:
        """The logits [R, V] fp32 of these chunks (a fresh tensor). Raises WorkerError, EngineClosedError."""
        return self.forward_batch(build_batch(list(chunks), kv), n_layers, cache)

    def forward_batch(self, batch: ForwardBatch, n_layers: int | None = None, cache: int = 0) -> torch.Tensor:
        """Transformer.forward's contract for an already packed batch (the KV storage is the ranks')."""
        if self._failure is not None:
            raise self._failure
        if self._closed or not self._procs:
            raise EngineClosedError("the tensor-parallel group is not running")
        wire = to_wire(batch)
        rows = wire.num_rows
        if cache not in (0, 1) or (cache == 1 and self.config.draft_cache is None):
            raise ValueError(f"no KV pool {cache} on the ranks")
        if rows > self.config.max_rows:
            raise ValueError(f"a step asks for {rows} logit rows; the group was sized for {self.config.max_rows}")
        index = self.stats.steps
        payload = pickle.dumps(Step(index, wire, n_layers, cache), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
        except OSError as exc:
            raise self._fail(f"a worker is gone ({exc})") from None
        self.stats.steps += 1
        self.stats.last_broadcast_bytes = len(payload)
        self.stats.broadcast_bytes += len(payload)
        deadline = time.monotonic() + self.config.step_timeout_s
        reply = self._expect(self._conns[0], "ok", deadline, f"step {index}")
        if reply[1] != index or reply[2] != rows:
            raise self._fail(f"rank 0 answered {reply} to step {index} with {rows} rows")
        self.stats.collective_s = reply[3]
        return self._logits[:rows].clone()

    def _expect(self, conn: Connection, kind: str, deadline: float, what: str) -> tuple:
        """The next message on `conn`, which must be `kind`; any worker exiting or the deadline -> WorkerError.

        During a step only rank 0 speaks, so a message from another rank is its error report.
        """
        sentinels = {p.sentinel: rank for rank, p in enumerate(self._procs)}
        others = [c for c in self._conns if c is not conn] if kind == "ok" else []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"{what}: no answer within {self._timeout_for(what)} s (a worker hangs)")
            ready = wait([conn, *others, *sentinels], timeout=left)
            for obj in ready:
                if obj in others or obj is conn:
                    msg = self._recv(obj, what)
                    if obj is conn and msg[0] == kind:
                        return msg
                    raise self._fail(self._describe(msg, what))
            for s in ready:
                assert isinstance(s, int), "a sentinel: conn and others were handled above"
                rank = sentinels[s]
                if self._conns[rank].poll():       # it said why before exiting
                    raise self._fail(self._describe(self._recv(self._conns[rank], what), what))
                p = self._procs[rank]
                p.join(1.0)                             # the sentinel fired: it is exiting, read its code
                raise self._fail(f"{what}: worker {p.name} (pid {p.pid}) exited with code {p.exitcode}")

    @staticmethod
    def _describe(msg: tuple, what: str) -> str:
        if msg[0] == "error":
            return f"{what}: rank {msg[1]} failed: {msg[2]}"
        return f"{what}: unexpected message {msg!r}"

    def _recv(self, conn: Connection, what: str) -> tuple:
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise self._fail(f"{what}: a worker closed its pipe (it died)") from None

    def _timeout_for(self, what: str) -> float:
        return self.config.start_timeout_s if what.startswith("starting") else self.config.step_timeout_s

    def _fail(self, why: str) -> WorkerError:
        """Record the failure, kill every rank now, and return the error to raise."""
        if self._failure is None:
            log.error("tp_worker_failed", why=why, pids=self.pids)
            self._failure = WorkerError(f"tensor-parallel worker failure: {why}")
            self._closed = True
            for proc in self._procs:
                if proc.is_alive():
                    proc.kill()
            reap(self._procs, self._conns, 0.0)
            self._remove_store()
        return self._failure


class TensorParallelModel:
    """Stands where a Transformer stands (`model(batch, kv)` -> [R, V] logits) with the forward on a
    TensorParallelGroup. The caller keeps its PagedKVCache for the block tables; the K/V storage that
    matters is the ranks' (each holds its KV heads). The group is started by `start` (the engine does,
    once it knows its KV pool's size) and stopped by `close`; `draft()` is the same ranks seen through
    their second KV pool, for a self-draft."""

    def __init__(self, model: str, world: int, *, weights: Weights = "int8", dtype: Dtype = "float32",
                 kv_dtype: Dtype | None = None, seed: int = 0) -> None:
        self.name, self.world, self.weights, self.dtype, self.seed = model, world, weights, dtype, seed
        self.config = _model_config(model, weights, dtype, kv_dtype)
        Shard(0, world).check(self.config)
        self.cache = 0
        self._slot: list[TensorParallelGroup] = []      # shared with draft(): the one running group

    @classmethod
    def on(cls, group: TensorParallelGroup, weights: Weights, cache: int = 0) -> TensorParallelModel:
        """A view of a group that is already running (tests, benchmarks)."""
        model = cls.__new__(cls)
        model.name, model.world, model.weights, model.dtype, model.seed = "", group.config.world, weights, "float32", 0
        model.config, model.cache, model._slot = group.model_config, cache, [group]
        return model

    def draft(self) -> TensorParallelModel:
        view = copy.copy(self)
        view.cache = 1
        return view

    @property
    def group(self) -> TensorParallelGroup:
        if not self._slot:
            raise EngineClosedError("the tensor-parallel workers are not started")
        return self._slot[0]

    def start(self, config: TPConfig) -> None:
        """Start the ranks (blocking: seconds). Raises WorkerError."""
        if self._slot:
            raise RuntimeError("already started")
        group = TensorParallelGroup(self.name, config, weights=self.weights, dtype=self.dtype,
                                    kv_dtype=self.config.kv_dtype, seed=self.seed)
        self._slot.append(group)
        group.start()

    def close(self) -> None:
        if self._slot:
            self._slot[0].close()

    def __call__(self, batch: ForwardBatch, kv: object = None, *, n_layers: int | None = None,
                 head: object = None) -> torch.Tensor:
        if head is not None:
            raise ValueError("a pruned draft head is not supported under tensor parallelism")
        return self.group.forward_batch(batch, n_layers, self.cache)


def _shm_dir() -> str | None:
    """/dev/shm where there is one (the logits buffer then lives in memory only), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _model_config(model: str, weights: Weights, dtype: Dtype, kv_dtype: Dtype | None) -> ModelConfig:
    """The whole model's config as load_model would give it, KV cache type included (no weights read)."""
    return model_config(model, dtype).replace(kv_dtype=kv_dtype or default_kv_dtype(weights, dtype))


def load_tensor_parallel(name_or_path: str, world: int, *, weights: Weights = "int8", dtype: Dtype = "float32",
                         kv_dtype: Dtype | None = None, seed: int = 0) -> LoadedModel:
    """load_model's result with the weights left on the ranks: the model is a TensorParallelModel
    (not started), read here are only the metadata and the tokenizer."""
    from interlock.models.loader import LoadedModel, load_tokenizer

    start = time.perf_counter()
    model = TensorParallelModel(name_or_path, world, weights=weights, dtype=dtype, kv_dtype=kv_dtype, seed=seed)
    tokenizer = load_tokenizer(name_or_path)
    config = model.config
    if config.eos_token_id is None and tokenizer.eos_token_ids:
        config = config.replace(eos_token_id=tokenizer.eos_token_ids[0])
    return LoadedModel(name_or_path, config, model, tokenizer, time.perf_counter() - start)  # type: ignore[arg-type]
