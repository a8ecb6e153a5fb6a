"""Property-based testing of grammars and grammar matchers (needs hypothesis; no CUDA).

What it owns:
- `grammar_case` / `GrammarCase`: a grammar compiled once for a backend and tokenizer, and the
  matcher to test (the backend's own, or yours via `matcher_factory`);
- strategies (`allowed_sequences`, `refused_sequences`, `operations`) that walk the real mask,
  with `TokenMix` choosing how often forced, frequent, rare or EOS tokens are picked;
- `matcher_machine`: a `RuleBasedStateMachine` checking any matcher against fresh replays after
  every accept / refused accept / rollback / multi-row fill; `run_operations` does the same for a
  drawn list of operations; failures raise `MatcherMismatch` and print text with token ids;
- `byte_tokenizer`: a ~300-token byte-level BPE tokenizer for fast tests;
- `greedy.py`: plain greedy decoding of one sequence, the reference a model's output is compared with.
"""
from __future__ import annotations

try:
    import hypothesis  # noqa: F401
except ImportError as exc:           # hypothesis is a test dependency, not a runtime one
    raise ImportError("interlock.testing needs hypothesis: pip install 'interlock[dev]' "
                      "(or pip install hypothesis)") from exc

from interlock.testing.case import GrammarCase, Refused, Tokens, grammar_case
from interlock.testing.choice import TokenMix
from interlock.testing.harness import Harness, MatcherMismatch, run_operations
from interlock.testing.machine import GrammarMachine, default_settings, machine_for, matcher_machine
from interlock.testing.operations import Accept, FillMasks, OfferRefused, Op, Rollback, RollbackTooFar
from interlock.testing.strategies import allowed_sequences, operations, refused_sequences
from interlock.testing.tokenizers import byte_tokenizer

__all__ = ["Accept", "FillMasks", "GrammarCase", "GrammarMachine", "Harness", "MatcherMismatch", "OfferRefused",
           "Op", "Refused", "Rollback", "RollbackTooFar", "TokenMix", "Tokens", "allowed_sequences",
           "byte_tokenizer", "default_settings", "grammar_case", "machine_for", "matcher_machine", "operations",
           "refused_sequences", "run_operations"]
