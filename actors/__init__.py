"""Orchestration only: the actor base, the runtime that starts every actor in one task group, one
file per actor (Scheduler, GrammarActor, DraftActor, VerifierActor, KVActor), and what they share:

step.py      one speculative step: its prologue on the event loop, then one lane program (the host
             order of every part's lane ops), captured once per shape and replayed
step_state.py
             the step's per-slot state and the step boundary (loop-side changes between steps)
watchdog.py  a step that never reports back (a device fault, a hang) becomes a typed error
staging.py / device_verifier.py
             the device runner's step buffers (pinned host, device) and its verifier
planner.py   the Scheduler's request view (its Phase) and the step plan, as pure functions
channel.py   `Channel[T]`, the bounded, closable actor inbox (`send`/`send_nowait`, `receive`/
             `receive_nowait`, `close`, `statistics()`)
reply.py     `Reply[T]` one-shot reply slots and `PendingReplies`, which fails them all when their
             actor stops
grammar_layer.py / compile_cache.py
             the thin async compile front the engine and the GrammarActor use: backends built on
             first use off the loop, one compile cache per backend (worker threads, timeouts, one
             compile per key) over grammars/compiled_store.py's store

Actors plan, lanes run: the Scheduler launches a step; its prologue runs on the loop and its program
on the lanes, where the parts meet only through timeline events and the step buffers.
"""
