"""structlog set-up for programs that embed interlock (the CLI calls it; the library never does).

Library code only asks `structlog.get_logger(__name__)` and binds request_id / step where it
has them; how events are rendered is the application's choice.
"""
from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, json: bool = False, level: str = "warning") -> None:
    """Human-readable console lines on stderr by default, one JSON object per line with json=True."""
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
