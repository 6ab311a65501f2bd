"""pyspark_leveret/field_table.py against pamqp, the codec it stands in for: every table pamqp encodes decodes to
what pamqp's own decoder gives, ``keys`` keeps exactly those entries, and broken tables are refused."""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import encode
from pamqp.decode import field_table
from pyspark_leveret.field_table import FieldTableError, decode_table

# Values pamqp encodes and decodes back: integers of every width it picks, text (and text that is not UTF-8,
# which stays bytes), booleans, floats, decimals, timestamps in seconds, byte arrays, void, and nesting.
_SCALARS = st.one_of(
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.text(max_size=20),
    st.booleans(),
    st.floats(allow_nan=False, width=32),  # pamqp writes floats as f (single precision)
    st.decimals(min_value=-1000, max_value=1000, places=2, allow_nan=False, allow_infinity=False),
    st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2100, 1, 1),
                 timezones=st.just(datetime.UTC)).map(lambda d: d.replace(microsecond=0)),
    st.binary(max_size=10).map(bytearray),
    st.none(),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=4)),
    max_leaves=12)
_TABLES = st.dictionaries(st.text(min_size=1, max_size=12), _VALUES, max_size=8)


@settings(max_examples=300, deadline=None)
@given(_TABLES)
def test_every_table_decodes_as_pamqp_decodes_it(table):
    raw = encode.field_table(table)
    expected = field_table(raw)[1]
    got, end = decode_table(raw, 0)
    assert got == expected
    assert end == len(raw)
    # Inside a larger buffer, at an offset, from a bytearray or a memoryview: the same.
    framed = bytearray(b"\x01\x02\x03" + raw + b"\xce")
    assert decode_table(framed, 3) == (expected, 3 + len(raw))
    assert decode_table(memoryview(framed), 3)[0] == expected


@settings(max_examples=200, deadline=None)
@given(_TABLES, st.data())
def test_keys_keep_exactly_those_entries(table, data):
    keys = data.draw(st.sets(st.sampled_from(sorted(table) + ["absent"])))
    raw = encode.field_table(table)
    got, end = decode_table(raw, 0, keys)
    assert got == {k: v for k, v in field_table(raw)[1].items() if k in keys}
    assert end == len(raw)


def test_the_kinds_pamqp_does_not_write_decode_as_pamqp_reads_them():
    """RabbitMQ writes kinds pamqp's encoder never picks: unsigned bytes, shorts and ints, an unsigned long
    long (L), a byte array (x), void (V), a float (f); each gives pamqp's value, and steps over when skipped."""
    entries = [(b"B", b"\xff"), (b"u", struct.pack(">H", 65535)), (b"i", struct.pack(">I", 4_000_000_000)),
               (b"L", struct.pack(">q", -5)), (b"x", struct.pack(">I", 3) + b"\x00\x01\x02"), (b"V", b""),
               (b"f", struct.pack(">f", 1.5)), (b"D", b"\x02" + struct.pack(">I", 12345)),
               (b"T", struct.pack(">Q", 1_700_000_000)), (b"s", struct.pack(">h", -2))]
    body = b"".join(bytes([1]) + bytes([ord("a") + i]) + kind + value for i, (kind, value) in enumerate(entries))
    raw = struct.pack(">I", len(body)) + body
    expected = field_table(raw)[1]
    assert decode_table(raw, 0)[0] == expected
    assert expected["b"] == 65535 and expected["d"] == -5 and expected["f"] is None
    assert expected["h"] == decimal.Decimal("123.45")
    assert decode_table(raw, 0, {"j"}) == ({"j": -2}, len(raw))


@pytest.mark.parametrize("raw, why", [
    (struct.pack(">I", 10) + b"\x01a", "length exceeds"),  # the table claims more than there is
    (struct.pack(">I", 3) + b"\x01aZ", "unknown field value kind"),
    (struct.pack(">I", 2) + b"\x01a", "has no value"),
    (struct.pack(">I", 7) + b"\x01aS" + struct.pack(">I", 9), "exceeds its table"),  # a string past the end
    (struct.pack(">I", 4) + b"\x01al\x00", "exceeds its table"),  # half an integer
])
def test_a_broken_table_is_refused(raw, why):
    with pytest.raises(FieldTableError, match=why):
        decode_table(raw, 0)
    with pytest.raises(FieldTableError):
        decode_table(raw, 0, {"other"})  # stepping over a broken value fails too
