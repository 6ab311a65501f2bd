"""The framing errors and the protocol-header check, shared by both frame parsers.

They live apart from protocol/frames.py so that the compiled parser (protocol/_codec.pyx) raises the very
same classes as the pure-Python one without importing protocol.frames, which imports the compiled module
at its end: a broker catching ``FrameError`` must not care which parser runs. protocol.frames re-exports
them; import them from there.
"""

from __future__ import annotations

from protocol.constants import FRAME_ERROR, PROTOCOL_HEADER, PROTOCOL_HEADER_0_9

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


def check_protocol_header(buf: bytes | bytearray) -> bool:
    """The protocol-header step of a parser whose buffer holds ``buf``: True once 8 bytes of AMQP 0-9-1 are
    there, False while fewer than 8 bytes came; :class:`BadProtocolHeader` for anything else (an HTTP
    request or a TLS hello is known from its first 4 bytes, without waiting for 8)."""
    end = len(buf)
    if end < 8:
        if end >= 4:
            kind = classify_protocol_header(bytes(buf[:4]) + b"\0\0\0\0")
            if kind in ("http", "tls"):
                raise BadProtocolHeader(kind, bytes(buf))
        return False
    header = bytes(buf[:8])
    kind = classify_protocol_header(header)
    if kind != "amqp-0-9-1":
        raise BadProtocolHeader(kind, header)
    return True
