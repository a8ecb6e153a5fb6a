"""How a walk picks the next token from a grammar's real mask: `TokenMix` and `draw_token`.

Kinds of token, each with a relative weight:
- frequent: among the first allowed ids in `GrammarCase.frequency_rank` order (printable ASCII
  tokens by id: in BPE, bytes and early merges are the tokens a model emits most);
- forced: the first of the grammar's forced tokens (jump-forward), where it has any;
- any: uniformly among the allowed ids;
- rare: among the last ones in that order (UTF-8 fragments, late merges);
- eos: end of sequence, where the grammar accepts;
- marker: a token that advances a switching grammar's marker (`marker_hints()`, where the matcher
  has it): a walk would seldom spell a multi-token trigger by chance, so the switch would go untested.

Draws go through hypothesis (kind first, then an index into that kind's ids), so shrinking moves
towards the first kind listed (frequent) and the lowest id in it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from hypothesis import strategies as st

from interlock.protocol.grammar import GrammarMatcher
from interlock.protocol.types import TokenId
from interlock.testing.case import GrammarCase

Draw = Callable[..., Any]          # hypothesis' draw (in @composite) or data.draw (in a rule)
KINDS = ("frequent", "forced", "any", "rare", "eos", "marker")


@dataclass(frozen=True)
class TokenMix:
    """Relative weights of the token kinds a walk picks (0 turns a kind off), and the share of
    allowed ids that counts as frequent (the first in frequency order) or rare (the last)."""

    frequent: int = 4
    forced: int = 2
    any: int = 2
    rare: int = 1
    eos: int = 1
    marker: int = 3
    share: float = 0.1

    def __post_init__(self) -> None:
        weights = [getattr(self, k) for k in KINDS]
        if any(not isinstance(w, int) or w < 0 for w in weights) or sum(weights) == 0:
            raise ValueError(f"TokenMix weights must be non-negative ints, not all 0: {weights}")
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"TokenMix.share must be in (0, 1], got {self.share}")


def kinds_of(mix: TokenMix) -> dict[str, int]:
    return {f.name: getattr(mix, f.name) for f in fields(mix) if f.name in KINDS}


def candidates(case: GrammarCase, matcher: GrammarMatcher, mix: TokenMix,
               allow_eos: bool = True) -> dict[str, list[TokenId]]:
    """kind -> the ids of that kind allowed now (kinds with weight 0 or no ids left out)."""
    allowed = case.allowed(matcher)
    eos_ids = set(case.tokenizer.eos_token_ids)
    body = [t for t in allowed if t not in eos_ids]
    ranked = case.by_frequency(body) if mix.frequent or mix.rare else body
    k = max(1, int(len(body) * mix.share))
    by_kind: dict[str, list[TokenId]] = {
        "frequent": ranked[:k],
        "forced": [t for t in matcher.forced_tokens()[:1] if t in body] if mix.forced else [],
        "any": body,
        "rare": ranked[::-1][:k],
        "eos": [t for t in allowed if t in eos_ids] if allow_eos else [],
        "marker": _hints(matcher, set(body)) if mix.marker else [],
    }
    weights = kinds_of(mix)
    return {kind: ids for kind, ids in by_kind.items() if ids and weights[kind]}


def draw_token(draw: Draw, case: GrammarCase, matcher: GrammarMatcher, mix: TokenMix,
               allow_eos: bool = True) -> TokenId | None:
    """One token matcher's mask allows now, picked by mix; None when nothing may follow."""
    options = candidates(case, matcher, mix, allow_eos)
    if not options and not allow_eos:
        options = candidates(case, matcher, mix, True)       # EOS is all there is: take it
    if not options:
        return None
    weights = kinds_of(mix)
    slots = [kind for kind in options for _ in range(weights[kind])]   # kind repeated by weight
    kind = slots[draw(st.integers(0, len(slots) - 1), label="token kind")]
    ids = options[kind]
    return ids[draw(st.integers(0, len(ids) - 1), label=f"{kind} token index")]


def _hints(matcher: GrammarMatcher, allowed: set[TokenId]) -> list[TokenId]:
    hints = getattr(matcher, "marker_hints", None)
    return [t for t in hints() if t in allowed] if hints is not None else []
