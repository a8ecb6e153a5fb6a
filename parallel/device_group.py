"""Tensor parallelism for the device runner: SPMD ranks, rank 0 in the engine's process.

Rank 0 is the engine: the scheduler, the grammar, the drafters and the verification, and one shard
of the weights (a DeviceLlama with a `ShardComm`). Ranks 1..W-1 are `python -m
interlock.parallel.device_worker` processes, each holding another shard and its own K/V pools.
Every forward runs on every rank:

- **Announced from the host, never from device work.** Each forward rank 0 issues is announced to
  the workers as a `Forward` header (its pool and shapes) over their pipes by the Python that
  issues it: at once for eager device work; for a captured step, the headers its capture issued
  are sent again at each replay (`recording`, `announce`), as a GPU runtime tells its workers
  which graph to replay.
- **Inputs by one broadcast inside the forward.** Rank 0 packs the step's tokens, positions, KV
  slots, block tables and logit rows into one int64 tensor and broadcasts it on the model lane; a
  replay broadcasts that step's values. The workers stage nothing.
- **Collectives inside the forward** (models/device_llama.py): a vocab-parallel embedding (one
  all-reduce), row-parallel o and down projections (one all-reduce each per layer), a
  vocab-parallel head (one all-gather). They are `_c10d_functional` ops, in place, then
  `wait_tensor`: dispatcher ops, so the CUDA-rules timeline records and replays them as it does
  any kernel (and as a CUDA graph captures NCCL's).
- **The grammar stays on rank 0.** Only rank 0 verifies, so masks, draws and accepted tokens are
  never sent: the next step's inputs carry all the workers need. (A replicated verification
  would need each step's mask broadcast; gathering the logits to the one verifier costs less
  than verifying W times.)

The process group is standalone, registered under a name of its own, never torch.distributed's
default group: an application's own torch.distributed (or a failed collective) stays apart.
Gloo on the CPU; NCCL and multi-GPU have not run, and CUDA refuses this by name (engine/load.py).

Supervision: the workers' starts are bounded (`start_timeout_s`) and watched through their
sentinels; a worker that dies or hangs mid-step makes rank 0's next collective fail (gloo: a
closed peer at once, a stopped one after `step_timeout_s`), which the timeline turns into a
device fault and the engine into a failure of every request in flight. `close` stops, kills and
joins every worker.
"""
from __future__ import annotations

import pickle
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from interlock.logs import get_logger
from interlock.models.config import ModelConfig
from interlock.parallel.process import RankProcess, reap, start_rank
from interlock.protocol.errors import UnsupportedModelError, WorkerError

if TYPE_CHECKING:
    from interlock.models.device_llama import StepInputs
    from interlock.models.kv_cache import PagedKVCache

log = get_logger(__name__)
c10d = torch.ops._c10d_functional
WORKER = "interlock.parallel.device_worker"


def join_group(store: str, rank: int, world: int, name: str, timeout_s: float) -> dist.ProcessGroup:
    """Build and register a standalone gloo group (over loopback) under `name`: the functional
    collectives find it by that name, as long as the caller keeps the group alive (the registry
    holds it weakly). Blocks until all `world` ranks have joined."""
    prefix = dist.PrefixStore(name, dist.FileStore(store, world))
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private, untyped: no public way to pin gloo to loopback
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._timeout = timedelta(seconds=timeout_s)
    backend = dist.ProcessGroupGloo(prefix, rank, world, options)
    group = dist.ProcessGroup(prefix, rank, world)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    torch._C._distributed_c10d._register_process_group(name, group)  # type: ignore[arg-type]  # GroupName is a str
    return group


def leave_group(name: str) -> None:
    torch._C._distributed_c10d._unregister_process_group(name)  # type: ignore[arg-type]  # GroupName is a str


@dataclass(frozen=True)
class ShardComm:
    """One rank's collectives inside the forward (models/device_llama.py calls them)."""

    rank: int
    world: int
    group: str                      # the registered name of the process group
    vocab: int                      # the whole vocabulary (each rank holds ceil(V / W) rows)
    leader: DeviceGroup | None = field(default=None, compare=False)     # rank 0's: announces forwards

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows of a vocab-parallel table [Vl, E]: each rank looks up the ids it holds, zeros
        elsewhere, and the all-reduce adds the one non-zero row (exact)."""
        rows = table.shape[0]
        local = ids - self.rank * rows
        mine = (local >= 0) & (local < rows)
        return self.reduce(table[local.clamp(0, rows - 1)] * mine.unsqueeze(1).to(table.dtype))

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (a fresh tensor when y is a view of something else)."""
        y = y.contiguous().clone() if y._base is not None else y.contiguous()
        c10d.all_reduce_(y, "sum", self.group)
        c10d.wait_tensor(y)
        return y

    def logits(self, local: torch.Tensor) -> torch.Tensor:
        """[N, Vl] of every rank -> [N, V], vocabulary in rank order (padding rows dropped)."""
        n, part = local.shape
        out = local.new_empty(self.world * n, part)
        c10d.all_gather_into_tensor_out(local.contiguous(), self.world, self.group, out=out)
        c10d.wait_tensor(out)
        return out.view(self.world, n, part).permute(1, 0, 2).reshape(n, self.world * part)[:, : self.vocab]

    def lead(self, inputs: StepInputs, kv: PagedKVCache, n_layers: int | None, head: torch.Tensor | None) -> None:
        """Rank 0, at the top of each forward: announce it and broadcast its inputs."""
        if self.leader is not None:
            if head is not None:
                raise UnsupportedModelError("a pruned draft head is not supported under tensor parallelism")
            self.leader.lead(inputs, kv, n_layers)


@dataclass(frozen=True)
class Forward:
    """What a worker needs to join one forward: the K/V pool (created the first time it is named)
    and the shapes of the broadcast inputs."""

    pool: int
    pool_layers: int
    pool_slots: int                 # block_size * blocks (spare blocks included)
    block_size: int
    rows: int                       # T
    tables: tuple[int, int]         # [S, max blocks]
    logit_rows: int                 # N
    n_layers: int | None

    @property
    def size(self) -> int:
        return 4 * self.rows + self.tables[0] * self.tables[1] + self.logit_rows


@dataclass(frozen=True)
class DeviceWorkerSpec:
    """What every worker starts with."""

    model: str
    config: ModelConfig             # the whole model's
    world: int
    store: str
    group: str
    seed: int
    threads: int
    timeout_s: float


@dataclass(frozen=True)
class Start:
    rank: int
    spec: DeviceWorkerSpec


@dataclass(frozen=True)
class Stop:
    pass


def pack(inputs: StepInputs) -> torch.Tensor:
    """The forward's inputs as one int64 tensor (device work on rank 0)."""
    return torch.cat([inputs.input_ids, inputs.positions, inputs.write_slots, inputs.row_table,
                      inputs.tables.reshape(-1).to(torch.int64), inputs.logit_rows])


def unpack(packed: torch.Tensor, f: Forward) -> tuple[torch.Tensor, ...]:
    """pack's inverse on a worker: (ids, positions, slots, row_table, tables int32, logit_rows)."""
    t, (s, b) = f.rows, f.tables
    ids, pos, slots, row_table, tables, logit_rows = packed.split([t, t, t, t, s * b, f.logit_rows])
    return ids, pos, slots, row_table, tables.view(s, b).to(torch.int32), logit_rows


class DeviceGroup:
    """Rank 0's side: the W-1 worker processes, the process group, and the announcements."""

    def __init__(self, model: str, world: int, config: ModelConfig, *, seed: int = 0, threads: int = 1,
                 start_timeout_s: float = 120.0, step_timeout_s: float = 60.0) -> None:
        if world < 2:
            raise ValueError(f"a device group needs 2 or more ranks, got {world}")
        if start_timeout_s <= 0 or step_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.model, self.world, self.config, self.seed, self.threads = model, world, config, seed, threads
        self.start_timeout_s, self.step_timeout_s = start_timeout_s, step_timeout_s
        self.name = f"interlock-tp-{uuid.uuid4().hex[:12]}"
        self.comm = ShardComm(0, world, self.name, config.vocab_size, self)
        self._procs: list[RankProcess] = []
        self._conns: list[Connection] = []
        self._store_dir: Path | None = None
        self._group: dist.ProcessGroup | None = None
        self._pools: dict[int, tuple[int, PagedKVCache]] = {}    # id(kv) -> (index, kv): kept alive
        self._recording: list[Forward] | None = None
        self._failure: WorkerError | None = None
        self.forwards = 0                  # forwards announced (benchmarks and tests read it)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def running(self) -> bool:
        return self._group is not None

    def start(self) -> None:
        """Start the workers, join the group with them, wait until each has loaded its shard
        (seconds: call it off the event loop). Raises WorkerError."""
        if self._group is not None:
            raise RuntimeError("already started")
        self._failure = None
        self._store_dir = Path(tempfile.mkdtemp(prefix="interlock-dtp-"))
        spec = DeviceWorkerSpec(self.model, self.config, self.world, str(self._store_dir / "store"), self.name,
                                self.seed, self.threads, self.step_timeout_s)
        try:
            for rank in range(1, self.world):
                proc, conn = start_rank(rank, Start(rank, spec), WORKER)
                self._procs.append(proc)
                self._conns.append(conn)
            self._group = join_group(spec.store, 0, self.world, self.name, self.start_timeout_s)
            deadline = time.monotonic() + self.start_timeout_s
            for conn in self._conns:
                self._ready(conn, deadline)
        except BaseException as exc:
            self.close(grace_s=0.0)
            if isinstance(exc, WorkerError):
                raise
            raise WorkerError(f"tensor-parallel workers did not start: {exc}") from exc
        log.info("tp_started", world=self.world, runner="device", pids=self.pids)

    def _ready(self, conn: Connection, deadline: float) -> None:
        sentinels = {p.sentinel: p for p in self._procs}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"a tensor-parallel worker did not load within {self.start_timeout_s} s")
            for obj in wait([conn, *sentinels], timeout=left):
                if obj is conn or (obj in sentinels and conn.poll()):
                    msg = conn.recv()
                    if msg[0] == "ready":
                        return
                    raise WorkerError(f"tensor-parallel rank {msg[1]} failed to start: {msg[2]}")
                if obj in sentinels:
                    p = sentinels[obj]
                    p.join(1.0)
                    raise WorkerError(f"tensor-parallel worker {p.name} exited with code {p.exitcode}")

    # --- announcements (module docstring) -------------------------------------------------------

    def lead(self, inputs: StepInputs, kv: PagedKVCache, n_layers: int | None) -> None:
        index, _ = self._pools.setdefault(id(kv), (len(self._pools), kv))
        header = Forward(index, kv.k.shape[0], kv.k.shape[1], kv.block_size, inputs.rows,
                         (inputs.tables.shape[0], inputs.tables.shape[1]),
                         inputs.logit_rows.shape[0], n_layers)
        if self._recording is not None:
            self._recording.append(header)
        else:
            self.announce([header])
        packed = pack(inputs)
        c10d.broadcast_(packed, 0, self.name)
        c10d.wait_tensor(packed)

    @contextmanager
    def recording(self) -> Iterator[list[Forward]]:
        """While a step is captured: the forwards it issues are kept, not sent (`announce` them at
        each replay)."""
        recorded: list[Forward] = []
        self._recording = recorded
        try:
            yield recorded
        finally:
            self._recording = None

    def announce(self, forwards: list[Forward]) -> None:
        """Tell every worker to join these forwards, in order. Raises WorkerError."""
        if not forwards:
            return
        if self._group is None:
            raise WorkerError("the tensor-parallel workers are not running")
        payload = pickle.dumps(forwards, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
        except OSError as exc:
            raise WorkerError(f"a tensor-parallel worker is gone ({exc})") from None
        self.forwards += len(forwards)

    def explain(self, fault: BaseException) -> BaseException:
        """The engine's error for a device fault: WorkerError when a worker is why (it reported an
        error, exited, or a collective timed out waiting for one), else the fault itself. Not
        chained to the fault: the engine reports the innermost EngineError of a chain."""
        if self._failure is not None:
            return self._failure
        why = None
        for rank, (proc, conn) in enumerate(zip(self._procs, self._conns), start=1):
            try:
                if conn.poll():
                    msg = conn.recv()
                    why = f"rank {msg[1]} failed: {msg[2]}" if msg[0] == "error" else why
            except (EOFError, OSError):
                pass
            proc.join(0.5 if why is None and not proc.is_alive() else 0.0)
            if why is None and not proc.is_alive():
                why = f"rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}"
        if why is None and "timed out" in str(fault).lower():
            why = f"a collective timed out after {self.step_timeout_s:g} s: a rank hangs"
        if why is None:
            return fault
        log.error("tp_worker_failed", why=why, pids=self.pids)
        self._failure = WorkerError(f"tensor-parallel worker failure: {why} ({fault})")
        return self._failure

    # --- stopping -------------------------------------------------------------------------------

    def close(self, grace_s: float = 5.0) -> None:
        """Stop every worker (Stop, then SIGKILL after `grace_s`), join them, leave the group.
        Idempotent; the group may be started again."""
        reap(self._procs, self._conns, grace_s, pickle.dumps(Stop()))
        self._procs, self._conns = [], []
        if self._group is not None:
            leave_group(self.name)
            self._group = None
        self._pools.clear()
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None
