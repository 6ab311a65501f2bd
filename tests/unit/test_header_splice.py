"""protocol/properties.py's with_long_header (a stream delivery's ``x-stream-offset``, spliced into the raw
content header) and with_longstr_header (the firehose's ``x-leveret-trace-id``) against with_properties, the decode-and-rebuild it replaces: the same bytes for any
well-formed header, whatever properties it has, whether it has a headers table, and whether the publisher
already set the key (the broker's value wins, as it did).

The headers are built with build_content_header, which has a compiled twin: every test runs twice, through the
``codec`` fixture (the pure-Python and the compiled build_content_header; tests/unit/protocol/codec_impls.py).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.fastcodec import shortstr
from protocol.frames import FrameError
from protocol.properties import (
    Long,
    decode_properties,
    encode_field_value,
    with_long_header,
    with_longstr_header,
    with_properties,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / "protocol"))
import codec_impls
from codec_impls import Codec


@pytest.fixture(scope="module", params=codec_impls.NAMES)
def codec(request: pytest.FixtureRequest) -> Codec:
    return codec_impls.get(request.param)


KEY = b"x-stream-offset"
KEY_RAW = shortstr(KEY)
# (flag bit, kind) in wire order: s = short string, t = table, o = octet, q = timestamp.
FIELDS = [(1 << 15, "s"), (1 << 14, "s"), (1 << 13, "t"), (1 << 12, "o"), (1 << 11, "o"), (1 << 10, "s"),
          (1 << 9, "s"), (1 << 8, "s"), (1 << 7, "s"), (1 << 6, "q"), (1 << 5, "s"), (1 << 4, "s"),
          (1 << 3, "s"), (1 << 2, "s")]

values = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=20), st.binary(max_size=20),
                   st.floats(allow_nan=False), st.none(), st.builds(Long, st.integers(-2**63, 2**63 - 1)),
                   st.lists(st.integers(-100, 100), max_size=3),
                   st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=2))
keys = st.one_of(st.sampled_from([KEY, b"x-stream-offset2", b"a-x-stream-offset", b"CC", b""]),
                 st.binary(max_size=12))
entries = st.lists(st.tuples(keys, values), max_size=6)
offsets = st.integers(0, 2**63 - 1)


@st.composite
def headers(draw: st.DrawFn, build_content_header: Callable[[int, bytes], bytes]) -> bytes:
    """A content header with a random choice of properties (short strings of any bytes), its headers table
    (if any) built entry by entry (duplicate keys and the key itself included), and sometimes extra bytes
    after the property list or flag bit 0-1 set."""
    flags = 0
    parts = []
    for bit, kind in FIELDS:
        if not draw(st.booleans()):
            continue
        flags |= bit
        if kind == "s":
            parts.append(shortstr(draw(st.binary(max_size=30))))
        elif kind == "o":
            parts.append(bytes([draw(st.integers(0, 255))]))
        elif kind == "q":
            parts.append(struct.pack(">Q", draw(st.integers(0, 2**64 - 1))))
        else:
            body = b"".join(shortstr(k) + encode_field_value(v) for k, v in draw(entries))
            parts.append(struct.pack(">I", len(body)) + body)
    flags |= draw(st.sampled_from([0, 0, 0, 1, 2]))
    trailing = draw(st.sampled_from([b"", b"", b"\x00", b"junk"]))
    return build_content_header(draw(st.integers(0, 2**40)), struct.pack(">H", flags) + b"".join(parts)) + trailing


def rebuilt(header: bytes, offset: int) -> bytes:
    """What a stream delivery did before: every property decoded, the header set, encoded again."""
    return with_properties(header, headers_set={"x-stream-offset": Long(offset)})


@settings(max_examples=300, deadline=None)  # per codec twin; the long lane fuzzes the codec with 1 M inputs
@given(st.data(), offsets)
def test_splice_is_byte_for_byte_the_rebuilt_header(codec: Codec, data: st.DataObject, offset: int) -> None:
    header = data.draw(headers(codec.fc.build_content_header), label="header")
    assert with_long_header(header, KEY_RAW, offset) == rebuilt(header, offset)


@settings(max_examples=300, deadline=None)
@given(st.data(), offsets)
def test_the_brokers_value_wins_and_the_rest_is_kept(codec: Codec, data: st.DataObject, offset: int) -> None:
    header = data.draw(headers(codec.fc.build_content_header), label="header")
    out = with_long_header(header, KEY_RAW, offset)
    before, after = decode_properties(header), decode_properties(out)
    assert after.headers[KEY.decode()] == offset
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id", "cluster_id"):
        assert getattr(after, name) == getattr(before, name), name
    old = dict(before.headers or {})
    old.pop(KEY.decode(), None)
    new = dict(after.headers)
    new.pop(KEY.decode())
    assert new == old
    assert out[:12] == header[:12]  # class, weight, body size


def test_no_properties_gets_a_one_entry_table(codec: Codec) -> None:
    header = codec.fc.build_content_header(5, b"\x00\x00")
    out = with_long_header(header, KEY_RAW, 7)
    assert out == header[:12] + b"\x20\x00" + struct.pack(">I", 25) + KEY_RAW + b"l" + struct.pack(">q", 7)


def test_a_publishers_own_offset_header_is_overwritten_in_place(codec: Codec) -> None:
    table = shortstr(b"a") + b"t\x01" + KEY_RAW + b"S" + struct.pack(">I", 3) + b"bad" + KEY_RAW + b"I\x00\x00\x00\x01"
    header = codec.fc.build_content_header(0, b"\x20\x00" + struct.pack(">I", len(table)) + table)
    out = with_long_header(header, KEY_RAW, 42)
    expected = shortstr(b"a") + b"t\x01" + KEY_RAW + b"l" + struct.pack(">q", 42)
    assert out == header[:14] + struct.pack(">I", len(expected)) + expected


def test_malformed_table_gets_the_entry_appended(codec: Codec) -> None:
    """Publishing does not check header tables (RabbitMQ does not either); delivery must not fail on one."""
    table = b"\x03abcZ"  # an unknown field type
    header = codec.fc.build_content_header(0, b"\x30\x00" + struct.pack(">I", len(table)) + table + b"\x02")
    out = with_long_header(header, KEY_RAW, 1)
    entry = KEY_RAW + b"l" + struct.pack(">q", 1)
    assert out == header[:14] + struct.pack(">I", len(table) + len(entry)) + table + entry + b"\x02"
    with pytest.raises(FrameError):
        rebuilt(header, 1)


@pytest.mark.parametrize("payload", [b"\x80\x00\x05ab", b"\x20\x00\x00\x00\x00\x09ab", b"\x10\x00", b"\x00"])
def test_a_cut_property_list_raises_as_before(codec: Codec, payload: bytes) -> None:
    header = codec.fc.build_content_header(0, b"")[:12] + payload
    with pytest.raises(FrameError):
        rebuilt(header, 1)
    with pytest.raises(FrameError):
        with_long_header(header, KEY_RAW, 1)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.binary(max_size=40))
def test_a_long_string_splice_is_byte_for_byte_the_rebuilt_header(codec: Codec, data: st.DataObject,
                                                                   value: bytes) -> None:
    header = data.draw(headers(codec.fc.build_content_header), label="header")
    assert with_longstr_header(header, KEY_RAW, value) == with_properties(header, headers_set={KEY.decode(): value})
