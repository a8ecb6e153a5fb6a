"""Workloads beyond JSONSchemaBench's one-instance rows.

`repeated_schema(row, n)` is the job structured output exists for: extract a record from each of
many texts, all with one schema. JSONSchemaBench rows carry one or two valid instances, so the n
documents are made from the row's first valid instance by varying its scalar leaves — digits and
letters of strings replaced in kind (so IDs keep their shape), ISO dates moved by days, numbers
scaled, booleans flipped — leaf by leaf, keeping a change only when the schema still accepts the
document (jsonschema). Everything is a deterministic function of (row, n, seed); prompts come from
`prompts.build_messages`, so each document's facts are in the user message, in prose.

    rows = repeated_schema(row_by_id(dataset("JME"), REPEATED_ROW), 50)

`extraction(row, n)` is the same job with the prompt mostly document, as extraction on a CPU is:
each record's facts (prompts.describe) scattered through filler prose, n documents whose lengths
step evenly from 500 to 2,000 tokens (about; the prose is English), all after the same system
message (the schema), where prefill speed decides most of the time to first token. With
`shared_head=True` the documents are one long body and differ only in a last paragraph holding the
record: a prompt repeated with a different document tail, where the prefix cache pays for the head.
"""
from __future__ import annotations

import datetime
import random
import re
import string
from pathlib import Path
from typing import Any

from interlock.benchmarks.prompts import Instance, Row, load_rows

# JME_26, a person (name, age, an address of four fields, a list of hobbies). Chosen on the
# embedded model (greedy, no speculation, 8 varied documents per row, max 256 tokens), among the JME
# rows with an object instance of at least 5 leaves: every output schema-valid and 7 of 8 the
# document's record exactly, the most leaves among rows that came back valid. The first choice,
# JME_29 (a purchase order), made every system, llama.cpp included, repeat its line items until
# max_tokens (0/50 valid): it measured a loop, not an extraction. `peers --row` picks another.
REPEATED_ROW = "JME_26"
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def row_by_id(path: Path | str, row_id: str) -> Row:
    for row in load_rows(path):
        if row.id == row_id:
            return row
    raise KeyError(f"no row {row_id!r} in {path}")


def repeated_schema(row: Row, n: int, *, seed: int = 0) -> list[Row]:
    """n rows with `row`'s schema, each with one valid instance; the first is the row's own."""
    import jsonschema

    if not row.valid_instances:
        raise ValueError(f"row {row.id} has no valid instance to vary")
    base = row.valid_instances[0].data
    validator = jsonschema.validators.validator_for(row.schema)(row.schema)
    out, seen = [], set()
    rng = random.Random(f"{row.id}:{seed}")
    for _ in range(50 * n):
        doc = base if not out else _vary(base, rng, lambda d: validator.is_valid(d))
        key = repr(doc)
        if key not in seen:
            seen.add(key)
            out.append(Row(f"{row.id}#{len(out)}", row.schema, (Instance(True, doc),)))
            if len(out) == n:
                return out
    raise ValueError(f"could not make {n} distinct valid documents for {row.id} (made {len(out)})")


def _vary(doc: Any, rng: random.Random, valid: Any) -> Any:
    """A copy of doc with each scalar leaf changed where the schema still accepts the result."""
    current = doc
    for path in list(_leaf_paths(doc)):
        candidate = _replace(current, path, _new_value(_get(current, path), rng))
        if valid(candidate):
            current = candidate
    return current


def _new_value(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return max(1, round(value * rng.uniform(0.5, 1.5))) if value > 0 else value - rng.randint(0, 9)
    if isinstance(value, float):
        return round(value * rng.uniform(0.5, 1.5), 2)
    if isinstance(value, str):
        if _DATE.fullmatch(value):
            try:
                day = datetime.date.fromisoformat(value) + datetime.timedelta(days=rng.randint(1, 900))
                return day.isoformat()
            except ValueError:
                return value
        return "".join(_same_kind(c, rng) for c in value)
    return value


def _same_kind(c: str, rng: random.Random) -> str:
    for alphabet in (string.digits, string.ascii_lowercase, string.ascii_uppercase):
        if c in alphabet:
            return rng.choice(alphabet)
    return c


def _leaf_paths(value: Any, path: tuple = ()) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaf_paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaf_paths(v, path + (i,))
    else:
        yield path


def _get(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(value)]


# Filler prose: plausible, fact-free sentences (no names, numbers or dates a record could take).
_SUBJECTS = ("The committee", "The survey team", "A later review", "The archive", "Our field office", "The board",
             "An outside auditor", "The working group", "The regional desk", "A short memo")
_VERBS = ("noted", "described", "recommended", "questioned", "summarized", "revisited", "documented", "weighed")
_OBJECTS = ("the scheduling of routine inspections", "the wording of the intake form", "how the files are stored",
            "the backlog of open requests", "the layout of the reading room", "the tone of earlier letters",
            "delays in the courier service", "the quality of scanned pages", "the cost of the cleaning contract",
            "a proposal to merge two offices", "the handling of duplicate entries", "the night shift's handover")
_TAILS = ("without reaching a conclusion", "and asked for a follow-up", "in some detail", "at the usual meeting",
          "as part of the yearly plan", "after several complaints", "in the margin of the report", "only briefly")
WORDS_PER_TOKEN = 0.82      # filler prose under SmolLM2's tokenizer, about (the tests pin the range)


def extraction(row: Row, n: int, *, tokens: tuple[int, int] = (500, 2000), seed: int = 0,
               shared_head: bool = False) -> list[Row]:
    """n rows with `row`'s schema, each a document of tokens[0]..tokens[1] tokens (evenly stepped)
    that states one repeated_schema record among filler prose (module docstring). shared_head: every
    document is instead the same tokens[1]-token body of filler followed by its own short tail, the
    paragraph that states its record: one long prompt repeated with a different tail."""
    from interlock.benchmarks.prompts import describe

    lo, hi = tokens
    if not 0 < lo <= hi:
        raise ValueError(f"tokens must be 0 < low <= high, got {tokens}")
    head = _filler(random.Random(f"{row.id}:extraction-head:{seed}"), hi * WORDS_PER_TOKEN) if shared_head else []
    out = []
    for i, record in enumerate(repeated_schema(row, n, seed=seed)):
        rng = random.Random(f"{row.id}:extraction:{seed}:{i}")
        facts = describe(record.valid_instances[0].data).splitlines()
        if shared_head:
            body = _paragraphs(head) + [" ".join(facts + _filler(rng, 20))]
            out.append(Row(f"{record.id}~head{hi}", row.schema, record.tests, "\n\n".join(body)))
            continue
        target = lo + (hi - lo) * i // max(1, n - 1)
        filler = _filler(rng, target * WORDS_PER_TOKEN - sum(len(f.split()) for f in facts))
        # the facts at random places, in their order (an object's fields stay near each other)
        spots = sorted(rng.sample(range(len(filler) + 1), min(len(facts), len(filler) + 1)))
        text: list[str] = []
        for j, sentence in enumerate(filler + [""]):
            while spots and spots[0] == j and facts:
                spots.pop(0)
                text.append(facts.pop(0))
            text.append(sentence)
        text += facts                                   # any left (more facts than places)
        out.append(Row(f"{record.id}~{target}", row.schema, record.tests, "\n\n".join(_paragraphs(text))))
    return out


def _filler(rng: random.Random, words: float) -> list[str]:
    """Fact-free sentences of about `words` words in all."""
    filler: list[str] = []
    count = 0
    while count < words:
        filler.append(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}.")
        count += len(filler[-1].split())
    return filler


def _paragraphs(sentences: list[str]) -> list[str]:
    paragraphs = (" ".join(sentences[k: k + 6]).strip() for k in range(0, len(sentences), 6))
    return [p for p in paragraphs if p]
