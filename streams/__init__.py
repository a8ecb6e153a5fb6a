"""How things cross, in order: bounded channels, per-request output streams and the device timeline.

- `channel.py`: `Channel[T]`, the bounded, closable actor inbox (`send`/`send_nowait`,
  `receive`/`receive_nowait`, `close`, `statistics()`).
- `reply.py`: `Reply[T]` one-shot reply slots and `PendingReplies`, which fails them all when
  their actor stops.
- `output.py`: `OutputStream[T]`, the bounded per-request stream users iterate; non-blocking
  producer (`try_put`, `finish`, `fail`), `on_room` / `on_cancel` callbacks.
- `timeline.py`: the device timeline interface (grammar lane, model lane, events, host
  functions) with CUDA stream/event semantics; `cpu_timeline.py`: its thread-per-lane CPU
  implementation; `cuda_timeline.py`: the CUDA one (streams, events, CUDA-graph programs), with
  `hostfunc.py`, the cuLaunchHostFunc binding whose callables live as long as a graph may replay
  them.
- `errors.py`: the typed errors raised here (full, empty, closed, timeline failed).

The timeline has a grammar lane and a model lane joined by token and mask events; it has a CPU
implementation and (on a GPU) a CUDA one, and nothing above this folder knows which one runs.
"""
