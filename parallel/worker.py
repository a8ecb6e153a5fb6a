"""The loop one tensor-parallel worker process runs: `python -m interlock.parallel.worker FD RANK`,
started by group.TensorParallelGroup through process.start_rank (FD: its end of the socket pair).

Each rank loads only its shard, keeps its own KV storage (its Hkvl heads of every block; the block
*tables* live with the engine and arrive with each step), and then, per step: receive the step's
bytes, rebuild the step's ForwardBatch (the same on every rank), run the sharded forward (the collectives meet
inside it), and — rank 0 only — write the gathered logits into the shared-memory buffer and say how
many rows. The worker exits on Stop, on end-of-file (its parent is gone) or on the first error,
which it reports first when it can.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import Weights
from interlock.parallel.sharded import Shard, ShardedTransformer, load_shard
from interlock.parallel.shard_sources import open_source
from interlock.parallel.wire import WireBatch, from_wire
from interlock.protocol.types import Dtype


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank is started with (in its Start message)."""

    model: str
    config: ModelConfig            # the full model's (the engine read it already)
    world: int
    store: str                     # file:// rendezvous of torch.distributed (no port to pick)
    weights: Weights
    dtype: Dtype
    seed: int
    num_blocks: int
    block_size: int
    collective_timeout_s: float
    threads: int
    draft_cache: tuple[int, int] | None = None     # (blocks, layers) of a second KV pool: a self-draft's


@dataclass(frozen=True)
class SharedLogits:
    """Rank 0's [rows, cols] fp32 output buffer: a file both processes map (shared memory under /dev/shm)."""

    path: str
    rows: int
    cols: int

    def open(self) -> torch.Tensor:
        """The buffer, mapped shared (created zero-filled by the first caller)."""
        return torch.from_file(self.path, shared=True, size=self.rows * self.cols,
                               dtype=torch.float32).view(self.rows, self.cols)


@dataclass(frozen=True)
class Start:
    """The first message to a rank: who it is, the spec, and (rank 0) where to write the logits."""

    rank: int
    spec: WorkerSpec
    logits: SharedLogits | None


@dataclass(frozen=True)
class Step:
    """The one message a step sends to every rank: its tokens (drafts included), positions, KV
    slots and block tables, as ints (parallel/wire.py)."""

    index: int
    batch: WireBatch
    n_layers: int | None = None
    cache: int = 0                 # 0: the target's KV pool; 1: the draft's (WorkerSpec.draft_cache)


@dataclass(frozen=True)
class Stop:
    pass


def main(argv: list[str] | None = None) -> None:
    """`python -m interlock.parallel.worker FD RANK`: read the Start message on FD, then serve."""
    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C reaches the whole process group; the parent stops the ranks (Stop, or end-of-file).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    try:
        start: Start = conn.recv()
    except EOFError:
        return                                              # the parent is gone before we began
    worker_main(start.rank, start.spec, conn, start.logits.open() if start.logits is not None else None)


def worker_main(rank: int, spec: WorkerSpec, conn: Connection, logits: torch.Tensor | None) -> None:
    """Rank `rank`'s life: load its shard, answer "ready", serve steps. `logits`: rank 0's shared
    [max_rows, V] output buffer."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")       # ranks talk over loopback only
    torch.set_num_threads(spec.threads)
    try:
        dist.init_process_group("gloo", init_method=spec.store, rank=rank, world_size=spec.world,
                                timeout=timedelta(seconds=spec.collective_timeout_s))
        config, source, inv_freq = open_source(spec.model, spec.dtype, spec.seed, spec.config)
        model = load_shard(source, config, Shard(rank, spec.world), inv_freq, spec.weights)
        del source
        model.group = dist.group.WORLD
        cache_config = model.config.replace(kv_dtype=spec.config.kv_dtype)    # the engine's choice
        caches = [PagedKVCache(cache_config, spec.num_blocks, spec.block_size)]
        if spec.draft_cache is not None:
            blocks, layers = spec.draft_cache
            caches.append(PagedKVCache(cache_config.first_layers(layers), blocks, spec.block_size))
        conn.send(("ready", rank))
        _serve(rank, model, caches, conn, logits)
    except EOFError:
        pass                                                # the parent is gone: just exit
    except BaseException as exc:                            # noqa: BLE001 - reported, then the process ends
        try:
            conn.send(("error", rank, f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _serve(rank: int, model: ShardedTransformer, caches: list[PagedKVCache], conn: Connection,
           logits: torch.Tensor | None) -> None:
    while True:
        msg = pickle.loads(conn.recv_bytes())
        if isinstance(msg, Stop):
            return
        out = model(from_wire(msg.batch), caches[msg.cache], n_layers=msg.n_layers)
        if rank == 0:
            assert logits is not None
            logits[: out.shape[0]].copy_(out)
            conn.send(("ok", msg.index, out.shape[0], model.collective_s))


if __name__ == "__main__":
    main()
