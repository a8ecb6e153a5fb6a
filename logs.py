"""Logging: the library is silent and costs nothing until the application asks for its logs.

Library modules write `log = get_logger(__name__)` and log structlog-style events
(`log.debug("step_planned", step=3)`). Each logger sits on the standard `logging` logger of the
same name, under "interlock", which carries a `NullHandler`; before anything else an event checks
`isEnabledFor` on that logger, so with logging unconfigured (effective level WARNING) a debug or
info event returns after one cached level check: no event dict is rendered, nothing is printed.

When the level lets an event through, structlog's configured processors render it (structlog's
defaults, or the application's `structlog.configure`) and the result goes to the `logging` logger,
so the application's handlers decide where it ends up. An application that wants interlock's logs:

    logging.basicConfig(level=logging.INFO)              # or logging.getLogger("interlock").setLevel(...)
    interlock.logs.configure_logging(level="debug")      # or this: console / JSON lines on stderr

The CLI calls configure_logging; library code never does.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

ROOT = "interlock"
_HANDLER_NAME = "interlock.configure_logging"


class Logger:
    """A structlog logger behind a level check on its stdlib logger; `bind` adds context to every event."""

    __slots__ = ("_std", "_structlog", "_context")

    def __init__(self, std: logging.Logger, context: dict[str, Any] | None = None) -> None:
        self._std = std
        # Processors and wrapper come from structlog's configuration at call time (a lazy proxy);
        # the output always goes to the stdlib logger, whatever logger factory is configured.
        self._structlog = structlog.wrap_logger(std)
        self._context = context or {}

    def bind(self, **context: Any) -> Logger:
        return Logger(self._std, {**self._context, **context})

    def is_enabled_for(self, level: int) -> bool:
        return self._std.isEnabledFor(level)

    def debug(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(logging.DEBUG):
            self._structlog.debug(event, **self._context, **kw)

    def info(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(logging.INFO):
            self._structlog.info(event, **self._context, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(logging.WARNING):
            self._structlog.warning(event, **self._context, **kw)

    def error(self, event: str, **kw: Any) -> None:
        if self._std.isEnabledFor(logging.ERROR):
            self._structlog.error(event, **self._context, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        """An error event with the current exception's traceback."""
        if self._std.isEnabledFor(logging.ERROR):
            self._structlog.error(event, exc_info=True, **self._context, **kw)


def get_logger(name: str) -> Logger:
    """The logger library modules use: `log = get_logger(__name__)` (names under "interlock")."""
    root = logging.getLogger(ROOT)
    if not any(isinstance(h, logging.NullHandler) for h in root.handlers):
        # The stdlib's advice for libraries: without it, logging's last-resort handler would
        # print our warnings to stderr in an application that never configured logging.
        root.addHandler(logging.NullHandler())
    return Logger(logging.getLogger(name if name.startswith(ROOT) else f"{ROOT}.{name}"))


def configure_logging(*, json: bool = False, level: str = "warning") -> None:
    """For programs (the CLI): interlock's events at `level` and above on stderr, as human-readable
    console lines, or one JSON object per line with json=True. Calling it again replaces the set-up."""
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger(ROOT)
    for h in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(message)s"))      # structlog already rendered the line
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False                                      # one line per event, not one per handler
