"""The device timeline: a grammar lane and a model lane joined by token and mask events.

- `timeline.py`: the timeline interface (lanes, events, host functions) with CUDA stream/event
  semantics;
- `cpu_timeline.py`: the CPU engine's, a thread per lane (events and failure: `cpu_events.py`);
- `cuda_timeline.py`: the CUDA one (streams, events, CUDA-graph programs), with `hostfunc.py`, the
  cuLaunchHostFunc binding whose callables live as long as a graph may replay them;
- `cuda_rules.py`: a CPU timeline that obeys CUDA's rules (device work's Python at enqueue and its
  tensor ops deferred, `deferred.py`; one host-function thread; replays of ops, not Python; no host
  sync in a capture; a fault stops everything and poisons every later query, sync and program
  free; a host function makes no timeline call, `HostFunctionCallError`): what the device
  runner's CPU tests run on;
  `program_graph.py`, the dependencies of a captured program;
- `errors.py`: the timeline's typed errors (a failed lane, a device fault, a host sync in a capture,
  a host function that calls the timeline).

This folder holds the device timeline and nothing else. Nothing above it knows which timeline runs.
The actors' mailboxes (`Channel`, `Reply`) live with the actors (actors/framework/), their errors
with every other typed error (protocol/errors.py), and a request's `OutputStream` with its output
(output/stream.py).
"""
