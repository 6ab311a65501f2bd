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

Records written before this format (broker/message_codec.py's msgpack list, first byte 0x96) are still read:
their header gets the offset spliced at delivery, as it used to.
"""

from __future__ import annotations

import struct

from broker.message import Message
from broker.message_codec import decode_message
from protocol.fastcodec import shortstr
from protocol.properties import with_long_header

FORMAT = 0xA1
_HEAD = struct.Struct(">BHI")
_HEAD_SIZE = _HEAD.size
# The header every delivery carries, as a field-table key (a short string).
OFFSET_KEY_RAW = shortstr("x-stream-offset")


def encode_record(msg: Message, offset: int) -> bytes:
    """The stored form of ``msg`` appended at ``offset``."""
    header = with_long_header(msg.header, OFFSET_KEY_RAW, offset)
    names = msg.names_raw
    return b"".join((_HEAD.pack(FORMAT, len(names), len(header)), names, header, msg.body))


def delivered_message(payload: bytes, offset: int, timestamp_ms: int) -> Message:
    """The message as a consumer receives it (``x-stream-offset`` already in its header)."""
    if payload[0] != FORMAT:
        msg = decode_message(payload)
        msg.header = with_long_header(msg.header, OFFSET_KEY_RAW, offset)
        return msg
    _, names_len, header_len = _HEAD.unpack_from(payload)
    at = _HEAD_SIZE + names_len
    names = payload[_HEAD_SIZE:at]
    ex_end = 1 + names[0]
    return Message(names[1:ex_end].decode(), names[ex_end + 1:].decode(), names,
                   payload[at:at + header_len], payload[at + header_len:], timestamp_ms)
