"""A small raw-socket AMQP 0-9-1 client for tests that need to misbehave on the wire.

It uses a blocking socket with timeouts and pamqp (4.x) to encode and decode frames. Unlike a real client
it never hides anything: it can send arbitrary bytes, stop in the middle of the handshake, skip close-ok,
and it reports exactly what the broker wrote back (including the 8-byte protocol header the broker sends
when it refuses a version) or that the broker closed the socket.

Typical use::

    with RawAMQPClient(broker.host, broker.port) as c:
        c.handshake(heartbeat=0)
        c.open_channel(1)
        c.send_method(1, commands.Basic.Ack(delivery_tag=99))
        code, text, class_id, method_id = c.expect_channel_close(1)

Every read has a deadline; nothing here can block a test for longer than the timeout it was given.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

from pamqp import body as pbody
from pamqp import commands, constants
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "PROTOCOL_HEADER",
    "CloseInfo",
    "ConnectionClosedError",
    "Frame",
    "FrameTimeout",
    "ProtocolHeaderReply",
    "RawAMQPClient",
    "body_frame",
    "commands",
    "content_header_frame",
    "heartbeat_frame",
    "method_frame",
    "method_payload",
    "plain_response",
    "raw_frame",
]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = constants.FRAME_METHOD  # 1
FRAME_HEADER = constants.FRAME_HEADER  # 2
FRAME_BODY = constants.FRAME_BODY  # 3
FRAME_HEARTBEAT = constants.FRAME_HEARTBEAT  # 8
FRAME_END = constants.FRAME_END  # 0xCE

DEFAULT_TIMEOUT = 5.0


class ConnectionClosedError(Exception):
    """The peer closed (or reset) the TCP connection."""


class FrameTimeout(Exception):
    """No frame matching the condition arrived before the deadline."""


class CloseInfo(NamedTuple):
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass
class Frame:
    """One frame read from the broker.

    ``value`` is the pamqp object (a method such as ``commands.Connection.Close``, a ``ContentHeader``,
    a ``ContentBody`` or a ``Heartbeat``), or None when pamqp could not decode the payload.
    """

    type: int
    channel: int
    payload: bytes
    value: Any = None

    @property
    def is_heartbeat(self) -> bool:
        return self.type == FRAME_HEARTBEAT

    def is_method(self, cls: type | None = None, channel: int | None = None) -> bool:
        if self.type != FRAME_METHOD:
            return False
        if channel is not None and self.channel != channel:
            return False
        return cls is None or isinstance(self.value, cls)

    def __repr__(self) -> str:
        name = getattr(self.value, "name", None) or f"type={self.type}"
        return f"Frame({name}, ch={self.channel}, {len(self.payload)}B)"


@dataclass
class ProtocolHeaderReply:
    """What a broker writes when it refuses our protocol header: ``AMQP`` plus four version octets."""

    raw: bytes

    @property
    def type(self) -> int:  # so it can sit in the same lists as Frame
        return -1


# -- encoding helpers (usable without a connection) -----------------------------------------------------

def raw_frame(frame_type: int, channel: int, payload: bytes, frame_end: int = FRAME_END,
              size: int | None = None) -> bytes:
    """A frame built by hand: any type, any declared size, any frame-end octet."""
    return struct.pack(">BHI", frame_type, channel, len(payload) if size is None else size) + payload + bytes(
        [frame_end])


def method_payload(method: Any) -> bytes:
    """The payload of a method frame: class id, method id, arguments."""
    return struct.pack(">I", method.index) + method.marshal()


def method_frame(channel: int, method: Any) -> bytes:
    return pframe.marshal(method, channel)


def content_header_frame(channel: int, body_size: int, properties: Any = None, weight: int = 0) -> bytes:
    props = properties if properties is not None else commands.Basic.Properties()
    return pframe.marshal(pheader.ContentHeader(weight, body_size, props), channel)


def body_frame(channel: int, data: bytes) -> bytes:
    return pframe.marshal(pbody.ContentBody(data), channel)


def heartbeat_frame() -> bytes:
    return pheartbeat.Heartbeat.marshal()


def plain_response(user: str, password: str) -> str:
    return f"\0{user}\0{password}"


def _decode(frame_type: int, channel: int, payload: bytes) -> Any:
    try:
        if frame_type == FRAME_HEARTBEAT:
            return pheartbeat.Heartbeat()
        _, _, value = pframe.unmarshal(raw_frame(frame_type, channel, payload))
        return value
    except Exception:  # noqa: BLE001 - an undecodable frame is still reported, with value None
        return None


# -- the client -----------------------------------------------------------------------------------------

class RawAMQPClient:
    """A blocking AMQP 0-9-1 client that does exactly what the test says, and nothing more.

    It answers nothing on its own: heartbeats are not sent unless asked for (``send_heartbeat``), and
    close-ok is sent only by the ``expect_*_close`` helpers (when ``send_close_ok`` is true).
    """

    def __init__(self, host: str, port: int, *, timeout: float = DEFAULT_TIMEOUT, connect: bool = True,
                 user: str = "guest", password: str = "guest", vhost: str = "/") -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.user = user
        self.password = password
        self.vhost = vhost
        self.sock: socket.socket | None = None
        self._buf = bytearray()
        self._eof = False
        self.received: list[Frame | ProtocolHeaderReply] = []  # every frame read, in order
        self.start: Any = None  # connection.start from the server
        self.tune: Any = None  # connection.tune from the server
        self.tune_ok: Any = None  # what we answered
        self.frame_max = 8192  # the limit before tuning (FRAME_MIN_SIZE in RabbitMQ)
        if connect:
            self.connect()

    @classmethod
    def for_broker(cls, broker: Any, **kw: Any) -> RawAMQPClient:
        """Build from the ``broker`` fixture (host, port, user, password, vhost)."""
        return cls(broker.host, broker.port, user=broker.user, password=broker.password, vhost=broker.vhost,
                   **kw)

    # -- socket ---------------------------------------------------------------------------------------
    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are. Raises ConnectionClosedError if the broker has already gone."""
        assert self.sock is not None, "not connected"
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
            raise ConnectionClosedError(str(e)) from e

    def send(self, value: Any, channel: int = 0) -> None:
        """Send a pamqp object (method, ContentHeader, ContentBody, Heartbeat, ProtocolHeader)."""
        self.send_raw(pframe.marshal(value, channel))

    def send_method(self, channel: int, method: Any) -> None:
        self.send_raw(method_frame(channel, method))

    def send_heartbeat(self) -> None:
        self.send_raw(heartbeat_frame())

    def send_protocol_header(self, header: bytes = PROTOCOL_HEADER) -> None:
        self.send_raw(header)

    def publish(self, channel: int, body: bytes, exchange: str = "", routing_key: str = "",
                properties: Any = None, mandatory: bool = False) -> None:
        """basic.publish + content header + body frames split at the negotiated frame_max."""
        data = method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                            mandatory=mandatory))
        data += content_header_frame(channel, len(body), properties)
        chunk = max(1, self.frame_max - 8) if self.frame_max else len(body) or 1
        for i in range(0, len(body), chunk):
            data += body_frame(channel, body[i:i + chunk])
        self.send_raw(data)

    def _recv_some(self, deadline: float) -> None:
        """Read whatever is available into the buffer; raise at EOF or when the deadline passes. The socket is
        read once into a local: a reader thread's client closed by its test meanwhile (``sock`` None) raises
        ConnectionClosedError, not AttributeError (a disk-full test's reader thread met that)."""
        sock = self.sock
        if sock is None:
            raise ConnectionClosedError("closed here")
        if self._eof:
            raise ConnectionClosedError("connection closed by peer")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FrameTimeout("deadline passed")
        try:
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
        except TimeoutError as e:
            raise FrameTimeout("deadline passed") from e
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as e:
            self._eof = True
            raise ConnectionClosedError(str(e)) from e
        if not chunk:
            self._eof = True
            raise ConnectionClosedError("connection closed by peer")
        self._buf += chunk

    def read_exact(self, n: int, timeout: float | None = None) -> bytes:
        """Read exactly n raw bytes (for instance the 8-byte protocol header a broker writes back)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self._buf) < n:
            self._recv_some(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def read_all_until_closed(self, timeout: float | None = None) -> bytes:
        """Read every byte until the broker closes the socket. Raises FrameTimeout if it does not."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                self._recv_some(deadline)
            except ConnectionClosedError:
                data = bytes(self._buf)
                self._buf.clear()
                return data

    def recv_frame(self, timeout: float | None = None) -> Frame | ProtocolHeaderReply:
        """Read the next frame (or a protocol header the broker wrote back)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self._buf) < 7:
            if len(self._buf) >= 4 and self._buf[:4] == b"AMQP":
                break
            self._recv_some(deadline)
        if self._buf[:4] == b"AMQP":
            while len(self._buf) < 8:
                self._recv_some(deadline)
            reply = ProtocolHeaderReply(bytes(self._buf[:8]))
            del self._buf[:8]
            self.received.append(reply)
            return reply
        frame_type, channel, size = struct.unpack(">BHI", self._buf[:7])
        while len(self._buf) < 7 + size + 1:
            self._recv_some(deadline)
        payload = bytes(self._buf[7:7 + size])
        end = self._buf[7 + size]
        del self._buf[:7 + size + 1]
        if end != FRAME_END:
            raise AssertionError(f"broker sent a frame with frame-end 0x{end:02x}")
        frame = Frame(frame_type, channel, payload, _decode(frame_type, channel, payload))
        self.received.append(frame)
        return frame

    def wait_for(self, predicate: Callable[[Frame], bool], timeout: float | None = None, *,
                 skip_heartbeats: bool = True) -> Frame:
        """Read frames until one satisfies predicate; others are dropped (they stay in ``received``)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            f = self.recv_frame(max(0.0, deadline - time.monotonic()))
            if isinstance(f, ProtocolHeaderReply):
                raise AssertionError(f"broker wrote a protocol header back: {f.raw!r}")  # noqa: TRY004
            if skip_heartbeats and f.is_heartbeat:
                continue
            if predicate(f):
                return f

    def expect_method(self, cls: type, channel: int | None = None, timeout: float | None = None) -> Any:
        """The next non-heartbeat frame must be a method of type cls (on channel, if given)."""
        f = self.wait_for(lambda _f: True, timeout)
        if not f.is_method(cls, channel):
            raise AssertionError(f"expected {cls.__name__} on channel {channel}, got {f!r} ({f.value!r})")
        return f.value

    def drain(self, timeout: float = 0.2) -> list[Frame | ProtocolHeaderReply]:
        """Read whatever frames arrive within timeout; stops quietly on timeout or close."""
        out: list[Frame | ProtocolHeaderReply] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                out.append(self.recv_frame(max(0.0, deadline - time.monotonic())))
            except (FrameTimeout, ConnectionClosedError):
                return out

    # -- handshake ------------------------------------------------------------------------------------
    def handshake(self, *, frame_max: int | None = None, channel_max: int | None = None,
                  heartbeat: int | None = 0, vhost: str | None = None,
                  client_properties: dict | None = None, open_connection: bool = True) -> Any:
        """Protocol header, start/start-ok (PLAIN), tune/tune-ok, open/open-ok.

        ``frame_max``/``channel_max``/``heartbeat`` are the values we put in tune-ok; None means "echo
        the server's proposal". Returns the server's connection.tune.
        """
        self.send_protocol_header()
        self.start = self.expect_method(commands.Connection.Start, 0)
        props = client_properties if client_properties is not None else {
            "product": "leveret-rawamqp-test",
            "capabilities": {"authentication_failure_close": True, "basic.nack": True,
                             "connection.blocked": True, "consumer_cancel_notify": True,
                             "publisher_confirms": True},
        }
        self.send_method(0, commands.Connection.StartOk(
            client_properties=props, mechanism="PLAIN", response=plain_response(self.user, self.password),
            locale="en_US"))
        self.tune = self.expect_method(commands.Connection.Tune, 0)
        self.tune_ok = commands.Connection.TuneOk(
            channel_max=self.tune.channel_max if channel_max is None else channel_max,
            frame_max=self.tune.frame_max if frame_max is None else frame_max,
            heartbeat=self.tune.heartbeat if heartbeat is None else heartbeat)
        self.send_method(0, self.tune_ok)
        self.frame_max = self.tune_ok.frame_max
        if open_connection:
            self.send_method(0, commands.Connection.Open(virtual_host=self.vhost if vhost is None else vhost))
            self.expect_method(commands.Connection.OpenOk, 0)
        return self.tune

    def open_channel(self, channel: int) -> None:
        self.send_method(channel, commands.Channel.Open())
        self.expect_method(commands.Channel.OpenOk, channel)

    def close_channel(self, channel: int) -> None:
        self.send_method(channel, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        self.wait_for(lambda f: f.is_method(commands.Channel.CloseOk, channel))

    def close_connection(self, timeout: float | None = None) -> None:
        """A clean connection.close; waits for close-ok (and then for the socket to close)."""
        self.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        self.wait_for(lambda f: f.is_method(commands.Connection.CloseOk, 0), timeout)
        self.close()

    # -- errors ---------------------------------------------------------------------------------------
    def expect_connection_close(self, timeout: float | None = None, *, send_close_ok: bool = True,
                                skip_other: bool = True) -> CloseInfo:
        """Wait for connection.close from the broker; return (reply_code, reply_text, class_id, method_id).

        With ``skip_other`` false, the next non-heartbeat frame must be the close.
        """
        if skip_other:
            f = self.wait_for(lambda f: f.is_method(commands.Connection.Close), timeout)
        else:
            f = self.wait_for(lambda f: True, timeout)
        if not f.is_method(commands.Connection.Close):
            raise AssertionError(f"expected connection.close, got {f!r} ({f.value!r})")
        if f.channel != 0:
            raise AssertionError(f"connection.close on channel {f.channel}")
        m = f.value
        if send_close_ok:
            try:
                self.send_method(0, commands.Connection.CloseOk())
            except (ConnectionClosedError, OSError):
                pass
        return CloseInfo(m.reply_code, m.reply_text, m.class_id, m.method_id)

    def expect_channel_close(self, channel: int, timeout: float | None = None, *,
                             send_close_ok: bool = True) -> CloseInfo:
        """Wait for channel.close on channel; fail if the broker closes the connection instead."""
        f = self.wait_for(lambda f: f.is_method(commands.Channel.Close, channel)
                          or f.is_method(commands.Connection.Close), timeout)
        if f.is_method(commands.Connection.Close):
            m = f.value
            raise AssertionError(f"expected channel.close on {channel}, got connection.close "
                                 f"{m.reply_code} {m.reply_text!r} ({m.class_id}, {m.method_id})")
        m = f.value
        if send_close_ok:
            self.send_method(channel, commands.Channel.CloseOk())
        return CloseInfo(m.reply_code, m.reply_text, m.class_id, m.method_id)

    def expect_close_or_eof(self, timeout: float | None = None) -> CloseInfo | None:
        """Either a connection.close (returned, close-ok sent) or the socket closing (None)."""
        try:
            return self.expect_connection_close(timeout)
        except ConnectionClosedError:
            return None

    def wait_closed(self, timeout: float | None = None) -> float | None:
        """Read and drop frames until the broker closes the socket; seconds waited, or None on timeout."""
        t0 = time.monotonic()
        deadline = t0 + (self.timeout if timeout is None else timeout)
        while True:
            try:
                self._recv_some(deadline)
                self._buf.clear()
            except ConnectionClosedError:
                return time.monotonic() - t0
            except FrameTimeout:
                return None

    def is_socket_closed(self, timeout: float = 1.0) -> bool:
        """True if the broker closes the socket within timeout (data that arrives meanwhile is dropped)."""
        return self.wait_closed(timeout) is not None
