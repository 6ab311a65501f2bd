"""FrameParser(combine_publish=True): a basic.publish with its content header and single body frame, all in what
one feed() splits, comes out as one FRAME_PUBLISH item; everything else exactly as without it.

The property tested on random streams (publishes with one, several or no body frames, interleaved channels,
other methods, heartbeats) and random read boundaries: expanding each FRAME_PUBLISH item back into its three
frames gives, read for read, what the plain parser gives; and errors (bad end octets, oversize frames, unknown
types) are raised with the same text and the same frames before them. Both implementations, through the
``codec`` fixture (tests/unit/protocol/codec_impls.py), and the two must agree item for item.
"""

from __future__ import annotations

import itertools
import struct

import codec_impls
import pytest
from codec_impls import Codec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.constants import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_PUBLISH
from protocol.frames import FrameError, encode_frame

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PUBLISH = b"\x00\x3c\x00\x28" + b"\x00\x00" + b"\x03ex1" + b"\x02rk" + b"\x00"


@pytest.fixture(scope="module", params=codec_impls.NAMES)
def codec(request: pytest.FixtureRequest) -> Codec:
    return codec_impls.get(request.param)


def header(body_size: int, class_id: int = 60) -> bytes:
    return struct.pack(">HHQH", class_id, 0, body_size, 0)


def publish_frames(channel: int, body: bytes, parts: int = 1) -> list[tuple[int, int, bytes]]:
    frames = [(FRAME_METHOD, channel, PUBLISH), (FRAME_HEADER, channel, header(len(body)))]
    if body:
        step = max(1, -(-len(body) // parts))
        frames += [(FRAME_BODY, channel, body[i:i + step]) for i in range(0, len(body), step)]
    return frames


def expand(items: list) -> list[tuple[int, int, bytes]]:
    out = []
    for frame_type, channel, payload in items:
        if frame_type == FRAME_PUBLISH:
            method, head, body = payload
            out += [(FRAME_METHOD, channel, method), (FRAME_HEADER, channel, head), (FRAME_BODY, channel, body)]
        else:
            out.append((frame_type, channel, payload))
    return out


def stream_of(frames: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(encode_frame(*f) for f in frames)


def feed_in_chunks(parser, data: bytes, cuts: list[int]) -> tuple[list[list], FrameError | None]:
    """Each feed()'s items, and the error that stopped the feeding (its frames appended to the last list)."""
    out: list[list] = []
    bounds = [0, *sorted(set(cuts)), len(data)]
    for a, b in itertools.pairwise(bounds):
        try:
            out.append(parser.feed(data[a:b]))
        except FrameError as exc:
            out.append(list(exc.frames))
            return out, exc
    return out, None


def test_a_whole_publish_is_one_item(codec: Codec) -> None:
    parser = codec.FrameParser(frame_max=0, expect_header=False, combine_publish=True)
    items = parser.feed(stream_of(publish_frames(3, b"hello")))
    assert items == [(FRAME_PUBLISH, 3, (PUBLISH, header(5), b"hello"))]
    assert parser.buffered == 0


def test_without_the_flag_nothing_is_combined(codec: Codec) -> None:
    frames = publish_frames(3, b"hello")
    assert codec.FrameParser(frame_max=0, expect_header=False).feed(stream_of(frames)) == frames


@pytest.mark.parametrize("frames", [
    publish_frames(1, b"abcdef", parts=2),  # a body in two frames
    publish_frames(1, b""),  # no body frame at all
    [(FRAME_METHOD, 1, PUBLISH), (FRAME_HEADER, 1, header(3)), (FRAME_BODY, 2, b"abc")],  # body on another channel
    [(FRAME_METHOD, 1, PUBLISH), (FRAME_HEADER, 2, header(3)), (FRAME_BODY, 2, b"abc")],  # header elsewhere
    [(FRAME_METHOD, 1, PUBLISH), (FRAME_HEADER, 1, header(4)), (FRAME_BODY, 1, b"abc")],  # body too short
    [(FRAME_METHOD, 1, PUBLISH), (FRAME_HEADER, 1, header(2)), (FRAME_BODY, 1, b"abc")],  # body too long
    [(FRAME_METHOD, 1, PUBLISH), (FRAME_HEADER, 1, b"\x00\x3c"), (FRAME_BODY, 1, b"abc")],  # header too short
    [(FRAME_METHOD, 1, PUBLISH), (FRAME_METHOD, 1, PUBLISH), (FRAME_HEADER, 1, header(1)), (FRAME_BODY, 1, b"a")],
    [(FRAME_METHOD, 1, b"\x00\x3c\x00\x50\x00"), (FRAME_HEADER, 1, header(1)), (FRAME_BODY, 1, b"a")],  # basic.ack
])
def test_other_shapes_stay_frame_by_frame(codec: Codec, frames: list) -> None:
    parser = codec.FrameParser(frame_max=0, expect_header=False, combine_publish=True)
    items = parser.feed(stream_of(frames))
    if frames[1:2] == [(FRAME_METHOD, 1, PUBLISH)]:  # the second publish is whole: only it combines
        assert items[0] == frames[0] and expand(items[1:]) == frames[1:]
    else:
        assert items == frames


def test_a_publish_cut_by_the_end_of_a_read_is_not_combined(codec: Codec) -> None:
    data = stream_of(publish_frames(1, b"abc"))
    parser = codec.FrameParser(frame_max=0, expect_header=False, combine_publish=True)
    first = parser.feed(data[:-1])
    assert first == publish_frames(1, b"abc")[:2]
    assert parser.feed(data[-1:]) == [(FRAME_BODY, 1, b"abc")]


def test_a_bad_body_frame_fails_as_without_the_flag(codec: Codec) -> None:
    frames = publish_frames(1, b"abc")
    data = bytearray(stream_of(frames))
    data[-1] = 0x00  # the body frame's end octet
    for combine in (False, True):
        parser = codec.FrameParser(frame_max=0, expect_header=False, combine_publish=combine)
        with pytest.raises(FrameError) as err:
            parser.feed(bytes(data))
        assert err.value.frames == frames[:2] and "bad frame end octet" in err.value.text


def test_an_oversize_body_frame_fails_as_without_the_flag(codec: Codec) -> None:
    frames = publish_frames(1, b"x" * 100)
    for combine in (False, True):
        parser = codec.FrameParser(frame_max=64, expect_header=False, combine_publish=combine)
        with pytest.raises(FrameError) as err:
            parser.feed(stream_of(frames))
        assert err.value.frames == frames[:2] and "larger than negotiated maximum" in err.value.text


channels = st.integers(1, 3)
bodies = st.binary(max_size=40)
pieces = st.one_of(
    st.builds(publish_frames, channels, bodies, st.integers(1, 3)),
    st.builds(lambda c, p: [(FRAME_METHOD, c, p)], channels, st.binary(min_size=4, max_size=12)),
    st.builds(lambda c, b: [(FRAME_BODY, c, b)], channels, bodies),
    st.just([(FRAME_HEARTBEAT, 0, b"")]),
)


@SETTINGS
@given(st.lists(pieces, max_size=10), st.data())
def test_random_streams_expand_to_what_the_plain_parser_gives(codec: Codec, parts: list, data: st.DataObject) -> None:
    frames = [f for part in parts for f in part]
    stream = stream_of(frames)
    if data.draw(st.booleans(), label="corrupt a byte"):
        at = data.draw(st.integers(0, max(0, len(stream) - 1)), label="where")
        stream = stream[:at] + bytes([data.draw(st.integers(0, 255))]) + stream[at + 1:]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="read boundaries")
    frame_max = data.draw(st.sampled_from([0, 48, 4096]), label="frame_max")
    plain_reads, plain_err = feed_in_chunks(codec.FrameParser(frame_max=frame_max, expect_header=False), stream,
                                            cuts)
    combined = codec.FrameParser(frame_max=frame_max, expect_header=False, combine_publish=True)
    reads, err = feed_in_chunks(combined, stream, cuts)
    assert [expand(r) for r in reads] == plain_reads
    assert (err is None) == (plain_err is None)
    if err is not None and plain_err is not None:
        assert (err.text, err.reply_code) == (plain_err.text, plain_err.reply_code)
    # And the two implementations agree item for item (the reference is the pure one).
    reference = codec_impls.get("pure").FrameParser(frame_max=frame_max, expect_header=False, combine_publish=True)
    assert feed_in_chunks(reference, stream, cuts)[0] == reads
