"""broker/queues/stream_record.py: a stream's stored form is delivered as three slices, offset header
included; records of the older msgpack form are still delivered right."""

from __future__ import annotations

import msgpack
from pamqp import commands as spec

from broker.message import Message
from broker.queues.stream_record import FORMAT, delivered_message, encode_record
from protocol.fastcodec import build_content_header, shortstr
from protocol.properties import Long, decode_headers, scan_properties


def _message(body: bytes, headers: dict | None = None, exchange: str = "ex", routing_key: str = "rk") -> Message:
    props = spec.Basic.Properties(headers=headers) if headers else spec.Basic.Properties()
    header = build_content_header(len(body), props.marshal())
    names = shortstr(exchange) + shortstr(routing_key)
    return Message(exchange, routing_key, names, header, body, 1_700_000_000_000)


def _headers(msg: Message) -> dict:
    return decode_headers(msg.header, scan_properties(msg.header).headers_span)


def test_round_trip_carries_the_offset_and_keeps_everything_else():
    msg = _message(b"payload", {"h": "v"}, exchange="ex\u00e9", routing_key="a.b")
    stored = encode_record(msg, 41)
    assert stored[0] == FORMAT
    out = delivered_message(stored, 41, 123)
    assert (out.exchange, out.routing_key, out.names_raw, out.body) == ("ex\u00e9", "a.b", msg.names_raw, b"payload")
    assert out.published_at == 123
    assert _headers(out) == {"h": "v", "x-stream-offset": 41}


def test_a_publishers_own_offset_header_is_overwritten():
    msg = _message(b"x", {"x-stream-offset": Long(7)})
    out = delivered_message(encode_record(msg, 3), 3, 0)
    assert _headers(out) == {"x-stream-offset": 3}


def test_empty_names_and_body():
    msg = _message(b"", exchange="", routing_key="")
    out = delivered_message(encode_record(msg, 0), 0, 0)
    assert (out.exchange, out.routing_key, out.body) == ("", "", b"")


def test_records_of_the_older_form_are_delivered_with_the_offset_spliced():
    """A stream record written before stream_record's format: message_codec's msgpack form of then."""
    msg = _message(b"old", {"h": 1})
    older = msgpack.packb([msg.exchange, msg.routing_key, msg.header, msg.body, 0, None], use_bin_type=True)
    out = delivered_message(older, 9, 0)
    assert out.body == b"old"
    assert _headers(out) == {"h": 1, "x-stream-offset": 9}


def test_the_record_template_never_serves_a_stale_head():
    """encode_record reuses the head of the last (names, header) pair: whatever the sequence of messages
    (headers with and without a table, the publisher's own offset header, other names, offsets of any size),
    every record is the one a fresh splice gives."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from broker.queues import stream_record

    shapes = [_message(b"a"), _message(b"bb", {"h": "v"}), _message(b"c", {"x-stream-offset": Long(5)}),
              _message(b"d", exchange="", routing_key="q"), _message(b"", {"n": 1, "m": "x"}, routing_key="r")]

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, len(shapes) - 1), st.integers(0, 2**63 - 1)), max_size=30))
    def check(sequence: list[tuple[int, int]]) -> None:
        for shape, offset in sequence:
            msg = shapes[shape]
            expected = stream_record._record_head(msg.names_raw, msg.header, offset) + msg.body
            assert encode_record(msg, offset) == expected
            out = delivered_message(expected, offset, 0)
            assert _headers(out)["x-stream-offset"] == offset

    check()


def test_the_first_difference_is_found_as_a_loop_over_the_bytes_finds_it():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from broker.queues.stream_record import _first_difference

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=64), st.binary(min_size=1, max_size=64), st.data())
    def check(common: bytes, tail_a: bytes, data: st.DataObject) -> None:
        tail_b = data.draw(st.binary(min_size=len(tail_a), max_size=len(tail_a)).filter(lambda t: t != tail_a))
        a, b = common + tail_a, common + tail_b
        assert _first_difference(a, b) == next(i for i in range(len(a)) if a[i] != b[i])

    check()


def test_a_pair_is_learnt_on_its_second_appearance_in_a_row_only():
    """Headers that differ message after message (the firehose's events) never pay for learning: each one is
    spliced once, and the template keeps the last pair it learnt."""
    from broker.queues.stream_record import _Template

    template = _Template()
    first, second, third = (_message(b"x", {"n": n}) for n in range(3))
    assert not template.matches(first.names_raw, first.header)
    assert not template.matches(second.names_raw, second.header)
    assert template.header == b""  # nothing learnt from two different pairs
    assert template.matches(second.names_raw, second.header)  # the second time in a row: learnt
    assert template.header == second.header
    assert not template.matches(third.names_raw, third.header)
    assert template.header == second.header
    assert template.matches(second.names_raw, second.header)
