"""broker/queues/message_codec.py: the flat stored form gives back the message that went in, messages stored
in the earlier msgpack form still read, and a record cut short is an error, not a shorter message."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.message import Message
from broker.queues.message_codec import FLAT, decode_message, encode_message

short = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)


def message(exchange: str, routing_key: str, header: bytes, body: bytes, published_at: float,
            expiration_ms: int | None) -> Message:
    ex, rk = exchange.encode(), routing_key.encode()
    msg = Message(exchange, routing_key, b"%c%b%c%b" % (len(ex), ex, len(rk), rk), header, body, published_at)
    msg.expiration_ms = expiration_ms
    return msg


def fields(msg: Message) -> tuple[object, ...]:
    return (msg.exchange, msg.routing_key, msg.names_raw, msg.header, msg.body, msg.published_at, msg.expiration_ms)


@settings(max_examples=300, deadline=None)
@given(exchange=short, routing_key=short, header=st.binary(max_size=300), body=st.binary(max_size=3000),
       published_at=st.one_of(st.floats(0, 2.0**53), st.integers(0, 2**53).map(float)),
       expiration_ms=st.one_of(st.none(), st.integers(0, 2**63 - 1)))
def test_the_flat_form_round_trips(exchange, routing_key, header, body, published_at, expiration_ms) -> None:
    msg = message(exchange, routing_key, header, body, published_at, expiration_ms)
    data = encode_message(msg)
    assert data[0] == FLAT
    assert fields(decode_message(data)) == fields(msg)
    assert fields(decode_message(memoryview(data))) == fields(msg)  # as a stream's reader may hand it


def test_a_message_stored_in_the_msgpack_form_still_reads() -> None:
    old = msgpack.packb(["amq.topic", "a.b", b"\x00<header", b"body", 1764532000123, 60000], use_bin_type=True)
    assert old[0] == 0x96
    assert fields(decode_message(old)) == ("amq.topic", "a.b", b"\x09amq.topic\x03a.b", b"\x00<header", b"body",
                                           1764532000123, 60000)


def test_a_flat_record_cut_short_is_an_error() -> None:
    data = encode_message(message("", "q", b"header-bytes", b"body", 1.0, None))
    with pytest.raises(ValueError):
        decode_message(data[:len(data) - len(b"body") - 3])  # inside the header
    with pytest.raises(ValueError):
        decode_message(data[:10])  # inside the head
