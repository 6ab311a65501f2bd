"""The compiled codec (protocol/_codec.pyx) against the pure-Python reference, on the same inputs.

Frames: random valid streams fed in random chunkings (bytes reads mostly, a bytearray now and then, frame_max
changed between reads) give the same frames, ``buffered`` and ``header_received`` after every read; random
garbage, alone or after valid frames, gives the same exception (class, text, reply code, the frames that
preceded the bad one, the refused protocol header), and the parsers go on alike after it. The fast codec's
functions give the same values for valid and arbitrary inputs, and the same exception (class and message)
for arbitrary ones, off-range integers and odd argument types included.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import codec_impls
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.constants import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    PROTOCOL_HEADER_0_9,
)
from protocol.frames import encode_frame

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def pure() -> codec_impls.Codec:
    return codec_impls.get("pure")


@pytest.fixture(scope="module")
def compiled() -> codec_impls.Codec:
    return codec_impls.get("compiled")


def outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    """What a call did, comparable across implementations: its value (normalised) or its exception."""
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 - any exception is an outcome to compare
        return ("raised", type(exc), str(exc), getattr(exc, "text", None), getattr(exc, "reply_code", None),
                getattr(exc, "frames", None), getattr(exc, "kind", None), getattr(exc, "received", None))
    return ("returned", normalise(value))


def normalise(value: Any) -> Any:
    if hasattr(value, "names_raw"):  # PublishArgs, whichever class
        return ("PublishArgs", value.exchange, value.routing_key, value.mandatory, value.immediate,
                value.names_raw, type(value.names_raw))
    if isinstance(value, list):
        return [(type(v), bytes(v)) if isinstance(v, (bytes, bytearray, memoryview)) else v for v in value]
    if isinstance(value, tuple):
        return tuple((type(v), v) for v in value)
    return (type(value), value)


# -- frames -------------------------------------------------------------------------------------------------

frames_st = st.lists(st.one_of(
    st.tuples(st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY]), st.integers(0, 65535),
              st.one_of(st.binary(max_size=300), st.integers(0, 20000).map(bytes))),
    st.tuples(st.just(FRAME_HEARTBEAT), st.integers(0, 65535), st.just(b"")),
), max_size=10)


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes | bytearray]:
    """``data`` cut at random points; each piece a bytes read, or now and then a bytearray."""
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=12))))
    pieces: list[bytes | bytearray] = []
    for a, b in itertools.pairwise([0, *cuts, len(data)]):
        piece = data[a:b]
        pieces.append(bytearray(piece) if draw(st.integers(0, 9)) == 0 else piece)
    return pieces


def run_both(pure: Any, compiled: Any, chunks: list[bytes | bytearray], frame_max: int, expect_header: bool,
             frame_max_changes: dict[int, int]) -> list[tuple[Any, ...]]:
    """Feed the same reads to a parser of each implementation; assert that every read has the same outcome and
    leaves the same state. Returns the outcomes."""
    p, c = pure.FrameParser(frame_max, expect_header=expect_header), \
        compiled.FrameParser(frame_max, expect_header=expect_header)
    seen = []
    for i, chunk in enumerate(chunks):
        if i in frame_max_changes:
            p.frame_max = c.frame_max = frame_max_changes[i]
        got_p, got_c = outcome(p.feed, chunk), outcome(c.feed, chunk)
        assert got_c == got_p, f"read {i} of {len(chunks)}"
        assert (c.buffered, c.header_received, c.frame_max) == (p.buffered, p.header_received, p.frame_max)
        seen.append(got_p)
    return seen


@SETTINGS
@given(frames=frames_st, header=st.sampled_from([None, PROTOCOL_HEADER, PROTOCOL_HEADER_0_9]),
       frame_max=st.sampled_from([0, 4096, 8192, 131072]), data=st.data())
def test_valid_streams_in_random_chunkings(pure, compiled, frames, header, frame_max, data) -> None:
    stream = (header or b"") + b"".join(encode_frame(*f) for f in frames)
    chunks = data.draw(chunkings(stream), label="reads")
    changes = data.draw(st.dictionaries(st.integers(0, len(chunks)), st.sampled_from([0, 4096, 131072]),
                                        max_size=2), label="frame_max changes")
    seen = run_both(pure, compiled, chunks, frame_max, header is not None, changes)
    if frame_max == 0 and not changes:
        assert [f for _kind, value in seen for f in value] == frames


def _one_octet_changed(frame: bytes, where: int, octet: int) -> bytes:
    where %= len(frame)
    return frame[:where] + bytes([octet]) + frame[where + 1 :]


NEAR_MISSES = [encode_frame(FRAME_METHOD, 1, b"\x00\x3c\x00\x28abc"), encode_frame(FRAME_BODY, 2, b"x" * 40)]
garbage = st.one_of(
    st.binary(max_size=64),
    st.builds(_one_octet_changed, st.sampled_from(NEAR_MISSES), st.integers(0, 50), st.integers(0, 255)),
    st.sampled_from([b"GET / HTTP/1.1\r\n", b"\x16\x03\x01\x02\x00", b"AMQP\x00\x00\x08\x00",
                     b"AMQP\x00\x00\x09\x01", struct.pack(">BHI", FRAME_BODY, 1, 1 << 30),
                     struct.pack(">BHI", FRAME_HEARTBEAT, 0, 5)]),
)


@SETTINGS
@given(frames=frames_st, junk=st.lists(garbage, min_size=1, max_size=3), expect_header=st.booleans(),
       frame_max=st.sampled_from([0, 1, 8, 9, 4096, 8192]), data=st.data())
def test_garbage_gives_the_same_errors(pure, compiled, frames, junk, expect_header, frame_max,
                                       data) -> None:
    head = PROTOCOL_HEADER if expect_header and data.draw(st.booleans(), label="valid header") else b""
    stream = head + b"".join(encode_frame(*f) for f in frames) + b"".join(junk)
    chunks = data.draw(chunkings(stream), label="reads")
    # More reads after the error: the parsers must also agree on what they do next.
    chunks += data.draw(st.lists(st.binary(max_size=30), max_size=3), label="reads after")
    changes = data.draw(st.dictionaries(st.integers(0, len(chunks)), st.sampled_from([0, 4096, 10]),
                                        max_size=1), label="frame_max changes")
    run_both(pure, compiled, chunks, frame_max, expect_header, changes)


@SETTINGS
@given(data=st.binary(max_size=300), expect_header=st.booleans(), frame_max=st.sampled_from([0, 8192]))
def test_random_bytes_whole_and_one_by_one(pure, compiled, data, expect_header, frame_max) -> None:
    run_both(pure, compiled, [data], frame_max, expect_header, {})
    run_both(pure, compiled, [data[i : i + 1] for i in range(len(data))], frame_max, expect_header, {})


# -- the fast codec ------------------------------------------------------------------------------------------

shortstr_raw = st.binary(max_size=40).map(lambda b: bytes([len(b)]) + b)
publish_args = st.builds(lambda ex, rk, bits, tail: b"\x00\x00" + ex + rk + bytes([bits]) + tail,
                         shortstr_raw, shortstr_raw, st.integers(0, 255), st.binary(max_size=4))
decode_inputs = st.one_of(
    st.binary(max_size=60),
    publish_args,
    publish_args.flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),  # cut anywhere
    st.builds(struct.Struct(">QB").pack, st.integers(0, 2**64 - 1), st.integers(0, 255)),
    st.builds(lambda cls, size, rest: struct.pack(">HHQ", cls, 0, size) + rest,
              st.sampled_from([60, 50, 0]), st.integers(0, 2**64 - 1), st.binary(max_size=6)),
)
starts = st.one_of(st.sampled_from([0, 4]), st.integers(-3, 70),
                   st.sampled_from([2**31, 2**62, 2**63 - 1, 2**70]), st.just(True))
DECODERS = ("decode_basic_publish", "decode_ack", "decode_nack", "decode_reject")


@SETTINGS
@given(args=decode_inputs, start=starts, as_type=st.sampled_from([bytes, bytes, bytes, bytearray]))
def test_decoders_agree_on_anything(pure, compiled, args, start, as_type) -> None:
    value = as_type(args)
    for name in DECODERS:
        fast, reference = getattr(compiled.fc, name), getattr(pure.fc, name)
        assert outcome(fast, value, start) == outcome(reference, value, start), name
        if start == 0:
            assert outcome(fast, value) == outcome(reference, value), name
    assert outcome(compiled.fc.decode_content_header, value) == outcome(pure.fc.decode_content_header, value)


@SETTINGS
@given(args=publish_args.map(lambda b: b"\x00\x3c\x00\x28" + b))
def test_publish_from_offset_four_agrees(pure, compiled, args) -> None:
    fast, reference = compiled.fc.decode_basic_publish, pure.fc.decode_basic_publish
    assert outcome(fast, args, 4) == outcome(reference, args, 4)


ints = st.one_of(st.integers(0, 65535), st.integers(0, 2**64 - 1),
                 st.sampled_from([-1, 65536, 2**64, 2**80]), st.booleans())
raws = st.one_of(shortstr_raw, st.binary(max_size=20), shortstr_raw.map(bytearray))
flags = st.one_of(st.booleans(), st.integers(0, 3), st.none(), st.just("yes"))


@SETTINGS
@given(channel=ints, raw1=raws, tag=ints, flag1=flags, raw2=raws, flag2=flags)
def test_encoders_agree_on_anything(pure, compiled, channel, raw1, tag, flag1, raw2, flag2) -> None:
    calls = [
        ("encode_basic_deliver", (channel, raw1, tag, flag1, raw2)),
        ("encode_basic_ack", (channel, tag, flag1)),
        ("encode_basic_nack", (channel, tag, flag1, flag2)),
        ("encode_basic_nack", (channel, tag, flag1)),
        ("build_content_header", (tag, raw1)),
    ]
    for name, args in calls:
        assert outcome(getattr(compiled.fc, name), *args) == outcome(getattr(pure.fc, name), *args), name


@SETTINGS
@given(channel=ints, header=raws,
       body=st.one_of(st.binary(max_size=300), st.integers(0, 40000).map(bytes),
                      st.binary(max_size=50).map(bytearray)),
       frame_max=st.one_of(st.sampled_from([0, 1, 8, 9, 4096, 131072, -5]), st.integers(9, 5000)))
def test_encode_content_agrees(pure, compiled, channel, header, body, frame_max) -> None:
    args = (channel, header, body, frame_max)
    assert outcome(compiled.fc.encode_content, *args) == outcome(pure.fc.encode_content, *args)
