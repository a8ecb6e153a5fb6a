"""The timeline's errors.

They live here (not in `protocol/errors.py`) because only code that holds a timeline can see
them. Each is an `EngineError`, so if one ever reaches a user it still reads correctly.
"""
from __future__ import annotations

from interlock.protocol.errors import EngineError


class TimelineError(EngineError):
    """A host function failed on a lane; the whole timeline is failed (errors are sticky)."""


class LaneFullError(TimelineError):
    """A lane's bounded op queue is full; enqueueing would block the event loop."""


class TimelineClosedError(TimelineError):
    """The timeline was closed; pending ops were discarded and nothing more can be enqueued."""


class DeviceFaultError(TimelineError):
    """Device work faulted (an illegal address or a device assert on CUDA; a tensor op that raised
    when its lane ran it on the CUDA-rules timeline). Nothing after it runs, host functions
    included, so the step that faulted never reports back: the engine's watchdog notices."""


class HostFunctionCallError(TimelineError):
    """A host function called the timeline (a query, a sync, an enqueue, a health check): CUDA
    forbids any CUDA call inside a host function (it deadlocks or returns a mis-typed error). The
    CUDA-rules timeline raises it where CUDA would misbehave."""


class HostSyncInCaptureError(TimelineError):
    """Device work read a tensor's value on the host (`.item()`, `.tolist()`, `bool()`, a
    data-dependent output shape) while a step was being captured: a CUDA graph would fail to
    capture it, or replay a value frozen at capture time."""
