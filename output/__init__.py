"""What a request hands back, and where it stops.

delivery.py    a request's output as it is delivered: stop rules (the end-of-sequence rule, once),
               max_tokens, the end-of-request grammar check, deltas and stats
detokenize.py  incremental detokenizing: text deltas that never split a UTF-8 character or leak a
               stop string
reasoning.py   the one splitter of a Reasoning output into thinking and answer (engine and server)
stream.py      `OutputStream[T]`, the bounded per-request stream users iterate: a non-blocking
               producer (`try_put`, `finish`, `fail`) and `on_room` / `on_cancel` callbacks

Only stream.py holds async code (the consumer's `async for`); the rest is synchronous.
"""
