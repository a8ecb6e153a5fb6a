"""What the step's batched grammar pass (grammars/batch.py) hands each backend's batch path
(grammars/batch_xgrammar.py, grammars/batch_llguidance.py): one constrained request's part of a
step (`Drafted`), the interface a batch path offers (`Group`), and marking rows filled. Its own
file so that the pass imports the backends' paths and they import only this.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from interlock.protocol.grammar import GrammarMatcher
from interlock.protocol.types import TokenId

# The matcher a request's part carries: a batch path declares the concrete matcher it drives (it
# reaches into that matcher's native state), the pass routes each part by type(matcher) to it.
M = TypeVar("M", bound=GrammarMatcher, covariant=True)
M_in = TypeVar("M_in", bound=GrammarMatcher, contravariant=True)


@dataclass(frozen=True)
class Drafted(Generic[M]):
    """One constrained request's part of a step: its matcher, drafts and first mask row.

    skip: offsets j whose rows already hold their mask (filled while a draft model drafted).
    """

    matcher: M
    drafts: tuple[TokenId, ...]
    start_row: int
    skip: frozenset[int] = frozenset()


class Group(Protocol[M_in]):
    """One backend's batch path over matchers of type M_in; every method takes only matchers that
    `StepMasks` routed to it (those `takes` says yes to). What a group remembers between the calls
    of one step, `reset` drops."""

    def takes(self, matcher: M_in) -> bool: ...

    def reset(self) -> None: ...

    def validate(self, requests: Sequence[Drafted[M_in]], bitmask: torch.Tensor) -> list[int]: ...

    def fill(self, requests: Sequence[Drafted[M_in]], bitmask: torch.Tensor, free: Any) -> list[int]: ...

    def accept(self, matchers: Sequence[M_in], tokens: Sequence[Sequence[TokenId]]) -> list[bool]: ...


def mark_filled(free: Any, rows: Sequence[int]) -> None:
    """free[row] = False for each row (a bool tensor or a list; None: nothing to mark)."""
    if free is None or not rows:
        return
    if isinstance(free, torch.Tensor):
        free[torch.tensor(rows, dtype=torch.long)] = False
    else:
        for row in rows:
            free[row] = False
