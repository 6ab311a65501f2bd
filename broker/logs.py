"""Logging with structlog: console lines for a terminal, JSON lines otherwise (``log.console.format``),
and optionally a JSON log file (``log.file``, ``log.file.level``).

What is logged (the operator's contract): one event per connection accepted, opened and closed (with the
reason and reply code), per channel error, per alarm raised and cleared, per listener started; queue
declared/deleted at debug; nothing per message above debug.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any, NoReturn

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
           "critical": logging.CRITICAL, "none": logging.CRITICAL + 10}
_METHOD_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                  "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
                  "critical": logging.CRITICAL, "fatal": logging.CRITICAL}


class _Sinks:
    """The last processor: renders the event once per sink whose level admits it, and writes it there."""

    def __init__(self, sinks: list[tuple[IO[str], int, Any]]) -> None:
        self.sinks = sinks

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> NoReturn:
        level = _METHOD_LEVELS.get(method_name, logging.INFO)
        for stream, min_level, renderer in self.sinks:
            if level >= min_level:
                try:
                    stream.write(renderer(logger, method_name, dict(event_dict)) + "\n")
                    stream.flush()
                except (OSError, ValueError):
                    pass  # a closed stream during shutdown must not break the broker
        raise structlog.DropEvent


def configure_logging(level: str = "info", fmt: str = "auto", console: bool = True,
                      file: Path | None = None, file_level: str | None = None) -> None:
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    json_renderer = structlog.processors.JSONRenderer()
    sinks: list[tuple[IO[str], int, Any]] = []
    if console:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()) if fmt == "console" else json_renderer
        sinks.append((sys.stderr, _LEVELS[level], renderer))
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        sinks.append((open(file, "a", buffering=1), _LEVELS[file_level or level], json_renderer))  # noqa: SIM115
    lowest = min((s[1] for s in sinks), default=_LEVELS["none"])
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _Sinks(sinks),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lowest),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that log through the standard library (aiohttp) go to stderr at warning and above.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
