"""Tensor parallelism: one model's forward over W worker processes, each holding 1/W of the weights.

sharded.py        which slice of each weight a rank holds, and the sharded forward with its
                  collectives (Megatron-style)
shard_sources.py  reading only those slices from GGUF / safetensors checkpoints
group.py          `TensorParallelGroup` (the supervised worker processes) and `TensorParallelModel`,
                  which stands in for a Transformer in the engine
process.py        starting a rank as its own `python -m interlock.parallel.worker` process
worker.py         a rank's loop: receive a step, run the sharded forward, answer
wire.py           a step's ForwardBatch as plain ints and back
device_group.py   the device runner's tensor parallelism: SPMD ranks, rank 0 in the engine's process,
                  functional collectives inside the (captured) forward, forwards announced per step
device_worker.py  a device-runner rank's loop: `python -m interlock.parallel.device_worker`

Synchronous (processes and sockets, no asyncio); the engine starts either group in engine/build.py.
"""
