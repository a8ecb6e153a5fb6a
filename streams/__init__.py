"""The device timeline: a grammar lane and a model lane joined by token and mask events.

- `timeline.py`: the timeline interface (lanes, events, host functions) with CUDA stream/event
  semantics;
- `cpu_timeline.py`: its thread-per-lane CPU implementation;
- `cuda_timeline.py`: the CUDA one (streams, events, CUDA-graph programs), with `hostfunc.py`, the
  cuLaunchHostFunc binding whose callables live as long as a graph may replay them;
- `errors.py`: the typed errors of the timeline and of the bounded queues built on anyio
  (full, empty, closed, timeline failed), shared with actors/ mailboxes and output/'s stream.

Nothing above this folder knows which timeline runs. The actors' mailboxes (`Channel`, `Reply`)
live with the actors (actors/channel.py, actors/reply.py); a request's `OutputStream` with its
output (output/stream.py).
"""
