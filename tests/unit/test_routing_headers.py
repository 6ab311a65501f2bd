"""The raw-table readers behind CC / BCC (protocol.properties: table_values, array_long_strings,
field_type_name): RabbitMQ's ``header_routes`` takes the first entry of a key, only the long strings of
its array, and names a wrong type by its AMQP field type."""

from __future__ import annotations

import struct

import pytest

from protocol.frames import FrameError
from protocol.properties import FIELD_TYPE_NAMES, array_long_strings, field_type_name, table_values


def _entry(key: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + value


def _long(kind: bytes, raw: bytes) -> bytes:
    return kind + struct.pack(">I", len(raw)) + raw


def _table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def test_first_entry_of_each_key_counts() -> None:
    cc1 = _long(b"A", _long(b"S", b"a"))
    cc2 = _long(b"A", _long(b"S", b"b"))
    table = _table(_entry(b"x", b"t\x01"), _entry(b"CC", cc1), _entry(b"CC", cc2))
    spans = table_values(table, 0, len(table), (b"CC", b"BCC"))
    assert list(spans) == [b"CC"]
    start, end = spans[b"CC"]
    assert table[start:end] == cc1


def test_only_long_string_elements_are_taken_in_order() -> None:
    array = _long(b"A", _long(b"S", b"k1") + b"I\x00\x00\x00\x07" + _long(b"x", b"bin")
                  + _long(b"A", _long(b"S", b"nested")) + _long(b"S", b"k2") + b"V")
    assert array_long_strings(array, 0, len(array)) == [b"k1", b"k2"]
    empty = _long(b"A", b"")
    assert array_long_strings(empty, 0, len(empty)) == []


def test_a_malformed_table_is_a_frame_error() -> None:
    table = _table(_entry(b"CC", b"A\x00\x00\x00\x09"))  # the array claims more octets than there are
    with pytest.raises(FrameError):
        table_values(table, 0, len(table), (b"CC",))


@pytest.mark.parametrize(("kind", "name"), [(b"S", "longstr"), (b"I", "signedint"), (b"i", "unsignedint"),
                                            (b"l", "long"), (b"t", "bool"), (b"F", "table"), (b"x", "binary"),
                                            (b"D", "decimal"), (b"T", "timestamp"), (b"V", "void")])
def test_field_types_have_rabbitmqs_names(kind: bytes, name: str) -> None:
    assert field_type_name(kind[0]) == name


def test_every_known_type_is_named_and_no_name_is_a_python_type() -> None:
    assert set(FIELD_TYPE_NAMES) == set(b"STbBsuUIidflLtDFAxV")
    # ("float" is RabbitMQ's own name for 'f', a 32-bit float.)
    assert not {"str", "int", "bytes", "bytearray", "dict", "list", "NoneType"} & set(FIELD_TYPE_NAMES.values())
