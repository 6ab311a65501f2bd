"""How a message is stored: the bytes a backing queue (storage/variable_queue.py) or a stream's log
(storage/stream_log.py) keeps for it. storage/ stores opaque bytes; this is the one format both use.

msgpack ``[exchange, routing_key, content header, body, published_at, expiration_ms]``: the header keeps its
raw properties, so a recovered message is delivered byte for byte as it was published. (RabbitMQ's
counterpart is ``rabbit_msg_record`` / the message container's serialisation.) It sits at the bottom of the
broker's layers so that the queue types (broker/queues/stream_queue.py's in-memory fallback) and the
persistence layer above them share it.
"""

from __future__ import annotations

import msgpack

from broker.message import Message


def encode_message(msg: Message) -> bytes:
    packed: bytes = msgpack.packb([msg.exchange, msg.routing_key, msg.header, msg.body, msg.published_at,
                                   msg.expiration_ms], use_bin_type=True)
    return packed


def decode_message(data: bytes) -> Message:
    exchange, routing_key, header, body, published_at, expiration_ms = msgpack.unpackb(data, raw=False)
    ex, rk = exchange.encode(), routing_key.encode()  # both were short strings when published
    msg = Message(exchange, routing_key, b"%c%b%c%b" % (len(ex), ex, len(rk), rk), header, body, published_at)
    msg.expiration_ms = expiration_ms
    return msg
