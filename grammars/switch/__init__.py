"""Grammars that switch on mid-output: `Reasoning` and `StructuralTag`, compiled for one backend,
and the matcher that composes free text with the inner specs' own matchers.

Why a composing matcher is the default rather than xgrammar's structural tags or llguidance's Lark
grammars (which `native=True` uses instead, grammars/native_tags.py): (1) a free row must be
reported as free so the verifier skips it, and a native grammar only hands back a filled row; (2)
the two backends define free text differently, so "auto" falling back from one to the other would
change outputs, while here the switch is computed by us, identically on both (triggers matched on
the tokens' bytes, grammars/triggers.py; forced markers as the tokenizer's own token sequence), and
the inner specs still use each backend's native grammar; (3) max_reasoning_tokens and special-token
markers. Rollback is exact because the matcher keeps one immutable state per accepted token (the
inner matcher's depth included) and a rollback pops states.

Two files: compiler.py (a spec into a `SwitchProgram`), matcher.py (`SwitchMatcher`, on
`BaseMatcher`'s loop; its phases are described there), and grammars/triggers.py for the byte-level
trigger scan. Splitting the streamed text into thinking and answer is output's (output/reasoning.py).
`Reasoning(then, end=...)` is one tag whose begin is the end marker, whose spec is `then` and
which has no end: the answer runs to EOS. `then=None` leaves the answer free.
"""
from interlock.grammars.switch.compiler import (
    CompiledTag, SwitchProgram, compile_switch, is_switch, marker_ids, token_bytes,
)
from interlock.grammars.switch.matcher import Segment, SwitchMatcher

__all__ = ["CompiledTag", "Segment", "SwitchMatcher", "SwitchProgram", "compile_switch", "is_switch", "marker_ids",
           "token_bytes"]
