"""Times as the HTTP API writes them: RabbitMQ's ``idle_since`` format and the delayed exchange's
ISO 8601 milliseconds."""

from __future__ import annotations

import datetime


def format_timestamp(seconds: float) -> str:
    """A time as RabbitMQ's HTTP API writes ``idle_since`` (rabbit_mgmt_format: ISO 8601, UTC, in
    milliseconds): ``2024-01-01T12:00:00.000+00:00``."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


def iso_ms(ms: int) -> str:
    """An epoch time in ms as ISO 8601 UTC with milliseconds (``2025-01-31T12:00:00.250Z``)."""
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
