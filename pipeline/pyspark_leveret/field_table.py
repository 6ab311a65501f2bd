"""AMQP field tables decoded in place: the headers of every delivery a read hands to Spark.

Why not pamqp's ``decode.field_table``, which gives the same values (tests/pipeline/test_field_table.py checks
it on generated tables): it decodes every entry, and it slices the rest of the buffer for every value
(``value[offset:]``), so a table costs time in the square of its size. A trace event's headers (eleven entries
of 395 bytes, the message's properties as a nested table) took 22 µs there and 16–20 µs here (measured side by
side on one machine; the reader's whole cost per trace event went from 62–67 µs to 49 µs). The larger lever is
``keys`` (option ``headerKeys``): only the entries a reader asked for are decoded, the others are stepped over
by their length, compared as raw bytes before anything is decoded (8–9 µs for the six the traffic job reads;
its reader went to 26 µs a trace event).

This walks the table by offsets, decodes the common kinds (strings, integers, booleans, nested tables and
arrays) with precompiled structs, and hands the rare ones (decimal, timestamp, floats, byte arrays, void) to
pamqp's own function for that kind on a slice of just that value, so every value is what pamqp gives.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Collection
from typing import Any

from pamqp.decode import TABLE_MAPPING

_U32 = struct.Struct(">I")
_INTEGERS = {
    ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"), ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"), ord("I"): struct.Struct(">i"), ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">q"),  # pamqp reads L as signed, as RabbitMQ writes it
}
# The size of every kind that is not length-prefixed (those are S, x, A, F: a 4-byte length, then the data).
_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
          ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0, 0: 0}
_S, _A, _F, _T = ord("S"), ord("A"), ord("F"), ord("t")
_PREFIXED, _UNKNOWN = -1, -2
_SIZES = [_UNKNOWN] * 256  # by kind byte: its fixed size, or _PREFIXED (a 4-byte length first), or _UNKNOWN
for _kind, _size in _FIXED.items():
    _SIZES[_kind] = _size
for _kind in b"SxAF":
    _SIZES[_kind] = _PREFIXED


class FieldTableError(ValueError):
    """The bytes are not a field table (a length past the end, an unknown kind)."""


def decode_table(data: bytes | bytearray | memoryview, pos: int,
                 keys: Collection[str] | None = None) -> tuple[dict[str, Any], int]:
    """The table whose 4-byte length is at ``pos`` in ``data`` (only its ``keys`` entries when given), and the
    position after it."""
    end = pos + 4 + _U32.unpack_from(data, pos)[0]
    if end > len(data):
        raise FieldTableError("field table length exceeds the data")
    if type(data) is not bytes:  # a receive buffer: one copy of the table, so that every slice below is bytes
        return decode_table(bytes(data[pos:end]), 0, keys)[0], end
    pos += 4
    table: dict[str, Any] = {}
    wanted = None if keys is None else _raw_keys(frozenset(keys))
    sizes = _SIZES
    unpack = _U32.unpack_from
    while pos < end:
        n = data[pos]
        raw = data[pos + 1:pos + 1 + n]
        pos += 1 + n
        if pos >= end:
            raise FieldTableError(f"field table entry {raw!r} has no value")
        key: str | None
        if wanted is None:
            key = raw.decode("utf-8")
        else:
            key = wanted.get(raw)
            if key is None:  # stepped over: its size from its kind, or its 4-byte length (S, x, A, F)
                size = sizes[data[pos]]
                if size < 0:
                    if size == _UNKNOWN:
                        raise FieldTableError(f"unknown field value kind {data[pos:pos + 1]!r}")
                    size = 4 + unpack(data, pos + 1)[0]
                pos += 1 + size
                if pos > end:
                    raise FieldTableError("field value exceeds its table")
                continue
        if data[pos] == _S:  # the usual value, inline
            stop = pos + 5 + unpack(data, pos + 1)[0]
            if stop > end:
                raise FieldTableError("long string length exceeds its table")
            text = data[pos + 5:stop]
            try:
                table[key] = text.decode("utf-8")
            except UnicodeDecodeError:
                table[key] = text  # as pamqp: text that is not UTF-8 stays bytes
            pos = stop
        else:
            table[key], pos = _value(data, pos, end)
    if pos != end:
        raise FieldTableError("field table entries overrun its length")
    return table, end


@functools.lru_cache(maxsize=64)
def _raw_keys(keys: frozenset[str]) -> dict[bytes, str]:
    """The wanted keys as they are on the wire (compared before anything is decoded)."""
    return {k.encode("utf-8"): k for k in keys}


def _array(data: bytes | bytearray | memoryview, pos: int) -> tuple[list[Any], int]:
    end = pos + 4 + _U32.unpack_from(data, pos)[0]
    if end > len(data):
        raise FieldTableError("field array length exceeds the data")
    pos += 4
    values = []
    while pos < end:
        value, pos = _value(data, pos, end)
        values.append(value)
    if pos != end:
        raise FieldTableError("field array values overrun its length")
    return values, end


def _value(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[Any, int]:
    """The value whose kind byte is at ``pos`` (inside a table or array ending at ``end``)."""
    kind = data[pos]
    pos += 1
    if kind == _S:
        stop = pos + 4 + _U32.unpack_from(data, pos)[0]
        if stop > end:
            raise FieldTableError("long string length exceeds its table")
        raw = bytes(data[pos + 4:stop])
        try:
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            return raw, stop  # as pamqp: text that is not UTF-8 stays bytes
    integer = _INTEGERS.get(kind)
    if integer is not None:
        if pos + integer.size > end:
            raise FieldTableError("integer value exceeds its table")
        return integer.unpack_from(data, pos)[0], pos + integer.size
    if kind == _F or kind == _A:
        nested, stop = decode_table(data, pos) if kind == _F else _array(data, pos)
        if stop > end:
            raise FieldTableError("nested value exceeds its table")
        return nested, stop
    if kind == _T:
        if pos >= end:
            raise FieldTableError("boolean value exceeds its table")
        return bool(data[pos]), pos + 1
    size = _FIXED.get(kind)
    if size is None:
        if kind != ord("x"):
            raise FieldTableError(f"unknown field value kind {bytes([kind])!r}")
        size = 4 + _U32.unpack_from(data, pos)[0]
    if pos + size > end:
        raise FieldTableError("field value exceeds its table")
    _consumed, value = TABLE_MAPPING[bytes([kind])](bytes(data[pos:pos + size]))
    return value, pos + size
