"""A hypothesis state machine that checks a grammar matcher against fresh replays.

Each step draws one operation — accept a token the mask allows, offer one it refuses, roll back
(within the history, and past it), fill several mask rows for drafts — and applies it through
`Harness`; after every step the matcher must agree with a fresh matcher replaying the accepted
prefix. On failure hypothesis shrinks to a short run and prints each operation as text and ids.

    TestJson = matcher_machine(JsonSchema(schema), backend="llguidance").TestCase   # pytest collects it
"""
from __future__ import annotations

import hashlib
from typing import ClassVar

from hypothesis import HealthCheck, Phase
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from interlock.models.tokenizer import Tokenizer
from interlock.protocol.grammar import BackendName, GrammarBackend, GrammarSpec
from interlock.testing.case import GrammarCase, MatcherFactory, grammar_case
from interlock.testing.choice import TokenMix
from interlock.testing.harness import Harness
from interlock.testing.operations import (RollbackTooFar, draw_accept, draw_fill_masks, draw_marker, draw_offer_refused,
                                          draw_rollback)
from interlock.testing.strategies import DEFAULT_MIX

# Mask fills on a real vocabulary take up to milliseconds; deadlines would flake on a busy machine.
MAX_MARKER = 12            # marker tokens one spell_marker step may accept
RELAXED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


class GrammarMachine(RuleBasedStateMachine):
    """Subclass with `case` (optionally `mix`, `lenient_refusals`) set, or use `matcher_machine`."""

    case: ClassVar[GrammarCase]
    mix: ClassVar[TokenMix] = DEFAULT_MIX
    lenient_refusals: ClassVar[bool] = False          # see Harness

    def __init__(self) -> None:
        super().__init__()
        self.harness = Harness(self.case, lenient_refusals=self.lenient_refusals)

    @rule(data=st.data())
    def accept(self, data: st.DataObject) -> None:
        op = draw_accept(data.draw, self.case, self.harness.matcher, self.mix)
        if op is not None:
            self.harness.apply(op)

    @rule(data=st.data())
    def offer_refused(self, data: st.DataObject) -> None:
        op = draw_offer_refused(data.draw, self.case, self.harness.matcher)
        if op is not None:
            self.harness.apply(op)

    @precondition(lambda self: self.harness.accepted)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        self.harness.apply(draw_rollback(data.draw, len(self.harness.accepted)))

    @rule()
    def rollback_too_far(self) -> None:
        self.harness.apply(RollbackTooFar())

    @precondition(lambda self: hasattr(self.harness.matcher, "marker_hints"))
    @rule(data=st.data())
    def spell_marker(self, data: st.DataObject) -> None:
        """Switching grammars: accept up to n tokens that advance a marker (a trigger, a tag's begin
        or end), so walks cross the switch, stop inside a marker, and roll back across it."""
        for _ in range(data.draw(st.integers(1, MAX_MARKER), label="marker tokens")):
            op = draw_marker(data.draw, self.case, self.harness.matcher)
            if op is None:
                break
            self.harness.apply(op)

    @rule(data=st.data())
    def fill_masks(self, data: st.DataObject) -> None:
        self.harness.apply(draw_fill_masks(data.draw, self.case, self.harness.accepted, self.mix))

    @invariant()
    def agrees_with_fresh_replay(self) -> None:
        self.harness.check()


def default_settings() -> Settings:
    """The loaded hypothesis profile's budget (max_examples, stateful_step_count), no deadline,
    and no explain phase: it re-runs the shrunk example hundreds of times (most of the time spent on
    a failure) to annotate steps that the printed operations already make plain."""
    phases = [p for p in Settings().phases if p != Phase.explain]       # Settings(): the loaded profile's
    return Settings(deadline=None, suppress_health_check=RELAXED, phases=phases)


def machine_for(case: GrammarCase, *, mix: TokenMix = DEFAULT_MIX, lenient_refusals: bool = False,
                settings: Settings | None = None) -> type[GrammarMachine]:
    """A GrammarMachine subclass bound to case; its `.TestCase` runs under settings."""
    # The name feeds hypothesis' example database key: one key per spec, backend and factory, so
    # a failure saved for one grammar is not replayed against another.
    factory = getattr(case.matcher_factory, "__qualname__", "")
    digest = hashlib.sha256(f"{case.spec.key}|{case.tokenizer.key}|{factory}".encode()).hexdigest()[:12]
    name = f"GrammarMachine_{case.backend.name}_{digest}"
    machine: type[GrammarMachine] = type(name, (GrammarMachine,), {
        "case": case, "mix": mix, "lenient_refusals": lenient_refusals, "__module__": __name__})
    machine.TestCase.settings = settings or default_settings()
    return machine


def matcher_machine(spec: GrammarSpec, backend: BackendName | GrammarBackend = "xgrammar",
                    tokenizer: Tokenizer | str | None = None, *, vocab_size: int | None = None,
                    matcher_factory: MatcherFactory | None = None, mix: TokenMix = DEFAULT_MIX,
                    lenient_refusals: bool = False, settings: Settings | None = None) -> type[GrammarMachine]:
    """Compile spec (once) and return a state machine class checking matchers for it.

    backend / tokenizer / vocab_size: as `grammar_case` (default: xgrammar over the small
    byte-level tokenizer). matcher_factory: the matcher to test, made from the case (default: the
    backend's). lenient_refusals: tolerate accept taking a token its mask refuses (see Harness).
    Run it with `Machine.TestCase().runTest()`, or let pytest collect `Machine.TestCase`.
    Raises GrammarError when the backend cannot compile spec.
    """
    case = grammar_case(spec, backend, tokenizer, vocab_size=vocab_size, matcher_factory=matcher_factory)
    return machine_for(case, mix=mix, lenient_refusals=lenient_refusals, settings=settings)
