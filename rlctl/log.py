"""structlog setup: readable lines on a terminal, one JSON object per line with ``json``.

Logs always go to stderr so that ``--json`` machine output on stdout stays clean.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_configured = False


class _CurrentStderr:
    """Whatever ``sys.stderr`` is at write time, so loggers made earlier never write to a stream
    that was swapped out and closed since (redirections, test capture)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog once per process; ``fmt`` is auto|console|json."""
    global _configured
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "plain"
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso" if fmt == "json" else "%H:%M:%S"),
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=(fmt == "console")))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str = "rlctl", **bound: Any) -> Any:
    """A structlog logger bound to ``name``.

    Configures the defaults on first use unless structlog was configured already (by the CLI, by
    a host program, or by ``structlog.testing.capture_logs``, whose capture must not be replaced).
    """
    if not _configured and not structlog.is_configured():
        configure()
    return structlog.get_logger(name).bind(**bound)
