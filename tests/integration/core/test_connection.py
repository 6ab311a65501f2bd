"""The `connection` and `channel` classes as clients see them: handshake, login, tuning, close and errors.

Checked against RabbitMQ 3.10.8. Where pika refuses something on the client side (channel_max), a small
raw-socket client built on pamqp checks what the broker itself does.
"""

from __future__ import annotations

import socket
import time
from typing import Self

import amqp.exceptions
import kombu
import pika
import pika.exceptions
import pika.spec
import pytest
from pamqp import commands, frame, header, heartbeat
from pamqp import exceptions as pamqp_exceptions

CAPABILITIES = (
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- a minimal raw AMQP client, to see what reaches the broker ---------------------------------------------


class RawClient:
    """Just enough AMQP 0-9-1 over a plain socket to send any method on any channel and read the reply."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, channel: int, method) -> None:
        self.sock.sendall(frame.marshal(method, channel))

    def recv(self, *, skip_heartbeats: bool = True):
        """The next (channel, frame); EOFError when the broker closed the socket."""
        while True:
            if self.buf:
                try:
                    consumed, channel, value = frame.unmarshal(self.buf)
                except pamqp_exceptions.UnmarshalingException:
                    consumed = 0
                if consumed:
                    self.buf = self.buf[consumed:]
                    if skip_heartbeats and isinstance(value, heartbeat.Heartbeat):
                        continue
                    return channel, value
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the broker closed the socket")
            self.buf += data

    def start(self) -> commands.Connection.Start:
        self.sock.sendall(header.ProtocolHeader().marshal())
        _, start = self.recv()
        assert isinstance(start, commands.Connection.Start), start
        return start

    def login(self, user: str, password: str, *, auth_failure_close: bool = True) -> None:
        caps = {"authentication_failure_close": True} if auth_failure_close else {}
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "leveret-tests-raw", "capabilities": caps},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))

    def handshake(self, broker, *, channel_max: int | None = None, frame_max: int | None = None,
                  heartbeat: int | None = None) -> commands.Connection.Tune:
        """Open a connection; unset tune values echo the broker's proposal. Returns the broker's Tune."""
        self.start()
        self.login(broker.user, broker.password)
        _, tune = self.recv()
        assert isinstance(tune, commands.Connection.Tune), tune
        self.send(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max if channel_max is None else channel_max,
            frame_max=tune.frame_max if frame_max is None else frame_max,
            heartbeat=tune.heartbeat if heartbeat is None else heartbeat))
        self.send(0, commands.Connection.Open(virtual_host=broker.vhost))
        _, ok = self.recv()
        assert isinstance(ok, commands.Connection.OpenOk), ok
        return tune

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        ch, ok = self.recv()
        assert (ch, type(ok)) == (channel, commands.Channel.OpenOk), (ch, ok)


def _assert_connection_closed_by_broker(raw: RawClient, code: int, text_prefix: str):
    ch, close = raw.recv()
    assert ch == 0 and isinstance(close, commands.Connection.Close), (ch, close)
    assert close.reply_code == code, (close.reply_code, close.reply_text)
    assert close.reply_text.startswith(text_prefix), close.reply_text
    raw.send(0, commands.Connection.CloseOk())
    return close


# -- server properties -----------------------------------------------------------------------------------


def test_server_properties_product_version_platform_capabilities(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        props = conn._impl.server_properties
        expected_product = "Leveret" if broker.is_leveret else "RabbitMQ"
        assert _text(props["product"]) == expected_product
        assert _text(props["version"]).strip()
        assert _text(props["platform"]).strip()
        caps = props["capabilities"]
        for cap in CAPABILITIES:
            assert caps.get(cap) is True, (cap, caps)
    finally:
        conn.close()


def test_connection_start_frame(broker):
    with RawClient(broker.host, broker.port) as raw:
        start = raw.start()
        assert (start.version_major, start.version_minor) == (0, 9)
        assert {"PLAIN", "AMQPLAIN"} <= set(_text(start.mechanisms).split())
        assert "en_US" in _text(start.locales).split()
        caps = start.server_properties["capabilities"]
        assert all(caps.get(cap) is True for cap in CAPABILITIES), caps


def test_kombu_sees_product_and_version(broker):
    with kombu.Connection(broker.url, connect_timeout=5) as conn:
        conn.connect()
        props = conn.connection.server_properties
        assert _text(props["product"]) == ("Leveret" if broker.is_leveret else "RabbitMQ")
        assert _text(props["version"]).strip()


# -- login and vhost -------------------------------------------------------------------------------------


def test_wrong_password_pika_403(broker):
    params = pika.ConnectionParameters(
        host=broker.host, port=broker.port, virtual_host=broker.vhost,
        credentials=pika.PlainCredentials(broker.user, "definitely-wrong"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5)
    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError)) as exc:
        pika.BlockingConnection(params)
    assert "403" in str(exc.value) and "ACCESS_REFUSED" in str(exc.value)


@pytest.mark.parametrize("login_method", [None, "AMQPLAIN", "PLAIN"])
def test_wrong_password_kombu_403(broker, login_method):
    url = f"amqp://{broker.user}:definitely-wrong@{broker.host}:{broker.port}/{broker.url.rsplit('/', 1)[1]}"
    conn = kombu.Connection(url, login_method=login_method, connect_timeout=5)
    try:
        with pytest.raises(amqp.exceptions.AccessRefused) as exc:
            conn.connect()
        assert exc.value.code == 403
        assert "ACCESS_REFUSED" in exc.value.reply_text
        if login_method:
            assert login_method in exc.value.reply_text  # "... using authentication mechanism AMQPLAIN ..."
    finally:
        conn.release()


def test_kombu_amqplain_login_works(broker):
    with kombu.Connection(broker.url, login_method="AMQPLAIN", connect_timeout=5) as conn:
        conn.connect()
        assert [a.mechanism for a in conn.connection.authentication] == [b"AMQPLAIN"]
        assert conn.connected


def test_wrong_password_raw_close_403(broker):
    """With authentication_failure_close the broker explains itself with connection.close 403, then drops."""
    with RawClient(broker.host, broker.port) as raw:
        raw.start()
        raw.login(broker.user, "definitely-wrong")
        _assert_connection_closed_by_broker(raw, 403, "ACCESS_REFUSED")


def test_wrong_password_without_capability_drops_socket(broker):
    """Without authentication_failure_close RabbitMQ just closes the socket: no connection.close frame.

    (RabbitMQ 3.10 takes about 3 s to drop it.)"""
    with RawClient(broker.host, broker.port, timeout=10.0) as raw:
        raw.start()
        raw.login(broker.user, "definitely-wrong", auth_failure_close=False)
        with pytest.raises((EOFError, ConnectionResetError)):
            raw.recv()


def test_unknown_vhost_530(broker, uid):
    params = pika.ConnectionParameters(
        host=broker.host, port=broker.port, virtual_host=f"{uid}-no-such-vhost",
        credentials=pika.PlainCredentials(broker.user, broker.password), connection_attempts=1, socket_timeout=5)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as exc:
        pika.BlockingConnection(params)
    assert "530" in str(exc.value) and "NOT_ALLOWED" in str(exc.value)

    conn = kombu.Connection(f"amqp://{broker.user}:{broker.password}@{broker.host}:{broker.port}/{uid}-nope",
                            connect_timeout=5)
    try:
        with pytest.raises(amqp.exceptions.NotAllowed) as kexc:
            conn.connect()
        assert kexc.value.code == 530
        assert kexc.value.reply_text.startswith("NOT_ALLOWED")
        assert kexc.value.method_name == "Connection.open"
    finally:
        conn.release()


def test_guest_may_log_in_from_localhost(broker):
    if broker.host not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip("broker is not on the loopback interface")
    params = pika.ConnectionParameters(host="127.0.0.1", port=broker.port, virtual_host="/",
                                       credentials=pika.PlainCredentials("guest", "guest"))
    conn = pika.BlockingConnection(params)
    try:
        assert conn.is_open
        conn.channel().queue_declare("", exclusive=True)
    finally:
        conn.close()


# -- tuning ----------------------------------------------------------------------------------------------


def test_broker_tune_defaults(broker):
    with RawClient(broker.host, broker.port) as raw:
        tune = raw.handshake(broker)
        assert tune.channel_max == 2047
        assert tune.frame_max == 131072
        assert tune.heartbeat == 60


def test_pika_negotiates_frame_max_and_heartbeat(broker):
    conn = pika.BlockingConnection(broker.pika_params(heartbeat=5))
    try:
        assert conn._impl.params.frame_max == 131072
        assert conn._impl.params.heartbeat == 5
        assert conn._impl.params.channel_max == 2047
    finally:
        conn.close()


def test_heartbeat_5_is_used_by_broker(broker):
    """After tune-ok heartbeat=5 the broker sends heartbeat frames (about every 2.5 s) on an idle connection."""
    with RawClient(broker.host, broker.port, timeout=16.0) as raw:
        raw.handshake(broker, heartbeat=5)
        t0 = time.monotonic()
        ch, value = raw.recv(skip_heartbeats=False)
        elapsed = time.monotonic() - t0
        assert ch == 0 and isinstance(value, heartbeat.Heartbeat), (ch, value)
        # The first comes about 2.5 s in; a broker that kept its own 60 s would send its first at 30 s. 15 s tells
        # the two apart and leaves a loaded CI machine (2 cores, load 6-10) room for a late timer.
        assert elapsed < 15, elapsed


def test_channel_max_pika_refuses_client_side(broker):
    conn = pika.BlockingConnection(broker.pika_params(channel_max=10))
    try:
        assert conn._impl.params.channel_max == 10
        channels = [conn.channel() for _ in range(10)]
        assert sorted(ch.channel_number for ch in channels) == list(range(1, 11))
        with pytest.raises(pika.exceptions.NoFreeChannels):
            conn.channel()
        assert conn.is_open
    finally:
        conn.close()


def test_channel_max_broker_refuses_eleventh_channel(broker):
    """The broker counts open channels: with channel_max=10 the 11th channel.open is a 530 connection error,
    whose close names class and method 0 (RabbitMQ 3.10.8 sends 0/0, not channel.open's 20/10)."""
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(broker, channel_max=10)
        for n in range(1, 11):
            raw.open_channel(n)
        raw.send(11, commands.Channel.Open())
        close = _assert_connection_closed_by_broker(raw, 530, "NOT_ALLOWED")
        assert "channel_max" in close.reply_text
        assert (close.class_id, close.method_id) == (0, 0)


# -- close and unacked deliveries ------------------------------------------------------------------------


def test_connection_close_requeues_unacked(broker, uid):
    qname = f"{uid}-q"
    setup = pika.BlockingConnection(broker.pika_params())
    try:
        sch = setup.channel()
        sch.queue_declare(qname, auto_delete=False)
        sch.confirm_delivery()
        sch.basic_publish("", qname, b"payload", pika.BasicProperties(message_id="m1"))

        first = pika.BlockingConnection(broker.pika_params())
        fch = first.channel()
        method, props, body = fch.basic_get(qname, auto_ack=False)
        assert body == b"payload" and not method.redelivered
        first.close()  # never acked

        second = pika.BlockingConnection(broker.pika_params())
        try:
            ch2 = second.channel()
            got = None
            deadline = time.monotonic() + 5
            while got is None and time.monotonic() < deadline:
                got = ch2.basic_get(qname, auto_ack=False)
                if got[0] is None:
                    got = None
                    time.sleep(0.05)
            assert got is not None, "the unacked message was not requeued"
            method, props, body = got
            assert body == b"payload" and props.message_id == "m1"
            assert method.redelivered is True
            ch2.basic_ack(method.delivery_tag)
        finally:
            second.close()
    finally:
        sch.queue_delete(qname)
        setup.close()


def test_connection_close_handshake_raw(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(broker)
        raw.open_channel(1)
        raw.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        ch, ok = raw.recv()
        assert ch == 0 and isinstance(ok, commands.Connection.CloseOk)
        # RabbitMQ leaves closing the socket to the client after close-ok, so nothing more is asserted here.


# -- channel errors --------------------------------------------------------------------------------------


def _pump_until_closed(conn: pika.BlockingConnection, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)


def test_channel_flow_active_true_is_acknowledged(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        result: list[bool] = []
        ch._impl.flow(True, result.append)
        deadline = time.monotonic() + 5
        while not result and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert result == [True]
        ch.queue_declare("", exclusive=True)  # channel still usable
    finally:
        conn.close()


def test_channel_flow_active_false_is_540(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch._impl.flow(False, lambda active: None)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
            _pump_until_closed(conn)
        assert exc.value.reply_code == 540
        assert exc.value.reply_text.startswith("NOT_IMPLEMENTED")
    finally:
        if conn.is_open:
            conn.close()


def test_second_channel_open_is_504(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        conn._impl._send_method(ch.channel_number, pika.spec.Channel.Open())
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
            _pump_until_closed(conn)
        assert exc.value.reply_code == 504
        assert exc.value.reply_text.startswith("CHANNEL_ERROR")
        assert "second 'channel.open'" in exc.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def test_method_before_channel_open_is_504(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(broker)
        raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
        close = _assert_connection_closed_by_broker(raw, 504, "CHANNEL_ERROR")
        assert "expected 'channel.open'" in close.reply_text
