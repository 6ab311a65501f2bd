"""Message properties kept as the raw bytes of the content header, decoded only as far as needed.

A content header payload is ``class_id(2) weight(2) body_size(8) flags(2) property list``. The broker
routes and delivers most messages without looking at the property list at all; when it needs a few
fields (persistence, expiry, priority, reply-to, user-id, headers for a headers exchange) it calls
:func:`scan_properties`, which walks the list skipping what it does not need. Rewriting properties
(direct reply-to, dead-lettering) goes through :func:`with_properties`, which splices raw bytes: the
properties and header entries it is not asked to change are copied byte for byte, never decoded and
re-encoded (a round trip through pamqp turns doubles into floats, millisecond timestamps into seconds,
binary long strings into errors and cuts long keys).
"""

from __future__ import annotations

import calendar
import datetime
import decimal as _decimal
import struct
import time
from collections.abc import Iterable
from typing import Any

from pamqp import commands, encode

from protocol.fastcodec import build_content_header
from protocol.frames import FrameError

__all__ = [
    "FIELD_TYPE_NAMES",
    "MAX_TABLE_DEPTH",
    "ScannedProperties",
    "TableTooDeep",
    "array_long_strings",
    "body_size_of",
    "build_content_header",
    "check_field_table",
    "check_nesting",
    "decode_field_table",
    "decode_headers",
    "decode_properties",
    "delivery_mode_of",
    "encode_field_table",
    "encode_field_value",
    "field_table_entries",
    "field_type_name",
    "scan_properties",
    "table_values",
    "with_long_header",
    "with_properties",
]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_DOUBLE = struct.Struct(">d")
_PROPS_OFFSET = 14  # class, weight, body size, flags

# Flag bit → (name, kind) in wire order. Kinds: s = short string, t = table, o = octet, q = timestamp.
# Names are pamqp's ``Basic.Properties`` attribute names (the ``type`` property is ``message_type``).
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
    (1 << 5, "message_type", "s"),
    (1 << 4, "user_id", "s"),
    (1 << 3, "app_id", "s"),
    (1 << 2, "cluster_id", "s"),
)
_KINDS = {name: kind for _, name, kind in _FIELDS}
PROPERTY_FIELDS = _FIELDS  # (flag bit, pamqp name, kind) in wire order, for readers of the raw list


class ScannedProperties:
    """The few properties the broker acts on. ``headers_span`` locates the raw headers table, if any."""

    __slots__ = ("delivery_mode", "expiration", "headers_span", "priority", "reply_to", "user_id")

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


_HEADERS_FLAG = 1 << 13
_DELIVERY_MODE_FLAG = 1 << 12
# The fields around the delivery mode, as (flag bit, size kind): the two short strings before it (with the
# headers table absent, all that may come before it) and everything after it.
_BEFORE_MODE = tuple((bit, kind) for bit, _, kind in _FIELDS if bit > _HEADERS_FLAG)
_AFTER_MODE = tuple((bit, kind) for bit, _, kind in _FIELDS if bit < _DELIVERY_MODE_FLAG)
_AFTER_MODE_FLAGS = sum(bit for bit, _ in _AFTER_MODE)


def delivery_mode_of(header_payload: bytes, flags: int) -> int:
    """The delivery mode of a content header whose headers table is absent (``flags``: its property flags),
    stepping over the other properties by their lengths without decoding any: a persistent publish without
    headers needs nothing else, where :func:`scan_properties` decodes (a third of basic.publish's property
    checks in S3). Raises :class:`FrameError` where :func:`scan_properties` would: a property list that runs
    past the frame (the short strings it decodes, reply-to, expiration and user-id, are for a caller that
    needs them to read through it). 0 when the flag is not set."""
    if flags & _HEADERS_FLAG:
        raise ValueError("delivery_mode_of: the headers table comes before the delivery mode; scan instead")
    pos = _PROPS_OFFSET
    mode = 0
    try:
        for bit, _kind in _BEFORE_MODE:
            if flags & bit:
                pos += 1 + header_payload[pos]
        if flags & _DELIVERY_MODE_FLAG:
            mode = header_payload[pos]
            pos += 1
        for bit, kind in _AFTER_MODE if flags & _AFTER_MODE_FLAGS else ():
            if flags & bit:
                pos += 1 + header_payload[pos] if kind == "s" else 1 if kind == "o" else 8
    except IndexError:
        raise FrameError("malformed content header properties") from None
    if pos > len(header_payload):
        raise FrameError("content header properties run past the frame")
    return mode


# -- field tables, raw ---------------------------------------------------------------------------------------

# Field value type octet → size of the value after it, for the fixed-size types (RabbitMQ's reading of the
# 0-9-1 table types: 's' is a signed 16-bit integer, not a short string; 'x' is a byte array).
_FIXED_SIZES = {ord(t): n for t, n in (("t", 1), ("b", 1), ("B", 1), ("s", 2), ("u", 2), ("U", 2),
                                        ("I", 4), ("i", 4), ("f", 4), ("L", 8), ("l", 8), ("d", 8),
                                        ("T", 8), ("D", 5), ("V", 0))}
_LONG_STRING, _BYTE_ARRAY, _ARRAY, _TABLE = ord("S"), ord("x"), ord("A"), ord("F")
# How deep tables and arrays may nest inside a field table (the table itself is level 0, a table in one of
# its values level 1, ...). Deeper is refused rather than risking a RecursionError in whatever decodes it
# later: the headers exchange, dead-lettering, the HTTP API. The one limit of the broker: method
# arguments past it are a frame error (501), message headers past it are refused at publish (406).
MAX_TABLE_DEPTH = 100
# A table or array at level MAX_TABLE_DEPTH + 1 is the innermost of MAX_TABLE_DEPTH + 1 nested values, each
# with a type octet ('F' or 'A') and a 4-byte length, the outermost under a key: a smaller table, or one
# with fewer 'F' and 'A' octets, cannot be too deep.
_TOO_DEEP_MIN_SIZE = 4 + 1 + 5 * (MAX_TABLE_DEPTH + 1)
_NOT_NESTING_TYPES = bytes(b for b in range(256) if b not in b"FA")  # deleted, what is left is counted


class TableTooDeep(FrameError):
    """A well-formed field table whose tables and arrays nest deeper than :data:`MAX_TABLE_DEPTH`."""


def _value_end(buf: bytes, pos: int, end: int, depth: int) -> int:
    """End of the field value (type octet + value) at ``pos``, which must lie within ``end``."""
    if pos >= end:
        raise FrameError("field value runs past its table")
    kind = buf[pos]
    pos += 1
    size = _FIXED_SIZES.get(kind)
    if size is not None:
        pos += size
    elif kind == _LONG_STRING or kind == _BYTE_ARRAY or kind == _ARRAY or kind == _TABLE:
        if pos + 4 > end:
            raise FrameError("field value length runs past its table")
        inner = pos + 4
        pos = inner + _U32.unpack_from(buf, pos)[0]
        if pos > end:
            raise FrameError("field value runs past its table")
        if kind == _ARRAY or kind == _TABLE:
            if depth >= MAX_TABLE_DEPTH:
                raise TableTooDeep(f"field tables and arrays nested more than {MAX_TABLE_DEPTH} levels deep")
            if kind == _TABLE:
                _entries(buf, inner, pos, depth + 1, None)
            else:
                while inner < pos:
                    inner = _value_end(buf, inner, pos, depth + 1)
    else:
        raise FrameError(f"unknown field value type {bytes([kind])!r}")
    if pos > end:
        raise FrameError("field value runs past its table")
    return pos


def _entries(buf: bytes, pos: int, end: int, depth: int,
             out: list[tuple[bytes, int, int]] | None) -> None:
    """Walk the entries of a table body ``buf[pos:end]``; append (key, start, end) of each to ``out``."""
    while pos < end:
        start = pos
        key_end = pos + 1 + buf[pos]
        if key_end > end:
            raise FrameError("field table key runs past its table")
        pos = _value_end(buf, key_end, end, depth)
        if out is not None:
            out.append((buf[start + 1 : key_end], start, pos))


def field_table_entries(buf: bytes, start: int = 0, end: int | None = None) -> list[tuple[bytes, int, int]]:
    """The entries of the field table (4-byte length included) that fills ``buf[start:end]``.

    Each entry is ``(raw key, entry start, entry end)``; ``buf[entry start:entry end]`` is the whole entry
    (short-string key, type octet, value), ready to be copied into another table. Every value is checked
    down to nested tables and arrays; anything malformed or cut raises :class:`FrameError`.
    """
    end = len(buf) if end is None else end
    if start + 4 > end or start + 4 + _U32.unpack_from(buf, start)[0] != end:
        raise FrameError("field table length does not match its bytes")
    out: list[tuple[bytes, int, int]] = []
    _entries(buf, start + 4, end, 0, out)
    return out


def check_field_table(buf: bytes, start: int = 0, end: int | None = None) -> None:
    """Raise :class:`FrameError` unless ``buf[start:end]`` is exactly one well-formed field table."""
    end = len(buf) if end is None else end
    if start + 4 > end or start + 4 + _U32.unpack_from(buf, start)[0] != end:
        raise FrameError("field table length does not match its bytes")
    _entries(buf, start + 4, end, 0, None)


# RabbitMQ's names of the field value types (rabbit_binary_parser), which its reply texts show, e.g.
# ``{unacceptable_type_in_header,"CC",longstr}``. 'U' is not RabbitMQ's; read here as a signed short.
FIELD_TYPE_NAMES: dict[int, str] = {ord(t): n for t, n in (
    ("S", "longstr"), ("T", "timestamp"), ("b", "byte"), ("B", "unsignedbyte"), ("s", "short"),
    ("u", "unsignedshort"), ("U", "short"), ("I", "signedint"), ("i", "unsignedint"), ("d", "double"),
    ("f", "float"), ("l", "long"), ("L", "long"), ("t", "bool"), ("D", "decimal"), ("F", "table"),
    ("A", "array"), ("x", "binary"), ("V", "void"))}


def amqp_type_name(value: Any) -> str:
    """The AMQP field type of a decoded value, by RabbitMQ's names (its reply texts say
    ``{unacceptable_type,longstr}``, never a Python type). Widths are not kept by decoding: an integer is
    named ``long`` (what clients send for a Python or Java long)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, (str, bytes, bytearray)):
        return "longstr"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    if value is None:
        return "void"
    name = type(value).__name__
    return {"Decimal": "decimal", "datetime": "timestamp", "struct_time": "timestamp"}.get(name, name)


def field_type_name(kind: int) -> str:
    """RabbitMQ's name of the field value type octet ``kind`` (never a Python type name)."""
    return FIELD_TYPE_NAMES.get(kind) or f"unknown type {bytes([kind])!r}"


def table_values(buf: bytes, start: int, end: int, keys: tuple[bytes, ...]) -> dict[bytes, tuple[int, int]]:
    """For each of ``keys`` present in the field table ``buf[start:end]`` (4-byte length included): the
    span of its value, type octet first. The first entry of a key counts, as RabbitMQ's
    ``table_lookup`` has it. Malformed tables raise :class:`FrameError`."""
    out: dict[bytes, tuple[int, int]] = {}
    for key, entry_start, entry_end in field_table_entries(buf, start, end):
        if key in keys and key not in out:
            out[key] = (entry_start + 1 + len(key), entry_end)
    return out


def array_long_strings(buf: bytes, start: int, end: int) -> list[bytes]:
    """The long-string ('S') elements of the array value ``buf[start:end]`` (type octet 'A' first), in
    order; elements of other types are skipped, as RabbitMQ's ``header_routes`` skips them."""
    out: list[bytes] = []
    pos = start + 5
    while pos < end:
        stop = _value_end(buf, pos, end, 1)
        if buf[pos] == _LONG_STRING:
            out.append(buf[pos + 5 : stop])
        pos = stop
    return out


# -- field tables, decoded -----------------------------------------------------------------------------------

_UTC = datetime.UTC
_I32 = struct.Struct(">i")
_DECIMAL_TEN = _decimal.Decimal(10)
_FIXED_DECODERS: dict[int, tuple[int, Any]] = {
    ord(t): (fmt.size, fmt.unpack_from) for t, fmt in (
        ("b", struct.Struct(">b")), ("B", struct.Struct(">B")), ("s", struct.Struct(">h")),
        ("u", struct.Struct(">H")), ("U", struct.Struct(">h")), ("I", struct.Struct(">i")),
        ("i", struct.Struct(">I")), ("l", struct.Struct(">q")), ("L", struct.Struct(">q")),
        ("f", struct.Struct(">f")), ("d", _DOUBLE))
}
_BOOLEAN, _TIMESTAMP, _DECIMAL, _VOID = ord("t"), ord("T"), ord("D"), ord("V")


def _timestamp_value(seconds: int) -> datetime.datetime | int:
    """pamqp's reading of a timestamp (above 2**32 it takes milliseconds); one that no datetime can hold
    stays an int rather than failing the whole table."""
    try:
        return datetime.datetime.fromtimestamp(seconds / 1000.0 if seconds > 0xFFFFFFFF else seconds, tz=_UTC)
    except (OverflowError, OSError, ValueError):
        return seconds


def _decode_value(buf: bytes, pos: int, end: int, depth: int, strict_keys: bool) -> tuple[Any, int]:
    """(value, end of the value) for the field value (type octet first) at ``pos``, within ``end``."""
    if pos >= end:
        raise FrameError("field value runs past its table")
    kind = buf[pos]
    pos += 1
    fixed = _FIXED_DECODERS.get(kind)
    if fixed is not None:
        size, unpack = fixed
        if pos + size > end:
            raise FrameError("field value runs past its table")
        return unpack(buf, pos)[0], pos + size
    if kind == _LONG_STRING or kind == _BYTE_ARRAY or kind == _ARRAY or kind == _TABLE:
        if pos + 4 > end:
            raise FrameError("field value length runs past its table")
        inner = pos + 4
        stop = inner + _U32.unpack_from(buf, pos)[0]
        if stop > end:
            raise FrameError("field value runs past its table")
        if kind == _LONG_STRING:
            raw = buf[inner:stop]
            try:
                return raw.decode(), stop
            except UnicodeDecodeError:
                return raw, stop  # as pamqp has it: a long string need not be text
        if kind == _BYTE_ARRAY:
            return bytearray(buf[inner:stop]), stop
        if depth >= MAX_TABLE_DEPTH:
            raise TableTooDeep(f"field tables and arrays nested more than {MAX_TABLE_DEPTH} levels deep")
        if kind == _TABLE:
            return _decode_entries(buf, inner, stop, depth + 1, strict_keys), stop
        items = []
        while inner < stop:
            value, inner = _decode_value(buf, inner, stop, depth + 1, strict_keys)
            items.append(value)
        return items, stop
    if kind == _BOOLEAN:
        if pos + 1 > end:
            raise FrameError("field value runs past its table")
        return buf[pos] != 0, pos + 1
    if kind == _TIMESTAMP:
        if pos + 8 > end:
            raise FrameError("field value runs past its table")
        return _timestamp_value(_U64.unpack_from(buf, pos)[0]), pos + 8
    if kind == _DECIMAL:
        if pos + 5 > end:
            raise FrameError("field value runs past its table")
        # The value signed, as pamqp reads it (and writes it).
        return _decimal.Decimal(_I32.unpack_from(buf, pos + 1)[0]) * _DECIMAL_TEN ** -buf[pos], pos + 5
    if kind == _VOID:
        return None, pos
    raise FrameError(f"unknown field value type {bytes([kind])!r}")


def _decode_entries(buf: bytes, pos: int, end: int, depth: int, strict_keys: bool) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    while pos < end:
        key_end = pos + 1 + buf[pos]
        if key_end > end:
            raise FrameError("field table key runs past its table")
        raw_key = buf[pos + 1 : key_end]
        try:
            key: str | bytes = raw_key.decode()
        except UnicodeDecodeError:
            if strict_keys:
                raise FrameError(f"field table key {raw_key!r} is not UTF-8") from None
            key = raw_key
        out[key], pos = _decode_value(buf, key_end, end, depth, strict_keys)
    return out


def decode_field_table(buf: bytes, start: int = 0, end: int | None = None, *,
                       strict_keys: bool = False) -> dict[Any, Any]:
    """The field table (4-byte length included) that fills ``buf[start:end]``, decoded in one pass.

    The values are pamqp's (``decode.field_table``) for every table pamqp decodes, but in time linear in
    the size (pamqp copies the rest of the table at every value: a 128 KiB header of small values took
    seconds) and without failing where pamqp does on a well-formed table: a key that is not UTF-8 stays
    ``bytes`` (unless ``strict_keys``, for method arguments), a timestamp no datetime can hold stays an
    int, and 'U' is a signed 16-bit integer (the 0-9-1 spec's short-int). Malformed, cut or nested past
    :data:`MAX_TABLE_DEPTH` raises :class:`FrameError` (:class:`TableTooDeep` for the last).
    """
    end = len(buf) if end is None else end
    if start + 4 > end or start + 4 + _U32.unpack_from(buf, start)[0] != end:
        raise FrameError("field table length does not match its bytes")
    return _decode_entries(buf, start + 4, end, 0, strict_keys)


def check_nesting(buf: bytes, start: int, end: int) -> None:
    """Raise :class:`TableTooDeep` if the field table ``buf[start:end]`` (4-byte length included) nests
    tables or arrays more than :data:`MAX_TABLE_DEPTH` levels deep.

    Made for the publish path: a table too small, or with too few ``F``/``A`` octets, to hold that many
    nested values is passed without being walked (one C-level pass over its bytes, and none below
    ``_TOO_DEEP_MIN_SIZE``), so ordinary headers cost next to nothing. Only the nesting is checked: a malformed table is not refused here (RabbitMQ does not
    look at headers at publish either); whoever decodes it later copes with a :class:`FrameError`.
    """
    if end - start < _TOO_DEEP_MIN_SIZE or len(buf[start:end].translate(None, _NOT_NESTING_TYPES)) \
            <= MAX_TABLE_DEPTH:
        return
    try:
        check_field_table(buf, start, end)
    except TableTooDeep:
        raise
    except FrameError:
        pass


def _shortstr_bytes(value: str | bytes, what: str) -> bytes:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"{what} is {len(raw)} bytes, a short string holds at most 255")
    return bytes([len(raw)]) + raw


def _timestamp_seconds(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            value = value.replace(tzinfo=datetime.UTC)  # naive: UTC, as pamqp takes it
        seconds = int(value.timestamp())
    elif isinstance(value, time.struct_time):
        seconds = calendar.timegm(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        raise TypeError(f"timestamp must be a datetime, struct_time or int seconds, not {type(value)}")
    if not 0 <= seconds < 2**64:
        raise ValueError(f"timestamp {seconds} out of range")
    return seconds


def _table_body(entries: Iterable[tuple[Any, Any]]) -> bytes:
    return b"".join(_shortstr_bytes(key, "field table key") + encode_field_value(value)
                    for key, value in entries)


def _long(raw: bytes) -> bytes:
    return _U32.pack(len(raw)) + raw


def encode_field_table(table: dict[Any, Any]) -> bytes:
    """A field table (4-byte length first) with :func:`encode_field_value`'s types: unlike pamqp's
    encoder it takes ``bytes`` (pamqp's decoding of a long string that is not UTF-8), so a table decoded
    by pamqp can always be written back."""
    return _long(_table_body(table.items()))


class Long(int):
    """An integer to be written as a signed 64-bit 'l' field whatever its size, as RabbitMQ writes
    counters such as x-death's ``count`` and ``x-delivery-count`` (clients check the type)."""


_I64 = struct.Struct(">q")


def encode_field_value(value: Any) -> bytes:
    """One field value, type octet first, as RabbitMQ reads it.

    pamqp's encoders, except where they lose information: floats are written as doubles ('d', pamqp
    writes 32-bit 'f'), ``bytes`` as a long string ('S', pamqp refuses them), keys of nested tables are
    not cut at 128 bytes, and timestamps are unsigned 64-bit seconds.
    """
    if isinstance(value, bool):
        return b"t" + encode.boolean(value)
    if isinstance(value, Long):
        return b"l" + _I64.pack(value)
    if isinstance(value, int):
        return encode.table_integer(value)
    if isinstance(value, float):
        return b"d" + _DOUBLE.pack(value)
    if isinstance(value, str):
        return b"S" + _long(value.encode())
    if isinstance(value, bytes):
        return b"S" + _long(value)
    if isinstance(value, (bytearray, memoryview)):
        return b"x" + _long(bytes(value))
    if isinstance(value, _decimal.Decimal):
        return b"D" + encode.decimal(value)
    if isinstance(value, (datetime.datetime, time.struct_time)):
        return b"T" + _U64.pack(_timestamp_seconds(value))
    if isinstance(value, dict):
        return b"F" + _long(_table_body(value.items()))
    if isinstance(value, (list, tuple)):
        return b"A" + _long(b"".join(encode_field_value(v) for v in value))
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in a field table: {value!r}")


# -- the property list ---------------------------------------------------------------------------------------

def _property_spans(header_payload: bytes, check_headers: bool = True
                    ) -> tuple[int, dict[str, tuple[int, int]]]:
    """(flags, name → (start, end)) of each present property, every length checked against the payload.

    The headers table is checked entry by entry, down to nested values, unless ``check_headers`` is
    false (only its length is). Bytes after the last property are ignored (as pamqp and
    :func:`scan_properties` ignore them).
    """
    size = len(header_payload)
    if size < _PROPS_OFFSET:
        raise FrameError("content header shorter than its property flags")
    flags = _U16.unpack_from(header_payload, 12)[0]
    spans: dict[str, tuple[int, int]] = {}
    pos = _PROPS_OFFSET
    for bit, name, kind in _FIELDS:
        if not flags & bit:
            continue
        if kind == "s":
            if pos >= size:
                raise FrameError(f"content header cut before its {name} property")
            end = pos + 1 + header_payload[pos]
        elif kind == "o":
            end = pos + 1
        elif kind == "t":
            if pos + 4 > size:
                raise FrameError("content header cut inside its headers table length")
            end = pos + 4 + _U32.unpack_from(header_payload, pos)[0]
        else:
            end = pos + 8
        if end > size:
            raise FrameError(f"content header cut inside its {name} property")
        if kind == "t" and check_headers:
            check_field_table(header_payload, pos, end)
        spans[name] = (pos, end)
        pos = end
    return flags, spans


def property_spans(header_payload: bytes) -> dict[str, tuple[int, int]]:
    """pamqp name → (start, end) of each present property (a short string's span starts at its length octet, the
    headers table's at its 4-byte length), every length checked; the headers table's entries are not. A cut
    property list raises :class:`FrameError`."""
    return _property_spans(header_payload, check_headers=False)[1]


def decode_headers(header_payload: bytes, span: tuple[int, int] | None) -> dict[Any, Any]:
    """The headers table located by :func:`scan_properties`, decoded (empty if absent) by
    :func:`decode_field_table`; a malformed table raises :class:`FrameError`."""
    if span is None:
        return {}
    return decode_field_table(header_payload, span[0], span[1])


def decode_properties(header_payload: bytes, *, skip_headers: bool = False) -> commands.Basic.Properties:
    """Every property (off the hot path), as pamqp's ``Basic.Properties`` holds them, with pamqp's values
    wherever pamqp can decode the list. Where it cannot, this does not fail either: a short string that is
    not UTF-8 stays ``bytes``, and the headers table is read by :func:`decode_field_table`. A cut property
    list, or a malformed headers table, raises :class:`FrameError`; with ``skip_headers`` the headers
    are left out (None) instead of decoded, so the other properties of such a message can still be shown.
    """
    _flags, spans = _property_spans(header_payload, check_headers=False)
    props = commands.Basic.Properties()
    for _bit, name, kind in _FIELDS:
        span = spans.get(name)
        if span is None:
            continue
        start, end = span
        value: Any
        if kind == "s":
            raw = header_payload[start + 1 : end]
            try:
                value = raw.decode()
            except UnicodeDecodeError:
                value = raw
        elif kind == "o":
            value = header_payload[start]
        elif kind == "q":
            value = _timestamp_value(_U64.unpack_from(header_payload, start)[0])
        elif skip_headers:
            continue
        else:
            value = decode_field_table(header_payload, start, end)
        setattr(props, name, value)
    return props


def body_size_of(header_payload: bytes) -> int:
    size: int = struct.unpack_from(">Q", header_payload, 4)[0]
    return size


def _encode_property(name: str, kind: str, value: Any) -> bytes:
    if kind == "s":
        return _shortstr_bytes(value, name)
    if kind == "o":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"{name} must be an integer 0..255, not {value!r}")
        return bytes([value])
    if kind == "q":
        return _U64.pack(_timestamp_seconds(value))
    if not isinstance(value, dict):
        raise TypeError(f"headers must be a dict, not {type(value).__name__}")
    return _long(_table_body(value.items()))


def _key_bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


def with_properties(header_payload: bytes, *, headers_set: dict[str, Any] | None = None,
                    headers_remove: Iterable[str] = (), **changes: Any) -> bytes:
    """A new content header payload with some properties changed; the rest is copied byte for byte.

    ``changes`` maps property names (pamqp's: ``content_type``, ``content_encoding``, ``headers``,
    ``delivery_mode``, ``priority``, ``correlation_id``, ``reply_to``, ``expiration``, ``message_id``,
    ``timestamp``, ``message_type``, ``user_id``, ``app_id``, ``cluster_id``) to a new value, or to
    ``None`` (or ``""``, as pamqp has it) to remove the property. Short strings take ``str`` or ``bytes``;
    ``timestamp`` a datetime (naive = UTC) or int seconds, written as an unsigned 64-bit integer;
    ``headers`` a dict, replacing the whole table (``{}`` writes an empty table).

    ``headers_set`` / ``headers_remove`` edit the headers table entry by entry (applied after a
    ``headers`` replacement, if both are given): entries they do not name are copied raw; an entry set
    replaces the first entry with that key in place (later duplicates are dropped) or is appended; a key
    in both is set. Values are encoded by :func:`encode_field_value`. If editing leaves the table empty,
    the headers property is dropped.

    Class, weight and body size are kept; flag bits 0-1 (continuation, reserved) and bytes after the
    property list are dropped. A malformed or cut header raises :class:`FrameError`; a value that
    cannot be encoded raises TypeError or ValueError.
    """
    for name in changes:
        if name not in _KINDS:
            raise TypeError(f"with_properties() got an unknown property {name!r}")
    # A headers table replaced whole is not read, so a malformed one can be replaced.
    _flags, spans = _property_spans(header_payload, check_headers="headers" not in changes)
    removed = {_key_bytes(k) for k in headers_remove}
    edits = {_key_bytes(k): v for k, v in (headers_set or {}).items()}
    edit_headers = bool(removed or edits)

    out_flags = 0
    parts: list[bytes] = []
    for bit, name, kind in _FIELDS:
        if name == "headers" and edit_headers:
            raw: bytes | None = _edited_headers(header_payload, spans.get("headers"), changes, edits, removed)
        elif name in changes:
            value = changes[name]
            raw = None if value is None or (isinstance(value, (str, bytes)) and not value) \
                else _encode_property(name, kind, value)
        elif name in spans:
            start, end = spans[name]
            raw = header_payload[start:end]
        else:
            raw = None
        if raw is not None:
            out_flags |= bit
            parts.append(raw)
    return header_payload[:12] + _U16.pack(out_flags) + b"".join(parts)


def _edited_headers(header_payload: bytes, span: tuple[int, int] | None, changes: dict[str, Any],
                    edits: dict[bytes, Any], removed: set[bytes]) -> bytes | None:
    """The headers table after ``changes['headers']`` (if any), ``edits`` and ``removed``; None if empty."""
    if "headers" in changes:
        base = changes["headers"]
        if base is None:
            table, start, end = b"", 0, 0
        else:
            table = _encode_property("headers", "t", base)
            start, end = 0, len(table)
    elif span is not None:
        table, (start, end) = header_payload, span
    else:
        table, start, end = b"", 0, 0
    entries = field_table_entries(table, start, end) if end else []

    body: list[bytes] = []
    done: set[bytes] = set()
    for key, entry_start, entry_end in entries:
        if key in edits:
            if key not in done:
                done.add(key)
                body.append(_shortstr_bytes(key, "field table key") + encode_field_value(edits[key]))
        elif key not in removed:
            body.append(table[entry_start:entry_end])
    for key, value in edits.items():
        if key not in done:
            body.append(_shortstr_bytes(key, "field table key") + encode_field_value(value))
    if not body:
        return None
    return _long(b"".join(body))


# -- one header added on the deliver path ------------------------------------------------------------------

_FLAG_HEADERS = 1 << 13
_BEFORE_HEADERS = (1 << 15) | (1 << 14)  # content_type, content_encoding: short strings
# The properties after the headers table, in wire order (bit, size of a fixed one or 0 for a short string).
_AFTER_HEADERS = tuple((bit, 1 if kind == "o" else 8 if kind == "q" else 0) for bit, _name, kind in _FIELDS[3:])
_AFTER_HEADERS_MASK = sum(bit for bit, _size in _AFTER_HEADERS)
_OCTETS_ONLY = (1 << 12) | (1 << 11)  # delivery_mode, priority: the common tail, sized without a walk
_LONG_VALUE = struct.Struct(">cq")


def _property_list_end(header_payload: bytes, flags: int, pos: int) -> int:
    """Where the property list ends, walking the properties after the headers table from ``pos``."""
    tail = flags & _AFTER_HEADERS_MASK
    if not tail & ~_OCTETS_ONLY:
        return pos + (tail >> 12 & 1) + (tail >> 11 & 1)
    for bit, size in _AFTER_HEADERS:
        if tail & bit:
            pos += size or 1 + header_payload[pos]
    return pos


def with_long_header(header_payload: bytes, key_raw: bytes, value: int) -> bytes:
    """``with_properties(header_payload, headers_set={key: Long(value)})``, made for the deliver path (a
    stream's ``x-stream-offset`` on every delivery): the entry (``key_raw`` is the UTF-8 key as a short
    string, length octet included) is appended to the raw headers table, whose length is adjusted, or a one-entry
    table is inserted (and its flag set) when the message has none; every other byte is copied, nothing is
    decoded. The result is byte for byte what :func:`with_properties` gives a well-formed header.

    What the splice cannot do alike goes to :func:`with_properties`: the key already in the table (its entry
    is then replaced in place and later duplicates dropped, so the caller's value wins), flag bits 0-1 set,
    or a cut property list (which raises :class:`FrameError`, as there). Unlike there, the entries of the
    table are not checked: a malformed table gets the entry appended, after any entry of that key (a classic
    queue delivers such a message as it was published, too).
    """
    return _with_header_entry(header_payload, key_raw, _LONG_VALUE.pack(b"l", value), Long, value)


def with_longstr_header(header_payload: bytes, key_raw: bytes, value: bytes) -> bytes:
    """``with_properties(header_payload, headers_set={key: value})`` for a long string ('S') value, spliced as
    :func:`with_long_header` splices (the firehose's ``x-leveret-trace-id``, stamped on every traced publish).
    As there, a malformed headers table gets the entry appended where with_properties raises: a caller that
    must not change such a message checks the table first."""
    return _with_header_entry(header_payload, key_raw, b"S" + _U32.pack(len(value)) + value, bytes, value)


def _with_header_entry(header_payload: bytes, key_raw: bytes, value_raw: bytes, kind: type, value: Any) -> bytes:
    """The splice of :func:`with_long_header`: ``value_raw`` is the encoded field value (type octet first),
    ``kind(value)`` what :func:`encode_field_value` encodes to the same bytes (for the slow path)."""
    # Called once per message a stream appends (and per traced publish): the common shapes (no headers table,
    # or one without the key, and a tail of delivery mode / priority only) take a straight line; nothing of
    # the slow path is built unless it is taken.
    if len(header_payload) < _PROPS_OFFSET:
        return _with_header_slow(header_payload, key_raw, kind(value))
    flags = header_payload[12] << 8 | header_payload[13]
    if flags & 3:
        return _with_header_slow(header_payload, key_raw, kind(value))
    try:
        pos = _PROPS_OFFSET
        if flags & _BEFORE_HEADERS:
            if flags & (1 << 15):
                pos += 1 + header_payload[pos]
            if flags & (1 << 14):
                pos += 1 + header_payload[pos]
        if flags & _FLAG_HEADERS:
            table_end = pos + 4 + _U32.unpack_from(header_payload, pos)[0]
            tail = flags & _AFTER_HEADERS_MASK
            end = table_end + (tail >> 12 & 1) + (tail >> 11 & 1) if not tail & ~_OCTETS_ONLY \
                else _property_list_end(header_payload, flags, table_end)
            if end > len(header_payload):
                return _with_header_slow(header_payload, key_raw, kind(value))  # raises FrameError
            if header_payload.find(key_raw, pos + 4, table_end) >= 0:
                try:
                    return _with_header_slow(header_payload, key_raw, kind(value))
                except FrameError:
                    pass  # a malformed table: appended below, as to any other
            entry = key_raw + value_raw
            return b"".join((header_payload[:pos], _U32.pack(table_end - pos - 4 + len(entry)),
                             header_payload[pos + 4 : table_end], entry, header_payload[table_end:end]))
        tail = flags & _AFTER_HEADERS_MASK
        end = pos + (tail >> 12 & 1) + (tail >> 11 & 1) if not tail & ~_OCTETS_ONLY \
            else _property_list_end(header_payload, flags, pos)
        if end > len(header_payload):
            return _with_header_slow(header_payload, key_raw, kind(value))  # raises FrameError
        entry = key_raw + value_raw
        return b"".join((header_payload[:12], _U16.pack(flags | _FLAG_HEADERS), header_payload[14:pos],
                         _U32.pack(len(entry)), entry, header_payload[pos:end]))
    except (IndexError, struct.error):  # cut inside a short string's length or the table's length
        return _with_header_slow(header_payload, key_raw, kind(value))


def _with_header_slow(header_payload: bytes, key_raw: bytes, value: Any) -> bytes:
    """What the splice cannot do alike: decode and rebuild (:func:`with_properties`)."""
    return with_properties(header_payload, headers_set={key_raw[1:].decode(): value})