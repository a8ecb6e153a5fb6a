"""The state machine passes real matchers, finds planted rollback bugs within the default budget,
and shrinks them to a counterexample of a few tokens that prints as text and ids."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings

from interlock.protocol.grammar import Ebnf, JsonSchema
from interlock.testing import (Accept, FillMasks, MatcherMismatch, default_settings, grammar_case, matcher_machine,
                               run_operations)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"]}
EBNF = Ebnf('root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"')
SMALL = settings(max_examples=15, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck))


class Delegate:
    """Forwards the matcher protocol to a real matcher; subclasses plant one bug."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.depth = 0

    def accept(self, token_ids) -> bool:
        ok = self.inner.accept(token_ids)
        self.depth += len(token_ids) if ok else 0
        return ok

    def rollback(self, n: int) -> None:
        if n < 0 or n > self.depth:
            raise ValueError(f"cannot roll back {n}")
        self.inner.rollback(self.native_rollback(n))
        self.depth -= n

    def native_rollback(self, n: int) -> int:
        return n

    @property
    def num_accepted(self) -> int:
        return self.depth       # our own count: a bug must show in the masks, not in this number

    def __getattr__(self, name):
        return getattr(self.inner, name)


class KeepsOneToken(Delegate):
    """Rolling back two or more tokens forgets to undo the oldest of them."""

    def native_rollback(self, n: int) -> int:
        return n - 1 if n >= 2 else n


class DropsOneMore(Delegate):
    """Every rollback also undoes one token it should keep (when there is one)."""

    def native_rollback(self, n: int) -> int:
        return n + 1 if 0 < n < self.depth else n


class SkipsTheWrongRow(Delegate):
    """fill_masks skips offset j+1 where it was told j (an off-by-one in draft-side masking)."""

    def fill_masks(self, bitmask, start_row, drafts, skip=()):
        return self.inner.fill_masks(bitmask, start_row, drafts, skip={j + 1 for j in skip})


class OverwritesSkippedRows(Delegate):
    """fill_masks ignores skip and writes the mask after the wrong prefix into skipped rows."""

    def fill_masks(self, bitmask, start_row, drafts, skip=()):
        rows = self.inner.fill_masks(bitmask, start_row, drafts)
        for j in skip:
            if 0 < j < rows:
                bitmask[start_row + j] = bitmask[start_row + j - 1]
        return rows


def failure_of(machine) -> MatcherMismatch:
    """Run the machine; return the (shrunk) MatcherMismatch it must raise."""
    try:
        machine.TestCase().runTest()
    except MatcherMismatch as exc:
        return exc
    except BaseExceptionGroup as group:          # several distinct bugs reported at once
        found = group.subgroup(MatcherMismatch)
        assert found is not None, group
        return found.exceptions[0]
    raise AssertionError("the machine did not find the planted bug")


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("spec", [JsonSchema(SCHEMA), EBNF], ids=["json", "ebnf"])
def test_real_matchers_pass_on_the_byte_tokenizer(spec, backend, byte_backends, byte_tok):
    machine = matcher_machine(spec, byte_backends[backend], byte_tok, settings=SMALL)
    machine.TestCase().runTest()


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_real_matchers_pass_on_the_tiny_tokenizer(backend, tiny_backends, tiny_tokenizer):
    machine = matcher_machine(JsonSchema(SCHEMA, whitespace="flexible"), tiny_backends[backend], tiny_tokenizer,
                              settings=SMALL)
    machine.TestCase().runTest()


@pytest.mark.parametrize(("bug", "backend"), [(KeepsOneToken, "xgrammar"), (DropsOneMore, "llguidance")])
def test_planted_rollback_bug_is_found_and_shrunk(bug, backend, byte_backends, byte_tok):
    """Default settings (the loaded profile's budget: 100 examples unless a profile says less),
    without the example database, so that a failure saved by an earlier run cannot help, and
    derandomized: how far hypothesis shrinks depends on its random search (one run in CI ended at
    8 accepts), and the bound below is about our machine's shrinkability, not hypothesis' luck."""
    machine = matcher_machine(JsonSchema(SCHEMA), byte_backends[backend], byte_tok,
                              matcher_factory=lambda case: bug(case.backend.matcher(case.compiled)),
                              settings=settings(default_settings(), database=None, derandomize=True))
    exc = failure_of(machine)
    accepts = [op for op in exc.history if isinstance(op, Accept)]
    assert 1 <= len(accepts) <= 3, exc.history
    assert len(exc.history) <= 5, exc.history
    message = str(exc)
    assert "ids=" in message and repr(accepts[0]) in message     # readable: text and ids


@pytest.mark.parametrize(("bug", "backend"), [(SkipsTheWrongRow, "xgrammar"), (OverwritesSkippedRows, "llguidance")])
def test_planted_skip_bug_is_found(bug, backend, byte_backends, byte_tok):
    """fill_masks(skip=...) is an operation of the machine: a matcher that mishandles it fails."""
    machine = matcher_machine(JsonSchema(SCHEMA), byte_backends[backend], byte_tok,
                              matcher_factory=lambda case: bug(case.backend.matcher(case.compiled)),
                              settings=settings(default_settings(), database=None, derandomize=True))
    exc = failure_of(machine)
    fills = [op for op in exc.history if isinstance(op, FillMasks)]
    assert fills and fills[-1].skip, exc.history
    assert "skip" in str(exc)


def test_fill_masks_with_skip_through_run_operations(byte_backends, byte_tok):
    case = grammar_case(JsonSchema(SCHEMA), byte_backends["llguidance"], byte_tok)
    first = case.tokenizer.encode('{"')
    drafts = tuple(case.tokenizer.encode('{"name":"a"'))
    ops = [FillMasks(drafts, case.text(drafts), skip=(0, 2)), Accept(first[0], case.text(first[:1])),
           FillMasks(drafts[1:], case.text(drafts[1:]), skip=(1,))]
    run_operations(case, ops)
    with pytest.raises(MatcherMismatch, match="row"):
        run_operations(grammar_case(JsonSchema(SCHEMA), byte_backends["llguidance"], byte_tok,
                                    matcher_factory=lambda c: SkipsTheWrongRow(c.backend.matcher(c.compiled))),
                       [FillMasks(drafts, case.text(drafts), skip=(0,))])


def test_matcher_factory_gets_the_case(byte_backends, byte_tok):
    seen = []

    def factory(case):
        seen.append(case)
        return case.backend.matcher(case.compiled)

    machine = matcher_machine(EBNF, byte_backends["xgrammar"], byte_tok, matcher_factory=factory,
                              settings=settings(SMALL, max_examples=2))
    machine.TestCase().runTest()
    assert seen and all(case is machine.case and case.spec == EBNF for case in seen)


def test_backend_by_name_with_the_default_byte_tokenizer():
    machine = matcher_machine(EBNF, "llguidance", settings=settings(SMALL, max_examples=3))
    assert machine.case.tokenizer.key.startswith("bytes-")
    machine.TestCase().runTest()


def test_backend_instance_without_tokenizer_attribute_needs_one(byte_backends):
    class Bare:
        name, vocab_size = "bare", byte_backends["xgrammar"].vocab_size

    with pytest.raises(ValueError, match="tokenizer"):
        matcher_machine(EBNF, Bare())


def test_import_without_hypothesis_names_the_install_command():
    code = "import sys; sys.modules['hypothesis'] = None; import interlock.testing"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "ImportError" in run.stderr and "interlock[dev]" in run.stderr and "hypothesis" in run.stderr
