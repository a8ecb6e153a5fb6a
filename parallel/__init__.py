"""Tensor parallelism: one model's forward over W worker processes, each holding 1/W of the weights.

sharded.py        which slice of each weight a rank holds, and the sharded forward with its
                  collectives (Megatron-style)
shard_sources.py  reading only those slices from GGUF / safetensors checkpoints
group.py          `TensorParallelGroup` (the supervised worker processes) and `TensorParallelModel`,
                  which stands in for a Transformer in the engine
process.py        starting a rank as its own `python -m interlock.parallel.worker` process
worker.py         a rank's loop: receive a step, run the sharded forward, answer
wire.py           a step's ForwardBatch as plain ints and back

Synchronous (processes and sockets, no asyncio); the engine builds a group in engine/build.py.
"""
