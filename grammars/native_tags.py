"""Switching grammars compiled by the backends themselves (`Reasoning(native=True)`,
`StructuralTag(native=True)`): an xgrammar structural tag, or an llguidance Lark grammar.

The result is an ordinary backend grammar behind the usual matcher: free rows are written as mask
rows (a native grammar cannot say that a row allows everything, so nothing is skipped), and the
switch is wherever the backend's byte-level lexer puts it. What the composing matcher
(grammars/switch/) does and these do not: max_reasoning_tokens, markers that are special tokens,
refusing a token inside which a trigger ends (here the grammar after it begins mid-token), and on
xgrammar an `at_most` other than 1 or None. Each raises GrammarError at compile, so `auto` falls
back to the other backend as for any spec. The end-of-request check is the same text-level one
(grammars/validate.py splits the text at the markers). Nor is xgrammar's JSON control-character
filter (xgrammar_backend.ControlFilter) applied inside a native tag: a raw control character in a
JSON string gets through the mask and is refused by that check.

Lark here: free text up to and including the first trigger is one lexeme,
    PRE: /(?s:.*)T/ & ~/(?s:.*(T1|T2).+)/
(any text that ends with trigger T and holds no trigger before its end), and the free text after
the last tag is one lexeme that holds no trigger at all; each tag's spec is a sub-grammar (@name)
built by the backend as for a plain spec.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from interlock.grammars.switch import marker_ids
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarSpec, Reasoning, StructuralTag

SubGrammar = Callable[[GrammarSpec], dict]    # a plain spec -> one llguidance grammar entry (no name)
Content = Callable[[GrammarSpec], dict]       # a plain spec -> one xgrammar structural-tag format


def check_native(spec: Reasoning | StructuralTag, tokenizer: Tokenizer, backend: str) -> None:
    """What neither native form supports, and markers that are no token sequence (typed errors)."""
    special = {i for i, added in tokenizer.hf.added_tokens_decoder.items() if added.special}
    if isinstance(spec, Reasoning):
        if spec.max_reasoning_tokens is not None:
            raise GrammarError(f"{backend}: native Reasoning has no max_reasoning_tokens (use native=False)")
        markers = [spec.end]
        if spec.then is not None and isinstance(spec.then, (Reasoning, StructuralTag)):
            if isinstance(spec.then, Reasoning):
                raise GrammarError("Reasoning.then: a Reasoning cannot be nested in another")
            check_native(spec.then, tokenizer, backend)
    else:
        if not spec.triggers or not spec.tags:
            raise GrammarError("StructuralTag: needs at least one trigger and one tag")
        if spec.at_most is not None and (not isinstance(spec.at_most, int) or spec.at_most < 1):
            raise GrammarError(f"StructuralTag.at_most must be a positive int or None, got {spec.at_most!r}")
        for a in spec.triggers:
            for b in spec.triggers:
                if a != b and a in b:
                    raise GrammarError(f"StructuralTag: triggers {a!r} and {b!r} overlap (one holds the other)")
        markers = list(spec.triggers) + [t.end for t in spec.tags]
        for n, tag in enumerate(spec.tags):
            if sum(tag.begin.startswith(t) for t in spec.triggers) != 1:
                raise GrammarError(f"StructuralTag tag {n} ({tag.begin!r}): begin must start with exactly one trigger")
            if isinstance(tag.spec, (Reasoning, StructuralTag)):
                raise GrammarError(f"StructuralTag tag {n}: a tag's spec cannot itself switch")
            markers.append(tag.begin)
    for text in markers:
        ids = marker_ids(tokenizer, text, f"native {type(spec).__name__} marker")
        if special & set(ids):
            raise GrammarError(f"{backend}: native switching grammars match markers as text; {text!r} is a "
                               "special token here (use native=False)")


# --- xgrammar ------------------------------------------------------------------------------------

def xgrammar_structural_tag(spec: Reasoning | StructuralTag, content: Content) -> dict:
    """The xgrammar structural tag (JSON form) for spec."""
    return {"type": "structural_tag", "format": _xgr_format(spec, content)}


def _xgr_format(spec: Reasoning | StructuralTag, content: Content) -> dict:
    if isinstance(spec, Reasoning):
        end = spec.end
        thinking = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": end}
        if spec.then is None:
            return {"type": "sequence", "elements": [thinking, {"type": "any_text"}]}
        then = _xgr_format(spec.then, content) if isinstance(spec.then, StructuralTag) else content(spec.then)
        return {"type": "sequence", "elements": [thinking, then]}
    if spec.at_most not in (None, 1):
        raise GrammarError(f"xgrammar: native structural tags allow at_most 1 or None, got {spec.at_most}")
    tags = [{"type": "tag", "begin": t.begin, "content": content(t.spec), "end": t.end} for t in spec.tags]
    return {"type": "triggered_tags", "triggers": list(spec.triggers), "tags": tags,
            "stop_after_first": spec.at_most == 1}


# --- llguidance ----------------------------------------------------------------------------------

def llguidance_grammar(spec: Reasoning | StructuralTag, sub: SubGrammar) -> str:
    """The llguidance grammar (JSON text: a Lark grammar and one sub-grammar per constrained part)."""
    subs: list[dict] = []

    def ref(inner: GrammarSpec) -> str:
        entry = dict(sub(inner))
        entry["name"] = f"part{len(subs)}"
        subs.append(entry)
        return "@" + entry["name"]

    rules: list[str] = []
    if isinstance(spec, Reasoning):
        end = spec.end
        rules.append(f"THINK: {_ends_with_first(end, [end])}")
        if spec.then is None:
            rules.insert(0, "start: THINK ANY | ANY_NO_END")
            rules += ["ANY: /(?s:.*)/", f"ANY_NO_END: {_without([end])}"]
        elif isinstance(spec.then, StructuralTag):
            rules.insert(0, "start: THINK tags")
            rules += _lark_tags(spec.then, ref, "tags")
        else:
            rules.insert(0, f"start: THINK {ref(spec.then)}")
    else:
        rules.append("start: tags")
        rules += _lark_tags(spec, ref, "tags")
    return json.dumps({"grammars": [{"lark_grammar": "\n".join(rules) + "\n"}, *subs]})


def _lark_tags(spec: StructuralTag, ref: Callable[[GrammarSpec], str], name: str) -> list[str]:
    """Rules for free text with tags: `name` derives the whole output of spec."""
    triggers = list(spec.triggers)
    lex = name.upper()                        # Lark: lexemes are upper case, rules lower case
    rules = [f"{lex}_TAIL: {_without(triggers)}"]
    calls = []
    for k, trigger in enumerate(triggers):
        rules.append(f"{lex}_PRE{k}: {_ends_with_first(trigger, triggers)}")
        bodies = [f"{_lit(t.begin[len(trigger):])} {ref(t.spec)} {_lit(t.end)}".strip()
                  for t in spec.tags if t.begin.startswith(trigger)]
        calls.append(f"{lex}_PRE{k} ({' | '.join(bodies)})")
    rules.append(f"{name}_call: {' | '.join(calls)}")
    if spec.at_most is None:
        rules.insert(0, f"{name}: {name}_call* {lex}_TAIL")
    else:                       # up to at_most calls; after the last one allowed, the output ends
        rules.insert(0, f"{name}: {lex}_TAIL | {name}_call {name}_1" if spec.at_most > 1
                     else f"{name}: {lex}_TAIL | {name}_call")
        for i in range(1, spec.at_most):
            last = i == spec.at_most - 1
            rules.append(f"{name}_{i}: {lex}_TAIL | {name}_call" + ("" if last else f" {name}_{i + 1}"))
    return rules


def _ends_with_first(marker: str, triggers: list[str]) -> str:
    """A lexeme: any text that ends with marker and holds no trigger before its end."""
    alts = "|".join(_re(t) for t in triggers)
    return f"/(?s:.*){_re(marker)}/ & ~/(?s:.*({alts})(?s:.+))/"


def _without(markers: list[str]) -> str:
    alts = "|".join(_re(t) for t in markers)
    return f"/(?s:.*)/ & ~/(?s:.*({alts}).*)/"


def _re(text: str) -> str:
    return re.escape(text).replace("/", "\\/")


def _lit(text: str) -> str:
    return json.dumps(text) if text else ""
