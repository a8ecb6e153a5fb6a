"""One worker rank of the device runner's tensor parallelism (parallel/device_group.py):
`python -m interlock.parallel.device_worker FD RANK`, started by DeviceGroup.start.

It joins the group, loads its shard as a DeviceLlama, says "ready", then for each announced
`Forward`: receives the inputs rank 0 broadcasts, and runs the same forward on its shard (its
collectives meet rank 0's). Its K/V pools are made the first time a forward names them. It exits
on Stop, at end-of-file (rank 0 is gone), or on the first error, which it reports when it can.
"""
from __future__ import annotations

import pickle
import signal
import sys
from multiprocessing.connection import Connection

import torch

from interlock.models.device_llama import DeviceLlama, StepInputs
from interlock.models.kv_cache import PagedKVCache
from interlock.parallel.device_group import (Forward, ShardComm, Start, Stop, c10d, join_group, leave_group,
                                             unpack)
from interlock.parallel.shard_sources import open_source
from interlock.parallel.sharded import Shard, load_shard


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # Ctrl-C reaches the process group; rank 0 stops us
    conn = Connection(int(argv[0]))
    try:
        start: Start = conn.recv()
    except EOFError:
        return
    try:
        serve(start, conn)
    except EOFError:
        pass                                            # rank 0 is gone
    except BaseException as exc:                        # noqa: BLE001 - reported, then the process ends
        try:
            conn.send(("error", start.rank, f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise SystemExit(1) from None


def serve(start: Start, conn: Connection) -> None:
    spec, rank = start.spec, start.rank
    torch.set_num_threads(spec.threads)
    group = join_group(spec.store, rank, spec.world, spec.group, spec.timeout_s)   # the registry holds it weakly
    try:
        config, source, inv_freq = open_source(spec.model, "float32", spec.seed, spec.config)
        shard = load_shard(source, config, Shard(rank, spec.world), inv_freq, "float")
        del source
        comm = ShardComm(rank, spec.world, spec.group, spec.config.vocab_size)
        model = DeviceLlama.from_transformer(shard, "cpu", torch.float32, tp=comm)
        del shard
        conn.send(("ready", rank))
        pools: dict[int, PagedKVCache] = {}
        while True:
            msg = pickle.loads(conn.recv_bytes())
            if isinstance(msg, Stop):
                return
            for forward in msg:
                run(model, pools, forward)
    finally:
        leave_group(spec.group)
        del group


@torch.inference_mode()
def run(model: DeviceLlama, pools: dict[int, PagedKVCache], f: Forward) -> None:
    """Join one forward: its inputs from rank 0's broadcast, then the sharded forward."""
    kv = pools.get(f.pool)
    if kv is None:
        config = model.config.first_layers(f.pool_layers)
        kv = pools[f.pool] = PagedKVCache(config, num_blocks=f.pool_slots // f.block_size, block_size=f.block_size)
    packed = torch.empty(f.size, dtype=torch.int64)
    c10d.broadcast_(packed, 0, model.tp.group)          # type: ignore[union-attr]
    c10d.wait_tensor(packed)
    model(StepInputs(*unpack(packed, f)), kv, n_layers=f.n_layers)


if __name__ == "__main__":
    main()
