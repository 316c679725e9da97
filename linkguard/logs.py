"""structlog set-up shared by every linkguard process: JSON lines (default for daemons) or a
console renderer, to stderr, with ISO timestamps and the log level."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO, cast

import structlog
from structlog.typing import Processor

__all__ = ["configure_logging"]


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (not the object it was at configuration: a
    replaced and closed stream must not break every later log call)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(fmt: Literal["json", "console"] = "json", level: str = "info") -> None:
    """Route structlog and stdlib logging (aiomqtt, amqtt, pyroute2) to stderr in ``fmt``."""
    lvl = logging.getLevelNamesMapping().get(level.upper())
    if lvl is None:
        raise ValueError(f"unknown log level {level!r}")
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # PrintLogger calls only write() and flush() of its file
        logger_factory=structlog.PrintLoggerFactory(cast("TextIO", _Stderr())),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer, foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name]
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Third-party libraries are chatty at INFO (amqtt logs every connection).
    root.setLevel(max(lvl, logging.WARNING))
