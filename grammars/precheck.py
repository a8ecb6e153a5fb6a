"""What can be said of a grammar before a tokenizer or a model loads: the CLI's check, in tenths of a
second, instead of the seconds it takes to import torch and the backends and load a tokenizer.

It says only what a compile with the tokenizer would say: the shared checks (checks.py), a regex
Python's `re` cannot compile, llguidance's verdict on the grammar's text (its core needs neither
torch nor a tokenizer: llguidance_text.py), and for `auto` on a JSON schema the keywords xgrammar is
known not to enforce (keywords.py), in `auto`'s order and with `auto`'s message. Where only a
compile can tell (xgrammar's own parser, llguidance's warnings on a schema), it says "unknown".
"""
from __future__ import annotations

import json
from typing import Literal

from interlock.grammars.checks import check_regexes, check_spec
from interlock.grammars.keywords import Gap, gap_named, gaps, no_backend_error, said_by
from interlock.grammars.llguidance_text import refusal
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import (AUTO_ORDER, BackendName, Choice, Ebnf, GrammarConfig, GrammarSpec,
                                        JsonObject, JsonSchema, Lark, Regex)

Verdict = Literal["compiles", "unknown"]
PLAIN = (JsonSchema, JsonObject, Regex, Ebnf, Lark, Choice)      # what llguidance_text.grammar_text spells


def precheck(spec: GrammarSpec, backend: BackendName, config: GrammarConfig | None = None) -> Verdict:
    """Raise the GrammarError that compiling `spec` with `backend` would raise, where that is known
    without a tokenizer. "compiles": the backend that would take it (llguidance, alone or first in
    `auto`) takes its text as it is; "unknown": only a compile with the tokenizer can tell."""
    check_spec(spec, config or GrammarConfig())
    check_regexes(spec)
    if backend == "xgrammar" or not isinstance(spec, PLAIN):
        return "unknown"
    reason, warnings = refusal(spec)
    exact = isinstance(spec, JsonSchema) and not spec.lenient
    if reason is None:                     # a warning on an exact schema: auto would try xgrammar
        return "unknown" if exact and warnings else "compiles"
    if backend == "llguidance":
        raise GrammarError(reason)
    schema = json.loads(spec.compiled_schema) if exact else None    # type: ignore[union-attr]
    named: list[Gap] = gap_named(schema, reason) if exact else []
    reasons = [said_by("llguidance", reason)]
    for name in AUTO_ORDER[1:]:
        found = gaps(schema, name) if exact else ()
        if not found:                      # that backend might compile it: only it can say
            return "unknown"
        named.append(found[0])
        reasons.append(f"{name} does not enforce " + "; ".join(map(str, found[:3])))
    raise no_backend_error(named, reasons)
