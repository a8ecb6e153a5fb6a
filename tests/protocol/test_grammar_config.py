"""A config refused at construction names the bad field and its value, not a list of fields."""
from __future__ import annotations

import pytest

from interlock.protocol.grammar import GrammarConfig


@pytest.mark.parametrize("make,said", [
    (lambda: GrammarConfig(compile_timeout_s=0), "compile_timeout_s must be positive, got 0"),
    (lambda: GrammarConfig(cache_max_entries=-1), "cache_max_entries must be positive, got -1"),
])
def test_a_bad_grammar_config_names_its_field_and_value(make, said) -> None:
    with pytest.raises(ValueError, match=said):
        make()
