"""JSONSchemaBench rows and the chat prompts built from them (issue 4's benchmark contract).

    rows = load_rows(dataset("JME"), limit=20)        # JME.jsonl where `data_folders` finds it
    messages = build_messages(rows[0])      # [{"role": "system", ...}, {"role": "user", ...}]

The system message holds the instructions and the schema as JSON. For a row with a valid test
instance, the user message states that instance's facts in prose — never as JSON — so the
expected answer can be extracted from the prompt, as in NousResearch's JSON Mode Eval; rows
without one get a generic request. Everything here is a pure, deterministic function of the row.

Prose rules (`describe`): the subject of each sentence is a phrase naming the value's place
("the city of the address of item 2 of the people"); strings are quoted verbatim, numbers
written as JSON writes them, booleans as the words true/false, null as the word null; lists
say how many items they hold and enumerate them; empty objects and lists are called empty.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interlock.models.tokenizer import Tokenizer

Message = dict[str, str]

SYSTEM_TEMPLATE = (
    "You are a careful assistant that answers only in JSON. Reply with a single JSON value that "
    "conforms to the JSON schema below, with no text before or after it.\n"
    "Schema:\n{schema}"
)
FACTS_HEADER = "Record the following facts in the JSON answer, exactly as stated:"
GENERIC_REQUEST = "Produce a JSON object that matches the schema."
DOCUMENT_HEADER = "Extract the record from this document into the JSON answer, with the values exactly as stated:"
ROOT = "the answer"
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\- ]*\Z")


# Where a set named by name ("JME") or file name ("JME.jsonl") is found. The repository vendors a
# slice of JSONSchemaBench for its tests (tests/data/jsonschemabench; its README says which rows):
# JME and BFCL_simple whole, the other sets as 12-row samples. The full sets are tens of MB and live
# wherever $INTERLOCK_DATA names, or in ../shared/data/jsonschemabench beside a checkout that has it.
DATA_ENV = "INTERLOCK_DATA"
VENDORED = Path(__file__).resolve().parents[1] / "tests" / "data" / "jsonschemabench"
VENDORED_WHOLE = ("JME", "BFCL_simple")          # the vendored sets that are the whole set
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench"


class MissingDataError(FileNotFoundError):
    """A JSONSchemaBench set that is not where the benchmarks look; the message says where they
    looked and how to provide it."""


def data_folders(name: str) -> list[Path]:
    """The folders a set's name is looked up in, in order: the vendored slice first, then
    $INTERLOCK_DATA, then ../shared/data/jsonschemabench; a set the slice holds only a sample of
    comes from the full sets first (so a benchmark never runs 12 rows believing it ran them all)."""
    full = [full_sets(), SHARED] if os.environ.get(DATA_ENV) else [SHARED]
    return [VENDORED, *full] if name in VENDORED_WHOLE else [*full, VENDORED]


def full_sets() -> Path:
    """The folder of the full sets: $INTERLOCK_DATA, else ../shared/data/jsonschemabench."""
    return Path(os.environ.get(DATA_ENV) or SHARED)


def dataset(name: str | Path) -> Path:
    """The file of a set: a path to a .jsonl file, or a set's name ("JME", "BFCL_simple", ...) or
    file name ("JME.jsonl") looked up in `data_folders`. MissingDataError lists where it looked
    (a benchmark turns it into a usage error)."""
    path = Path(name)
    if path.is_file():
        return path
    looked = [path.resolve()]
    if len(path.parts) == 1:
        stem = path.stem if path.suffix == ".jsonl" else path.name
        for folder in data_folders(stem):
            candidate = folder / f"{stem}.jsonl"
            if candidate.is_file():
                return candidate
            looked.append(candidate)
    raise MissingDataError(
        f"no JSONSchemaBench file {str(name)!r}; looked in: {', '.join(map(str, looked))}. The repository "
        f"vendors JME and BFCL_simple whole (and 12-row samples of Github_trivial, Github_easy, Glaiveai2K) "
        f"in {VENDORED}; for the full sets set {DATA_ENV} to their folder, or pass a .jsonl path")


def dataset_arg(text: str) -> Path:
    """argparse `type=` for --dataset: a set name or a path; a missing file is a usage error, not a traceback."""
    try:
        return dataset(text)
    except MissingDataError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Instance:
    """One test instance of a schema: the JSON value and whether the schema accepts it."""

    valid: bool
    data: Any


@dataclass(frozen=True)
class Row:
    """One schema of JSONSchemaBench with its test instances (file order kept)."""

    id: str
    schema: Mapping[str, Any] | bool
    tests: tuple[Instance, ...]
    document: str | None = None     # a text holding the first valid instance's facts (workloads.extraction)

    @property
    def valid_instances(self) -> tuple[Instance, ...]:
        return tuple(t for t in self.tests if t.valid)


def is_valid(text: str, schema: Mapping[str, Any] | bool) -> bool:
    """The text is JSON that the schema accepts (what every benchmark counts as a valid output)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


# --- loading ---------------------------------------------------------------------------------

def load_rows(path: Path | str, limit: int | None = None) -> list[Row]:
    """The first `limit` rows (all if None) of a JSONSchemaBench .jsonl file.

    Raises FileNotFoundError for a missing file and ValueError, naming the line, for a line that
    is not a JSON object with `id`, `schema` and a `tests` list of {valid, data}.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    rows: list[Row] = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                rows.append(_parse_row(line, f"{path}:{number}"))
    return rows


def _parse_row(line: str, where: str) -> Row:
    try:
        raw = json.loads(line)
        tests = tuple(Instance(bool(t["valid"]), t["data"]) for t in raw.get("tests", ()))
        return Row(id=str(raw["id"]), schema=raw["schema"], tests=tests)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not a JSONSchemaBench row ({type(e).__name__}: {e})") from e


# --- prompts ---------------------------------------------------------------------------------

def build_messages(row: Row) -> list[Message]:
    """[system: instructions + schema, user: the first valid instance in prose or a generic request]."""
    schema = json.dumps(row.schema, ensure_ascii=False)
    valid = row.valid_instances
    user = (GENERIC_REQUEST if not valid else f"{DOCUMENT_HEADER}\n\n{row.document}" if row.document
            else f"{FACTS_HEADER}\n{describe(valid[0].data)}")
    return [{"role": "system", "content": SYSTEM_TEMPLATE.format(schema=schema)},
            {"role": "user", "content": user}]


def build_prompt(row: Row, tokenizer: Tokenizer) -> list[Message] | str:
    """build_messages(row) for a chat model; for a base model (no chat template) the same text as
    one plain prompt that ends where the JSON starts."""
    messages = build_messages(row)
    if tokenizer.has_chat_template:
        return messages
    return "\n\n".join(m["content"] for m in messages) + "\n\nJSON:"


def describe(value: Any) -> str:
    """The facts of a JSON value as English sentences, one per line (deterministic, never JSON)."""
    return "\n".join(_sentences(value, ROOT))


def _sentences(value: Any, subject: str) -> Iterator[str]:
    if isinstance(value, Mapping):
        yield from _object_sentences(value, subject)
    elif isinstance(value, list):
        yield from _list_sentences(value, subject)
    else:
        yield _sentence(f"{subject} is {scalar_text(value)}")


def _object_sentences(value: Mapping[str, Any], subject: str) -> Iterator[str]:
    if not value:
        yield _sentence(f"{subject} is an empty object, with no fields")
        return
    for key, item in value.items():
        # Top-level fields read as "the city"; nested ones carry their place: "the city of the address".
        name = f"the {key_phrase(key)}"
        yield from _sentences(item, name if subject == ROOT else f"{name} of {subject}")


def _list_sentences(value: list[Any], subject: str) -> Iterator[str]:
    if not value:
        yield _sentence(f"{subject} is an empty list")
        return
    count = f"{len(value)} item" + ("" if len(value) == 1 else "s")
    if all(_is_scalar(v) for v in value):
        listed = "; ".join(f"({i}) {scalar_text(v)}" for i, v in enumerate(value, start=1))
        yield _sentence(f"{subject} is a list of {count}: {listed}")
        return
    yield _sentence(f"{subject} is a list of {count}")
    for i, item in enumerate(value, start=1):
        yield from _sentences(item, f"item {i} of {subject}")


def key_phrase(key: str) -> str:
    """A key as it appears after "the": bare when it reads as words, else `field "<key>"` verbatim."""
    return key if _PLAIN_KEY.match(key) else f"field {json.dumps(key, ensure_ascii=False)}"


def scalar_text(value: Any) -> str:
    """Strings quoted verbatim; true/false/null as words; numbers as JSON writes them."""
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    raise TypeError(f"not a JSON scalar: {type(value).__name__}")


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (Mapping, list))


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."
