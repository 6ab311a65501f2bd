"""Answers where Leveret used to differ from RabbitMQ (issue 10). Each case names the RabbitMQ source
(``rabbitmq/rabbitmq-server``, tags v3.10.8 and v3.13.7) that fixes the expected behaviour and text.

=====================================================  ===================================================
``connection.update-secret`` (10/70)                   ``update-secret-ok`` (10/71); the internal backend's
                                                       state never expires, so the secret is not checked
                                                       (rabbit_reader ``handle_method0``,
                                                       rabbit_access_control ``update_state/2``)
frames on a channel after our ``channel.close-ok``     none until the channel is reopened (AMQP 0-9-1
or after our ``channel.close``                         §2.2.6/4.2.4: a closed channel is gone)
frames after our ``connection.close-ok``               none
exclusive queue redeclared by its owner with           405 RESOURCE_LOCKED "cannot obtain exclusive access
``exclusive=false`` (and the other way round)          to locked queue '…' in vhost '…'. It could be …"
                                                       (rabbit_amqqueue ``check_exclusive_access/3``, strict)
tune-ok ``frame_max`` 4096                             accepted (``?FRAME_MIN_SIZE`` is 4096 in 3.x);
                                                       content goes out in frames of at most 4096 octets
tune-ok ``frame_max`` 4095, or 0 / ``channel_max`` 0   no connection.close: the socket is closed, after
(no limit) where the broker proposed a limit           ?SILENT_CLOSE_DELAY (3 s); the text ("negotiated
                                                       frame_max = 4095 is lower than the minimum allowed
                                                       value (4096)") is only logged. ``fail_negotiation``
                                                       raises with method 'connection.tune', so
                                                       handle_method0/3 wraps it and handle_exception's
                                                       catch-all runs, not its tuning/not_allowed clause
                                                       (same in 3.10.8, 3.13.7 and 4.x; seen on 3.10.8)
``delivery_mode`` other than 1 or 2                    406 "invalid message: {delivery_mode_unknown,3}", 60/40
                                                       (rabbit_basic ``is_message_persistent``; 3.13+ with
                                                       message containers treats it as transient instead)
``CC`` / ``BCC`` header that is not an array           406 "invalid message: {unacceptable_type_in_header,
                                                       \\"CC\\",longstr}", 60/40 (rabbit_basic ``header_routes``)
``CC`` array elements that are not long strings        ignored (``[Route || {longstr, Route} <- Routes]``)
``x-priority`` consumer argument that is no integer    406 "invalid arg 'x-priority' for queue '…' in vhost
                                                       '/': \\"expected integer, got longstr\\""
                                                       (rabbit_amqqueue ``check_int_arg/2``)
=====================================================  ===================================================
"""

from __future__ import annotations

import asyncio
import decimal
import random
import struct
import time
from collections.abc import Callable

import aiormq
import pika
import pytest
from amqp_helpers import expect_channel_error, wait_get
from pika.exceptions import ChannelClosedByBroker
from rawamqp import (  # tests/ is on sys.path (rootdir conftest)
    FRAME_BODY,
    FRAME_HEADER,
    Frame,
    RawAMQPClient,
    body_frame,
    commands,
    content_header_frame,
    method_frame,
    raw_frame,
)

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(120)

_LOCKED_TEXT = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It could "
               "be originally declared on another connection or the exclusive property value does not match "
               "that of the original declaration.")


def locked_text(name: str) -> str:
    """RabbitMQ's 405 text for ``name``, cut as RabbitMQ cuts a reply text over 255 octets: 252 and "..."."""
    raw = _LOCKED_TEXT.format(name=name).encode()
    return raw.decode() if len(raw) <= 255 else raw[:252].decode(errors="ignore") + "..."


# -- helpers --------------------------------------------------------------------------------------------



def opened(raw: Callable[..., RawAMQPClient], channel: int = 1, **handshake_kw) -> RawAMQPClient:
    c = raw()
    c.handshake(**handshake_kw)
    c.open_channel(channel)
    return c


def header_with_delivery_mode(channel: int, body_size: int, mode: int) -> bytes:
    """A basic content header with only delivery-mode set, to any octet (pamqp refuses modes but 1, 2)."""
    return raw_frame(FRAME_HEADER, channel, struct.pack(">HHQH", 60, 0, body_size, 1 << 12) + bytes([mode]))


def persistent() -> commands.Basic.Properties:
    return commands.Basic.Properties(delivery_mode=2)


def publish_frames(channel: int, routing_key: str, body: bytes, properties=None) -> bytes:
    return (method_frame(channel, commands.Basic.Publish(exchange="", routing_key=routing_key))
            + content_header_frame(channel, len(body), properties) + body_frame(channel, body))


# -- connection.update-secret -----------------------------------------------------------------------------

def test_update_secret_is_answered_with_update_secret_ok(raw, uid):
    """RabbitMQ answers update-secret-ok on channel 0 and the connection goes on; Leveret closed it (504)."""
    c = raw()
    c.handshake()
    c.send_method(0, commands.Connection.UpdateSecret(new_secret=c.password, reason="rotation"))
    ok = c.expect_method(commands.Connection.UpdateSecretOk, 0)
    assert isinstance(ok, commands.Connection.UpdateSecretOk)
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
    assert c.expect_method(commands.Queue.DeclareOk, 1).queue == f"{uid}-q"
    c.close_connection()


def test_update_secret_with_another_secret_is_accepted_by_the_internal_backend(raw):
    """The internal user database keeps no state that can expire (``expiry_timestamp/1`` is ``never``, 3.10:
    ``state_can_expire/0`` is false), so ``rabbit_access_control:update_state/2`` does not consult it and any
    secret is accepted. Only a backend with expiring credentials (OAuth 2) checks the new one."""
    c = raw()
    c.handshake()
    c.send_method(0, commands.Connection.UpdateSecret(new_secret="not-the-password", reason="r"))
    c.expect_method(commands.Connection.UpdateSecretOk, 0)
    c.open_channel(1)
    c.close_connection()


async def test_update_secret_with_aiormq(broker, uid):
    """aiormq's ``Connection.update_secret`` waits for update-secret-ok; the connection stays usable."""
    async with asyncio.timeout(20):
        conn = await aiormq.connect(broker.url)
        try:
            ok = await conn.update_secret(broker.password, reason="token refresh", timeout=5)
            assert ok.name == "Connection.UpdateSecretOk"
            channel = await conn.channel()
            declared = await channel.queue_declare(f"{uid}-q", exclusive=True)
            assert declared.queue == f"{uid}-q"
            await channel.basic_publish(b"after", routing_key=f"{uid}-q")
            got = await channel.basic_get(f"{uid}-q", no_ack=True)
            assert got.body == b"after"
        finally:
            await conn.close()


# -- nothing on a channel after it is closed -------------------------------------------------------------

def _not_on(channel: int, frames: list[Frame], why: str) -> None:
    stray = [f for f in frames if f.channel == channel]
    assert not stray, f"{why}: {stray} ({[f.value for f in stray]})"


def _read_until(c: RawAMQPClient, predicate: Callable[[Frame], bool], timeout: float = 10.0) -> list[Frame]:
    """Frames read up to and including the first that satisfies predicate (heartbeats skipped)."""
    seen: list[Frame] = []
    deadline = time.monotonic() + timeout
    while True:
        f = c.recv_frame(max(0.0, deadline - time.monotonic()))
        assert isinstance(f, Frame), f
        if f.is_heartbeat:
            continue
        seen.append(f)
        if predicate(f):
            return seen


@pytest.mark.parametrize("durable", [True, False], ids=["persistent-to-durable", "transient"])
def test_no_confirm_or_delivery_after_channel_close_ok(raw, make_queue, durable):
    """Eight channels publish with confirms (half of them also consume), then all close at once, 300 times
    over. After our close-ok nothing may arrive on a channel number until it is reopened: no basic.ack of
    a publish whose confirm was ready, or whose fsync ended, just as the close came in; no delivery. Every
    stray frame is seen: the numbers are reopened at once, and what comes on a channel before the replies
    to open, confirm.select, qos and consume belongs to the closed one. (Before the fix, a confirm settled
    by an fsync in the loop turn before the close went out after close-ok in about 3% of the rounds.)"""
    q = make_queue("q", durable=durable)
    props = persistent() if durable else None
    channels = range(1, 9)
    consumers = {ch for ch in channels if ch % 2}
    c = raw(timeout=10.0)
    c.handshake()
    rng = random.Random(10)
    close = b"".join(method_frame(ch, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                                                method_id=0)) for ch in channels)
    replies = (commands.Channel.OpenOk, commands.Confirm.SelectOk, commands.Basic.QosOk, commands.Basic.ConsumeOk)
    for i in range(300):
        reopen = b""
        for ch in channels:
            reopen += method_frame(ch, commands.Channel.Open()) + method_frame(ch, commands.Confirm.Select())
            if ch in consumers:
                reopen += (method_frame(ch, commands.Basic.Qos(prefetch_count=5))
                           + method_frame(ch, commands.Basic.Consume(queue=q, consumer_tag="c")))
        c.send_raw(reopen)
        waiting = set(channels)
        while waiting:
            f = _read_until(c, lambda f: True)[0]
            if f.channel in waiting:
                assert f.is_method(), f"round {i}: {f} ({f.value}) on a reopened channel came from the closed one"
                assert isinstance(f.value, replies), (
                    f"round {i}: {f.value} on channel {f.channel} after its close-ok, before it was set up again")
                if f.is_method(commands.Basic.ConsumeOk) or (
                        f.is_method(commands.Confirm.SelectOk) and f.channel not in consumers):
                    waiting.discard(f.channel)
        c.send_raw(b"".join(publish_frames(ch, q, b"m%d" % k, props)
                            for ch in channels for k in range(rng.randint(1, 5))))
        if rng.random() < 0.7:  # the close a moment later, around the end of the fsync
            time.sleep(rng.uniform(0, 0.006))
        c.send_raw(close)
        closed: set[int] = set()
        while len(closed) < len(channels):
            f = _read_until(c, lambda f: True)[0]
            assert f.channel not in closed, f"round {i}: {f} ({f.value}) after close-ok"
            if f.is_method(commands.Channel.CloseOk):
                closed.add(f.channel)
    late = [f for f in c.drain(0.5) if isinstance(f, Frame) and f.channel in channels]
    assert not late, f"frames of closed channels at the end: {late}"
    c.close_connection()


def test_nothing_after_connection_close_ok(raw, make_queue):
    """A confirm that is ready when connection.close comes in goes out before close-ok, or not at all."""
    q = make_queue("q")
    for _ in range(20):
        c = opened(raw)
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk, 1)
        c.send_raw(b"".join(publish_frames(1, q, b"m") for _ in range(5))
                   + method_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
        _read_until(c, lambda f: f.is_method(commands.Connection.CloseOk, 0))
        # RabbitMQ and Leveret leave the socket to the client after close-ok (rabbit_reader close_connection:
        # the server ends it itself only after min(heartbeat, 30 s)), so this waits out its window each round.
        # A frame the broker had ready would have gone out with close-ok, in the same write: 0.25 s on loopback
        # is ample to see it.
        after = [f for f in c.drain(0.25) if isinstance(f, Frame) and not f.is_heartbeat]
        assert not after, f"frames after connection.close-ok: {after}"


def test_nothing_after_our_channel_close(raw, make_queue):
    """When the broker closes a channel (here: a bad delivery mode), a confirm of an earlier publish may come
    before its channel.close, never after it: the client discards everything after a close (§4.2.4)."""
    q = make_queue("q")
    c = opened(raw)
    for i in range(20):
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk, 1)
        c.send_raw(publish_frames(1, q, b"fine") + method_frame(1, commands.Basic.Publish(routing_key=q))
                   + header_with_delivery_mode(1, 1, 3) + body_frame(1, b"x"))
        info = c.expect_channel_close(1, send_close_ok=False)
        assert info.reply_code == 406
        # Nothing more on channel 1, not even a confirm, until we answer and reopen it.
        _not_on(1, [f for f in c.drain(0.2) if isinstance(f, Frame)], f"round {i}: after channel.close")
        c.send_method(1, commands.Channel.CloseOk())
        c.send_method(1, commands.Channel.Open())
        _not_on(1, _read_until(c, lambda f: f.is_method(commands.Channel.OpenOk, 1))[:-1],
                f"round {i}: before open-ok")


# -- exclusive queues: the exclusive flag is part of the equivalence -------------------------------------

def test_owner_redeclaring_exclusive_queue_as_non_exclusive_is_resource_locked(conn, uid):
    name = f"{uid}-excl"
    ch = conn.channel()
    ch.queue_declare(name, exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(name, exclusive=False)
    assert ei.value.reply_code == 405
    assert ei.value.reply_text == locked_text(name)
    # The queue is untouched and still the owner's: an exclusive redeclare and a passive one succeed.
    ch2 = conn.channel()
    ch2.queue_declare(name, exclusive=True)
    ch2.queue_declare(name, passive=True)


def test_owner_redeclaring_shared_queue_as_exclusive_is_resource_locked(conn, make_queue):
    name = make_queue("shared")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(name, exclusive=True)
    assert ei.value.reply_code == 405
    assert ei.value.reply_text == locked_text(name)


# -- frame_max 4096 ---------------------------------------------------------------------------------------

def test_pika_with_frame_max_4096_publishes_and_consumes_100kb(broker, make_queue):
    q = make_queue("big")
    body = random.Random(4096).randbytes(100 * 1024)
    conn = pika.BlockingConnection(broker.pika_params(frame_max=4096))
    try:
        assert conn._impl.params.frame_max == 4096
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
        got: list[bytes] = []
        ch.basic_consume(q, lambda _ch, _m, _p, b: got.append(b), auto_ack=True)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert got == [body]
    finally:
        conn.close()


def test_content_is_split_into_frames_of_the_negotiated_4096(raw, uid):
    c = opened(raw, frame_max=4096)
    assert c.tune_ok.frame_max == 4096
    q = f"{uid}-q"
    c.send_method(1, commands.Queue.Declare(queue=q, exclusive=True))
    c.expect_method(commands.Queue.DeclareOk, 1)
    body = random.Random(1).randbytes(100 * 1024)
    c.publish(1, body, routing_key=q)  # body frames of frame_max - 8 octets
    c.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
    c.expect_method(commands.Basic.GetOk, 1)
    header = c.wait_for(lambda f: True)
    assert header.type == FRAME_HEADER and header.value.body_size == len(body)
    parts: list[bytes] = []
    while sum(map(len, parts)) < len(body):
        f = c.wait_for(lambda f: True)
        assert f.type == FRAME_BODY, f
        assert 7 + len(f.payload) + 1 <= 4096, f"body frame of {7 + len(f.payload) + 1} octets > frame_max"
        parts.append(f.payload)
    assert b"".join(parts) == body
    assert len(parts) == -(-len(body) // (4096 - 8))  # full frames: the body is split at frame_max
    c.close_connection()


@pytest.mark.parametrize("tune_ok", [{"frame_max": 4095}, {"frame_max": 0}, {"channel_max": 0}],
                         ids=["frame_max-4095", "frame_max-0", "channel_max-0"])
def test_refused_tune_ok_closes_the_socket_without_connection_close(raw, tune_ok):
    """A tune-ok below the minimum (frame_max 4095) or above the broker's maximum (0 = no limit, where the
    broker proposed one) is refused while tuning: RabbitMQ sends no connection.close but closes the socket
    (after ?SILENT_CLOSE_DELAY, 3 s) and only logs "negotiated frame_max = 4095 is lower than the minimum
    allowed value (4096)" (see the table above)."""
    c = raw()
    tune = c.handshake(open_connection=False, **tune_ok)
    assert tune.frame_max and tune.channel_max, "the broker proposed no limit: nothing to refuse"
    assert c.read_all_until_closed(10.0) == b"", "expected the socket closed with nothing sent"


# -- delivery_mode and CC / BCC ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0, 3, 255])
def test_unknown_delivery_mode_is_precondition_failed(raw, make_queue, mode):
    q = make_queue("q")
    c = opened(raw)
    c.send_raw(method_frame(1, commands.Basic.Publish(routing_key=q)) + header_with_delivery_mode(1, 1, mode)
               + body_frame(1, b"x"))
    text = f"PRECONDITION_FAILED - invalid message: {{delivery_mode_unknown,{mode}}}"
    assert c.expect_channel_close(1) == (406, text, 60, 40)
    c.open_channel(2)
    c.send_method(2, commands.Queue.Declare(queue=q, passive=True))
    assert c.expect_method(commands.Queue.DeclareOk, 2).message_count == 0  # nothing was enqueued


@pytest.mark.parametrize("mode", [1, 2])
def test_delivery_modes_1_and_2_are_accepted(conn, make_queue, mode):
    q = make_queue("q")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"ok", pika.BasicProperties(delivery_mode=mode))
    method, props, _body = wait_get(ch, q)
    assert method is not None and props.delivery_mode == mode


@pytest.mark.parametrize(("headers", "key", "type_name"), [
    ({"CC": "other"}, "CC", "longstr"),
    ({"BCC": "other"}, "BCC", "longstr"),
    ({"CC": 7}, "CC", "signedint"),
    ({"BCC": {"a": "b"}}, "BCC", "table"),
    ({"CC": True}, "CC", "bool"),
    ({"CC": ["fine"], "BCC": decimal.Decimal("1.5")}, "BCC", "decimal"),
])
def test_cc_or_bcc_header_that_is_not_an_array_is_precondition_failed(conn, make_queue, headers, key, type_name):
    """The error names the header and its AMQP field type (never a Python type)."""
    q = make_queue("q")
    ch = conn.channel()
    ch.basic_publish("", q, b"x", pika.BasicProperties(headers=headers))
    err = expect_channel_error(conn, ch)
    assert (err.reply_code, err.reply_text) == (
        406, f'PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,"{key}",{type_name}}}')


def test_cc_elements_that_are_not_long_strings_are_ignored(conn, make_queue, make_exchange):
    """Only the long-string elements of CC / BCC are routing keys: an integer 7 is not the key "7"."""
    x = make_exchange("x", "direct")
    by_int = make_queue("by-int")
    by_str = make_queue("by-str")
    ch = conn.channel()
    ch.queue_bind(by_int, x, "7")
    ch.queue_bind(by_str, x, "k")
    ch.confirm_delivery()
    ch.basic_publish(x, "nowhere", b"m", pika.BasicProperties(headers={"CC": [7, "k"]}))
    assert wait_get(ch, by_str)[2] == b"m"
    assert ch.basic_get(by_int, auto_ack=True)[0] is None


# -- reply texts name AMQP types --------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "type_name"), [("high", "longstr"), (True, "bool"), ({"a": 1}, "table"),
                                                  (decimal.Decimal("1.5"), "decimal")])
def test_consumer_priority_of_wrong_type_names_the_amqp_type(conn, make_queue, value, type_name):
    q = make_queue("q")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *_: None, arguments={"x-priority": value})
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' in vhost '/': "
                                   f'"expected integer, got {type_name}"')
