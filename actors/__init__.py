"""Orchestration only. The design card's five actors, one file each, own the state a step changes:

scheduler.py       the Scheduler: requests, slots, queues and output streams; it plans and
                   launches each step
grammar_actor.py   the GrammarActor: one matcher per slot, the host bitmasks, the grammar lane's part
draft_actor.py     the DraftActor: the drafter chain and each request's drafts
verifier_actor.py  the VerifierActor: the target model, the sampling state, the model lane's part
kv_actor.py        the KVActor: the paged KV allocator and the admission promises
grammar_layer.py / compile_cache.py
                   the thin async compile front the engine and the GrammarActor use: backends built
                   on first use off the loop, one compile cache per backend (worker threads,
                   timeouts, one compile per key) over grammars/compiled_store.py's store

and three subfolders for what they share:

framework/  the actor framework: the base (one task, one bounded inbox), its `Channel`, `Reply`
            slots, and the runtime that starts every actor in one task group
step/       one speculative step: its program (a prologue on the loop, then one lane program,
            captured once per shape and replayed), its per-slot state and boundary, the planner's
            pure functions, and the watchdog
device/     the device runner's actor-side pieces: its step buffers (staging, feature staging), its
            verifier and its draft actor. Its forward (models/device_llama.py), draft model
            (drafters/device_draft.py) and tensor-parallel group (parallel/device_group.py) sit in
            their layers, because models/, drafters/ and parallel/ below this folder use them.

Actors plan, lanes run: the Scheduler launches a step; its prologue runs on the loop and its program
on the lanes, where the parts meet only through timeline events and the step buffers.
"""
