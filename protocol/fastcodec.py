"""Hand-written codec for the frames every message crosses: basic.publish, content header and body in;
basic.deliver, basic.get-ok, basic.return, basic.ack / nack out; basic.ack / nack / reject in.

pamqp decodes these correctly but slowly (~8 µs a frame; docs/decisions/hot-path-messages.md); these functions do the same
in well under 1 µs with precompiled structs, and are tested against pamqp. Short strings that only pass
through (exchange and routing key of a publish) are kept as raw bytes, length octet included, so a
delivery can reuse them without re-encoding.

The functions of the per-message path (publish, header and ack in; deliver, ack, nack and content out) have a
compiled twin in protocol/_codec.pyx. The definitions here are the reference; when the compiled module runs
(see protocol/__init__.py), the end of this module replaces their public names with the compiled ones, and
:data:`pure` keeps the pure-Python ones reachable (the tests run both, the micro-benchmark times both).
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

from protocol import codec_extension
from protocol.constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET_EMPTY,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_RETURN,
    CLASS_BASIC,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
)
from protocol.frames import FrameError

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_HEADER = struct.Struct(">HHQ")
_METHOD_HEAD = struct.Struct(">BHIHH")  # frame head + class id + method id
_TAG_BITS = struct.Struct(">QB")


class PublishArgs:
    """The arguments of one basic.publish; ``names_raw`` is exchange + routing key as two short strings."""

    __slots__ = ("exchange", "immediate", "mandatory", "names_raw", "routing_key")

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool,
                 names_raw: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.names_raw = names_raw


# The reference class under its own name: the pure decoder keeps building it after the public name
# PublishArgs has become the compiled class.
PyPublishArgs = PublishArgs


def decode_basic_publish(args: bytes, start: int = 0) -> PublishArgs:
    """The method's arguments from offset ``start`` (4 for a whole method payload, which saves a copy):
    reserved short, exchange, routing key, bits."""
    try:
        p = start + 3
        n = args[p - 1]
        exchange = args[p : p + n].decode() if n else ""
        p += n
        m = args[p]
        routing_key = args[p + 1 : p + 1 + m].decode()
        q = p + 1 + m
        bits = args[q]
    except IndexError:
        raise FrameError("basic.publish: truncated method frame") from None
    except UnicodeDecodeError:
        raise FrameError("basic.publish: short string is not UTF-8") from None
    return PyPublishArgs(exchange, routing_key, bool(bits & 1), bool(bits & 2), args[start + 2 : q])


def decode_ack(args: bytes, start: int = 0) -> tuple[int, bool]:
    """basic.ack → (delivery_tag, multiple)."""
    try:
        tag, bits = _TAG_BITS.unpack_from(args, start)
    except struct.error:
        raise FrameError("basic.ack: truncated method frame") from None
    return tag, bool(bits & 1)


def decode_nack(args: bytes, start: int = 0) -> tuple[int, bool, bool]:
    """basic.nack → (delivery_tag, multiple, requeue)."""
    try:
        tag, bits = _TAG_BITS.unpack_from(args, start)
    except struct.error:
        raise FrameError("basic.nack: truncated method frame") from None
    return tag, bool(bits & 1), bool(bits & 2)


def decode_reject(args: bytes, start: int = 0) -> tuple[int, bool]:
    """basic.reject → (delivery_tag, requeue)."""
    try:
        tag, bits = _TAG_BITS.unpack_from(args, start)
    except struct.error:
        raise FrameError("basic.reject: truncated method frame") from None
    return tag, bool(bits & 1)


def decode_content_header(payload: bytes) -> int:
    """Check a content header's class and return its body size. The properties stay raw in ``payload``."""
    try:
        class_id, _weight, body_size = _CONTENT_HEADER.unpack_from(payload, 0)
    except struct.error:
        raise FrameError("content header frame too short") from None
    if class_id != CLASS_BASIC:
        raise FrameError(f"content header for class {class_id}, expected {CLASS_BASIC}")
    size: int = body_size
    return size


def shortstr(value: str | bytes) -> bytes:
    """Encode an AMQP short string (length octet + bytes)."""
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > 255:
        raise ValueError("short string longer than 255 bytes")
    return _U8.pack(len(raw)) + raw


def _method_frame(channel: int, method_id: int, args: bytes) -> bytes:
    return (_METHOD_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, CLASS_BASIC, method_id)
            + args + b"\xce")


def encode_basic_deliver(channel: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                         names_raw: bytes) -> bytes:
    """basic.deliver; ``consumer_tag_raw`` and ``names_raw`` (exchange + routing key) are short strings."""
    args = consumer_tag_raw + _U64.pack(delivery_tag) + (b"\x01" if redelivered else b"\x00") + names_raw
    return _method_frame(channel, BASIC_DELIVER, args)


def encode_basic_get_ok(channel: int, delivery_tag: int, redelivered: bool, names_raw: bytes,
                        message_count: int) -> bytes:
    args = (_U64.pack(delivery_tag) + (b"\x01" if redelivered else b"\x00") + names_raw
            + message_count.to_bytes(4, "big"))
    return _method_frame(channel, BASIC_GET_OK, args)


def encode_basic_get_empty(channel: int) -> bytes:
    return _method_frame(channel, BASIC_GET_EMPTY, b"\x00")


def encode_basic_return(channel: int, reply_code: int, reply_text: str, names_raw: bytes) -> bytes:
    args = _U16.pack(reply_code) + shortstr(reply_text) + names_raw
    return _method_frame(channel, BASIC_RETURN, args)


def encode_basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _method_frame(channel, BASIC_ACK, _TAG_BITS.pack(delivery_tag, 1 if multiple else 0))


def encode_basic_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _method_frame(channel, BASIC_NACK, _TAG_BITS.pack(delivery_tag, bits))


def encode_content(channel: int, header_payload: bytes, body: bytes, frame_max: int
                   ) -> list[bytes | memoryview]:
    """The content header frame (its payload as received, properties untouched) and the body frames,
    each body frame at most ``frame_max`` bytes in all (0 = no limit). A body larger than one frame is
    cut into views of it, not copies (the writer joins them once)."""
    head = _FRAME_HEAD.pack
    out: list[bytes | memoryview] = [head(FRAME_HEADER, channel, len(header_payload)), header_payload, b"\xce"]
    size = len(body)
    if not size:
        return out
    chunk = frame_max - FRAME_OVERHEAD if frame_max else size
    if size <= chunk:
        out.append(head(FRAME_BODY, channel, size))
        out.append(body)
        out.append(b"\xce")
        return out
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        out.append(head(FRAME_BODY, channel, len(piece)))
        out.append(piece)
        out.append(b"\xce")
    return out


# A delivery whose body is at most this long goes out as one piece (basic.deliver, the content header and the
# body copied into one bytes): one copy of a small message is cheaper than the writer joining seven pieces.
# Longer bodies are not copied here (the writer joins them once).
SMALL_DELIVERY = 4096


def encode_delivery_into(out: list[bytes | memoryview], channel: int, consumer_tag_raw: bytes, delivery_tag: int,
                         redelivered: bool, names_raw: bytes, header_payload: bytes, body: bytes,
                         frame_max: int) -> None:
    """basic.deliver and its content frames, appended to ``out`` (a connection's outgoing pieces): the bytes of
    :func:`encode_basic_deliver` followed by those of :func:`encode_content`, as one piece for a body of at most
    :data:`SMALL_DELIVERY` bytes in one frame."""
    deliver = encode_basic_deliver(channel, consumer_tag_raw, delivery_tag, redelivered, names_raw)
    content = encode_content(channel, header_payload, body, frame_max)
    if len(body) <= SMALL_DELIVERY and len(content) <= 6:
        out.append(b"".join([deliver, *content]))
    else:
        out.append(deliver)
        out.extend(content)


def build_content_header(body_size: int, properties_raw: bytes) -> bytes:
    """A content header payload for basic from already-encoded flags + property list."""
    return _CONTENT_HEADER.pack(CLASS_BASIC, 0, body_size) + properties_raw


# The names the compiled module replaces, and the pure-Python definitions under ``pure.<name>``.
ACCELERATED = ("PublishArgs", "decode_basic_publish", "decode_ack", "decode_nack", "decode_reject",
               "decode_content_header", "encode_basic_deliver", "encode_basic_ack", "encode_basic_nack",
               "encode_content", "encode_delivery_into", "build_content_header")
pure = SimpleNamespace(**{name: globals()[name] for name in ACCELERATED})
if codec_extension is not None:
    globals().update({name: getattr(codec_extension, name) for name in ACCELERATED})
