"""Frame parsing from a receive buffer (sans-IO).

Wire format of a frame (AMQP 0-9-1 §4.2.3)::

    octet type | short channel | long size | size octets of payload | octet 0xCE

The parser is fed whatever the socket gave and returns the complete frames in it as plain tuples
``(frame_type, channel, payload)``: tuples, not objects, because this runs once per frame on the hot path.
It remembers where it stopped, so a frame split over many reads costs one copy of its bytes. A protocol
violation raises :class:`FrameError` with the reply code the connection must be closed with.

Two implementations: :class:`PyFrameParser` here, the reference, and the compiled one of
protocol/_codec.pyx, which replaces the name :class:`FrameParser` at the end of this module when it was
built and ``LEVERET_NO_EXTENSIONS`` is not set (see protocol/__init__.py). Both raise the exceptions of
protocol/frame_errors.py, re-exported here.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from protocol import codec_extension
from protocol.constants import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    FRAME_PUBLISH,
)
from protocol.frame_errors import (
    BadProtocolHeader,
    Frame,
    FrameError,
    check_protocol_header,
    classify_protocol_header,
)

__all__ = ["HEARTBEAT_FRAME", "BadProtocolHeader", "Frame", "FrameError", "FrameParser", "PyFrameParser",
           "classify_protocol_header", "encode_frame"]

_FRAME_HEAD = struct.Struct(">BHI")
_KNOWN_TYPES = frozenset({FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT})


class FrameParser:
    """Turns received bytes into frames. Call :meth:`feed` with each read; it returns the frames completed.

    ``frame_max`` is the largest frame (header and end octet included) the peer may send: 8192 until tuning,
    then the negotiated value (0 means no limit). Until :attr:`header_received`, the first 8 bytes are taken
    as the protocol header.

    ``combine_publish`` (the broker's reader): a basic.publish method frame followed, in what is being split,
    by a content header frame and one body frame of exactly the announced size, all on its channel and all
    well-formed, comes out as one item ``(FRAME_PUBLISH, channel, (method, header, body))``: the common
    message in one step instead of three (docs/decisions/performance.md: publish + header + body in one pass). Anything else
    (a body in several frames, an empty body, a frame still incomplete, one that would fail a check) comes out
    frame by frame, so errors are raised where and as they would be without it.
    """

    __slots__ = ("_buf", "_pos", "combine_publish", "frame_max", "header_received")

    def __init__(self, frame_max: int = FRAME_MIN_SIZE, expect_header: bool = True,
                 combine_publish: bool = False) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.frame_max = frame_max
        self.header_received = not expect_header
        self.combine_publish = combine_publish

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        if self._pos:
            del buf[: self._pos]
            self._pos = 0
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        if not self.header_received:
            if not check_protocol_header(buf):
                return frames
            self.header_received = True
            pos = 8
        try:
            pos = self._split(buf, pos, end, frames)
        except FrameError as exc:
            exc.frames = frames
            self._buf = bytearray()
            self._pos = 0
            raise
        self._pos = pos
        return frames

    def _split(self, buf: bytearray, pos: int, end: int, frames: list[Frame]) -> int:
        frame_max = self.frame_max
        unpack_head = _FRAME_HEAD.unpack_from
        while end - pos >= 7:
            frame_type, channel, size = unpack_head(buf, pos)
            if frame_type not in _KNOWN_TYPES:
                raise FrameError(f"unknown frame type {frame_type}")
            if frame_max and size + FRAME_OVERHEAD > frame_max:
                raise FrameError(
                    f"frame size {size + FRAME_OVERHEAD} larger than negotiated maximum {frame_max}")
            if frame_type == FRAME_HEARTBEAT and size:
                raise FrameError(f"heartbeat frame with a {size}-byte payload")
            stop = pos + 7 + size
            if stop >= end:
                break
            if buf[stop] != FRAME_END:
                raise FrameError(f"bad frame end octet {buf[stop]:#04x}, expected 0xce")
            if (frame_type == FRAME_METHOD and self.combine_publish and size >= 4
                    and buf[pos + 7 : pos + 11] == _BASIC_PUBLISH_IDS):
                after = _whole_publish_end(buf, stop + 1, end, channel, frame_max)
                if after:
                    header_stop = stop + 8 + _FRAME_HEAD.unpack_from(buf, stop + 1)[2]
                    # The item's payload is the three payloads' tuple, which Frame (bytes, as for every other
                    # item, so the hot path needs no narrowing) does not describe: Any; the reader takes it apart.
                    parts: Any = (bytes(buf[pos + 7 : stop]), bytes(buf[stop + 8 : header_stop]),
                                  bytes(buf[header_stop + 8 : after - 1]))
                    frames.append((FRAME_PUBLISH, channel, parts))
                    pos = after
                    continue
            frames.append((frame_type, channel, bytes(buf[pos + 7 : stop])))
            pos = stop + 1
        return pos

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf) - self._pos


_BASIC_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # class 60, method 40
_BODY_SIZE = struct.Struct(">Q")


def _frame_fits(frame_type: int, size: int, frame_max: int) -> bool:
    """Whether a frame head passes the checks :meth:`FrameParser._split` makes (without raising)."""
    return frame_type in _KNOWN_TYPES and not (frame_max and size + FRAME_OVERHEAD > frame_max) \
        and not (frame_type == FRAME_HEARTBEAT and size)


def _whole_publish_end(buf: bytearray, pos: int, end: int, channel: int, frame_max: int) -> int:
    """Where the body frame ends if ``buf[pos:end]`` starts with a content header frame and a single body frame
    completing it, both on ``channel``, complete and well-formed; else 0 (the frames then go one by one)."""
    if end - pos < 7:
        return 0
    frame_type, ch, size = _FRAME_HEAD.unpack_from(buf, pos)
    stop: int = pos + 7 + size
    if (frame_type != FRAME_HEADER or ch != channel or size < 12 or stop >= end or buf[stop] != FRAME_END
            or not _frame_fits(frame_type, size, frame_max)):
        return 0
    body_size = _BODY_SIZE.unpack_from(buf, pos + 11)[0]
    pos = stop + 1
    if body_size == 0 or end - pos < 7:
        return 0
    frame_type, ch, size = _FRAME_HEAD.unpack_from(buf, pos)
    stop = pos + 7 + size
    if (frame_type != FRAME_BODY or ch != channel or size != body_size or stop >= end or buf[stop] != FRAME_END
            or not _frame_fits(frame_type, size, frame_max)):
        return 0
    return stop + 1


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + b"\xce"


HEARTBEAT_FRAME = encode_frame(FRAME_HEARTBEAT, 0, b"")

# The pure-Python parser under a name of its own, for the tests that run both and for a reader of the code:
# it is the reference that the compiled one must match byte for byte and error for error.
PyFrameParser = FrameParser
# Not for the type checker: to it FrameParser stays the class above, whose interface the compiled one has
# (protocol/_codec.pyi), so the name remains usable as a type.
if not TYPE_CHECKING and codec_extension is not None:
    FrameParser = codec_extension.FrameParser
