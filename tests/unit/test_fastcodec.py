"""The hand-written fast codec and the raw property scanner, checked against pamqp on generated inputs.

The tests of the functions that have a compiled twin (fastcodec.ACCELERATED) run twice, through the ``codec``
fixture: against the pure-Python reference (protocol.fastcodec.pure) and the compiled protocol._codec; see
tests/unit/protocol/codec_impls.py.
"""

from __future__ import annotations

import datetime
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from protocol.constants import (
    CLASS_BASIC,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_OVERHEAD,
)
from protocol.fastcodec import (
    build_content_header,
    decode_content_header,
    encode_basic_get_empty,
    encode_basic_get_ok,
    encode_basic_return,
    shortstr,
)
from protocol.frames import FrameError, FrameParser
from protocol.properties import (
    body_size_of,
    check_field_table,
    decode_headers,
    decode_properties,
    delivery_mode_of,
    encode_field_value,
    field_table_entries,
    scan_properties,
    with_properties,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / "protocol"))
import codec_impls
from codec_impls import Codec


@pytest.fixture(scope="module", params=codec_impls.NAMES)
def codec(request: pytest.FixtureRequest) -> Codec:
    return codec_impls.get(request.param)


SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(SETTINGS, max_examples=60)

# -- strategies --------------------------------------------------------------------------------------------

_chars = st.characters(exclude_categories=("Cs",))


def _cut_utf8(text: str, limit: int = 255) -> str:
    return text.encode()[:limit].decode(errors="ignore")


# Short strings: any text of 0..255 UTF-8 bytes, with the edges drawn often.
short_text = st.one_of(
    st.text(_chars, max_size=40),
    st.text(_chars, max_size=255).map(_cut_utf8),
    st.sampled_from(["", "x" * 255, "é" * 127 + "x", "€" * 85, "\U0001f407" * 63 + "abc", "a b\x00c",
                     "amq.direct", "amq.rabbitmq.reply-to"]),
)
nonempty_short_text = short_text.filter(bool)
channels = st.integers(0, 65535)
# pamqp encodes 'longlong' signed, so it can only check delivery tags below 2**63.
delivery_tags = st.integers(0, 2**63 - 1)


def _field_values(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.dictionaries(st.text(_chars, max_size=20), children, max_size=4),
        st.lists(children, max_size=4),
    )


field_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-300, 70000),
    st.text(_chars, max_size=40),
    st.none(),
    st.binary(max_size=10).map(bytearray),
)
field_values = st.recursive(field_scalars, _field_values, max_leaves=12)
header_tables = st.dictionaries(st.text(_chars, max_size=20), field_values, max_size=6)

timestamps = st.integers(0, 2**32 - 1).map(
    lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC))

PROPERTY_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "content_type": st.one_of(st.sampled_from(["application/json", "text/plain"]), nonempty_short_text),
    "content_encoding": nonempty_short_text,
    "headers": header_tables,
    "delivery_mode": st.sampled_from([1, 2]),
    "priority": st.integers(0, 9),
    "correlation_id": nonempty_short_text,
    "reply_to": st.one_of(st.just("amq.rabbitmq.reply-to"), nonempty_short_text),
    "expiration": st.integers(0, 2**32 - 1).map(str),
    "message_id": nonempty_short_text,
    "timestamp": timestamps,
    "message_type": nonempty_short_text,
    "user_id": nonempty_short_text,
    "app_id": nonempty_short_text,
}
PROPERTY_NAMES = list(PROPERTY_STRATEGIES)


@st.composite
def basic_properties(draw: st.DrawFn, min_present: int = 0) -> commands.Basic.Properties:
    present = draw(st.sets(st.sampled_from(PROPERTY_NAMES), min_size=min_present))
    values = {name: draw(PROPERTY_STRATEGIES[name]) for name in PROPERTY_NAMES if name in present}
    return commands.Basic.Properties(**values)


def _header_payload(props: commands.Basic.Properties, body_size: int = 0) -> bytes:
    return build_content_header(body_size, props.marshal())


def _method_payload(method: Any, channel: int = 1) -> bytes:
    """pamqp's frame for ``method``, less frame header, class/method id and end octet."""
    return pframe.marshal(method, channel)[11:-1]


def _unmarshal_one(data: bytes) -> tuple[int, Any]:
    consumed, channel, value = pframe.unmarshal(data)
    assert consumed == len(data)
    return channel, value


class _UncheckedPublish(commands.Basic.Publish):
    """Basic.Publish without pamqp's client-side name rules (ASCII subset, 127 chars), which a broker must
    not apply: any short string is a valid exchange name or routing key on the wire."""

    def validate(self) -> None:
        pass


# -- basic.publish -----------------------------------------------------------------------------------------

@SETTINGS
@given(exchange=short_text, routing_key=short_text, mandatory=st.booleans(), immediate=st.booleans(),
       ticket=st.integers(0, 65535))
def test_decode_basic_publish_matches_pamqp(codec: Codec, exchange: str, routing_key: str, mandatory: bool,
                                            immediate: bool, ticket: int) -> None:
    method = _UncheckedPublish(ticket=ticket, exchange=exchange, routing_key=routing_key,
                               mandatory=mandatory, immediate=immediate)
    args = _method_payload(method)
    # pamqp itself reads back what it wrote.
    _, back = _unmarshal_one(pframe.marshal(method, 1))
    assert (back.exchange, back.routing_key, back.mandatory, back.immediate) == \
        (exchange, routing_key, mandatory, immediate)

    got = codec.fc.decode_basic_publish(args)
    assert isinstance(got, codec.fc.PublishArgs)
    assert got.exchange == exchange
    assert got.routing_key == routing_key
    assert got.mandatory is mandatory
    assert got.immediate is immediate
    assert got.names_raw == shortstr(exchange) + shortstr(routing_key)
    assert bytes(got.names_raw) == args[2:-1]


@SETTINGS
@given(exchange=short_text, routing_key=short_text, bits=st.integers(0, 3), data=st.data())
def test_truncated_basic_publish_is_a_frame_error(codec: Codec, exchange: str, routing_key: str, bits: int,
                                                  data: st.DataObject) -> None:
    args = b"\x00\x00" + shortstr(exchange) + shortstr(routing_key) + bytes([bits])
    cut = data.draw(st.integers(0, len(args) - 1), label="cut")
    with pytest.raises(FrameError) as info:
        codec.fc.decode_basic_publish(args[:cut])
    assert info.value.reply_code == FRAME_ERROR


@pytest.mark.parametrize("args", [
    b"\x00\x00\x02\xff\xfe\x00\x00",          # exchange not UTF-8
    b"\x00\x00\x00\x03ab\xc3\x00",            # routing key ends inside a UTF-8 sequence
])
def test_basic_publish_with_non_utf8_names_is_a_frame_error(codec: Codec, args: bytes) -> None:
    with pytest.raises(FrameError):
        codec.fc.decode_basic_publish(args)


def test_basic_publish_ignores_higher_bits_and_trailing_bytes(codec: Codec) -> None:
    got = codec.fc.decode_basic_publish(b"\x00\x00\x01e\x01r\xfd" + b"junk")
    assert (got.exchange, got.routing_key, got.mandatory, got.immediate) == ("e", "r", True, False)
    assert got.names_raw == b"\x01e\x01r"


def test_publish_args_is_a_plain_record(codec: Codec) -> None:
    # The broker builds PublishArgs itself too (tests, internal publishes) and may set its attributes.
    args = codec.fc.PublishArgs(exchange="ex", routing_key="rk", mandatory=True, immediate=False,
                                names_raw=b"\x02ex\x02rk")
    assert (args.exchange, args.routing_key, args.mandatory, args.immediate, args.names_raw) == \
        ("ex", "rk", True, False, b"\x02ex\x02rk")
    args.routing_key = "other"
    assert args.routing_key == "other"
    with pytest.raises(AttributeError):
        args.unknown = 1


@pytest.mark.parametrize("args, start", [(b"\x00\x00\x00\x02rk\x01", 0),
                                         (b"\x00\x3c\x00\x28\x00\x00\x00\x02rk\x01", 4)])
def test_decode_basic_publish_from_an_offset_keeps_the_names_raw(codec: Codec, args: bytes, start: int) -> None:
    got = codec.fc.decode_basic_publish(args, start)
    assert (got.exchange, got.routing_key, got.mandatory, got.names_raw) == ("", "rk", True, b"\x00\x02rk")
    assert type(got.names_raw) is bytes


# -- basic.ack / nack / reject in --------------------------------------------------------------------------

@SETTINGS
@given(tag=delivery_tags, multiple=st.booleans())
def test_decode_ack_matches_pamqp(codec: Codec, tag: int, multiple: bool) -> None:
    payload = _method_payload(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))
    assert codec.fc.decode_ack(payload) == (tag, multiple)


@SETTINGS
@given(tag=delivery_tags, multiple=st.booleans(), requeue=st.booleans())
def test_decode_nack_matches_pamqp(codec: Codec, tag: int, multiple: bool, requeue: bool) -> None:
    payload = _method_payload(commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue))
    assert codec.fc.decode_nack(payload) == (tag, multiple, requeue)


@SETTINGS
@given(tag=delivery_tags, requeue=st.booleans())
def test_decode_reject_matches_pamqp(codec: Codec, tag: int, requeue: bool) -> None:
    payload = _method_payload(commands.Basic.Reject(delivery_tag=tag, requeue=requeue))
    assert codec.fc.decode_reject(payload) == (tag, requeue)


def test_delivery_tags_are_unsigned(codec: Codec) -> None:
    args = struct.pack(">QB", 2**64 - 1, 3)
    assert codec.fc.decode_ack(args) == (2**64 - 1, True)
    assert codec.fc.decode_nack(args) == (2**64 - 1, True, True)
    assert codec.fc.decode_reject(args) == (2**64 - 1, True)


@pytest.mark.parametrize("decode", ["decode_ack", "decode_nack", "decode_reject"])
@pytest.mark.parametrize("length", range(9))
def test_truncated_ack_nack_reject_is_a_frame_error(codec: Codec, decode: str, length: int) -> None:
    with pytest.raises(FrameError) as info:
        getattr(codec.fc, decode)(struct.pack(">QB", 12345, 3)[:length])
    assert info.value.reply_code == FRAME_ERROR
    assert info.value.text == f"basic.{decode[7:]}: truncated method frame"
    # From an offset, as the reader calls them (4: past class and method id).
    with pytest.raises(FrameError):
        getattr(codec.fc, decode)(b"\x00\x3c\x00\x50" + struct.pack(">QB", 12345, 3)[:length], 4)


# -- frames out, read back by pamqp ------------------------------------------------------------------------

@SETTINGS
@given(channel=channels, consumer_tag=short_text, tag=delivery_tags, redelivered=st.booleans(),
       exchange=short_text, routing_key=short_text)
def test_encode_basic_deliver(codec: Codec, channel: int, consumer_tag: str, tag: int, redelivered: bool,
                              exchange: str, routing_key: str) -> None:
    data = codec.fc.encode_basic_deliver(channel, shortstr(consumer_tag), tag, redelivered,
                                shortstr(exchange) + shortstr(routing_key))
    got_channel, method = _unmarshal_one(data)
    assert got_channel == channel
    assert isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange,
            method.routing_key) == (consumer_tag, tag, redelivered, exchange, routing_key)


@SETTINGS
@given(channel=channels, tag=delivery_tags, redelivered=st.booleans(), exchange=short_text,
       routing_key=short_text, message_count=st.integers(0, 2**32 - 1))
def test_encode_basic_get_ok(channel: int, tag: int, redelivered: bool, exchange: str, routing_key: str,
                             message_count: int) -> None:
    data = encode_basic_get_ok(channel, tag, redelivered, shortstr(exchange) + shortstr(routing_key),
                               message_count)
    got_channel, method = _unmarshal_one(data)
    assert got_channel == channel
    assert isinstance(method, commands.Basic.GetOk)
    assert (method.delivery_tag, method.redelivered, method.exchange, method.routing_key,
            method.message_count) == (tag, redelivered, exchange, routing_key, message_count)


@pytest.mark.parametrize("channel", [0, 1, 65535])
def test_encode_basic_get_empty(channel: int) -> None:
    data = encode_basic_get_empty(channel)
    got_channel, method = _unmarshal_one(data)
    assert got_channel == channel
    assert isinstance(method, commands.Basic.GetEmpty)
    assert method.cluster_id == ""
    assert data == pframe.marshal(commands.Basic.GetEmpty(), channel)


@SETTINGS
@given(channel=channels, reply_code=st.integers(0, 65535), reply_text=short_text, exchange=short_text,
       routing_key=short_text)
def test_encode_basic_return(channel: int, reply_code: int, reply_text: str, exchange: str,
                             routing_key: str) -> None:
    data = encode_basic_return(channel, reply_code, reply_text, shortstr(exchange) + shortstr(routing_key))
    got_channel, method = _unmarshal_one(data)
    assert got_channel == channel
    assert isinstance(method, commands.Basic.Return)
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == \
        (reply_code, reply_text, exchange, routing_key)


@SETTINGS
@given(channel=channels, tag=delivery_tags, multiple=st.booleans())
def test_encode_basic_ack(codec: Codec, channel: int, tag: int, multiple: bool) -> None:
    data = codec.fc.encode_basic_ack(channel, tag, multiple)
    got_channel, method = _unmarshal_one(data)
    assert got_channel == channel
    assert isinstance(method, commands.Basic.Ack)
    assert (method.delivery_tag, method.multiple) == (tag, multiple)
    assert data == pframe.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), channel)


@SETTINGS
@given(channel=channels, tag=delivery_tags, multiple=st.booleans(), requeue=st.booleans())
def test_encode_basic_nack(codec: Codec, channel: int, tag: int, multiple: bool, requeue: bool) -> None:
    data = codec.fc.encode_basic_nack(channel, tag, multiple, requeue)
    got_channel, method = _unmarshal_one(data)
    assert got_channel == channel
    assert isinstance(method, commands.Basic.Nack)
    assert (method.delivery_tag, method.multiple, method.requeue) == (tag, multiple, requeue)
    assert data == pframe.marshal(commands.Basic.Nack(delivery_tag=tag, multiple=multiple,
                                                      requeue=requeue), channel)


def test_encode_basic_nack_requeue_defaults_to_false(codec: Codec) -> None:
    assert codec.fc.encode_basic_nack(1, 5, True) == codec.fc.encode_basic_nack(1, 5, True, False)


def test_shortstr() -> None:
    assert shortstr("") == b"\x00"
    assert shortstr("é") == b"\x02\xc3\xa9"
    assert shortstr(b"raw") == b"\x03raw"
    assert shortstr("x" * 255) == b"\xff" + b"x" * 255
    with pytest.raises(ValueError):
        shortstr("x" * 256)
    with pytest.raises(ValueError):
        shortstr("é" * 128)


# -- content header and body -------------------------------------------------------------------------------

def _frames_of(pieces: list[Any], frame_max: int) -> list[tuple[int, int, bytes]]:
    data = b"".join(pieces)
    parser = FrameParser(frame_max=frame_max, expect_header=False)
    frames = parser.feed(data)
    assert parser.buffered == 0
    # Every frame, header and end octet included, fits in frame_max.
    pos = 0
    for _, _, payload in frames:
        size = struct.unpack_from(">I", data, pos + 3)[0]
        assert size == len(payload)
        if frame_max:
            assert 7 + size + 1 <= frame_max
        pos += 7 + size + 1
    assert pos == len(data)
    return frames


@SETTINGS
@given(channel=channels, props=basic_properties(),
       body=st.one_of(st.binary(max_size=2000),
                      st.integers(0, 70000).map(lambda n: (bytes(range(256)) * 274)[:n])),
       frame_max=st.one_of(st.just(0), st.integers(4096, 20000), st.sampled_from([4096, 8192, 131072])))
def test_encode_content(codec: Codec, channel: int, props: commands.Basic.Properties, body: bytes,
                        frame_max: int) -> None:
    header_payload = _header_payload(props, len(body))
    assume(not frame_max or len(header_payload) + FRAME_OVERHEAD <= frame_max)
    frames = _frames_of(codec.fc.encode_content(channel, header_payload, body, frame_max), frame_max)

    assert frames[0] == (FRAME_HEADER, channel, header_payload)
    bodies = frames[1:]
    assert all(t == FRAME_BODY and c == channel for t, c, _ in bodies)
    assert b"".join(p for _, _, p in bodies) == body
    assert all(p for _, _, p in bodies)  # no empty body frame
    chunk = frame_max - FRAME_OVERHEAD if frame_max else max(len(body), 1)
    assert len(bodies) == -(-len(body) // chunk)
    # Every body frame but the last is full.
    assert all(len(p) == chunk for _, _, p in bodies[:-1])

    # pamqp reads the header frame the same way.
    data = b"".join(codec.fc.encode_content(channel, header_payload, body, frame_max))
    consumed, got_channel, content_header = pframe.unmarshal(data)
    assert got_channel == channel
    assert isinstance(content_header, pheader.ContentHeader)
    assert content_header.body_size == len(body)
    assert consumed == 7 + len(header_payload) + 1


@SETTINGS
@given(channel=channels, consumer_tag=short_text, tag=delivery_tags, redelivered=st.booleans(),
       names=st.tuples(short_text, short_text), props_raw=st.binary(max_size=40),
       size=st.one_of(st.integers(0, 64), st.integers(4080, 4100), st.integers(0, 9000)),
       frame_max=st.one_of(st.just(0), st.sampled_from([4096, 4104, 8192, 131072]), st.integers(4096, 10000)))
def test_encode_delivery_into_is_deliver_and_content_in_fewer_pieces(codec: Codec, channel: int, consumer_tag: str,
                                                                    tag: int, redelivered: bool,
                                                                    names: tuple[str, str], props_raw: bytes,
                                                                    size: int, frame_max: int) -> None:
    """The reader's one call per delivery: the same bytes as basic.deliver then the content, one piece for a
    small body in one frame (so the writer joins fewer), the pieces already in ``out`` left alone."""
    body = (bytes(range(256)) * 40)[:size]
    header_payload = build_content_header(size, b"\x00\x00" + props_raw)
    names_raw = shortstr(names[0]) + shortstr(names[1])
    out: list[bytes | memoryview] = [b"before"]
    codec.fc.encode_delivery_into(out, channel, shortstr(consumer_tag), tag, redelivered, names_raw, header_payload,
                                  body, frame_max)
    expected = (codec.fc.encode_basic_deliver(channel, shortstr(consumer_tag), tag, redelivered, names_raw)
                + b"".join(codec.fc.encode_content(channel, header_payload, body, frame_max)))
    assert out[0] == b"before"
    assert b"".join(out[1:]) == expected
    one_frame = not frame_max or size <= frame_max - FRAME_OVERHEAD
    assert (len(out) == 2) == (size <= 4096 and one_frame)


@pytest.mark.parametrize("frame_max, size, frames", [
    (4096, 0, 0), (4096, 1, 1), (4096, 4088, 1), (4096, 4089, 2), (4096, 8176, 2), (4096, 8177, 3),
    (0, 10 * 1024 * 1024, 1),
])
def test_encode_content_boundaries(codec: Codec, frame_max: int, size: int, frames: int) -> None:
    body = b"b" * size
    header_payload = build_content_header(size, b"\x00\x00")
    got = _frames_of(codec.fc.encode_content(7, header_payload, body, frame_max), frame_max)
    assert len(got) == 1 + frames
    assert b"".join(p for _, _, p in got[1:]) == body


@SETTINGS
@given(body_size=st.integers(0, 2**64 - 1), props_raw=st.binary(max_size=40))
def test_build_content_header(codec: Codec, body_size: int, props_raw: bytes) -> None:
    out = codec.fc.build_content_header(body_size, props_raw)
    assert type(out) is bytes
    assert out == struct.pack(">HHQ", CLASS_BASIC, 0, body_size) + props_raw
    assert codec.fc.decode_content_header(out) == body_size


def test_content_header_errors_name_the_class(codec: Codec) -> None:
    with pytest.raises(FrameError) as info:
        codec.fc.decode_content_header(struct.pack(">HHQ", 50, 0, 42))
    assert info.value.text == "content header for class 50, expected 60"
    with pytest.raises(FrameError) as info:
        codec.fc.decode_content_header(b"\x00\x3c")
    assert info.value.text == "content header frame too short"


# -- properties --------------------------------------------------------------------------------------------

def _expected(props: commands.Basic.Properties, name: str) -> Any:
    value = getattr(props, name)
    return None if value == "" else value


@SETTINGS
@given(props=basic_properties(), body_size=st.integers(0, 2**64 - 1))
def test_scan_properties_matches_pamqp(props: commands.Basic.Properties, body_size: int) -> None:
    payload = _header_payload(props, body_size)
    assert decode_content_header(payload) == body_size
    assert body_size_of(payload) == body_size

    scanned = scan_properties(payload)
    assert scanned.delivery_mode == (props.delivery_mode or 0)
    assert scanned.priority == (props.priority or 0)
    assert scanned.expiration == _expected(props, "expiration")
    assert scanned.reply_to == _expected(props, "reply_to")
    assert scanned.user_id == _expected(props, "user_id")
    if props.headers is None:
        assert scanned.headers_span is None
    else:
        assert scanned.headers_span is not None
    assert decode_headers(payload, scanned.headers_span) == (props.headers or {})

    # pamqp's reading of the same payload agrees, and so does decode_properties.
    content_header = pheader.ContentHeader()
    content_header.unmarshal(payload)
    assert content_header.body_size == body_size
    assert content_header.properties.headers == props.headers
    decoded = decode_properties(payload)
    for name in PROPERTY_NAMES:
        assert getattr(decoded, name) == _expected(props, name), name


@SETTINGS
@given(props=basic_properties(), data=st.data())
def test_delivery_mode_of_reads_what_scan_properties_reads(props: commands.Basic.Properties,
                                                          data: st.DataObject) -> None:
    """The persistent publish's short cut (broker/publish.py): on a header without a headers table, whole or
    cut anywhere after its flags, the delivery mode is scan_properties's and so is the frame error."""
    props.headers = None
    payload = _header_payload(props, 10)
    flags = struct.unpack_from(">H", payload, 12)[0]
    payload = payload[:data.draw(st.integers(14, len(payload)), label="cut")]
    try:
        expected: int | type[FrameError] = scan_properties(payload).delivery_mode
    except FrameError:
        expected = FrameError
    try:
        got: int | type[FrameError] = delivery_mode_of(payload, flags)
    except FrameError:
        got = FrameError
    assert got == expected


def test_delivery_mode_of_refuses_a_header_with_a_table() -> None:
    payload = _header_payload(commands.Basic.Properties(headers={"a": 1}, delivery_mode=2))
    with pytest.raises(ValueError):
        delivery_mode_of(payload, struct.unpack_from(">H", payload, 12)[0])


def test_scan_properties_without_properties() -> None:
    scanned = scan_properties(build_content_header(5, b"\x00\x00"))
    assert (scanned.delivery_mode, scanned.priority, scanned.expiration, scanned.reply_to, scanned.user_id,
            scanned.headers_span) == (0, 0, None, None, None, None)
    assert decode_headers(build_content_header(5, b"\x00\x00"), None) == {}


def test_headers_span_locates_the_raw_table() -> None:
    props = commands.Basic.Properties(content_type="text/plain", headers={"x-match": "all", "n": 1})
    payload = _header_payload(props)
    start, end = scan_properties(payload).headers_span
    table = payload[start:end]
    assert struct.unpack(">I", table[:4])[0] == len(table) - 4
    assert start == 14 + 1 + len("text/plain")


def test_decode_content_header_checks_class_and_length(codec: Codec) -> None:
    assert codec.fc.decode_content_header(struct.pack(">HHQ", CLASS_BASIC, 0, 42) + b"\x00\x00") == 42
    with pytest.raises(FrameError):
        codec.fc.decode_content_header(struct.pack(">HHQ", 50, 0, 42) + b"\x00\x00")
    for n in range(12):
        with pytest.raises(FrameError):
            codec.fc.decode_content_header(struct.pack(">HHQ", CLASS_BASIC, 0, 42)[:n])


@SETTINGS
@given(props=basic_properties(min_present=1), data=st.data())
def test_truncated_content_header_is_a_frame_error(props: commands.Basic.Properties,
                                                   data: st.DataObject) -> None:
    payload = _header_payload(props, 10)
    cut = data.draw(st.integers(0, len(payload) - 1), label="cut")
    with pytest.raises(FrameError) as info:
        scan_properties(payload[:cut])
    assert info.value.reply_code == FRAME_ERROR


@pytest.mark.parametrize("props_raw", [
    struct.pack(">H", 1 << 9) + b"\x02\xff\xfe",                      # reply_to not UTF-8
    struct.pack(">H", 1 << 8) + b"\x01\x80",                          # expiration not UTF-8
    struct.pack(">H", 1 << 4) + b"\x03ab\xe2",                        # user_id cut inside a character
    struct.pack(">H", 1 << 13) + b"\xff\xff\xff\xff",                # headers table longer than the frame
    struct.pack(">H", 1 << 6) + b"\x00" * 7,                          # timestamp short of a byte
    struct.pack(">H", (1 << 12) | (1 << 11)) + b"\x02",               # priority missing
])
def test_malformed_properties_are_a_frame_error(props_raw: bytes) -> None:
    with pytest.raises(FrameError):
        scan_properties(build_content_header(0, props_raw))


def test_malformed_headers_table_is_a_frame_error() -> None:
    table = b"\x01k" + b"?" + b"\x00\x00"          # unknown field type '?'
    payload = build_content_header(0, struct.pack(">H", 1 << 13) + struct.pack(">I", len(table)) + table)
    span = scan_properties(payload).headers_span
    with pytest.raises(FrameError):
        decode_headers(payload, span)


_REPLACEMENTS: dict[str, st.SearchStrategy[Any]] = {
    name: st.one_of(st.none(), strategy) for name, strategy in PROPERTY_STRATEGIES.items()
}


@SETTINGS
@given(props=basic_properties(), body_size=st.integers(0, 2**40), data=st.data())
def test_with_properties_changes_one_property_and_keeps_the_rest(
        props: commands.Basic.Properties, body_size: int, data: st.DataObject) -> None:
    payload = _header_payload(props, body_size)
    name = data.draw(st.sampled_from(PROPERTY_NAMES), label="property")
    value = data.draw(_REPLACEMENTS[name], label="new value")

    out = with_properties(payload, **{name: value})
    assert decode_content_header(out) == body_size
    assert out[:12] == payload[:12]
    decoded = decode_properties(out)
    for other in PROPERTY_NAMES:
        want = value if other == name else _expected(props, other)
        assert getattr(decoded, other) == (None if want == "" else want), other

    scanned = scan_properties(out)
    if name == "reply_to":
        assert scanned.reply_to == (value or None)
    else:
        assert scanned.reply_to == _expected(props, "reply_to")
    want_headers = value if name == "headers" else props.headers
    assert decode_headers(out, scanned.headers_span) == (want_headers or {})


def test_with_properties_direct_reply_to_rewrite() -> None:
    props = commands.Basic.Properties(content_type="application/json", delivery_mode=2,
                                      reply_to="amq.rabbitmq.reply-to", correlation_id="c1",
                                      headers={"a": [1, "two", {"three": True}]})
    payload = _header_payload(props, 99)
    out = with_properties(payload, reply_to="amq.rabbitmq.reply-to.g1h2AA==.abc")
    scanned = scan_properties(out)
    assert scanned.reply_to == "amq.rabbitmq.reply-to.g1h2AA==.abc"
    assert scanned.delivery_mode == 2
    assert decode_headers(out, scanned.headers_span) == {"a": [1, "two", {"three": True}]}
    assert decode_properties(out).correlation_id == "c1"
    assert body_size_of(out) == 99


def _headers_payload(table_body: bytes) -> bytes:
    return build_content_header(3, struct.pack(">H", 1 << 13) + struct.pack(">I", len(table_body))
                                + table_body)


def test_with_properties_keeps_binary_long_string_header() -> None:
    payload = _headers_payload(b"\x01k" + b"S" + struct.pack(">I", 2) + b"\xff\xfe")
    assert decode_headers(payload, scan_properties(payload).headers_span) == {"k": b"\xff\xfe"}
    out = with_properties(payload, reply_to="x")
    assert decode_headers(out, scan_properties(out).headers_span) == {"k": b"\xff\xfe"}


def test_with_properties_keeps_double_header() -> None:
    payload = _headers_payload(b"\x01d" + b"d" + struct.pack(">d", 0.1))
    out = with_properties(payload, reply_to="x")
    assert decode_headers(out, scan_properties(out).headers_span) == {"d": 0.1}


def test_with_properties_keeps_large_timestamp() -> None:
    payload = build_content_header(3, struct.pack(">HQ", 1 << 6, 1_700_000_000_123))
    out = with_properties(payload, reply_to="x")
    assert out[-8:] == struct.pack(">Q", 1_700_000_000_123)


def test_decode_properties_refuses_truncated_header() -> None:
    payload = build_content_header(1, commands.Basic.Properties(app_id="abcdef").marshal())
    with pytest.raises(FrameError):
        scan_properties(payload[:-2])          # the scanner sees it
    with pytest.raises(FrameError):
        decode_properties(payload[:-2])        # returns app_id "abcd"


# -- with_properties splices raw bytes ---------------------------------------------------------------------

def _entry(key: bytes, value_raw: bytes) -> bytes:
    return bytes([len(key)]) + key + value_raw


_LONG_KEY = b"k" * 200
# Entries pamqp cannot round-trip: binary long string, double, big timestamp, key over 128 bytes, 'U',
# a nested table holding a 16-bit 'U' and a byte array, decimal, void, unsigned 64-bit-looking 'L'.
_TRICKY_ENTRIES = [
    _entry(b"bin", b"S" + struct.pack(">I", 3) + b"\xff\x00\xfe"),
    _entry(b"dbl", b"d" + struct.pack(">d", 0.1)),
    _entry(b"ts", b"T" + struct.pack(">Q", 1_700_000_000_123)),
    _entry(_LONG_KEY, b"t\x01"),
    _entry(b"U", b"U" + struct.pack(">h", -2)),
    _entry(b"nested", b"F" + struct.pack(">I", 13) + _entry(b"u", b"U\x00\x07") + _entry(b"x", b"x\x00\x00\x00\x01\x80")),
    _entry(b"dec", b"D\x02" + struct.pack(">I", 314)),
    _entry(b"void", b"V"),
    _entry(b"arr", b"A" + struct.pack(">I", 6) + b"f" + struct.pack(">f", 1.5) + b"V"),
    _entry(b"big", b"L" + struct.pack(">q", -(2**63))),
]


def _tricky_payload(**extra: bytes) -> bytes:
    table = b"".join(_TRICKY_ENTRIES)
    flags = (1 << 13) | (1 << 9) | (1 << 6)
    props = (struct.pack(">H", flags) + struct.pack(">I", len(table)) + table + b"\x05reply"
             + struct.pack(">Q", 2**63 + 5))
    return build_content_header(77, props)


def _raw_entries(payload: bytes) -> dict[bytes, bytes]:
    span = scan_properties(payload).headers_span
    assert span is not None
    return {key: payload[start:end] for key, start, end in field_table_entries(payload, *span)}


def test_field_table_entries_split_every_type() -> None:
    payload = _tricky_payload()
    entries = list(_raw_entries(payload).values())
    assert entries == _TRICKY_ENTRIES


def test_with_properties_untouched_properties_and_entries_are_byte_identical() -> None:
    payload = _tricky_payload()
    assert with_properties(payload) == payload
    out = with_properties(payload, reply_to="amq.rabbitmq.reply-to.abc")
    assert out == payload.replace(b"\x05reply", b"\x19amq.rabbitmq.reply-to.abc")
    out = with_properties(payload, headers_set={"new": 2.5, "bin": b"\x01\x02"}, headers_remove=["dbl"])
    raw = _raw_entries(out)
    assert list(raw) == [b"bin", b"ts", _LONG_KEY, b"U", b"nested", b"dec", b"void", b"arr", b"big", b"new"]
    assert raw[b"bin"] == _entry(b"bin", b"S\x00\x00\x00\x02\x01\x02")          # replaced in place
    assert raw[b"new"] == _entry(b"new", b"d" + struct.pack(">d", 2.5))          # a double, not 'f'
    for entry in _TRICKY_ENTRIES[2:]:
        assert entry in raw.values()
    assert out.endswith(b"\x05reply" + struct.pack(">Q", 2**63 + 5))            # timestamp untouched
    assert out[:12] == payload[:12]


def test_with_properties_header_edits_decode_like_pamqp() -> None:
    props = commands.Basic.Properties(content_type="text/plain", headers={"a": 1, "b": [1, "x"], "c": "y"},
                                      priority=3)
    payload = _header_payload(props, 5)
    out = with_properties(payload, headers_set={"d": {"e": None}, "a": "one"}, headers_remove=["c", "zz"])
    decoded = decode_properties(out)
    assert decoded.headers == {"a": "one", "b": [1, "x"], "d": {"e": None}}
    assert (decoded.content_type, decoded.priority) == ("text/plain", 3)


def test_with_properties_set_wins_over_remove_and_drops_duplicates() -> None:
    payload = _headers_payload(_entry(b"k", b"b\x01") + _entry(b"j", b"b\x02") + _entry(b"k", b"b\x03"))
    out = with_properties(payload, headers_set={"k": 9}, headers_remove=["k"])
    assert list(_raw_entries(out).items()) == [(b"k", _entry(b"k", b"b\x09")), (b"j", _entry(b"j", b"b\x02"))]
    out = with_properties(payload, headers_remove=["k"])
    assert decode_headers(out, scan_properties(out).headers_span) == {"j": 2}


def test_with_properties_long_new_key_is_not_cut() -> None:
    key = "é" * 100                                   # 200 bytes: pamqp would cut it to 128
    out = with_properties(_header_payload(commands.Basic.Properties()), headers_set={key: 1})
    assert decode_headers(out, scan_properties(out).headers_span) == {key: 1}
    with pytest.raises(ValueError):
        with_properties(out, headers_set={"x" * 256: 1})


def test_with_properties_drops_headers_left_empty() -> None:
    props = commands.Basic.Properties(headers={"only": 1}, delivery_mode=2, app_id="app")
    payload = _header_payload(props, 1)
    out = with_properties(payload, headers_remove=["only"])
    assert out == _header_payload(commands.Basic.Properties(delivery_mode=2, app_id="app"), 1)
    assert scan_properties(out).headers_span is None
    # a whole-table replacement keeps pamqp's meaning: {} is an empty table, None removes it
    assert scan_properties(with_properties(payload, headers={})).headers_span is not None
    assert scan_properties(with_properties(payload, headers=None)).headers_span is None
    # headers= and entry edits combine: the edits apply to the new table
    out = with_properties(payload, headers={"a": 1, "b": 2}, headers_set={"c": 3}, headers_remove=["a"])
    assert decode_headers(out, scan_properties(out).headers_span) == {"b": 2, "c": 3}


@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_with_properties_removes_a_property(name: str) -> None:
    values = {
        "content_type": "a", "content_encoding": "b", "headers": {"h": 1}, "delivery_mode": 2,
        "priority": 1, "correlation_id": "c", "reply_to": "d", "expiration": "60000", "message_id": "e",
        "timestamp": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "message_type": "f",
        "user_id": "g", "app_id": "h"}
    payload = _header_payload(commands.Basic.Properties(**values), 12)
    out = with_properties(payload, **{name: None})
    want = commands.Basic.Properties(**{n: v for n, v in values.items() if n != name})
    assert out == _header_payload(want, 12)


def test_with_properties_cluster_id() -> None:
    # pamqp refuses to build a non-empty cluster-id (deprecated); it still travels, raw
    payload = build_content_header(0, struct.pack(">H", 1 << 2) + b"\x03abc")
    assert with_properties(payload, app_id="x") == build_content_header(
        0, struct.pack(">H", (1 << 3) | (1 << 2)) + b"\x01x\x03abc")
    assert with_properties(payload, cluster_id=None) == build_content_header(0, b"\x00\x00")
    assert with_properties(payload, cluster_id="de")[-3:] == b"\x02de"


def test_with_properties_encodes_timestamps_as_unsigned_seconds() -> None:
    payload = _header_payload(commands.Basic.Properties(), 0)
    assert with_properties(payload, timestamp=2**64 - 1)[-8:] == b"\xff" * 8
    naive = datetime.datetime(2024, 5, 6, 7, 8, 9)
    out = with_properties(payload, timestamp=naive)
    assert out[-8:] == struct.pack(">Q", int(naive.replace(tzinfo=datetime.UTC).timestamp()))
    with pytest.raises(ValueError):
        with_properties(payload, timestamp=-1)


def test_with_properties_refuses_bad_arguments() -> None:
    payload = _header_payload(commands.Basic.Properties(), 0)
    with pytest.raises(TypeError):
        with_properties(payload, type="t")                # pamqp's name is message_type
    with pytest.raises(ValueError):
        with_properties(payload, reply_to="x" * 256)
    with pytest.raises(ValueError):
        with_properties(payload, priority=256)
    with pytest.raises(TypeError):
        with_properties(payload, headers_set={"k": object()})


@pytest.mark.parametrize("props_raw", [
    struct.pack(">H", 1 << 13) + struct.pack(">I", 5) + _entry(b"k", b"S\x00\x00\x00\x09") + b"abcdefgh",
    struct.pack(">H", 1 << 13) + struct.pack(">I", 4) + _entry(b"k", b"l\x00"),
    struct.pack(">H", 1 << 13) + struct.pack(">I", 3) + _entry(b"k", b"?"),
    struct.pack(">H", 1 << 13) + struct.pack(">I", 3) + b"\x05abc",
    struct.pack(">H", 1 << 13) + struct.pack(">I", 9) + _entry(b"k", b"A\x00\x00\x00\x02S\x00"),
    struct.pack(">H", 1 << 6) + b"\x00" * 7,
    struct.pack(">H", 1 << 3) + b"\x06abcd",
    struct.pack(">H", 1 << 3),
    b"\x00",
])
def test_malformed_properties_are_a_frame_error_everywhere(props_raw: bytes) -> None:
    payload = build_content_header(0, props_raw)
    with pytest.raises(FrameError):
        decode_properties(payload)
    with pytest.raises(FrameError):
        with_properties(payload, reply_to="x")
    with pytest.raises(FrameError):
        with_properties(payload, headers_set={"k": 1})


def test_decode_headers_refuses_an_entry_running_past_its_table() -> None:
    payload = _headers_payload(_entry(b"k", b"S\x00\x00\x00\x09") + b"ab")
    with pytest.raises(FrameError):
        decode_headers(payload, scan_properties(payload).headers_span)


@SETTINGS
@given(props=basic_properties(min_present=1), data=st.data())
def test_with_properties_refuses_any_truncation(props: commands.Basic.Properties, data: st.DataObject) -> None:
    payload = _header_payload(props, 10)
    cut = data.draw(st.integers(0, len(payload) - 1), label="cut")
    with pytest.raises(FrameError):
        decode_properties(payload[:cut])
    with pytest.raises(FrameError):
        with_properties(payload[:cut], reply_to="r")


@SETTINGS
@given(table=header_tables)
def test_field_table_splitter_matches_pamqp(table: dict[str, Any]) -> None:
    from pamqp import decode as pdecode
    from pamqp import encode as pencode

    raw = pencode.field_table(table)
    check_field_table(raw)
    entries = field_table_entries(raw)
    assert [key.decode() for key, _, _ in entries] == list(pdecode.field_table(raw)[1])
    assert b"".join(raw[s:e] for _, s, e in entries) == raw[4:]
    for key, start, end in entries:
        assert pdecode.field_table(struct.pack(">I", end - start) + raw[start:end])[1] == {key.decode(): table[key.decode()]}
    # our encoder agrees with pamqp wherever pamqp is exact (no floats, no bytes, keys within 128 bytes),
    # except that nested tables keep their order where pamqp sorts their keys
    for value in table.values():
        raw_value = encode_field_value(value)
        assert pdecode.embedded_value(raw_value) == (len(raw_value), value)
        if not isinstance(value, (dict, list)):
            assert raw_value == pencode.encode_table_value(value)


@SETTINGS
@given(props=basic_properties(), new=header_tables, data=st.data())
def test_with_properties_header_edits_match_pamqp(props: commands.Basic.Properties, new: dict[str, Any],
                                                  data: st.DataObject) -> None:
    payload = _header_payload(props, 3)
    old = props.headers or {}
    remove = data.draw(st.lists(st.one_of(st.sampled_from(sorted(old) or ["-"]), st.text(_chars, max_size=5)),
                                max_size=4), label="remove")
    out = with_properties(payload, headers_set=new, headers_remove=remove)

    want = {k: v for k, v in old.items() if k not in remove}
    want.update(new)
    decoded = decode_properties(out)
    if not new and not remove:
        assert out == payload                       # nothing to edit: even an empty table stays
        return
    assert decoded.headers == (want or None)
    for other in PROPERTY_NAMES:
        if other != "headers":
            assert getattr(decoded, other) == _expected(props, other), other
    if want:
        raw = _raw_entries(out)
        before = _raw_entries(payload) if old else {}
        for key, entry in before.items():
            if key.decode() not in remove and key.decode() not in new:
                assert raw[key] == entry
    # the same change done by pamqp on the decoded properties
    props.headers = want or None
    assert decode_properties(out) == decode_properties(_header_payload(props, 3))
