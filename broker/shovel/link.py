"""One AMQP 0-9-1 client connection with one channel (number 1), for a shovel's source or destination.

Built on the project's own codec (protocol/: FrameParser, method_frame, encode_content) rather than an
asyncio client library: a shovel passes each message's content header through byte for byte (properties
and headers kept exactly), and needs neither a task nor a future per message — aiormq, for one, makes a
future per confirmed publish and a task per delivery callback. The rare methods (handshake, declare, bind,
qos, consume, confirm.select) are RPCs awaited one at a time; deliveries, confirms and acks are handled in
``data_received`` and reported to the :class:`LinkEvents` the worker gives.

Backpressure: when the transport asks to pause writing, ``events.on_writable(False)`` lets the worker stop
reading its source (and resume it later), so a slow destination never makes the shovel buffer without bound.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, cast

import structlog
from pamqp import commands
from pamqp.base import Frame as Method

from broker.shovel.uri import ShovelURI
from protocol.constants import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD
from protocol.fastcodec import encode_basic_ack, encode_basic_nack, encode_content
from protocol.frames import FrameError, FrameParser, encode_frame
from protocol.methods import decode_method, method_frame
from protocol.properties import body_size_of

log = structlog.get_logger("leveret.shovel")

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CLIENT_FRAME_MAX = 131072
CHANNEL = 1
_HEARTBEAT_FRAME = encode_frame(FRAME_HEARTBEAT, 0, b"")


class LinkError(Exception):
    """The connection failed or was closed; ``str()`` says why (the status's reason)."""


class LinkEvents(Protocol):
    def on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str,
                    header: bytes, body: bytes) -> None: ...

    def on_confirm(self, tag: int, multiple: bool, nack: bool) -> None: ...

    def on_closed(self, reason: str) -> None: ...

    def on_writable(self, writable: bool) -> None: ...


class Link(asyncio.Protocol):
    """Connect with :meth:`open`; then ``rpc``, ``publish``, ``ack``, ``nack``; :meth:`close` at the end."""

    def __init__(self, events: LinkEvents, connection_name: str) -> None:
        self.events = events
        self.connection_name = connection_name
        self.transport: asyncio.Transport | None = None
        self.parser = FrameParser(CLIENT_FRAME_MAX, expect_header=False)
        self.frame_max = CLIENT_FRAME_MAX
        self.heartbeat = 0
        self.closed_reason: str | None = None
        self.server_properties: dict[str, Any] = {}  # connection.start's (a federation link reads cluster_name)
        self._waiter: asyncio.Future[Method] | None = None
        self._waiting_for: tuple[type, ...] = ()
        self._connected = asyncio.get_running_loop().create_future()
        self._last_read = time.monotonic()
        self._heartbeats: asyncio.Task[None] | None = None
        # The delivery being assembled: (tag, redelivered, exchange, routing key), header, body parts, size left.
        self._delivery: tuple[int, bool, str, str] | None = None
        self._header = b""
        self._body: list[bytes] = []
        self._left = 0
        self._reported = False  # events.on_closed called

    # -- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        self.transport.write(PROTOCOL_HEADER)
        if not self._connected.done():
            self._connected.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(self.closed_reason or (f"connection lost: {exc}" if exc else "connection closed by the peer"))

    def pause_writing(self) -> None:
        self.events.on_writable(False)

    def resume_writing(self) -> None:
        self.events.on_writable(True)

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        try:
            frames = self.parser.feed(data)
        except FrameError as exc:
            self._abort(f"frame error: {exc}")
            return
        for frame_type, _channel, payload in frames:
            if frame_type == FRAME_METHOD:
                self._on_method(payload)
            elif frame_type == FRAME_HEADER:
                self._header = payload
                self._left = body_size_of(payload)
                self._body = []
                if self._left == 0:
                    self._deliver()
            elif frame_type == FRAME_BODY:
                self._body.append(payload)
                self._left -= len(payload)
                if self._left <= 0:
                    self._deliver()
            if self.closed_reason is not None:
                return

    # -- incoming methods ----------------------------------------------------------------------------------
    def _on_method(self, payload: bytes) -> None:
        try:
            m = decode_method(payload)
        except FrameError as exc:
            self._abort(f"cannot decode a method: {exc}")
            return
        if isinstance(m, commands.Basic.Deliver):
            self._delivery = (m.delivery_tag or 0, m.redelivered, m.exchange, m.routing_key or "")
        elif isinstance(m, (commands.Basic.Ack, commands.Basic.Nack)):
            self.events.on_confirm(m.delivery_tag, m.multiple, isinstance(m, commands.Basic.Nack))
        elif isinstance(m, commands.Channel.Close):
            self._write(method_frame(CHANNEL, commands.Channel.CloseOk))
            reason = f"channel closed by the server: {m.reply_code} {m.reply_text}"
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(ChannelClosed(m.reply_code or 0, reason))
            else:
                self._abort(reason)
        elif isinstance(m, commands.Connection.Close):
            self._write(method_frame(0, commands.Connection.CloseOk))
            self._abort(f"connection closed by the server: {m.reply_code} {m.reply_text}")
        elif isinstance(m, commands.Connection.Blocked):
            self.events.on_writable(False)
        elif isinstance(m, commands.Connection.Unblocked):
            self.events.on_writable(True)
        elif isinstance(m, commands.Basic.Cancel):
            self._abort(f"the server cancelled the consumer {m.consumer_tag} (source queue deleted?)")
        elif self._waiter is not None and isinstance(m, self._waiting_for) and not self._waiter.done():
            self._waiter.set_result(m)

    def _deliver(self) -> None:
        d = self._delivery
        if d is None:
            return  # content of a basic.return: nothing to do (the shovel does not publish mandatory)
        self._delivery = None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self.events.on_delivery(d[0], d[1], d[2], d[3], self._header, body)

    # -- outgoing ------------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def rpc(self, frame: bytes, *replies: type, timeout: float = 30.0) -> Any:
        """Send a method and wait for one of ``replies`` (a channel.close raises ChannelClosed)."""
        if self.closed_reason is not None:
            raise LinkError(self.closed_reason)
        self._waiter = asyncio.get_running_loop().create_future()
        self._waiting_for = replies
        self._write(frame)
        try:
            return await asyncio.wait_for(self._waiter, timeout)
        except TimeoutError:
            raise LinkError(f"no answer to {replies[0].__name__.replace('Ok', '')} within {timeout:g} s") from None
        finally:
            self._waiter = None

    def publish(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(method_frame(CHANNEL, commands.Basic.Publish, exchange=exchange,
                                          routing_key=routing_key))
        self.transport.writelines(encode_content(CHANNEL, header, body, self.frame_max))

    def ack(self, tag: int, multiple: bool) -> None:
        self._write(encode_basic_ack(CHANNEL, tag, multiple))

    def nack(self, tag: int, multiple: bool, requeue: bool = True) -> None:
        self._write(encode_basic_nack(CHANNEL, tag, multiple, requeue))

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def open(self, uri: ShovelURI, host: str, port: int, user: str, password: str, vhost: str) -> None:
        """TCP (or TLS), the handshake as RabbitMQ's Erlang client does it (PLAIN), channel 1 open."""
        loop = asyncio.get_running_loop()
        ctx = uri.ssl_context()
        # The server speaks first, maybe in the read that follows connection_made: wait for it from now.
        self._waiter = loop.create_future()
        self._waiting_for = (commands.Connection.Start,)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, host, port, ssl=ctx,
                                                          server_hostname=uri.server_hostname if ctx else None),
                                   uri.connection_timeout)
        except TimeoutError:
            raise LinkError(f"could not connect to {host}:{port}: timed out") from None
        except OSError as exc:
            raise LinkError(f"could not connect to {host}:{port}: {exc.strerror or exc}") from None
        start = await self._await(commands.Connection.Start, uri.connection_timeout, self._waiter)
        self.server_properties = dict(start.server_properties or {})
        mechanisms = start.mechanisms.split() if isinstance(start.mechanisms, str) else []
        if "PLAIN" not in mechanisms:
            raise LinkError(f"the server does not offer PLAIN (offers {start.mechanisms})")
        props = {"product": "Leveret shovel", "connection_name": self.connection_name,
                 "capabilities": {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                                  "connection.blocked": True, "authentication_failure_close": True}}
        self._write(method_frame(0, commands.Connection.StartOk, client_properties=props, mechanism="PLAIN",
                                 response=f"\0{user}\0{password}", locale="en_US"))
        tune = await self._await(commands.Connection.Tune, uri.connection_timeout)
        self.frame_max = min(tune.frame_max or CLIENT_FRAME_MAX, CLIENT_FRAME_MAX)
        self.heartbeat = uri.heartbeat if uri.heartbeat is not None else tune.heartbeat
        if tune.heartbeat and self.heartbeat:
            self.heartbeat = min(self.heartbeat, tune.heartbeat)
        self.parser.frame_max = self.frame_max
        self._write(method_frame(0, commands.Connection.TuneOk, channel_max=tune.channel_max or 2047,
                                 frame_max=self.frame_max, heartbeat=self.heartbeat))
        await self.rpc(method_frame(0, commands.Connection.Open, virtual_host=vhost), commands.Connection.OpenOk,
                       timeout=uri.connection_timeout)
        if self.heartbeat:
            self._heartbeats = loop.create_task(self._beat())
        await self.open_channel()

    async def open_channel(self) -> None:
        await self.rpc(method_frame(CHANNEL, commands.Channel.Open), commands.Channel.OpenOk)

    async def _await(self, kind: type, timeout: float, waiter: asyncio.Future[Method] | None = None) -> Any:
        """The server speaks first in the handshake: wait for its next method without sending one."""
        self._waiter = waiter or asyncio.get_running_loop().create_future()
        self._waiting_for = (kind,)
        try:
            return await asyncio.wait_for(self._waiter, timeout)
        except TimeoutError:
            raise LinkError(f"handshake: no {kind.__name__} within {timeout:g} s") from None
        finally:
            self._waiter = None

    async def _beat(self) -> None:
        """Send a heartbeat every half interval; a peer silent for two intervals is gone (RabbitMQ's rule)."""
        interval = self.heartbeat
        while self.closed_reason is None:
            await asyncio.sleep(interval / 2)
            if time.monotonic() - self._last_read > 2 * interval:
                self._abort(f"missed heartbeats from the server ({interval} s)")
                return
            self._write(_HEARTBEAT_FRAME)

    def _abort(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        if self.transport is not None:
            self.transport.close()
        self._fail(reason)

    def _fail(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(LinkError(self.closed_reason))
        if not self._reported:
            self._reported = True
            self.events.on_closed(self.closed_reason)

    async def close(self) -> None:
        """connection.close and close-ok (at most 2 s), then the socket."""
        if self.transport is None or self.closed_reason is not None:
            if self.transport is not None:
                self.transport.close()
            return
        self.closed_reason = "closed by the shovel"
        self._reported = True
        self._waiting_for = (commands.Connection.CloseOk,)
        self._waiter = asyncio.get_running_loop().create_future()
        self._write(method_frame(0, commands.Connection.Close, reply_code=200, reply_text="Goodbye"))
        try:
            await asyncio.wait_for(self._waiter, 2.0)
        except (TimeoutError, LinkError):
            pass
        finally:
            self._waiter = None
            if self._heartbeats is not None:
                self._heartbeats.cancel()
            self.transport.close()


    def abandon(self) -> None:
        """Close the socket now (after :meth:`close`, or instead of it when cancelled)."""
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class ChannelClosed(LinkError):
    """The server closed channel 1 in answer to an RPC (``code``: 404 for a passive declare of nothing)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
