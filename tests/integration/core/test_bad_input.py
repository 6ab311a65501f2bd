"""Bad input on the wire: the broker must refuse it exactly as RabbitMQ does, and keep serving others.

Every case was checked against RabbitMQ 3.10.8. For each one the test asserts the reply code, whether it is a
``connection.close`` (hard error, channel 0) or a ``channel.close`` (soft error), the class/method ids RabbitMQ
puts in the close, and then that the broker still serves a fresh client (``assert_broker_serves``).

What RabbitMQ 3.10.8 does (hard = connection.close on channel 0; ids = class/method in the close):

=================================================  ======================================================
wrong ``AMQP`` version header, HTTP, TLS hello     writes ``AMQP\\x00\\x00\\x09\\x01``, closes the socket
``AMQP 1 1 0 9`` (0-9)                             accepted, connection.start 0-9
garbage / bad frame-end / frame > frame_max        hard 501 FRAME_ERROR, ids 0/0; socket closed ~3 s later
unknown frame type, heartbeat with payload         hard 501 FRAME_ERROR, ids 0/0; socket closed on close-ok
method arguments cut short                         hard 501 FRAME_ERROR "cannot decode", ids of the method
method on a channel never opened                   hard 504 "expected 'channel.open'", ids of the method
second channel.open                                hard 504 "second 'channel.open' seen", 20/10
channel method on channel 0                        hard 504 "unexpected method in connection state running"
connection method on channel 1                     hard 503 COMMAND_INVALID, 10/50
header/body with no publish, body on channel 0,    hard 505 UNEXPECTED_FRAME, ids 0/0
heartbeat on channel 1
publish then no header, header of another class,   hard 505 UNEXPECTED_FRAME, ids 60/40
method before the body is complete
body longer than body_size                         nothing at once; next non-body frame: 505, 60/40
unknown class or method id                         socket closed at once, no connection.close
basic.ack of an unknown tag                        soft 406 "unknown delivery tag N", 60/80
frames on a channel waiting for close-ok           methods and whole messages dropped (channel.open → 504)
before connection.open: queue.declare on ch 0      hard 504 "... in connection state opening", 50/10
before connection.open: channel.open on ch 1       hard 505 UNEXPECTED_FRAME, 0/0
anything but start-ok after connection.start       socket closed ~3 s later, no connection.close
=================================================  ======================================================

Where this differs from newer RabbitMQ as its documentation describes it: 3.10 does not tell HTTP or TLS apart
from a wrong version header, and it drops the socket on an unknown method instead of answering 503.
"""

from __future__ import annotations

import random
import struct
import time

import pika
import pytest
from rawamqp import (  # tests/ is on sys.path (rootdir conftest)
    FRAME_BODY,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    CloseInfo,
    RawAMQPClient,
    body_frame,
    commands,
    content_header_frame,
    heartbeat_frame,
    method_frame,
    method_payload,
    raw_frame,
)

pytestmark = pytest.mark.timeout(60)

# Hard errors that RabbitMQ treats as fatal frame errors close the socket about 3 s after connection.close.
SOCKET_CLOSE_TIMEOUT = 6.0


# -- helpers --------------------------------------------------------------------------------------------

def assert_broker_serves(broker, uid: str) -> None:
    """A fresh pika connection can declare a queue, publish to it and get the message back."""
    params = broker.pika_params(connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5,
                                heartbeat=0)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        q = f"{uid}-alive"
        ch.queue_declare(q, auto_delete=False)
        body = f"still-alive-{time.monotonic_ns()}".encode()
        ch.basic_publish("", q, body)
        got = None
        deadline = time.monotonic() + 5
        while got is None and time.monotonic() < deadline:
            _method, _props, got = ch.basic_get(q, auto_ack=True)
            if got is None:
                time.sleep(0.05)
        assert got == body
        ch.queue_delete(q)
    finally:
        if conn.is_open:
            conn.close()




def opened(raw, channel: int | None = 1, **handshake_kw) -> RawAMQPClient:
    """A raw client past the handshake, with one channel open (unless channel is None)."""
    c = raw()
    c.handshake(**handshake_kw)
    if channel is not None:
        c.open_channel(channel)
    return c


def hard_close(c: RawAMQPClient, data: bytes, timeout: float = 5.0) -> CloseInfo:
    """Send data and expect a connection.close (answered with close-ok), then the socket to close."""
    c.send_raw(data)
    info = c.expect_connection_close(timeout)
    assert c.is_socket_closed(SOCKET_CLOSE_TIMEOUT), "socket still open after connection.close/close-ok"
    return info


def publish_frames(channel: int, routing_key: str = "nowhere") -> bytes:
    return method_frame(channel, commands.Basic.Publish(exchange="", routing_key=routing_key))


def declare_queue(c: RawAMQPClient, channel: int, name: str = "", **kw) -> str:
    c.send_method(channel, commands.Queue.Declare(queue=name, **kw))
    return c.expect_method(commands.Queue.DeclareOk, channel).queue


def queue_message_count(broker, name: str) -> int | None:
    """Ready messages in a queue (passive declare through pika), or None if the queue does not exist."""
    conn = pika.BlockingConnection(broker.pika_params(connection_attempts=1, socket_timeout=5, heartbeat=0))
    try:
        ch = conn.channel()
        try:
            return ch.queue_declare(name, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return None
    finally:
        if conn.is_open:
            conn.close()


# -- protocol header ------------------------------------------------------------------------------------

@pytest.mark.parametrize("header", [
    pytest.param(b"AMQP\x00\x00\x09\x02", id="0-9-2"),
    pytest.param(b"AMQP\x01\x01\x00\x0a", id="1-1-0-10"),
    pytest.param(b"AMQP\x00\x00\x09\x00", id="0-9-0"),
    pytest.param(b"AMQP\x00\x00\x08\x00", id="0-0-8-0"),
])
def test_wrong_protocol_header_gets_supported_version_back(raw, broker, uid, header):
    c = raw()
    c.send_raw(header)
    data = c.read_all_until_closed(5)
    assert data == PROTOCOL_HEADER
    assert_broker_serves(broker, uid)


def test_amqp_0_9_header_is_accepted_as_0_9_1(raw, broker):
    # RabbitMQ treats the 0-9 header (AMQP 1 1 0 9) as 0-9-1 and starts the connection.
    c = raw()
    c.send_raw(b"AMQP\x01\x01\x00\x09")
    start = c.expect_method(commands.Connection.Start, 0)
    assert (start.version_major, start.version_minor) == (0, 9)
    c.send_method(0, commands.Connection.StartOk(response=f"\0{broker.user}\0{broker.password}"))
    c.expect_method(commands.Connection.Tune, 0)


@pytest.mark.parametrize("data", [
    pytest.param(b"GET / HTTP/1.1\r\nHost: localhost:5672\r\nUser-Agent: curl/8.0\r\nAccept: */*\r\n\r\n",
                 id="http-get"),
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\x00\x02\x13\x01\x01\x00",
                 id="tls-client-hello"),
])
def test_non_amqp_protocol_is_refused(raw, broker, uid, data):
    # RabbitMQ 3.10 answers any 8 bytes that do not start with "AMQP" like a wrong version: it writes its
    # own header back and closes the socket (newer RabbitMQ also logs that it saw HTTP or TLS).
    c = raw()
    c.send_raw(data)
    assert c.read_all_until_closed(5) == PROTOCOL_HEADER
    assert_broker_serves(broker, uid)


# -- framing errors after the handshake (501 FRAME_ERROR) ----------------------------------------------

GARBAGE = {
    "random": random.Random(20240501).randbytes(64),
    "text": b"hello broker, this is not an AMQP frame at all!" * 2,
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_after_handshake_is_frame_error(raw, broker, uid, kind):
    data = GARBAGE[kind]
    assert data[0] not in (FRAME_METHOD, 2, FRAME_BODY, FRAME_HEARTBEAT)
    assert struct.unpack(">I", data[3:7])[0] > 131072  # the size field is absurd
    c = opened(raw, channel=None)
    code, text, class_id, method_id = hard_close(c, data)
    assert code == 501
    assert text.startswith("FRAME_ERROR")
    assert (class_id, method_id) == (0, 0)
    assert_broker_serves(broker, uid)


def test_bad_frame_end_octet_is_frame_error(raw, broker, uid):
    c = opened(raw)
    frame = raw_frame(FRAME_METHOD, 1, method_payload(commands.Basic.Qos(prefetch_count=1)), frame_end=0xFF)
    code, text, class_id, method_id = hard_close(c, frame)
    assert code == 501
    assert text.startswith("FRAME_ERROR")
    assert (class_id, method_id) == (0, 0)
    assert_broker_serves(broker, uid)


@pytest.mark.parametrize("frame", [
    pytest.param(raw_frame(9, 0, b"abc"), id="type-9-ch0"),
    pytest.param(raw_frame(4, 1, b"abc"), id="type-4-ch1"),
    pytest.param(raw_frame(0, 0, b""), id="type-0-empty"),
    pytest.param(raw_frame(FRAME_HEARTBEAT, 0, b"abc"), id="heartbeat-with-payload"),
])
def test_unknown_frame_type_is_frame_error(raw, broker, uid, frame):
    c = opened(raw)
    code, text, class_id, method_id = hard_close(c, frame)
    assert code == 501
    assert text.startswith("FRAME_ERROR")
    assert (class_id, method_id) == (0, 0)
    assert_broker_serves(broker, uid)


def test_frame_larger_than_negotiated_frame_max_is_frame_error(raw, broker, uid):
    c = opened(raw, frame_max=8192)
    q = declare_queue(c, 1, f"{uid}-big", auto_delete=False)
    data = publish_frames(1, q) + content_header_frame(1, 9000) + body_frame(1, b"x" * 9000)
    code, text, class_id, method_id = hard_close(c, data)
    assert code == 501
    assert text.startswith("FRAME_ERROR")
    assert (class_id, method_id) == (0, 0)
    assert queue_message_count(broker, q) == 0
    assert_broker_serves(broker, uid)
    _delete_queue(broker, q)


def test_frame_of_exactly_frame_max_is_accepted(raw, broker, uid):
    # frame_max counts the whole frame: 7 header octets + payload + frame-end.
    c = opened(raw, frame_max=8192)
    q = declare_queue(c, 1, exclusive=True)
    body = bytes(range(256)) * 32  # 8192 octets: one full body frame (8184) and one of 8
    c.send_raw(publish_frames(1, q) + content_header_frame(1, len(body))
               + body_frame(1, body[:8184]) + body_frame(1, body[8184:]))
    c.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
    c.expect_method(commands.Basic.GetOk, 1)
    header = c.wait_for(lambda f: f.channel == 1)
    assert header.value.body_size == len(body)
    got = b""
    while len(got) < len(body):
        f = c.wait_for(lambda f: f.channel == 1)
        assert f.type == FRAME_BODY
        assert len(f.payload) + 8 <= 8192
        got += f.payload
    assert got == body
    c.close_connection()


@pytest.mark.parametrize("cut", [
    pytest.param(3, id="in-frame-header"),
    pytest.param(12, id="in-payload"),
])
def test_truncated_frame_then_client_closes(raw, broker, uid, cut):
    c = opened(raw)
    frame = method_frame(1, commands.Queue.Declare(queue=f"{uid}-trunc"))
    c.send_raw(frame[:cut])
    time.sleep(0.2)
    c.close()
    assert_broker_serves(broker, uid)
    assert queue_message_count(broker, f"{uid}-trunc") is None


def test_malformed_method_arguments_are_frame_error(raw, broker, uid):
    c = opened(raw)
    # queue.declare (50, 10) whose arguments stop after one octet
    code, text, class_id, method_id = hard_close(c, raw_frame(FRAME_METHOD, 1, struct.pack(">HH", 50, 10) + b"\0"))
    assert code == 501
    assert text.startswith("FRAME_ERROR")
    assert (class_id, method_id) == (50, 10)
    assert_broker_serves(broker, uid)


# -- channel state errors (504 CHANNEL_ERROR) ------------------------------------------------------------

def test_method_on_channel_not_open_is_channel_error(raw, broker, uid):
    c = opened(raw, channel=None)
    code, text, class_id, method_id = hard_close(c, method_frame(3, commands.Queue.Declare(queue=f"{uid}-x")))
    assert code == 504
    assert text == "CHANNEL_ERROR - expected 'channel.open'"
    assert (class_id, method_id) == (50, 10)
    assert queue_message_count(broker, f"{uid}-x") is None
    assert_broker_serves(broker, uid)


def test_second_channel_open_is_channel_error(raw, broker, uid):
    c = opened(raw)
    code, text, class_id, method_id = hard_close(c, method_frame(1, commands.Channel.Open()))
    assert code == 504
    assert text == "CHANNEL_ERROR - second 'channel.open' seen"
    assert (class_id, method_id) == (20, 10)
    assert_broker_serves(broker, uid)


@pytest.mark.parametrize("method,ids", [
    pytest.param(commands.Queue.Declare(queue="on-channel-zero"), (50, 10), id="queue.declare"),
    pytest.param(commands.Channel.Open(), (20, 10), id="channel.open"),
    pytest.param(commands.Basic.Qos(prefetch_count=1), (60, 10), id="basic.qos"),
    pytest.param(commands.Connection.Open(), (10, 40), id="connection.open-again"),
])
def test_channel_method_on_channel_zero_is_channel_error(raw, broker, uid, method, ids):
    c = opened(raw, channel=None)
    code, text, class_id, method_id = hard_close(c, method_frame(0, method))
    assert code == 504
    assert text == "CHANNEL_ERROR - unexpected method in connection state running"
    assert (class_id, method_id) == ids
    assert_broker_serves(broker, uid)


def test_connection_method_on_a_channel_is_command_invalid(raw, broker, uid):
    c = opened(raw)
    data = method_frame(1, commands.Connection.Close(reply_code=200, reply_text="x", class_id=0, method_id=0))
    code, text, class_id, method_id = hard_close(c, data)
    assert code == 503
    assert text.startswith("COMMAND_INVALID")
    assert (class_id, method_id) == (10, 50)
    assert_broker_serves(broker, uid)


# -- content errors (505 UNEXPECTED_FRAME) ----------------------------------------------------------------

UNEXPECTED = {
    # name: (frames on channel 1 after it is open, class/method ids RabbitMQ reports)
    "header-without-publish": (lambda: content_header_frame(1, 5), (0, 0)),
    "body-without-publish": (lambda: body_frame(1, b"hello"), (0, 0)),
    "body-without-header": (lambda: publish_frames(1) + body_frame(1, b"hello"), (60, 40)),
    "method-instead-of-header": (
        lambda: publish_frames(1) + method_frame(1, commands.Basic.Qos(prefetch_count=1)), (60, 40)),
    "method-in-the-middle-of-body": (
        lambda: publish_frames(1) + content_header_frame(1, 10) + body_frame(1, b"abc")
        + method_frame(1, commands.Basic.Qos(prefetch_count=1)), (60, 40)),
    "header-of-another-class": (
        lambda: publish_frames(1) + raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 5, 0)) + body_frame(1, b"hello"),
        (60, 40)),
    "body-after-complete-message": (
        lambda: publish_frames(1) + content_header_frame(1, 5) + body_frame(1, b"hello") + body_frame(1, b"extra"),
        (0, 0)),
    "body-after-empty-message": (
        lambda: publish_frames(1) + content_header_frame(1, 0) + body_frame(1, b"x"), (0, 0)),
    "header-on-channel-zero": (lambda: content_header_frame(0, 5), (0, 0)),
    "body-on-channel-zero": (lambda: body_frame(0, b"abc"), (0, 0)),
    "heartbeat-on-channel-1": (lambda: raw_frame(FRAME_HEARTBEAT, 1, b""), (0, 0)),
}


@pytest.mark.parametrize("case", list(UNEXPECTED))
def test_unexpected_frame(raw, broker, uid, case):
    frames, ids = UNEXPECTED[case]
    c = opened(raw)
    code, text, class_id, method_id = hard_close(c, frames())
    assert code == 505
    assert text.startswith("UNEXPECTED_FRAME")
    assert (class_id, method_id) == ids
    assert_broker_serves(broker, uid)


@pytest.mark.parametrize("chunks", [
    pytest.param([b"hello world"], id="one-frame"),
    pytest.param([b"hel", b"lo world"], id="two-frames"),
])
def test_body_longer_than_body_size(raw, broker, uid, chunks):
    # RabbitMQ 3.10 does not notice the overflow itself: the message never completes (nothing is routed)
    # and the next frame that is not a body frame gets 505 on behalf of basic.publish.
    q = f"{uid}-overflow"
    c = opened(raw)
    declare_queue(c, 1, q, auto_delete=False)
    data = publish_frames(1, q) + content_header_frame(1, 5) + b"".join(body_frame(1, x) for x in chunks)
    data += method_frame(1, commands.Basic.Get(queue=q, no_ack=True))
    code, text, class_id, method_id = hard_close(c, data)
    assert code == 505
    assert text.startswith("UNEXPECTED_FRAME")
    assert (class_id, method_id) == (60, 40)
    assert queue_message_count(broker, q) == 0
    assert_broker_serves(broker, uid)
    _delete_queue(broker, q)


def test_empty_body_frame_is_allowed(raw, broker, uid):
    c = opened(raw)
    q = declare_queue(c, 1, exclusive=True)
    c.send_raw(publish_frames(1, q) + content_header_frame(1, 3) + body_frame(1, b"") + body_frame(1, b"abc"))
    c.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
    c.expect_method(commands.Basic.GetOk, 1)
    assert c.wait_for(lambda f: f.channel == 1).value.body_size == 3
    assert c.wait_for(lambda f: f.channel == 1).payload == b"abc"
    c.close_connection()


# -- unknown methods --------------------------------------------------------------------------------------

@pytest.mark.parametrize("channel,class_id,method_id", [
    pytest.param(1, 60, 999, id="unknown-method-of-basic"),
    pytest.param(1, 999, 10, id="unknown-class"),
    pytest.param(0, 10, 99, id="unknown-connection-method"),
])
def test_unknown_class_or_method(raw, broker, uid, channel, class_id, method_id):
    # RabbitMQ 3.10 drops the socket without a connection.close. A broker that does report it must use
    # 503 COMMAND_INVALID, a hard error.
    c = opened(raw)
    c.send_raw(raw_frame(FRAME_METHOD, channel, struct.pack(">HH", class_id, method_id)))
    info = c.expect_close_or_eof(5)
    if info is not None:
        assert info.reply_code == 503
        assert info.reply_text.startswith("COMMAND_INVALID")
    assert c.is_socket_closed(SOCKET_CLOSE_TIMEOUT)
    assert_broker_serves(broker, uid)


@pytest.mark.leveret_only
def test_unknown_method_is_reported_as_command_invalid(raw, broker, uid):
    # Leveret reports what RabbitMQ 3.10 only logs: connection.close 503 COMMAND_INVALID.
    c = opened(raw)
    c.send_raw(raw_frame(FRAME_METHOD, 1, struct.pack(">HH", 60, 999)))
    info = c.expect_connection_close(5)
    assert info.reply_code == 503
    assert c.is_socket_closed(SOCKET_CLOSE_TIMEOUT)
    assert_broker_serves(broker, uid)


# -- soft errors (channel.close) --------------------------------------------------------------------------

def test_ack_of_unknown_delivery_tag_closes_only_the_channel(raw, broker, uid):
    c = opened(raw)
    c.send_method(1, commands.Basic.Ack(delivery_tag=42))
    code, text, class_id, method_id = c.expect_channel_close(1)
    assert code == 406
    assert text == "PRECONDITION_FAILED - unknown delivery tag 42"
    assert (class_id, method_id) == (60, 80)
    # the connection is still usable: another channel, and the same channel number again
    c.open_channel(2)
    declare_queue(c, 2, exclusive=True)
    c.open_channel(1)
    declare_queue(c, 1, exclusive=True)
    c.close_connection()
    assert_broker_serves(broker, uid)


def test_frames_on_a_closing_channel_are_dropped_until_close_ok(raw, broker, uid):
    c = opened(raw)
    c.open_channel(2)
    target = declare_queue(c, 2, f"{uid}-target", auto_delete=False)
    c.send_method(1, commands.Basic.Ack(delivery_tag=7))
    assert c.expect_channel_close(1, send_close_ok=False).reply_code == 406
    # channel 1 now waits for close-ok: everything else sent on it is ignored
    ghost = f"{uid}-ghost"
    c.send_method(1, commands.Queue.Declare(queue=ghost))
    c.send_method(1, commands.Basic.Ack(delivery_tag=8))  # would be a second 406
    c.send_raw(publish_frames(1, target) + content_header_frame(1, 3) + body_frame(1, b"abc"))
    c.send_method(1, commands.Basic.Qos(prefetch_count=5))
    # meanwhile channel 2 works
    c.send_method(2, commands.Queue.Declare(queue=target, passive=True))
    ok = c.expect_method(commands.Queue.DeclareOk, 2)
    extra = c.drain(0.5)
    assert not [f for f in extra if getattr(f, "channel", None) == 1], extra
    assert not [f for f in extra if f.type == FRAME_METHOD], extra
    assert ok.message_count == 0
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    declare_queue(c, 1, exclusive=True)
    c.close_connection()
    assert queue_message_count(broker, ghost) is None
    assert queue_message_count(broker, target) == 0
    _delete_queue(broker, target)
    assert_broker_serves(broker, uid)


def test_channel_close_crossing_server_close(raw, broker, uid):
    # The client closes the channel while the server's channel.close is in flight: the server answers
    # close-ok, but still waits for the client's close-ok before the channel number is free again.
    c = opened(raw)
    c.send_method(1, commands.Basic.Ack(delivery_tag=7))
    assert c.expect_channel_close(1, send_close_ok=False).reply_code == 406
    c.send_method(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    c.expect_method(commands.Channel.CloseOk, 1)
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    declare_queue(c, 1, exclusive=True)
    c.close_connection()


# -- handshake ----------------------------------------------------------------------------------------------

def _until_start(c: RawAMQPClient) -> None:
    c.send_protocol_header()
    c.expect_method(commands.Connection.Start, 0)


@pytest.mark.parametrize("frame", [
    pytest.param(method_frame(0, commands.Connection.Open()), id="connection.open"),
    pytest.param(method_frame(0, commands.Connection.TuneOk(2047, 131072, 0)), id="tune-ok"),
    pytest.param(method_frame(0, commands.Queue.Declare(queue="x")), id="queue.declare"),
    pytest.param(method_frame(1, commands.Channel.Open()), id="channel.open-ch1"),
    pytest.param(body_frame(0, b"abc"), id="body-frame"),
])
def test_something_other_than_start_ok_during_handshake(raw, broker, uid, frame):
    # RabbitMQ 3.10 closes the socket ~3 s later without sending connection.close (it does not trust a
    # client that has not logged in). A connection.close, if sent, must carry 504 CHANNEL_ERROR.
    c = raw()
    _until_start(c)
    t0 = time.monotonic()
    c.send_raw(frame)
    info = c.expect_close_or_eof(SOCKET_CLOSE_TIMEOUT)
    if info is not None:
        assert info.reply_code == 504
    assert c.is_socket_closed(SOCKET_CLOSE_TIMEOUT)
    assert time.monotonic() - t0 < SOCKET_CLOSE_TIMEOUT
    assert not [f for f in c.received if f.type == FRAME_METHOD and not f.is_method(commands.Connection.Start)
                and not f.is_method(commands.Connection.Close)]
    assert_broker_serves(broker, uid)


def test_channel_method_before_connection_open_is_channel_error(raw, broker, uid):
    c = raw()
    c.handshake(open_connection=False)
    code, text, class_id, method_id = hard_close(c, method_frame(0, commands.Queue.Declare(queue=f"{uid}-early")))
    assert code == 504
    assert text == "CHANNEL_ERROR - unexpected method in connection state opening"
    assert (class_id, method_id) == (50, 10)
    assert_broker_serves(broker, uid)


def test_channel_open_before_connection_open_is_unexpected_frame(raw, broker, uid):
    c = raw()
    c.handshake(open_connection=False)
    code, text, class_id, method_id = hard_close(c, method_frame(1, commands.Channel.Open()))
    assert code == 505
    assert text.startswith("UNEXPECTED_FRAME")
    assert (class_id, method_id) == (0, 0)
    assert_broker_serves(broker, uid)


# -- misc -----------------------------------------------------------------------------------------------------

def _delete_queue(broker, name: str) -> None:
    conn = pika.BlockingConnection(broker.pika_params(connection_attempts=1, socket_timeout=5, heartbeat=0))
    try:
        conn.channel().queue_delete(name)
    finally:
        if conn.is_open:
            conn.close()


def test_raw_client_round_trip(raw, broker, uid):
    """The raw client itself works: publish and get back through the default exchange."""
    c = opened(raw)
    q = declare_queue(c, 1, exclusive=True)
    c.publish(1, b"ping", routing_key=q)
    c.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
    c.expect_method(commands.Basic.GetOk, 1)
    c.wait_for(lambda f: f.channel == 1)
    assert c.wait_for(lambda f: f.channel == 1).payload == b"ping"
    c.send_raw(heartbeat_frame())
    c.close_connection()
