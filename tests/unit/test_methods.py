"""Encoding and decoding of the methods that go through pamqp (protocol.methods)."""

from __future__ import annotations

import struct
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import base, commands
from pamqp import constants as pconstants
from pamqp import frame as pframe

from protocol.constants import COMMAND_INVALID, FRAME_ERROR, FRAME_METHOD
from protocol.frames import FrameError, FrameParser
from protocol.methods import (
    UnknownMethod,
    decode_method,
    encode_method,
    method_frame,
    method_ids,
    method_index,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

C = commands

SAMPLE_METHODS: list[base.Frame] = [
    C.Connection.Start(version_major=0, version_minor=9,
                       server_properties={"product": "Leveret", "version": "0.1.0",
                                          "capabilities": {"publisher_confirms": True,
                                                           "exchange_exchange_bindings": True,
                                                           "basic.nack": True,
                                                           "consumer_cancel_notify": True,
                                                           "connection.blocked": True,
                                                           "authentication_failure_close": True,
                                                           "per_consumer_qos": True,
                                                           "direct_reply_to": True},
                                          "cluster_name": "leveret@host", "n": 12345678901},
                       mechanisms="PLAIN AMQPLAIN", locales="en_US"),
    C.Connection.Start(),
    C.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=60),
    C.Connection.Tune(channel_max=0, frame_max=0, heartbeat=0),
    C.Connection.Tune(channel_max=65535, frame_max=2**32 - 1, heartbeat=65535),
    C.Connection.Close(reply_code=320, reply_text="CONNECTION_FORCED - broker forced connection closure",
                       class_id=0, method_id=0),
    C.Connection.Close(reply_code=501, reply_text="FRAME_ERROR", class_id=60, method_id=40),
    C.Connection.CloseOk(),
    C.Channel.OpenOk(),
    C.Channel.Close(reply_code=404, reply_text="NOT_FOUND - no queue 'q' in vhost '/'", class_id=50,
                    method_id=10),
    C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0),
    C.Channel.CloseOk(),
    C.Queue.DeclareOk(queue="amq.gen-JzTY20BRgKO-HjmUJj0wLg", message_count=5, consumer_count=1),
    C.Queue.DeclareOk(queue="q", message_count=2**32 - 1, consumer_count=0),
    C.Queue.DeclareOk(queue="a.b:c-d_e@f#g,h/i+j k", message_count=0, consumer_count=2**32 - 1),
    C.Queue.Declare(queue="q1", durable=True, auto_delete=True, arguments={"x-max-length": 10,
                                                                          "x-queue-type": "classic"}),
    C.Queue.Declare(queue="q2", passive=True, exclusive=True, nowait=True),
    C.Basic.ConsumeOk(consumer_tag="amq.ctag-9Vdo2n2nJjA6BzXLWWMo6g"),
    C.Basic.Consume(queue="q", consumer_tag="c", no_ack=True, exclusive=True, arguments={"x-priority": 5}),
    C.Basic.QosOk(),
    C.Basic.Qos(prefetch_size=0, prefetch_count=100, global_=True),
    C.Basic.CancelOk(consumer_tag="ctag"),
    C.Exchange.Declare(exchange="ex", exchange_type="topic", durable=True, internal=True),
    C.Exchange.DeclareOk(),
    C.Exchange.BindOk(),
    C.Exchange.UnbindOk(),
    C.Queue.BindOk(),
    C.Queue.UnbindOk(),
    C.Queue.PurgeOk(message_count=17),
    C.Queue.DeleteOk(message_count=3),
    C.Confirm.SelectOk(),
    C.Tx.SelectOk(),
    C.Tx.CommitOk(),
    C.Tx.RollbackOk(),
    C.Basic.RecoverOk(),
]


def _fields(method: base.Frame) -> dict[str, Any]:
    return {name: getattr(method, name) for name in method.__slots__}


@pytest.mark.parametrize("method", SAMPLE_METHODS, ids=lambda m: m.name)
@pytest.mark.parametrize("channel", [0, 1, 65535])
def test_encoding_matches_pamqp(method: base.Frame, channel: int) -> None:
    expected = pframe.marshal(method, channel)
    assert encode_method(channel, method) == expected
    assert method_frame(channel, type(method), **_fields(method)) == expected


@pytest.mark.parametrize("method", SAMPLE_METHODS, ids=lambda m: m.name)
def test_decode_method_round_trip(method: base.Frame) -> None:
    data = encode_method(3, method)
    frames = FrameParser(expect_header=False, frame_max=0).feed(data)
    assert len(frames) == 1
    frame_type, channel, payload = frames[0]
    assert (frame_type, channel) == (FRAME_METHOD, 3)
    assert method_index(payload) == method.index
    decoded = decode_method(payload)
    assert type(decoded) is type(method)
    assert _fields(decoded) == _fields(method)


def test_exchange_unbind_ok_is_method_51() -> None:
    data = method_frame(1, C.Exchange.UnbindOk)
    assert data == b"\x01\x00\x01\x00\x00\x00\x04\x00\x28\x00\x33\xce"
    assert method_index(data[7:-1]) == (40 << 16) | 51
    assert method_ids(C.Exchange.UnbindOk()) == (40, 51)
    assert isinstance(decode_method(data[7:-1]), C.Exchange.UnbindOk)


def test_method_ids() -> None:
    assert method_ids(C.Basic.Publish()) == (60, 40)
    assert method_ids(C.Channel.Close()) == (20, 40)
    assert method_ids(C.Connection.Start()) == (10, 10)


def test_missing_fields_take_zero_values() -> None:
    assert method_frame(1, C.Queue.DeclareOk, queue="q") == \
        pframe.marshal(C.Queue.DeclareOk(queue="q", message_count=0, consumer_count=0), 1)
    assert method_frame(0, C.Connection.Close) == \
        pframe.marshal(C.Connection.Close(reply_code=0, reply_text="", class_id=0, method_id=0), 0)
    # pamqp insists on channel_id "0"; the zero value of a long string is "", which is what RabbitMQ sends.
    assert method_frame(5, C.Channel.OpenOk) == \
        b"\x01\x00\x05\x00\x00\x00\x08\x00\x14\x00\x0b\x00\x00\x00\x00\xce"
    assert decode_method(method_frame(5, C.Channel.OpenOk)[7:-1]).channel_id == ""
    assert method_frame(1, C.Queue.Declare, queue="q", durable=True) == \
        pframe.marshal(C.Queue.Declare(queue="q", durable=True), 1)


_queue_names = st.from_regex(pconstants.DOMAIN_REGEX["queue-name"], fullmatch=True).filter(
    lambda s: len(s) <= 255)


@SETTINGS
@given(channel=st.integers(0, 65535), queue=_queue_names, message_count=st.integers(0, 2**32 - 1),
       consumer_count=st.integers(0, 2**32 - 1))
def test_queue_declare_ok_matches_pamqp(channel: int, queue: str, message_count: int,
                                        consumer_count: int) -> None:
    method = C.Queue.DeclareOk(queue=queue, message_count=message_count, consumer_count=consumer_count)
    expected = pframe.marshal(method, channel)
    assert method_frame(channel, C.Queue.DeclareOk, queue=queue, message_count=message_count,
                        consumer_count=consumer_count) == expected
    assert encode_method(channel, method) == expected


@SETTINGS
@given(channel=st.integers(0, 65535), consumer_tag=_queue_names)
def test_basic_consume_ok_matches_pamqp(channel: int, consumer_tag: str) -> None:
    assert method_frame(channel, C.Basic.ConsumeOk, consumer_tag=consumer_tag) == \
        pframe.marshal(C.Basic.ConsumeOk(consumer_tag=consumer_tag), channel)


@SETTINGS
@given(channel=st.integers(0, 65535), reply_code=st.integers(0, 65535),
       reply_text=st.text(st.characters(exclude_categories=("Cs",)), max_size=80).map(
           lambda t: t.encode()[:255].decode(errors="ignore")),
       class_id=st.integers(0, 65535), method_id=st.integers(0, 65535),
       cls=st.sampled_from([C.Connection.Close, C.Channel.Close]))
def test_close_matches_pamqp(channel: int, reply_code: int, reply_text: str, class_id: int, method_id: int,
                             cls: type[base.Frame]) -> None:
    method = cls(reply_code=reply_code, reply_text=reply_text, class_id=class_id, method_id=method_id)
    assert encode_method(channel, method) == pframe.marshal(method, channel)
    assert _fields(decode_method(encode_method(channel, method)[7:-1])) == _fields(method)


@SETTINGS
@given(channel=st.integers(0, 65535), bits=st.lists(st.booleans(), min_size=5, max_size=5),
       ticket=st.just(0), queue=_queue_names)
def test_queue_declare_bits_match_pamqp(channel: int, bits: list[bool], ticket: int, queue: str) -> None:
    passive, durable, exclusive, auto_delete, nowait = bits
    method = C.Queue.Declare(ticket=ticket, queue=queue, passive=passive, durable=durable,
                             exclusive=exclusive, auto_delete=auto_delete, nowait=nowait,
                             arguments={"x-message-ttl": 1000})
    assert encode_method(channel, method) == pframe.marshal(method, channel)


class _NineBits(base.Frame):
    """A made-up method with more bits than fit in one octet, to check the octet rollover."""

    __slots__: typing.ClassVar[list[str]] = ["b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "tail"]
    index: typing.ClassVar[int] = 0x00FE0001
    name: typing.ClassVar[str] = "Test.NineBits"
    _b0 = _b1 = _b2 = _b3 = _b4 = _b5 = _b6 = _b7 = _b8 = "bit"
    _tail = "short"

    def __init__(self, **values: Any) -> None:
        for name in self.__slots__:
            setattr(self, name, values.get(name, 0 if name == "tail" else False))


@SETTINGS
@given(bits=st.lists(st.booleans(), min_size=9, max_size=9), tail=st.integers(0, 65535))
def test_more_than_eight_bits_roll_over_like_pamqp(bits: list[bool], tail: int) -> None:
    values = {f"b{i}": bit for i, bit in enumerate(bits)}
    method = _NineBits(tail=tail, **values)
    data = method_frame(2, _NineBits, tail=tail, **values)
    assert data == pframe.marshal(method, 2)
    assert encode_method(2, method) == data
    assert data[11:13] == bytes([sum(1 << i for i, b in enumerate(bits[:8]) if b), int(bits[8])])


# -- names pamqp's client-side validator refuses -----------------------------------------------------------

@pytest.mark.parametrize("queue", [
    "my queue",
    "file ☃ queue",
    "キュー",
    "\U0001f407 rabbit",
    "a" * 200,
    "é" * 127,                                      # 254 bytes
    "with\ttab and \"quotes\" and 'single' and \\",
])
def test_method_frame_accepts_any_short_string_name(queue: str) -> None:
    data = method_frame(1, C.Queue.DeclareOk, queue=queue, message_count=3, consumer_count=4)
    consumed, channel, method = pframe.unmarshal(data)
    assert (consumed, channel) == (len(data), 1)
    assert isinstance(method, C.Queue.DeclareOk)
    assert (method.queue, method.message_count, method.consumer_count) == (queue, 3, 4)
    assert decode_method(data[7:-1]).queue == queue

    data = method_frame(1, C.Basic.ConsumeOk, consumer_tag=queue)
    assert pframe.unmarshal(data)[2].consumer_tag == queue


@pytest.mark.parametrize("queue", [
    "file ☃ queue", "キュー", "\U0001f407 rabbit", "é" * 127, "with\ttab",
])
def test_pamqp_refuses_these_names(queue: str) -> None:
    # The reason method_frame encodes fields itself: pamqp's validator rejects names a server must accept.
    with pytest.raises(ValueError):
        C.Queue.DeclareOk(queue=queue, message_count=0, consumer_count=0)


@SETTINGS
@given(queue=st.text(st.characters(exclude_categories=("Cs",)), max_size=255).map(
    lambda t: t.encode()[:255].decode(errors="ignore")))
def test_method_frame_queue_name_round_trip(queue: str) -> None:
    data = method_frame(7, C.Queue.DeclareOk, queue=queue, message_count=1, consumer_count=2)
    _, _, method = pframe.unmarshal(data)
    assert method.queue == queue
    assert decode_method(data[7:-1]).queue == queue


def test_method_frame_refuses_a_name_over_255_bytes() -> None:
    with pytest.raises((TypeError, ValueError)):
        method_frame(1, C.Queue.DeclareOk, queue="é" * 128)


# -- malformed payloads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", range(4))
def test_payload_shorter_than_method_index(length: int) -> None:
    with pytest.raises(FrameError) as info:
        method_index(b"\x00\x0a\x00\x0a"[:length])
    assert info.value.reply_code == FRAME_ERROR
    with pytest.raises(FrameError):
        decode_method(b"\x00\x0a\x00\x0a"[:length])


def _is_inside_trailing_string(method: base.Frame, cut: int, payload: bytes) -> bool:
    """True when ``cut`` falls inside the content of a string that ends the payload (after its length)."""
    last = method.__slots__[-1] if method.__slots__ else None
    if last is None:
        return False
    kind = method.amqp_type(last)
    if kind not in ("shortstr", "longstr"):
        return False
    value = getattr(method, last)
    raw = value.encode() if isinstance(value, str) else bytes(value)
    return bool(raw) and cut >= len(payload) - len(raw)


# Methods a client sends that go through decode_method, and a few more, each with fields in every position.
CLIENT_METHODS: list[base.Frame] = [
    C.Connection.StartOk(client_properties={"product": "pika", "capabilities": {"basic.nack": True}},
                         mechanism="PLAIN", response="\0guest\0guest", locale="en_US"),
    C.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60),
    C.Connection.Open(virtual_host="/", capabilities="", insist=False),
    C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
    C.Channel.Open(),
    C.Channel.Flow(active=True),
    C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
    C.Exchange.Declare(exchange="ex", exchange_type="topic", durable=True,
                       arguments={"alternate-exchange": "ae"}),
    C.Exchange.Delete(exchange="ex", if_unused=True),
    C.Exchange.Bind(destination="d", source="s", routing_key="k", arguments={"a": 1}),
    C.Exchange.Unbind(destination="d", source="s", routing_key="k"),
    C.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10}),
    C.Queue.Bind(queue="q", exchange="ex", routing_key="rk", arguments={"x-match": "all"}),
    C.Queue.Unbind(queue="q", exchange="ex", routing_key="rk", arguments={}),
    C.Queue.Purge(queue="q"),
    C.Queue.Delete(queue="q", if_empty=True),
    C.Basic.Qos(prefetch_count=10),
    C.Basic.Consume(queue="q", consumer_tag="ctag", no_ack=True, arguments={"x-priority": 1}),
    C.Basic.Cancel(consumer_tag="ctag", nowait=True),
    C.Basic.Get(queue="q", no_ack=True),
    C.Basic.Recover(requeue=True),
    C.Confirm.Select(nowait=False),
]


def _payload(method: base.Frame) -> bytes:
    return pframe.marshal(method, 1)[7:-1]


@pytest.mark.parametrize("method", CLIENT_METHODS + SAMPLE_METHODS, ids=lambda m: m.name)
def test_truncated_method_is_a_frame_error(method: base.Frame) -> None:
    payload = _payload(method)
    assert encode_method(1, method)[7:-1] == payload
    checked = 0
    for cut in range(len(payload)):
        if _is_inside_trailing_string(method, cut, payload):
            continue  # see test_truncated_trailing_string_is_a_frame_error
        with pytest.raises(FrameError) as info:
            decode_method(payload[:cut])
        assert info.value.reply_code == FRAME_ERROR, cut
        assert not isinstance(info.value, UnknownMethod)
        checked += 1
    assert checked >= min(len(payload), 4)


def test_truncated_trailing_string_is_a_frame_error() -> None:
    failures = []
    for method in CLIENT_METHODS + SAMPLE_METHODS:
        payload = _payload(method)
        for cut in range(len(payload)):
            if not _is_inside_trailing_string(method, cut, payload):
                continue
            try:
                decode_method(payload[:cut])
            except FrameError:
                continue
            failures.append((method.name, payload[:cut]))
    assert failures == []


def test_truncated_channel_open_minimal() -> None:
    with pytest.raises(FrameError):
        decode_method(b"\x00\x14\x00\x0a\x05ab")


def test_method_with_non_utf8_name_is_a_frame_error() -> None:
    # queue.declare, ticket 0, queue name b"\xff\xfe", bits, empty arguments table
    with pytest.raises(FrameError) as info:
        decode_method(b"\x00\x32\x00\x0a\x00\x00\x02\xff\xfe\x00\x00\x00\x00\x00")
    assert info.value.reply_code == FRAME_ERROR


def test_method_with_malformed_table_is_a_frame_error() -> None:
    table = b"\x01k?"                      # field type '?' does not exist
    payload = (struct.pack(">I", C.Queue.Declare.index) + b"\x00\x00\x01q\x00"
               + struct.pack(">I", len(table)) + table)
    with pytest.raises(FrameError):
        decode_method(payload)


def test_trailing_bytes_after_the_last_field_are_ignored() -> None:
    assert isinstance(decode_method(b"\x00\x0a\x00\x33" + b"\x00" * 4), C.Connection.CloseOk)


@pytest.mark.parametrize("index", [
    (60 << 16) | 999,       # basic, no such method
    (10 << 16) | 12,        # connection, no such method
    (99 << 16) | 1,         # no such class
    (30 << 16) | 10,        # access.request: not in the 0-9-1 method table
    0,
    0xFFFFFFFF,
])
def test_unknown_method_is_command_invalid(index: int) -> None:
    payload = struct.pack(">I", index) + b"\x00" * 8
    if index in C.INDEX_MAPPING:
        pytest.skip("pamqp knows this index")
    with pytest.raises(UnknownMethod) as info:
        decode_method(payload)
    assert info.value.reply_code == COMMAND_INVALID == 503
    assert isinstance(info.value, FrameError)


# -- the length-checked unmarshal --------------------------------------------------------------------------

@SETTINGS
@given(bits=st.lists(st.booleans(), min_size=9, max_size=9), tail=st.integers(0, 65535))
def test_more_than_eight_bits_decode_like_pamqp(bits: list[bool], tail: int) -> None:
    from protocol.methods import _unmarshal

    values = {f"b{i}": bit for i, bit in enumerate(bits)}
    body = method_frame(2, _NineBits, tail=tail, **values)[11:-1]
    ours = _unmarshal(_NineBits, body, 0)
    theirs = _NineBits()
    theirs.unmarshal(body)
    assert {n: getattr(ours, n) for n in _NineBits.__slots__} == \
        {n: getattr(theirs, n) for n in _NineBits.__slots__} == {**values, "tail": tail}
    for cut in range(len(body)):
        with pytest.raises(FrameError):
            _unmarshal(_NineBits, body[:cut], 0)


@pytest.mark.parametrize("table", [
    b"\x01kS\x00\x00\x00\x09abc",                     # long string runs past the table's end
    b"\x01kF\x00\x00\x00\x04\x01jS\x00",              # nested table entry cut
    b"\x01kA\x00\x00\x00\x02S\x00",                   # array element cut
    b"\x01kl\x00\x00",                                 # 64-bit integer cut
    b"\x05k",                                          # key runs past the table's end
    b"\x01k",                                          # key without a value
    b"\x01k\x00",                                      # type 0 is not a field type
])
def test_method_with_table_entry_past_its_table_is_a_frame_error(table: bytes) -> None:
    payload = (struct.pack(">I", C.Queue.Declare.index) + b"\x00\x00\x01q\x00"
               + struct.pack(">I", len(table)) + table + b"\x00" * 16)  # trailing bytes don't help
    with pytest.raises(FrameError) as info:
        decode_method(payload)
    assert info.value.reply_code == FRAME_ERROR


def test_method_keeps_trailing_bytes_tolerance_with_strings() -> None:
    method = decode_method(b"\x00\x14\x00\x0a\x02ab" + b"junk")
    assert isinstance(method, C.Channel.Open) and method.out_of_band == "ab"
    with pytest.raises(FrameError):
        decode_method(b"\x00\x14\x00\x0a")              # channel.open without its short string
