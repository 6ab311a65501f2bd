"""Message properties kept as the raw bytes of the content header, decoded only as far as needed.

A content header payload is ``class_id(2) weight(2) body_size(8) flags(2) property list``. The broker
routes and delivers most messages without looking at the property list at all; when it needs a few
fields (persistence, expiry, priority, reply-to, user-id, headers for a headers exchange) it calls
:func:`scan_properties`, which walks the list skipping what it does not need. Rewriting a property
(direct reply-to, dead-lettering) goes through pamqp, off the hot path.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, decode

from protocol.fastcodec import build_content_header
from protocol.frames import FrameError

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_PROPS_OFFSET = 14  # class, weight, body size, flags

# Flag bit → (name, kind) in wire order. Kinds: s = short string, t = table, o = octet, q = timestamp.
_FIELDS = (
    (1 << 15, "content_type", "s"),
    (1 << 14, "content_encoding", "s"),
    (1 << 13, "headers", "t"),
    (1 << 12, "delivery_mode", "o"),
    (1 << 11, "priority", "o"),
    (1 << 10, "correlation_id", "s"),
    (1 << 9, "reply_to", "s"),
    (1 << 8, "expiration", "s"),
    (1 << 7, "message_id", "s"),
    (1 << 6, "timestamp", "q"),
    (1 << 5, "type", "s"),
    (1 << 4, "user_id", "s"),
    (1 << 3, "app_id", "s"),
    (1 << 2, "cluster_id", "s"),
)


class ScannedProperties:
    """The few properties the broker acts on. ``headers_span`` locates the raw headers table, if any."""

    __slots__ = ("delivery_mode", "priority", "expiration", "reply_to", "user_id", "headers_span")

    def __init__(self) -> None:
        self.delivery_mode = 0
        self.priority = 0
        self.expiration: str | None = None
        self.reply_to: str | None = None
        self.user_id: str | None = None
        self.headers_span: tuple[int, int] | None = None


def scan_properties(header_payload: bytes) -> ScannedProperties:
    """Read delivery mode, priority, expiration, reply-to, user-id and where the headers table is."""
    out = ScannedProperties()
    try:
        flags = _U16.unpack_from(header_payload, 12)[0]
        if not flags:
            return out
        pos = _PROPS_OFFSET
        for bit, name, kind in _FIELDS:
            if not flags & bit:
                continue
            if kind == "s":
                n = header_payload[pos]
                if name == "expiration" or name == "reply_to" or name == "user_id":
                    setattr(out, name, header_payload[pos + 1 : pos + 1 + n].decode())
                pos += 1 + n
            elif kind == "o":
                setattr(out, name, header_payload[pos])
                pos += 1
            elif kind == "t":
                n = _U32.unpack_from(header_payload, pos)[0]
                out.headers_span = (pos, pos + 4 + n)
                pos += 4 + n
            else:
                pos += 8
        if pos > len(header_payload):
            raise FrameError("content header properties run past the frame")
    except (IndexError, struct.error, UnicodeDecodeError):
        raise FrameError("malformed content header properties") from None
    return out


def decode_headers(header_payload: bytes, span: tuple[int, int] | None) -> dict[str, Any]:
    """The headers table located by :func:`scan_properties`, decoded (empty if absent)."""
    if span is None:
        return {}
    try:
        return decode.field_table(header_payload[span[0] : span[1]])[1]
    except Exception:  # pamqp raises a variety of errors on malformed tables
        raise FrameError("malformed headers table in content header") from None


def decode_properties(header_payload: bytes) -> commands.Basic.Properties:
    """Every property, decoded by pamqp (off the hot path)."""
    props = commands.Basic.Properties()
    try:
        flags = _U16.unpack_from(header_payload, 12)[0]
        props.unmarshal(flags, header_payload[_PROPS_OFFSET:])
    except Exception:
        raise FrameError("malformed content header properties") from None
    return props


def body_size_of(header_payload: bytes) -> int:
    return struct.unpack_from(">Q", header_payload, 4)[0]


def with_properties(header_payload: bytes, **changes: Any) -> bytes:
    """A new content header payload with some properties replaced (``None`` removes one)."""
    props = decode_properties(header_payload)
    for name, value in changes.items():
        setattr(props, name, value)
    return build_content_header(body_size_of(header_payload), props.marshal())
