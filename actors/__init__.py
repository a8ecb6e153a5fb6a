"""Orchestration only: the actor base, the runtime that starts every actor in one task group, one
file per actor (Scheduler, GrammarActor, DraftActor, VerifierActor, KVActor), and what they share:

step.py      one speculative step as one lane program: per-part bounded StepQueues, the step
             buffers, the host order of every part's lane ops, capture once per shape and replay
planner.py   the Scheduler's request view (its Phase) and the step plan, as pure functions
channel.py   `Channel[T]`, the bounded, closable actor inbox (`send`/`send_nowait`, `receive`/
             `receive_nowait`, `close`, `statistics()`)
reply.py     `Reply[T]` one-shot reply slots and `PendingReplies`, which fails them all when their
             actor stops
grammar_layer.py / compile_cache.py
             the thin async compile front the engine and the GrammarActor use: backends built on
             first use off the loop, one compile cache per backend (worker threads, timeouts, one
             compile per key) over grammars/compile_cache.py's store

Actors plan, lanes run: the Scheduler stages a step's plan in each part's queue and enqueues the
whole step; inside a step the parts meet only through timeline events and the step buffers.
"""
