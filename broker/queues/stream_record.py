"""How a stream stores a message: the bytes a delivery is cut from, with no decoding.

A stream delivers every message with an ``x-stream-offset`` header, and may deliver it many times (every
consumer from ``first``, every replay). So the header is spliced into the raw properties once, at append,
with the offset the message is about to get, and the record keeps what basic.deliver and the content frames
need as they go on the wire::

    u8  format (0xA1)   u16 names length   u32 header length
    names   the exchange and routing key as two short strings (basic.deliver's tail, verbatim)
    header  the content header payload, ``x-stream-offset`` included
    body

A delivery is then three slices of the record. The publish time is the log's own timestamp of the record
(storage/stream_log.py's StreamRecord); streams have no per-message TTL, so nothing else is kept.

Records written before this format (broker/queues/message_codec.py's msgpack list, first byte 0x96) are still
read: their header gets the offset spliced at delivery, as it used to.
"""

from __future__ import annotations

import struct

from broker.message import Message
from broker.queues.message_codec import decode_message
from protocol.fastcodec import shortstr
from protocol.properties import with_long_header

FORMAT = 0xA1
_HEAD = struct.Struct(">BHI")
_HEAD_SIZE = _HEAD.size
# The header every delivery carries, as a field-table key (a short string).
OFFSET_KEY_RAW = shortstr("x-stream-offset")


_OFFSET_VALUE = struct.Struct(">q")


class _Template:
    """The record of the last (names, header) pair appended twice in a row, cut around the offset's 8 bytes.

    Publishers send the same exchange, routing key and properties message after message, so the record of
    the next one is usually ``before + offset + after + body``: a comparison of two short byte strings
    instead of a walk of the properties (:func:`with_long_header`, the most costly step of a stream append).

    Learning costs two splices, so a pair is learnt only when it comes a second time in a row: messages whose
    headers all differ (the firehose's events, each with its own time and message id) pay one splice each, as
    without a template, and not three."""

    __slots__ = ("after", "before", "header", "names", "seen_header", "seen_names")

    def __init__(self) -> None:
        self.names = self.header = self.before = self.after = b""
        self.seen_names = self.seen_header = b""

    def matches(self, names: bytes, header: bytes) -> bool:
        """Whether (names, header) is the learnt pair, learning it on its second appearance in a row."""
        if header == self.header and names == self.names:
            return True
        if header != self.seen_header or names != self.seen_names:
            self.seen_names, self.seen_header = names, header
            return False
        return self.learn(names, header)

    def learn(self, names: bytes, header: bytes) -> bool:
        """Cut the record head of (names, header) around the offset; False if it cannot be cut (the value
        is not 8 contiguous bytes that alone change with the offset: then every append splices)."""
        a = _record_head(names, header, 0)
        b = _record_head(names, header, -1)  # all eight bytes differ from 0's
        if len(a) != len(b):
            return False
        at = _first_difference(a, b)
        if a[at + 8:] != b[at + 8:]:
            return False
        self.names, self.header, self.before, self.after = names, header, a[:at], a[at + 8:]
        return True


def _first_difference(a: bytes, b: bytes) -> int:
    """The index of the first byte where ``a`` and ``b`` (same length, not equal) differ: the highest set
    bit of their XOR as big integers, found in C rather than by a loop over the bytes."""
    diff = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
    return len(a) - (diff.bit_length() + 7) // 8


_template = _Template()


def _record_head(names: bytes, header: bytes, offset: int) -> bytes:
    spliced = with_long_header(header, OFFSET_KEY_RAW, offset)
    return b"".join((_HEAD.pack(FORMAT, len(names), len(spliced)), names, spliced))


def encode_record(msg: Message, offset: int) -> bytes:
    """The stored form of ``msg`` appended at ``offset``."""
    t = _template
    header = msg.header
    names = msg.names_raw
    if not t.matches(names, header):
        return _record_head(names, header, offset) + msg.body
    return b"".join((t.before, _OFFSET_VALUE.pack(offset), t.after, msg.body))


def wire_parts(payload: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(names, header, body) of a record as they go on the wire, cut without building a Message (the deliver
    path); None for a record of the earlier format (use :func:`delivered_message`)."""
    if payload[0] != FORMAT:
        return None
    _, names_len, header_len = _HEAD.unpack_from(payload)
    at = _HEAD_SIZE + names_len
    body_at = at + header_len
    return payload[_HEAD_SIZE:at], payload[at:body_at], payload[body_at:]


def delivered_message(payload: bytes, offset: int, timestamp_ms: int) -> Message:
    """The message as a consumer receives it (``x-stream-offset`` already in its header)."""
    parts = wire_parts(payload)
    if parts is None:  # a record of the earlier format
        msg = decode_message(payload)
        msg.header = with_long_header(msg.header, OFFSET_KEY_RAW, offset)
        return msg
    names, header, body = parts
    return Message.from_wire(names, header, body, timestamp_ms)
