"""FrameParser (sans-IO frame splitting), protocol header classification and frame limits.

Every parser test runs twice, through the ``codec`` fixture: against the pure-Python reference
(protocol.frames.PyFrameParser) and the compiled parser (protocol._codec); see
tests/unit/protocol/codec_impls.py.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import heartbeat as pheartbeat

from protocol.constants import (
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    PROTOCOL_HEADER,
    PROTOCOL_HEADER_0_9,
)
from protocol.frames import (
    HEARTBEAT_FRAME,
    BadProtocolHeader,
    FrameError,
    FrameParser,
    classify_protocol_header,
    encode_frame,
)
from protocol.methods import method_frame

sys.path.insert(0, str(Path(__file__).resolve().parent / "protocol"))
import codec_impls
from codec_impls import Codec


@pytest.fixture(scope="module", params=codec_impls.NAMES)
def codec(request: pytest.FixtureRequest) -> Codec:
    return codec_impls.get(request.param)


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _payload(frame: bytes) -> bytes:
    return frame[7:-1]


# A fixed stream with frames of every type, on several channels.
SAMPLE_FRAMES: list[tuple[int, int, bytes]] = [
    (FRAME_METHOD, 0, _payload(method_frame(0, commands.Connection.StartOk, client_properties={"a": 1},
                                            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))),
    (FRAME_METHOD, 0, _payload(method_frame(0, commands.Connection.TuneOk, channel_max=2047,
                                            frame_max=131072, heartbeat=60))),
    (FRAME_METHOD, 1, _payload(method_frame(1, commands.Channel.Open))),
    (FRAME_METHOD, 1, _payload(method_frame(1, commands.Basic.Publish, exchange="ex", routing_key="rk"))),
    (FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 11, 0)),
    (FRAME_BODY, 1, b"hello world"),
    (FRAME_HEARTBEAT, 0, b""),
    (FRAME_METHOD, 65535, _payload(method_frame(65535, commands.Basic.Ack, delivery_tag=7))),
    (FRAME_HEADER, 2, struct.pack(">HHQH", 60, 0, 0, 0)),
    (FRAME_BODY, 3, b""),  # an empty body frame is legal framing
    (FRAME_BODY, 3, bytes(range(256)) * 4),
    (FRAME_HEARTBEAT, 0, b""),
]


def _stream(frames: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(encode_frame(t, c, p) for t, c, p in frames)


SAMPLE_STREAM = PROTOCOL_HEADER + _stream(SAMPLE_FRAMES)


def _feed_chunks(parser: FrameParser, data: bytes, cuts: list[int]) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    prev = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out.extend(parser.feed(data[prev:cut]))
        prev = cut
    return out


frame_strategy = st.one_of(
    st.tuples(st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY]), st.integers(0, 65535),
              st.binary(max_size=300)),
    st.tuples(st.just(FRAME_HEARTBEAT), st.integers(0, 65535), st.just(b"")),
)


# -- valid streams -----------------------------------------------------------------------------------------

def test_encode_frame_layout_and_heartbeat() -> None:
    assert encode_frame(FRAME_BODY, 5, b"abc") == b"\x03\x00\x05\x00\x00\x00\x03abc\xce"
    assert HEARTBEAT_FRAME == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    assert HEARTBEAT_FRAME == pframe.marshal(pheartbeat.Heartbeat(), 0)
    assert encode_frame(FRAME_BODY, 9, b"xyz" * 100) == pframe.marshal(pbody.ContentBody(b"xyz" * 100), 9)


def test_whole_stream(codec: Codec) -> None:
    parser = codec.FrameParser()
    assert parser.feed(SAMPLE_STREAM) == SAMPLE_FRAMES
    assert parser.header_received
    assert parser.buffered == 0


def test_one_byte_at_a_time(codec: Codec) -> None:
    parser = codec.FrameParser()
    out = []
    for i in range(len(SAMPLE_STREAM)):
        out.extend(parser.feed(SAMPLE_STREAM[i : i + 1]))
    assert out == SAMPLE_FRAMES
    assert parser.buffered == 0


def test_frames_come_out_as_soon_as_complete(codec: Codec) -> None:
    parser = codec.FrameParser()
    data = SAMPLE_STREAM
    pos = 0
    for i in range(len(data)):
        got = parser.feed(data[i : i + 1])
        if i < len(PROTOCOL_HEADER):
            assert got == []
            continue
        if got:
            # The byte just fed was the end octet of exactly this frame.
            assert len(got) == 1
            assert data[i] == 0xCE
            pos += 1
        assert parser.buffered == (i + 1 - len(PROTOCOL_HEADER)) - len(_stream(SAMPLE_FRAMES[:pos]))
    assert pos == len(SAMPLE_FRAMES)


def test_empty_feeds_are_harmless(codec: Codec) -> None:
    parser = codec.FrameParser()
    assert parser.feed(b"") == []
    assert parser.feed(SAMPLE_STREAM[:3]) == []
    assert parser.feed(b"") == []
    assert parser.buffered == 3
    assert parser.feed(SAMPLE_STREAM[3:]) == SAMPLE_FRAMES
    assert parser.feed(b"") == []
    assert parser.buffered == 0


@SETTINGS
@given(st.lists(st.integers(0, len(SAMPLE_STREAM)), max_size=40))
def test_random_chunkings_of_sample_stream(codec: Codec, cuts: list[int]) -> None:
    parser = codec.FrameParser()
    assert _feed_chunks(parser, SAMPLE_STREAM, cuts) == SAMPLE_FRAMES
    assert parser.buffered == 0


@SETTINGS
@given(st.lists(frame_strategy, max_size=12), st.data())
def test_random_frames_random_chunkings(codec: Codec, frames: list[tuple[int, int, bytes]],
                                        data: st.DataObject) -> None:
    stream = PROTOCOL_HEADER + _stream(frames)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    parser = codec.FrameParser(frame_max=0)
    assert _feed_chunks(parser, stream, cuts) == frames
    assert parser.buffered == 0
    # The same stream fed whole, and byte by byte, gives the same frames.
    assert codec.FrameParser(frame_max=0).feed(stream) == frames
    one = codec.FrameParser(frame_max=0)
    assert [f for i in range(len(stream)) for f in one.feed(stream[i : i + 1])] == frames


@SETTINGS
@given(st.lists(frame_strategy, max_size=8), frame_strategy, st.data())
def test_trailing_partial_frame_stays_buffered(codec: Codec, frames: list[tuple[int, int, bytes]],
                                               last: tuple[int, int, bytes], data: st.DataObject) -> None:
    tail = encode_frame(*last)
    keep = data.draw(st.integers(1, len(tail) - 1), label="partial bytes")
    parser = codec.FrameParser(frame_max=0)
    assert parser.feed(PROTOCOL_HEADER + _stream(frames) + tail[:keep]) == frames
    assert parser.buffered == keep
    # More partial bytes, still not complete.
    more = data.draw(st.integers(keep, len(tail) - 1), label="more partial bytes")
    assert parser.feed(tail[keep:more]) == []
    assert parser.buffered == more
    assert parser.feed(tail[more:]) == [last]
    assert parser.buffered == 0


def test_frame_missing_only_its_end_octet_is_buffered(codec: Codec) -> None:
    parser = codec.FrameParser(expect_header=False)
    frame = encode_frame(FRAME_BODY, 1, b"abc")
    assert parser.feed(frame[:-1]) == []
    assert parser.buffered == len(frame) - 1
    assert parser.feed(b"\xce") == [(FRAME_BODY, 1, b"abc")]


def test_partial_protocol_header_stays_buffered(codec: Codec) -> None:
    parser = codec.FrameParser()
    assert parser.feed(PROTOCOL_HEADER[:5]) == []
    assert not parser.header_received
    assert parser.buffered == 5
    assert parser.feed(PROTOCOL_HEADER[5:] + encode_frame(FRAME_HEARTBEAT, 0, b"")[:3]) == []
    assert parser.header_received
    assert parser.buffered == 3


def test_expect_header_false_parses_frames_from_the_first_byte(codec: Codec) -> None:
    parser = codec.FrameParser(expect_header=False)
    assert parser.header_received
    assert parser.feed(_stream(SAMPLE_FRAMES)) == SAMPLE_FRAMES


def test_returned_payloads_are_bytes_and_independent_of_the_buffer(codec: Codec) -> None:
    parser = codec.FrameParser(expect_header=False)
    frames = parser.feed(encode_frame(FRAME_BODY, 1, b"first") + encode_frame(FRAME_BODY, 1, b"sec"))
    parser.feed(encode_frame(FRAME_BODY, 1, b"XXXXXXXXXXXXXXXX"))
    assert frames == [(FRAME_BODY, 1, b"first"), (FRAME_BODY, 1, b"sec")]
    assert all(type(p) is bytes for _, _, p in frames)


# -- protocol header ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("header", [PROTOCOL_HEADER, PROTOCOL_HEADER_0_9])
def test_accepted_protocol_headers(codec: Codec, header: bytes) -> None:
    assert header in (b"AMQP\x00\x00\x09\x01", b"AMQP\x01\x01\x00\x09")
    assert classify_protocol_header(header) == "amqp-0-9-1"
    parser = codec.FrameParser()
    assert parser.feed(header + HEARTBEAT_FRAME) == [(FRAME_HEARTBEAT, 0, b"")]
    assert parser.header_received


@pytest.mark.parametrize("header, kind", [
    (b"AMQP\x00\x00\x09\x00", "amqp"),        # 0-9-0
    (b"AMQP\x00\x00\x08\x00", "amqp"),        # 0-8
    (b"AMQP\x01\x01\x08\x00", "amqp"),        # 0-8 as old clients wrote it
    (b"AMQP\x01\x01\x00\x0a", "amqp"),        # 0-10
    (b"AMQP\x00\x01\x00\x00", "amqp"),        # 1.0
    (b"AMQP\x03\x01\x00\x00", "amqp"),        # 1.0 SASL
    (b"AMQP\x00\x00\x09\x02", "amqp"),
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "http"),
    (b"POST /api HTTP/1.1\r\n", "http"),
    (b"PUT /x HTTP/1.1\r\n", "http"),
    (b"HEAD / HTTP/1.0\r\n", "http"),
    (b"DELETE / HTTP/1.1\r\n", "http"),
    (b"OPTIONS * HTTP/1.1\r\n", "http"),
    (b"PATCH / HTTP/1.1\r\n", "http"),
    (b"CONNECT x:443 HTTP/1.1\r\n", "http"),
    (b"TRACE / HTTP/1.1\r\n", "http"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "http"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "tls"),   # TLS 1.0-record ClientHello
    (b"\x16\x03\x03\x00\xf4\x01\x00\x00\xf0", "tls"),
    (b"\x00\x00\x00\x00\x00\x00\x00\x00", "garbage"),
    (b"amqp\x00\x00\x09\x01", "garbage"),
    (b"hello world\n", "garbage"),
    (b"\x01\x00\x00\x00\x00\x00\x05\x00", "garbage"),           # a frame without the protocol header
    (b"\x16\x02\x01\x02\x00\x01\x00\x01", "garbage"),
    (b"get / HTTP/1.1\r\n", "garbage"),
])
def test_rejected_protocol_headers(codec: Codec, header: bytes, kind: str) -> None:
    assert classify_protocol_header(header[:8]) == kind
    parser = codec.FrameParser()
    with pytest.raises(BadProtocolHeader) as info:
        parser.feed(header)
    assert info.value.kind == kind
    if kind in ("amqp", "garbage"):
        assert info.value.received == header[:8]
    else:
        assert info.value.received.startswith(header[:4])
    assert not parser.header_received


@pytest.mark.parametrize("header, kind", [
    (b"GET / HTTP/1.1\r\n", "http"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc", "tls"),
])
def test_http_and_tls_are_recognised_after_four_bytes(codec: Codec, header: bytes, kind: str) -> None:
    parser = codec.FrameParser()
    for i in range(3):
        assert parser.feed(header[i : i + 1]) == []
    with pytest.raises(BadProtocolHeader) as info:
        parser.feed(header[3:4])
    assert info.value.kind == kind
    assert info.value.received == header[:4]


@pytest.mark.parametrize("header, kind", [
    (b"AMQP\x00\x00\x08\x00", "amqp"),
    (b"hello world", "garbage"),
])
def test_other_headers_wait_for_eight_bytes(codec: Codec, header: bytes, kind: str) -> None:
    parser = codec.FrameParser()
    for i in range(7):
        assert parser.feed(header[i : i + 1]) == []
    assert parser.buffered == 7
    with pytest.raises(BadProtocolHeader) as info:
        parser.feed(header[7:8])
    assert info.value.kind == kind
    assert info.value.received == header[:8]


@SETTINGS
@given(st.binary(min_size=8, max_size=8))
def test_classification_of_arbitrary_headers(codec: Codec, header: bytes) -> None:
    kind = classify_protocol_header(header)
    if header in (PROTOCOL_HEADER, PROTOCOL_HEADER_0_9):
        assert kind == "amqp-0-9-1"
        return
    assert kind in ("amqp", "http", "tls", "garbage")
    if header.startswith(b"AMQP"):
        assert kind == "amqp"
    parser = codec.FrameParser()
    with pytest.raises(BadProtocolHeader) as info:
        parser.feed(header)
    assert info.value.kind == kind


def test_protocol_header_is_only_expected_once(codec: Codec) -> None:
    # A second protocol header is not a header any more: 'A' (0x41) is no frame type.
    parser = codec.FrameParser()
    assert parser.feed(PROTOCOL_HEADER) == []
    with pytest.raises(FrameError) as info:
        parser.feed(PROTOCOL_HEADER)
    assert info.value.reply_code == FRAME_ERROR


# -- frame_max ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("frame_max", [4096, FRAME_MIN_SIZE, 131072])
def test_frame_of_exactly_frame_max_is_accepted(codec: Codec, frame_max: int) -> None:
    frame = encode_frame(FRAME_BODY, 1, b"x" * (frame_max - FRAME_OVERHEAD))
    assert len(frame) == frame_max
    parser = codec.FrameParser(frame_max=frame_max, expect_header=False)
    assert parser.feed(frame) == [(FRAME_BODY, 1, b"x" * (frame_max - FRAME_OVERHEAD))]


@pytest.mark.parametrize("frame_max", [4096, FRAME_MIN_SIZE, 131072])
def test_frame_one_byte_over_frame_max_is_a_frame_error(codec: Codec, frame_max: int) -> None:
    frame = encode_frame(FRAME_BODY, 1, b"x" * (frame_max - FRAME_OVERHEAD + 1))
    assert len(frame) == frame_max + 1
    parser = codec.FrameParser(frame_max=frame_max, expect_header=False)
    with pytest.raises(FrameError) as info:
        parser.feed(frame)
    assert info.value.reply_code == FRAME_ERROR == 501


def test_oversized_frame_is_refused_from_its_header_alone(codec: Codec) -> None:
    parser = codec.FrameParser(frame_max=4096, expect_header=False)
    with pytest.raises(FrameError) as info:
        parser.feed(struct.pack(">BHI", FRAME_METHOD, 1, 1 << 30))
    assert info.value.reply_code == 501


def test_default_frame_max_is_the_pre_tuning_limit(codec: Codec) -> None:
    parser = codec.FrameParser()
    ok = encode_frame(FRAME_METHOD, 0, b"m" * (FRAME_MIN_SIZE - FRAME_OVERHEAD))
    assert parser.feed(PROTOCOL_HEADER + ok) == [(FRAME_METHOD, 0, b"m" * (FRAME_MIN_SIZE - FRAME_OVERHEAD))]
    with pytest.raises(FrameError) as info:
        parser.feed(encode_frame(FRAME_METHOD, 0, b"m" * (FRAME_MIN_SIZE - FRAME_OVERHEAD + 1)))
    assert info.value.reply_code == 501


def test_frame_max_zero_means_no_limit(codec: Codec) -> None:
    payload = b"z" * (1 << 20)
    parser = codec.FrameParser(frame_max=0, expect_header=False)
    assert parser.feed(encode_frame(FRAME_BODY, 1, payload)) == [(FRAME_BODY, 1, payload)]


def test_frame_max_can_be_changed_after_tuning(codec: Codec) -> None:
    parser = codec.FrameParser()
    parser.feed(PROTOCOL_HEADER)
    parser.frame_max = 131072
    big = b"b" * (131072 - FRAME_OVERHEAD)
    assert parser.feed(encode_frame(FRAME_BODY, 1, big)) == [(FRAME_BODY, 1, big)]
    parser.frame_max = 4096
    with pytest.raises(FrameError):
        parser.feed(encode_frame(FRAME_BODY, 1, b"b" * 4089))


@SETTINGS
@given(st.integers(4096, 20000), st.integers(0, 20000))
def test_frame_max_boundary(codec: Codec, frame_max: int, payload_size: int) -> None:
    frame = encode_frame(FRAME_BODY, 1, bytes(payload_size))
    parser = codec.FrameParser(frame_max=frame_max, expect_header=False)
    if len(frame) <= frame_max:
        assert parser.feed(frame) == [(FRAME_BODY, 1, bytes(payload_size))]
    else:
        with pytest.raises(FrameError) as info:
            parser.feed(frame)
        assert info.value.reply_code == 501


# -- malformed frames --------------------------------------------------------------------------------------

@pytest.mark.parametrize("end", [0x00, 0xCD, 0xCF, 0xFF, ord("A")])
def test_bad_frame_end_is_a_frame_error(codec: Codec, end: int) -> None:
    frame = encode_frame(FRAME_METHOD, 1, b"\x00\x14\x00\x0a\x00")[:-1] + bytes([end])
    parser = codec.FrameParser(expect_header=False)
    with pytest.raises(FrameError) as info:
        parser.feed(frame)
    assert info.value.reply_code == 501
    assert info.value.frames == []


@pytest.mark.parametrize("frame_type", [0, 4, 5, 7, 9, 0x41, 0xCE, 0xFF])
def test_unknown_frame_type_is_a_frame_error(codec: Codec, frame_type: int) -> None:
    parser = codec.FrameParser(expect_header=False)
    with pytest.raises(FrameError) as info:
        parser.feed(encode_frame(frame_type, 1, b"abc"))
    assert info.value.reply_code == 501


@pytest.mark.parametrize("size", [1, 4, 100])
def test_heartbeat_with_a_payload_is_a_frame_error(codec: Codec, size: int) -> None:
    parser = codec.FrameParser(expect_header=False)
    with pytest.raises(FrameError) as info:
        parser.feed(HEARTBEAT_FRAME + encode_frame(FRAME_HEARTBEAT, 0, b"x" * size))
    assert info.value.reply_code == 501
    assert info.value.frames == [(FRAME_HEARTBEAT, 0, b"")]


def test_unknown_frame_type_is_refused_from_its_header_alone(codec: Codec) -> None:
    parser = codec.FrameParser(expect_header=False)
    with pytest.raises(FrameError):
        parser.feed(b"\x04\x00\x01\x00\x00\x00\x10")


@pytest.mark.parametrize("bad", [
    encode_frame(FRAME_BODY, 1, b"abc")[:-1] + b"\x00",
    encode_frame(9, 1, b"abc"),
    encode_frame(FRAME_BODY, 1, b"x" * 9000),
])
def test_frames_before_a_bad_frame_are_in_the_error(codec: Codec, bad: bytes) -> None:
    parser = codec.FrameParser()
    with pytest.raises(FrameError) as info:
        parser.feed(SAMPLE_STREAM + bad + encode_frame(FRAME_BODY, 1, b"never"))
    assert info.value.reply_code == 501
    assert info.value.frames == SAMPLE_FRAMES
    assert parser.buffered == 0


def test_error_frames_only_hold_those_of_the_failing_read(codec: Codec) -> None:
    parser = codec.FrameParser()
    assert parser.feed(SAMPLE_STREAM) == SAMPLE_FRAMES
    good = encode_frame(FRAME_BODY, 1, b"ok")
    with pytest.raises(FrameError) as info:
        parser.feed(good + good[:-1] + b"\x01")
    assert info.value.frames == [(FRAME_BODY, 1, b"ok")]


@SETTINGS
@given(st.lists(frame_strategy, max_size=8), st.integers(0, 255).filter(lambda b: b != 0xCE), st.data())
def test_bad_frame_end_in_random_chunkings(codec: Codec, frames: list[tuple[int, int, bytes]], end: int,
                                           data: st.DataObject) -> None:
    stream = PROTOCOL_HEADER + _stream(frames) + encode_frame(FRAME_BODY, 1, b"bad")[:-1] + bytes([end])
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(stream)), max_size=10))))
    parser = codec.FrameParser(frame_max=0)
    got: list[tuple[int, int, bytes]] = []
    prev = 0
    with pytest.raises(FrameError) as info:
        for cut in cuts + [len(stream)]:
            got.extend(parser.feed(stream[prev:cut]))
            prev = cut
    assert info.value.reply_code == 501
    assert got + info.value.frames == frames


# -- how reads arrive ----------------------------------------------------------------------------------------

def test_reads_of_any_bytes_like_type(codec: Codec) -> None:
    # The broker's reads are bytes; a bytearray or memoryview read is taken too (the compiled parser's
    # generic path), and frames may straddle reads of different types.
    parser = codec.FrameParser()
    cut1, cut2 = 20, len(SAMPLE_STREAM) - 30
    out = parser.feed(bytearray(SAMPLE_STREAM[:cut1]))
    out += parser.feed(SAMPLE_STREAM[cut1:cut2])
    out += parser.feed(memoryview(SAMPLE_STREAM)[cut2:])
    assert out == SAMPLE_FRAMES
    assert parser.buffered == 0
    assert all(type(p) is bytes for _, _, p in out)


def test_a_large_frame_over_many_reads_then_small_ones_in_the_last(codec: Codec) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB
    tail = [(FRAME_BODY, 2, b"after"), (FRAME_HEARTBEAT, 0, b"")]
    first = encode_frame(FRAME_BODY, 1, big)
    stream = first + _stream(tail)
    parser = codec.FrameParser(frame_max=0, expect_header=False)
    got = []
    for i in range(0, len(stream), 65536):
        got += parser.feed(stream[i : i + 65536])
        if i + 65536 < len(first):
            assert got == [] and parser.buffered == i + 65536
    assert got == [(FRAME_BODY, 1, big), *tail]
    assert parser.buffered == 0


def test_frame_max_lowered_while_a_frame_is_buffered(codec: Codec) -> None:
    # The buffered frame's header is checked again on the next read, against the frame_max of then.
    parser = codec.FrameParser(frame_max=0, expect_header=False)
    frame = encode_frame(FRAME_BODY, 1, b"x" * 5000)
    assert parser.feed(frame[:100]) == []
    parser.frame_max = 4096
    with pytest.raises(FrameError) as info:
        parser.feed(frame[100:101])
    assert info.value.text == "frame size 5008 larger than negotiated maximum 4096"
    assert info.value.frames == []
    assert parser.buffered == 0


def test_header_received_and_frame_max_are_plain_attributes(codec: Codec) -> None:
    parser = codec.FrameParser(frame_max=4096)
    assert parser.frame_max == 4096 and parser.header_received is False
    parser.header_received = True
    parser.frame_max = 131072
    assert parser.feed(HEARTBEAT_FRAME) == [(FRAME_HEARTBEAT, 0, b"")]
    assert (parser.frame_max, parser.header_received) == (131072, True)
    with pytest.raises(AttributeError):
        parser.unknown_attribute = 1  # type: ignore[attr-defined]
