"""Logging with structlog: console lines for a terminal, JSON lines otherwise (``log.console.format``),
and optionally a JSON log file (``log.file``, ``log.file.level``), rotated as RabbitMQ rotates its own
(``log.file.rotation.date`` / ``.size`` / ``.count`` / ``.compress``, see :class:`RotatingLogFile`).

What is logged (the operator's contract): a start-up banner once the listeners are bound (:func:`log_banner`:
version, Python, config files, data directory, listeners, memory and disk limits; one block on a console, one
event in JSON); one event per connection accepted, opened and closed (with the reason and reply code, and the
client's ``connection_name`` when it gave one), per channel error (warning, with the reply code and text), per
alarm raised and cleared, per listener started; queue declared/deleted at debug; nothing per message above
debug.
"""

from __future__ import annotations

import calendar
import gzip
import logging
import logging.handlers
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, NoReturn

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
           "critical": logging.CRITICAL, "none": logging.CRITICAL + 10}
_METHOD_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                  "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
                  "critical": logging.CRITICAL, "fatal": logging.CRITICAL}


BANNER_EVENT = "Leveret started"
# The banner's fields in the order of the console block, with their labels (RabbitMQ's start-up log is laid out
# the same way: "node :", "home dir :", "config file(s) :", ...).
_BANNER_LABELS = {"version": "version", "python": "Python", "config_files": "config file(s)",
                  "data_dir": "data dir", "log_files": "log(s)", "listeners": "listeners",
                  "memory_high_watermark": "memory high watermark", "disk_free_limit": "disk free limit"}


def _write_stream(stream: IO[str]) -> Callable[[str], None]:
    def write(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()
    return write


class _Sinks:
    """The last processor: renders the event once per sink whose level admits it, and writes it there."""

    def __init__(self, sinks: list[tuple[Callable[[str], None], int, Any]]) -> None:
        self.sinks = sinks

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> NoReturn:
        level = _METHOD_LEVELS.get(method_name, logging.INFO)
        for write, min_level, renderer in self.sinks:
            if level >= min_level:
                try:
                    write(renderer(logger, method_name, dict(event_dict)))
                except (OSError, ValueError):
                    pass  # a closed stream during shutdown must not break the broker
        raise structlog.DropEvent


class _ConsoleRenderer:
    """structlog's console renderer, except for the start-up banner: one block, a field a line."""

    def __init__(self, colors: bool) -> None:
        self.renderer = structlog.dev.ConsoleRenderer(colors=colors)

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> str:
        if event_dict.get("event") != BANNER_EVENT:
            return str(self.renderer(logger, method_name, event_dict))
        head = {k: v for k, v in event_dict.items() if k not in _BANNER_LABELS}
        lines = [str(self.renderer(logger, method_name, head))]
        width = max(len(label) for label in _BANNER_LABELS.values())
        for key, label in _BANNER_LABELS.items():
            if key in event_dict:
                lines.append(f"  {label:<{width}} : {_banner_text(key, event_dict[key])}")
        return "\n".join(lines)


def _banner_text(key: str, value: Any) -> str:
    if key == "listeners" and isinstance(value, list):
        return ", ".join(f"{li.get('protocol')} {li.get('address')}" for li in value) or "none"
    if key == "memory_high_watermark" and isinstance(value, dict):
        text = f"{_size(value.get('bytes', 0))} ({value.get('bytes')} bytes)"
        if value.get("relative") is not None:
            text += f", {value['relative']} of {_size(value.get('total_memory', 0))} RAM"
        return text
    if key == "disk_free_limit" and isinstance(value, dict):
        text = f"{_size(value.get('bytes', 0))} ({value.get('bytes')} bytes)"
        return text + (f", {value['relative']} times RAM" if value.get("relative") is not None else "")
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def log_banner(logger: Any, **fields: Any) -> None:
    """The start-up banner: one event (``BANNER_EVENT``) whose fields the console shows as a block and JSON
    keeps as they are (see :data:`_BANNER_LABELS` for the fields the block lays out)."""
    logger.info(BANNER_EVENT, **fields)


# -- log file rotation -----------------------------------------------------------------------------------------
# RabbitMQ's log.file.rotation.date specs (newsyslog's, as lager and RabbitMQ read them), in local time:
# $H<MM> hourly at minute MM, $D<HH> daily at hour HH, $W<d>[D<HH>] weekly on day d (0 is Sunday) at hour HH,
# $M<day|L>[D<HH>] monthly on that day (L: the last; a day past the month's end is its last) at hour HH.
_DATE_SPEC = re.compile(r"\$(?:H(\d{1,2})?|D(\d{1,2})?|W([0-6])(?:D(\d{1,2}))?|M(\d{1,2}|[Ll])(?:D(\d{1,2}))?)")


def next_rotation(spec: str, now: datetime) -> datetime:
    """The first time after ``now`` (naive local time) that the date spec ``spec`` names."""
    m = _DATE_SPEC.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"not a log rotation date spec: {spec!r}")
    minute, day_hour, weekday, week_hour, mday, month_hour = m.groups()
    if spec.strip().startswith("$H"):
        at = now.replace(minute=int(minute or 0), second=0, microsecond=0)
        return at if at > now else at + timedelta(hours=1)
    if day_hour is not None or spec.strip() == "$D":
        at = now.replace(hour=int(day_hour or 0), minute=0, second=0, microsecond=0)
        return at if at > now else at + timedelta(days=1)
    if weekday is not None:
        target = (int(weekday) - 1) % 7  # newsyslog's 0 is Sunday; Python's weekday() 0 is Monday
        at = (now + timedelta(days=(target - now.weekday()) % 7)).replace(
            hour=int(week_hour or 0), minute=0, second=0, microsecond=0)
        return at if at > now else at + timedelta(days=7)
    year, month = now.year, now.month
    for _ in range(2):
        last = calendar.monthrange(year, month)[1]
        day = last if mday.upper() == "L" else min(int(mday), last)
        at = datetime(year, month, day, int(month_hour or 0))
        if at > now:
            return at
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    raise AssertionError("unreachable")  # pragma: no cover - the next month always has the day


@dataclass(frozen=True)
class FileRotation:
    """``log.file.rotation.*``: ``date`` a date spec (None: never by date), ``size`` bytes (0: never by size),
    ``count`` rotated files kept (0: none, the file is emptied), ``compress`` gzip the rotated files."""

    date: str | None = None
    size: int = 0
    count: int = 5
    compress: bool = False

    @property
    def active(self) -> bool:
        return self.date is not None or self.size > 0

    @classmethod
    def from_settings(cls, settings: Any) -> FileRotation:
        return cls(date=settings.log_file_rotation_date, size=settings.log_file_rotation_size,
                   count=settings.log_file_rotation_count, compress=settings.log_file_rotation_compress)


def _gzip_rotator(source: str, dest: str) -> None:
    with open(source, "rb") as src, gzip.open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(source)


class RotatingLogFile(logging.handlers.RotatingFileHandler):
    """The log file, rotated as RabbitMQ rotates it: when the next line would take it past ``size`` bytes and/or
    when the date spec's time has come, ``leveret.log`` becomes ``leveret.log.1`` (``.1.gz`` with compress), the
    older ones move up one, and past ``count`` the oldest goes. The standard library's RotatingFileHandler, with
    the date as a second trigger (RabbitMQ, too, numbers its rotated files whatever triggered the rotation)."""

    def __init__(self, path: Path, rotation: FileRotation) -> None:
        super().__init__(path, mode="a", maxBytes=rotation.size, backupCount=rotation.count, encoding="utf-8")
        self.setFormatter(logging.Formatter("%(message)s"))
        self.date = rotation.date
        self.next_at = next_rotation(self.date, datetime.now()).timestamp() if self.date else None
        if rotation.compress:
            self.namer = lambda name: name + ".gz"
            self.rotator = _gzip_rotator

    def write(self, line: str) -> None:
        """One rendered line: rotate first if it is time (or the line would not fit), then append it."""
        self.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO, "levelname": "INFO"}))

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.next_at is not None and time.time() >= self.next_at:
            return True
        return bool(super().shouldRollover(record))

    def doRollover(self) -> None:
        if self.backupCount > 0:
            super().doRollover()
        else:  # nothing is kept: the file starts again empty
            if self.stream:
                self.stream.close()
            self.stream = open(self.baseFilename, "w", encoding=self.encoding)  # noqa: SIM115
        if self.date:
            self.next_at = next_rotation(self.date, datetime.now()).timestamp()

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # as for the other sinks: a failing write (a full disk) must not break the broker


def configure_logging(level: str = "info", fmt: str = "auto", console: bool = True,
                      file: Path | None = None, file_level: str | None = None,
                      rotation: FileRotation | None = None) -> None:
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    json_renderer = structlog.processors.JSONRenderer()
    sinks: list[tuple[Callable[[str], None], int, Any]] = []
    if console:
        renderer = _ConsoleRenderer(colors=sys.stderr.isatty()) if fmt == "console" else json_renderer
        sinks.append((_write_stream(sys.stderr), _LEVELS[level], renderer))
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        write: Callable[[str], None]
        if rotation is not None and rotation.active:
            write = RotatingLogFile(file, rotation).write
        else:
            write = _write_stream(open(file, "a", buffering=1))  # noqa: SIM115
        sinks.append((write, _LEVELS[file_level or level], json_renderer))
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
