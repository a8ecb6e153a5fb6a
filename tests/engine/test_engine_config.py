"""EngineConfig refused at construction names the bad field and its value, not a list of fields."""
from __future__ import annotations

import pytest

from interlock.engine.config import EngineConfig


@pytest.mark.parametrize("field,value", [("block_size", 0), ("max_batch_size", -2), ("output_buffer", 0),
                                         ("kv_cache_bytes", 0), ("max_step_tokens", 0)])
def test_a_bad_count_names_its_field_and_value(field, value) -> None:
    with pytest.raises(ValueError, match=f"{field} must be >= 1, got {value}"):
        EngineConfig(**{field: value})
