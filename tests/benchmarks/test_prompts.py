"""benchmarks/prompts.py: rows load as written, prompts state an instance's facts in prose, not JSON."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_data import JSONSCHEMABENCH as DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.benchmarks.prompts import (GENERIC_REQUEST, Instance, Row, build_messages, describe,
                                          load_rows)

JME = DATA / "JME.jsonl"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in scalars(v)]
    return [value]


def expected_text(value: Any) -> str:
    """How a scalar must appear, written independently of the module under test."""
    if value is None:
        return "null"
    if value is True or value is False:
        return str(value).lower()
    if isinstance(value, str):
        return '"' + value + '"'
    return repr(value)          # Python's repr of int/float is the JSON number text


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def row_of(data: Any, valid: bool = True) -> Row:
    return Row(id="r", schema={"type": "object"}, tests=(Instance(valid, data),))


@pytest.fixture(scope="module")
def jme_rows() -> list[Row]:
    return load_rows(JME)


# --- load_rows -----------------------------------------------------------------------------------

def test_load_rows_reads_every_line_in_order(jme_rows: list[Row]) -> None:
    raw = [json.loads(line) for line in JME.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert [r.id for r in jme_rows] == [x["id"] for x in raw]
    assert [r.schema for r in jme_rows] == [x["schema"] for x in raw]
    assert [[(t.valid, t.data) for t in r.tests] for r in jme_rows] == \
        [[(t["valid"], t["data"]) for t in x["tests"]] for x in raw]


def test_load_rows_limit() -> None:
    assert [r.id for r in load_rows(JME, limit=3)] == [r.id for r in load_rows(JME)[:3]]
    assert load_rows(JME, limit=0) == []
    with pytest.raises(ValueError):
        load_rows(JME, limit=-1)


def test_load_rows_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "schema": {}, "tests": []}\n\n{"id": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        load_rows(path)
    assert [r.id for r in load_rows(path, limit=1)] == ["a"]


# --- build_messages on the real data --------------------------------------------------------------

def test_every_jme_row_gets_schema_and_prose(jme_rows: list[Row]) -> None:
    assert len(jme_rows) == 100
    for row in jme_rows:
        system, user = build_messages(row)
        assert (system["role"], user["role"]) == ("system", "user")
        assert json.loads(system["content"].split("Schema:\n", 1)[1]) == row.schema
        assert not is_json(user["content"]) and not is_json(describe(row.valid_instances[0].data))
        for value in scalars(row.valid_instances[0].data):
            assert expected_text(value) in user["content"], (row.id, value)


def test_rows_without_a_valid_instance_get_the_generic_request() -> None:
    rows = [r for path in sorted(DATA.glob("*.jsonl")) for r in load_rows(path) if not r.valid_instances]
    assert rows, "the data set should hold rows without a valid instance"
    for row in rows + [row_of({"a": 1}, valid=False), Row("e", {}, ())]:
        assert build_messages(row)[1]["content"] == GENERIC_REQUEST


def test_first_valid_instance_is_the_one_described() -> None:
    row = Row("r", {}, (Instance(False, {"x": "bad"}), Instance(True, {"x": "first"}),
                        Instance(True, {"x": "second"})))
    user = build_messages(row)[1]["content"]
    assert '"first"' in user and '"bad"' not in user and '"second"' not in user


# --- prose rules ---------------------------------------------------------------------------------

def test_object_fields_become_sentences() -> None:
    assert describe({"name": "Ada", "age": 36}).splitlines() == ['The name is "Ada".', "The age is 36."]


def test_nested_keys_read_as_phrases() -> None:
    text = describe({"address": {"city": "London", "geo": {"lat": 51.5}}})
    assert 'The city of the address is "London".' in text
    assert "The lat of the geo of the address is 51.5." in text


def test_lists_are_counted_and_enumerated() -> None:
    text = describe({"tags": ["a", "b", "c"], "people": [{"name": "X"}, {"name": "Y"}]})
    assert 'The tags is a list of 3 items: (1) "a"; (2) "b"; (3) "c".' in text
    assert "The people is a list of 2 items." in text
    assert 'The name of item 2 of the people is "Y".' in text


def test_booleans_null_and_empty_values_are_words() -> None:
    text = describe({"ok": True, "bad": False, "none": None, "l": [], "o": {}, "s": ""})
    for sentence in ("The ok is true.", "The bad is false.", "The none is null.",
                     "The l is an empty list.", "The o is an empty object", 'The s is "".'):
        assert sentence in text


def test_top_level_non_objects() -> None:
    assert describe([]) == "The answer is an empty list."
    assert describe("x") == 'The answer is "x".'
    assert describe([{"k": 1}]).splitlines() == ["The answer is a list of 1 item.", "The k of item 1 of the answer is 1."]


def test_unicode_keys_and_values_survive_verbatim() -> None:
    text = describe({"名前": "Zoë 🚀", "city/zip": "Ørsta"})
    assert '"名前"' in text and '"Zoë 🚀"' in text and '"city/zip"' in text and '"Ørsta"' in text


def test_string_and_number_are_told_apart() -> None:
    assert describe({"a": "1"}) != describe({"a": 1})
    assert describe({"a": "true"}) != describe({"a": True})
    assert describe({"a": "null"}) != describe({"a": None})


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_prose_holds_every_scalar_is_not_json_and_is_deterministic(value: Any) -> None:
    user = build_messages(row_of(value))[1]["content"]
    for scalar in scalars(value):
        assert expected_text(scalar) in user
    assert not is_json(user) and not is_json(describe(value))
    assert build_messages(row_of(json.loads(json.dumps(value))))[1]["content"] == user


# --- where the sets are found -------------------------------------------------------------------------

def test_a_set_resolves_against_the_vendored_slice_first(tmp_path: Path, monkeypatch) -> None:
    """`interlock bench --dataset JME.jsonl` works on a fresh clone, from any folder: a name or file
    name is looked up in the vendored slice, then $INTERLOCK_DATA, then ../shared; a set vendored only
    as a sample comes from the full sets when they are there."""
    from interlock.benchmarks import prompts

    full = tmp_path / "full"
    full.mkdir()
    for name in ("JME", "Github_easy"):
        (full / f"{name}.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(prompts.DATA_ENV, str(full))
    monkeypatch.setattr(prompts, "SHARED", tmp_path / "no-shared")
    assert prompts.dataset("JME") == prompts.dataset("JME.jsonl") == DATA / "JME.jsonl" == prompts.VENDORED / "JME.jsonl"
    assert prompts.dataset("Github_easy") == full / "Github_easy.jsonl"
    monkeypatch.delenv(prompts.DATA_ENV)
    assert prompts.dataset("Github_easy.jsonl") == DATA / "Github_easy.jsonl"       # the sample, as a last resort
    local = tmp_path / "mine.jsonl"
    local.write_text("")
    assert prompts.dataset("mine.jsonl").resolve() == local and prompts.dataset(str(local)) == local   # as given


def test_a_missing_set_is_a_usage_error_listing_where_it_looked(tmp_path: Path, monkeypatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from interlock.benchmarks import prompts

    monkeypatch.setenv(prompts.DATA_ENV, str(tmp_path / "full"))
    monkeypatch.setattr(prompts, "SHARED", tmp_path / "shared")
    with pytest.raises(prompts.MissingDataError) as info:
        prompts.dataset("Nope.jsonl")
    message = str(info.value)
    for place in (prompts.VENDORED / "Nope.jsonl", tmp_path / "full" / "Nope.jsonl", tmp_path / "shared" / "Nope.jsonl"):
        assert str(place) in message
    assert "INTERLOCK_DATA" in message
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", type=prompts.dataset_arg, default="Nope")
    with pytest.raises(SystemExit) as exit_info:      # the default is checked too: argparse converts it
        p.parse_args([])
    assert exit_info.value.code == 2 and "looked in" in capsys.readouterr().err
    assert p.parse_args(["--dataset", str(DATA / "BFCL_simple.jsonl")]).dataset == DATA / "BFCL_simple.jsonl"
