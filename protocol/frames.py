"""Frame parsing from a receive buffer (sans-IO).

Wire format of a frame (AMQP 0-9-1 §4.2.3)::

    octet type | short channel | long size | size octets of payload | octet 0xCE

The parser is fed whatever the socket gave and returns the complete frames in it as plain tuples
``(frame_type, channel, payload)``: tuples, not objects, because this runs once per frame on the hot path.
It remembers where it stopped, so a frame split over many reads costs one copy of its bytes. A protocol
violation raises :class:`FrameError` with the reply code the connection must be closed with.
"""

from __future__ import annotations

import struct

from protocol.constants import (
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    PROTOCOL_HEADER,
    PROTOCOL_HEADER_0_9,
)

_FRAME_HEAD = struct.Struct(">BHI")
_KNOWN_TYPES = frozenset({FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT})
_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN", b"TRAC", b"PRI ")

Frame = tuple[int, int, bytes]


class FrameError(Exception):
    """A framing violation; the connection is closed with ``reply_code`` (501 FRAME_ERROR unless stated)."""

    def __init__(self, text: str, reply_code: int = FRAME_ERROR) -> None:
        super().__init__(text)
        self.text = text
        self.reply_code = reply_code
        # The complete frames that preceded the bad one in the same read: they are still processed.
        self.frames: list[Frame] = []


class BadProtocolHeader(Exception):
    """The peer did not open with AMQP 0-9-1. ``kind`` is 'amqp' (another AMQP version), 'http', 'tls'
    or 'garbage'; for all of them the answer is our own protocol header and a closed socket."""

    def __init__(self, kind: str, received: bytes) -> None:
        super().__init__(f"{kind} protocol header {received!r}")
        self.kind = kind
        self.received = received


def classify_protocol_header(header: bytes) -> str:
    """Name what a peer that sent ``header`` (8 bytes) is speaking: 'amqp-0-9-1' is the only one we serve."""
    if header == PROTOCOL_HEADER or header == PROTOCOL_HEADER_0_9:
        return "amqp-0-9-1"
    if header.startswith(b"AMQP"):
        return "amqp"
    if header.startswith(_HTTP_METHODS):
        return "http"
    if header[:1] == b"\x16" and header[1:2] == b"\x03":
        return "tls"
    return "garbage"


class FrameParser:
    """Turns received bytes into frames. Call :meth:`feed` with each read; it returns the frames completed.

    ``frame_max`` is the largest frame (header and end octet included) the peer may send: 8192 until tuning,
    then the negotiated value (0 means no limit). Until :attr:`header_received`, the first 8 bytes are taken
    as the protocol header.
    """

    __slots__ = ("_buf", "_pos", "frame_max", "header_received")

    def __init__(self, frame_max: int = FRAME_MIN_SIZE, expect_header: bool = True) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.frame_max = frame_max
        self.header_received = not expect_header

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
            if end < 8:
                # An HTTP client or TLS hello is recognisable from its first bytes; don't wait for 8 of them.
                if end >= 4 and classify_protocol_header(bytes(buf[:4]) + b"\0\0\0\0") in ("http", "tls"):
                    raise BadProtocolHeader(classify_protocol_header(bytes(buf[:4]) + b"\0\0\0\0"), bytes(buf))
                return frames
            header = bytes(buf[:8])
            kind = classify_protocol_header(header)
            if kind != "amqp-0-9-1":
                raise BadProtocolHeader(kind, header)
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
            frames.append((frame_type, channel, bytes(buf[pos + 7 : stop])))
            pos = stop + 1
        return pos

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf) - self._pos


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + b"\xce"


HEARTBEAT_FRAME = encode_frame(FRAME_HEARTBEAT, 0, b"")
