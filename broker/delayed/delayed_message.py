"""When a message published to an ``x-delayed-message`` exchange is due (docs/decisions/delayed-messages.md): its ``x-delay`` /
``x-deliver-at`` headers read as the rabbitmq-delayed-message-exchange plugin reads ``x-delay``, and the
header the delivered message carries. Pure: no clock, no I/O, so every rule is testable alone.

- ``x-delay``: milliseconds, an AMQP integer of any width, a float (truncated toward zero, as the plugin) or
  a numeric string; ``<= 0``, absent, or of another type (bool, timestamp, table...) means "route at once".
  A string that is no number is refused (406): the plugin crashes on it, and silence would deliver at once.
- ``x-deliver-at`` (Leveret only): an absolute due time, an AMQP timestamp or ms since the epoch; it wins
  over ``x-delay``. A time already past means "route at once".
- Beyond the horizon (``delayed_message.max_delay``) the publish is refused with 406 naming it; the plugin
  silently delivers a delay above 2^32-1 ms at once, which is the complaint this rule answers.
- Delivered, the message carries ``x-delay`` negated as a 64-bit long (the plugin >= 3.13 writes an ``l``),
  so sending it on to another delayed exchange, or dead-lettering it back into one, does not delay it again.
"""

from __future__ import annotations

import datetime
import math
import struct
from typing import Any

from broker.errors import AMQPError
from protocol.constants import CLASS_BASIC, PRECONDITION_FAILED
from protocol.properties import Long, with_properties

X_DELAY = "x-delay"
X_DELIVER_AT = "x-deliver-at"
DEFAULT_MAX_DELAY_MS = 2 * 365 * 24 * 3_600_000  # two years, as QMQ


def _get(headers: dict[Any, Any], key: str) -> Any:
    value = headers.get(key)
    return headers.get(key.encode()) if value is None else value


def _delay_of(value: Any) -> int | None:
    """The plugin's coercion of an ``x-delay`` value: an int, or None for "not a delay"."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, str)):
        text = value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else value
        try:
            return int(text.strip())
        except ValueError:
            raise AMQPError(PRECONDITION_FAILED, f"invalid x-delay header {text[:64]!r}: not a number of "
                            "milliseconds", CLASS_BASIC, 40) from None
    return None


def _deliver_at_of(value: Any) -> int | None:
    """``x-deliver-at`` in ms since the epoch: a timestamp (decoded as a datetime) or an integer of ms."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _delay_of(value) if isinstance(value, (bytes, bytearray, str)) else None


def due_time(headers: dict[Any, Any], now_ms: int, max_delay_ms: int) -> tuple[int, int] | None:
    """``(due_ms, delay_ms)`` for a message to hold, or None to route it at once (see the module's rules).
    Raises AMQPError 406 for a delay beyond ``max_delay_ms`` or an ``x-delay`` string that is no number."""
    return due_time_of(_get(headers, X_DELIVER_AT), _get(headers, X_DELAY), now_ms, max_delay_ms)


def due_time_of(deliver_at: Any, delay_value: Any, now_ms: int, max_delay_ms: int) -> tuple[int, int] | None:
    """:func:`due_time` from the values of the two headers (None: absent)."""
    at = _deliver_at_of(deliver_at)
    if at is not None:
        delay = at - now_ms
        header = X_DELIVER_AT
    else:
        d = _delay_of(delay_value)
        if d is None:
            return None
        delay = d
        header = X_DELAY
    if delay <= 0:
        return None
    if delay > max_delay_ms:
        raise AMQPError(PRECONDITION_FAILED, f"{header} asks for a delay of {delay} ms, beyond the horizon "
                        f"delayed_message.max_delay = {max_delay_ms} ms", CLASS_BASIC, 40)
    return now_ms + delay, delay


# Reading the two headers straight off the raw headers table (see raw_delay_headers): the integer types as
# protocol/properties.py decodes them, the sizes of the other fixed-size values, and which slot a key fills.
_RAW_INTS = {ord(t): struct.Struct(f) for t, f in (("b", ">b"), ("B", ">B"), ("s", ">h"), ("u", ">H"), ("U", ">h"),
                                                    ("I", ">i"), ("i", ">I"), ("l", ">q"), ("L", ">q"))}
_RAW_SIZES = {ord(t): n for t, n in (("t", 1), ("f", 4), ("d", 8), ("T", 8), ("D", 5), ("V", 0))}
_RAW_LENGTH_PREFIXED = (ord("S"), ord("x"))
_RAW_KEYS = {X_DELIVER_AT.encode(): 0, X_DELAY.encode(): 1}
_U32 = struct.Struct(">I")


def raw_delay_headers(header: bytes, span: tuple[int, int] | None) -> tuple[Any, Any] | None:
    """``(x-deliver-at, x-delay)`` (None: absent) read off the content header's raw headers table at ``span``
    (as ``scan_properties`` found it) without decoding the whole table, when that gives what decoding it
    would (the last entry of a key wins, as in the decoded dict): every entry well-formed and not a table or
    an array, and the two keys, if present, integers. None otherwise: decode the table (``Message.headers``)
    and use :func:`due_time`, which also raises what a malformed table raises."""
    if span is None:
        return None, None
    start, end = span
    if start + 4 > end or start + 4 + _U32.unpack_from(header, start)[0] != end:
        return None
    found: list[Any] = [None, None]
    pos = start + 4
    while pos < end:
        key_end = pos + 1 + header[pos]
        if key_end >= end:
            return None
        slot = _RAW_KEYS.get(header[pos + 1:key_end])
        kind = header[key_end]
        pos = key_end + 1
        fmt = _RAW_INTS.get(kind)
        if fmt is not None:
            stop = pos + fmt.size
            if stop > end:
                return None
            if slot is not None:
                found[slot] = fmt.unpack_from(header, pos)[0]
        elif slot is not None:
            return None  # a delay header of another type: the ordinary way
        else:
            size = _RAW_SIZES.get(kind)
            if size is not None:
                stop = pos + size
            elif kind in _RAW_LENGTH_PREFIXED:
                if pos + 4 > end:
                    return None
                stop = pos + 4 + _U32.unpack_from(header, pos)[0]
            else:
                return None  # a table, an array or an unknown type
            if stop > end:
                return None
        pos = stop
    return found[0], found[1]


def delivered_header(header: bytes, delay_ms: int) -> bytes:
    """The content header of a message let go after ``delay_ms``: ``x-delay`` set to ``-delay_ms`` (a long)."""
    return with_properties(header, headers_set={X_DELAY: Long(-delay_ms)})
