"""Orchestration only: the actor base, the runtime that starts every actor in one task group,
and one file per actor (Scheduler, GrammarActor, DraftActor, VerifierActor, KVActor)."""
