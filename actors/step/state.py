"""The step's per-slot state and the boundary between steps.

`StepState` holds one `SlotState` per slot: what one part of the step in flight writes and a later
one reads (the timeline's events order them). It also marks whether a step is in flight: the
actors' own state (matchers, drafters, generators) is touched by the step's parts while a step
runs, and by the event loop only between steps. `between_steps(fn)` runs a loop-side change
(bind a grammar, add or release a request) now when no step is in flight, else right after the
step in flight ends, before the next one is planned.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from interlock.protocol.messages import SlotResult
from interlock.protocol.types import TokenId


@dataclass
class SlotState:
    """One slot's values in the step in flight, written by one part and read by a later one:

    lane: the request's place among the step's sampling requests (its grammar mask rows are
    lane * (K+1) + j, and on the device runner its verification row); -1 if it does not sample;
    forced: grammar -> drafter; drafts / probs: drafter -> grammar (which cuts refused drafts) and
    verifier; prefix / masking / refused: the draft-model loop's handshake with the grammar lane;
    result: verifier -> grammar commit and publish; error: any part -> publish (the request fails,
    the others go on).
    """

    lane: int = -1
    forced: tuple[TokenId, ...] = ()
    drafts: tuple[TokenId, ...] = ()
    probs: torch.Tensor | None = None
    prefix: tuple[TokenId, ...] = ()
    masking: bool = False
    refused: bool = False
    result: SlotResult | None = None
    error: BaseException | None = None


@dataclass
class StepState:
    """The step's per-slot state, one `SlotState` per slot, its timings, and the step boundary
    (module docstring). Host values: what the device reads lives in the runner's step buffers."""

    slots: list[SlotState]
    timing: dict[str, float] = field(default_factory=lambda: {"forward_s": 0.0})     # the host runner's forward
    in_flight: bool = False
    # the device runner's draft-model rounds this step (0: none), and whether some lane samples its
    # drafts (verification then needs their law q); written by the draft part in the prologue
    draft_rounds: int = 0
    draft_q: bool = False
    draft_rows: bool = False            # some model lane draws under the grammar's rows
    _pending: deque[tuple[Callable[..., object], tuple[object, ...]]] = field(default_factory=deque)

    @classmethod
    def allocate(cls, max_batch: int) -> StepState:
        return cls([SlotState() for _ in range(max_batch)])

    def __getitem__(self, slot: int) -> SlotState:
        return self.slots[slot]

    def __len__(self) -> int:
        return len(self.slots)

    def fail(self, slot: int, error: BaseException) -> None:
        """Record the first per-request error of this step for `slot`."""
        if self.slots[slot].error is None:
            self.slots[slot].error = error

    def between_steps(self, fn: Callable[..., object], *args: object) -> None:
        """On the loop: run `fn(*args)` now if no step is in flight, else when the step ends."""
        if self.in_flight:
            self._pending.append((fn, args))
        else:
            fn(*args)

    def begin_step(self) -> None:
        if self.in_flight:
            raise RuntimeError("a step is already in flight: the next one is planned from its outcome")
        self.in_flight = True

    def end_step(self) -> None:
        """On the loop, when the step's outcome arrives: the step is over; run what waited for it."""
        self.in_flight = False
        while self._pending:
            fn, args = self._pending.popleft()
            fn(*args)
