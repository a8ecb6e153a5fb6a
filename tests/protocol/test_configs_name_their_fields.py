"""A config refused at construction names the bad field and its value, not a list of fields."""
from __future__ import annotations

import pytest

from interlock.engine.config import EngineConfig
from interlock.grammars.keywords import gaps
from interlock.protocol.grammar import GrammarConfig


@pytest.mark.parametrize("make,said", [
    (lambda: EngineConfig(block_size=0), "block_size must be >= 1, got 0"),
    (lambda: EngineConfig(max_batch_size=-2), "max_batch_size must be >= 1, got -2"),
    (lambda: GrammarConfig(compile_timeout_s=0), "compile_timeout_s must be positive, got 0"),
    (lambda: GrammarConfig(cache_max_entries=-1), "cache_max_entries must be positive, got -1"),
])
def test_a_bad_config_names_its_field_and_value(make, said) -> None:
    with pytest.raises(ValueError, match=said):
        make()


def test_a_keyword_xgrammar_does_not_enforce_is_said_once() -> None:
    (gap,) = gaps({"not": {"type": "string"}}, "xgrammar")
    assert str(gap) == "'not' at /"
