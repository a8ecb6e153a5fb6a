"""Errors raised by the plumbing in `streams/`.

They live here (not in `protocol/errors.py`) because only code that holds a channel, a reply
slot or a timeline can see them. The ones that mean "the other side is gone" subclass
`EngineClosedError`, and a failed timeline is an `EngineError`, so if one ever reaches a user it
still reads correctly.
"""
from __future__ import annotations

from interlock.protocol.errors import EngineClosedError, EngineError, InterlockError


class WouldBlockError(InterlockError):
    """A `_nowait` call could not complete without waiting."""


class ChannelFullError(WouldBlockError):
    """`send_nowait` found the channel's buffer full (nobody is waiting to receive)."""


class ChannelEmptyError(WouldBlockError):
    """`receive_nowait` found nothing buffered (and the channel is still open)."""


class ChannelClosedError(EngineClosedError):
    """A send to a channel that was closed; its receiver accepts nothing more."""


class EndOfChannelError(InterlockError):
    """A receive from a channel that is closed and fully drained."""


class TimelineError(EngineError):
    """A host function failed on a lane; the whole timeline is failed (errors are sticky)."""


class LaneFullError(TimelineError):
    """A lane's bounded op queue is full; enqueueing would block the event loop."""


class TimelineClosedError(TimelineError):
    """The timeline was closed; pending ops were discarded and nothing more can be enqueued."""
