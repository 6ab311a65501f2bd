"""Field tables decoded by protocol.properties (decode_field_table, decode_headers, decode_properties) and
the one nesting limit (MAX_TABLE_DEPTH, check_nesting): same values as pamqp wherever pamqp decodes a
table, no failure where pamqp fails on a well-formed one, time linear in the size, and the limit at
exactly 100 levels for headers and for method arguments."""

from __future__ import annotations

import datetime
import decimal
import struct
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, decode, encode

from protocol.frames import FrameError
from protocol.methods import decode_method
from protocol.properties import (
    MAX_TABLE_DEPTH,
    TableTooDeep,
    build_content_header,
    check_field_table,
    check_nesting,
    decode_field_table,
    decode_headers,
    decode_properties,
    encode_field_table,
    scan_properties,
    with_properties,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def entry(key: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + value


def long_value(kind: bytes, raw: bytes) -> bytes:
    return kind + struct.pack(">I", len(raw)) + raw


def nested(levels: int, kind: str = "table") -> Any:
    value: Any = "leaf"
    for i in range(levels):
        value = {"n": value} if kind == "table" or (kind == "mixed" and i % 2) else [value]
    return value


def headers_payload(headers: dict) -> bytes:
    return build_content_header(0, commands.Basic.Properties(headers=headers).marshal())


def headers_span(payload: bytes) -> tuple[int, int]:
    span = scan_properties(payload).headers_span
    assert span is not None
    return span


# -- the same values as pamqp ----------------------------------------------------------------------------

_chars = st.characters(blacklist_categories=("Cs",))
scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.integers(-300, 70000), st.text(_chars, max_size=30),
    st.none(), st.binary(max_size=10).map(bytearray), st.floats(allow_nan=False, width=32),
    st.decimals(min_value=-(10**6), max_value=10**6, places=3, allow_nan=False, allow_infinity=False),
    st.integers(0, 2**32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)),
)
values = st.recursive(scalars, lambda children: st.one_of(
    st.dictionaries(st.text(_chars, max_size=12), children, max_size=4), st.lists(children, max_size=4)),
    max_leaves=15)
tables = st.dictionaries(st.text(_chars, max_size=20), values, max_size=6)


@SETTINGS
@given(value=tables)
def test_decode_field_table_matches_pamqp(value: dict) -> None:
    raw = encode.field_table(value)
    assert decode_field_table(raw) == decode.field_table(raw)[1]
    assert decode_field_table(b"pad" + raw + b"tail", 3, 3 + len(raw)) == decode.field_table(raw)[1]


def test_every_type_octet_as_pamqp_reads_it() -> None:
    raw = table(
        entry(b"t", b"t\x02"), entry(b"b", b"b\xff"), entry(b"B", b"B\xff"), entry(b"s", b"s\xff\xfe"),
        entry(b"u", b"u\xff\xfe"), entry(b"I", b"I\xff\xff\xff\xfe"), entry(b"i", b"i\xff\xff\xff\xfe"),
        entry(b"l", b"l" + struct.pack(">q", -5)), entry(b"L", b"L" + struct.pack(">q", -6)),
        entry(b"f", b"f" + struct.pack(">f", 1.5)), entry(b"d", b"d" + struct.pack(">d", -2.25)),
        entry(b"D", b"D\x02\x00\x00\x01\x00"), entry(b"T", b"T" + struct.pack(">Q", 1_700_000_000)),
        entry(b"Tms", b"T" + struct.pack(">Q", 1_700_000_000_123)), entry(b"V", b"V"),
        entry(b"S", long_value(b"S", "é".encode())), entry(b"Sbin", long_value(b"S", b"\xff\x00")),
        entry(b"x", long_value(b"x", b"\x00\x01")),
        entry(b"A", long_value(b"A", b"t\x01" + long_value(b"F", entry(b"k", b"V")))),
        entry(b"dup", b"t\x00"), entry(b"dup", b"t\x01"),
    )
    ours = decode_field_table(raw)
    assert ours == decode.field_table(raw)[1]
    assert ours["Sbin"] == b"\xff\x00" and isinstance(ours["x"], bytearray)
    assert ours["D"] == decimal.Decimal("2.56") and ours["dup"] is True
    assert ours["Tms"] == datetime.datetime.fromtimestamp(1_700_000_000.123, tz=datetime.UTC)


# -- where pamqp fails on a well-formed table ---------------------------------------------------------------

@pytest.mark.parametrize("raw,key,expected", [
    pytest.param(table(entry(b"u16", b"U\xff\xfe")), "u16", -2, id="U-is-a-signed-short"),
    pytest.param(table(entry(b"\xff\xfe", b"t\x01")), b"\xff\xfe", True, id="key-not-utf8"),
    pytest.param(table(entry(b"ts", b"T" + b"\xff" * 8)), "ts", 2**64 - 1, id="timestamp-beyond-datetime"),
])
def test_well_formed_tables_pamqp_cannot_decode(raw: bytes, key: Any, expected: Any) -> None:
    with pytest.raises(Exception):  # noqa: B017 - whatever pamqp raises
        decode.field_table(raw)
    check_field_table(raw)
    assert decode_field_table(raw) == {key: expected}


def test_strict_keys_refuse_a_key_that_is_not_utf8() -> None:
    with pytest.raises(FrameError):
        decode_field_table(table(entry(b"\xff", b"V")), strict_keys=True)


@pytest.mark.parametrize("raw", [
    pytest.param(table(entry(b"k", b"?\x00")), id="unknown-type"),
    pytest.param(table(entry(b"k", b"\x00")), id="type-zero"),
    pytest.param(table(entry(b"k", b"I\x00\x00")), id="cut-int"),
    pytest.param(table(entry(b"k", b"S\x00\x00\x00\x09ab")), id="cut-string"),
    pytest.param(table(entry(b"k", b"A\x00\x00\x00\x03t")), id="array-longer-than-table"),
    pytest.param(table(entry(b"k", b"A\x00\x00\x00\x01t")), id="value-cut-inside-array"),
    pytest.param(table(b"\x05ab"), id="cut-key"),
    pytest.param(struct.pack(">I", 9) + b"\x01kV", id="length-longer-than-bytes"),
])
def test_malformed_tables_are_frame_errors(raw: bytes) -> None:
    with pytest.raises(FrameError):
        check_field_table(raw)
    with pytest.raises(FrameError):
        decode_field_table(raw)


def test_decoding_takes_time_linear_in_the_size() -> None:
    # 120,000 one-byte values in one array: pamqp copies the rest of the array for each (seconds); one pass
    # takes a few tens of milliseconds. The process's CPU time, not the wall clock: beside the suite's other
    # workers on 2 cores this test waited for a core long enough to take 0.55 s of wall time (CI, b502459).
    raw = table(entry(b"a", long_value(b"A", b"V" * 120_000)))
    started = time.process_time()
    assert len(decode_field_table(raw)["a"]) == 120_000
    assert time.process_time() - started < 0.5


# -- the nesting limit --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["table", "array", "mixed"])
def test_headers_nested_to_the_limit_decode_and_one_more_level_is_too_deep(kind: str) -> None:
    ok = headers_payload({"deep": nested(MAX_TABLE_DEPTH, kind)})
    check_nesting(ok, *headers_span(ok))
    assert decode_headers(ok, headers_span(ok)) == {"deep": nested(MAX_TABLE_DEPTH, kind)}

    deep = headers_payload({"deep": nested(MAX_TABLE_DEPTH + 1, kind)})
    start, end = headers_span(deep)
    with pytest.raises(TableTooDeep):
        check_nesting(deep, start, end)
    with pytest.raises(TableTooDeep):
        check_field_table(deep, start, end)
    with pytest.raises(TableTooDeep):
        decode_headers(deep, (start, end))


def test_the_smallest_table_too_deep_is_found() -> None:
    # Arrays in arrays under an empty key: the least bytes that MAX_TABLE_DEPTH + 1 levels take.
    inner = b""
    for _ in range(MAX_TABLE_DEPTH + 1):
        inner = long_value(b"A", inner)
    raw = table(entry(b"", inner))
    with pytest.raises(TableTooDeep):
        check_nesting(raw, 0, len(raw))
    shallower = table(entry(b"", inner[5:]))  # one level less: the outermost array taken away
    check_nesting(shallower, 0, len(shallower))
    check_field_table(shallower)


def test_check_nesting_passes_what_only_looks_deep() -> None:
    many_f = table(entry(b"s", long_value(b"S", b"FA" * 600)))
    check_nesting(many_f, 0, len(many_f))
    # Malformed but not too deep: not this check's business (it is found where the table is decoded).
    malformed = table(entry(b"s", long_value(b"S", b"F" * 600)), entry(b"k", b"?"))
    check_nesting(malformed, 0, len(malformed))
    with pytest.raises(FrameError):
        check_field_table(malformed)


@pytest.mark.parametrize("levels,ok", [(MAX_TABLE_DEPTH, True), (MAX_TABLE_DEPTH + 1, False)])
def test_method_arguments_have_the_same_limit(levels: int, ok: bool) -> None:
    method = commands.Queue.Declare(queue="q", arguments={"x-deep": nested(levels)})
    payload = struct.pack(">I", method.index) + method.marshal()
    if ok:
        assert decode_method(payload).arguments == {"x-deep": nested(levels)}
    else:
        with pytest.raises(FrameError):
            decode_method(payload)


# -- properties ---------------------------------------------------------------------------------------------

def test_decode_properties_keeps_a_short_string_that_is_not_utf8() -> None:
    payload = build_content_header(0, struct.pack(">H", (1 << 15) | (1 << 12)) + b"\x02\xff\xfe\x02")
    props = decode_properties(payload)
    assert props.content_type == b"\xff\xfe" and props.delivery_mode == 2


def test_malformed_headers_can_be_skipped_or_replaced() -> None:
    bad = table(entry(b"k", b"?"))
    payload = build_content_header(0, struct.pack(">H", (1 << 13) | (1 << 12)) + bad + b"\x02")
    with pytest.raises(FrameError):
        decode_properties(payload)
    props = decode_properties(payload, skip_headers=True)
    assert props.headers is None and props.delivery_mode == 2
    out = with_properties(payload, headers={"x-death": [{"count": 1}]})
    assert decode_properties(out).headers == {"x-death": [{"count": 1}]}
    assert decode_properties(out).delivery_mode == 2


def test_encode_field_table_writes_bytes_back_as_long_strings() -> None:
    raw = encode_field_table({"bin": b"\xff\xfe", "text": "é", "n": [1, {"k": None}]})
    assert decode_field_table(raw) == {"bin": b"\xff\xfe", "text": "é", "n": [1, {"k": None}]}
