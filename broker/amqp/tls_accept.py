"""The AMQP-over-TLS listener's accepting side: the TLS handshake done here, then the connection handed on.

Why not ``loop.create_server(ssl=...)``: asyncio (and uvloop) drop a connection whose TLS handshake fails
without a word (an ``ssl.SSLError`` is an OSError, logged at debug level only), and RabbitMQ logs each one
with the client's address and the reason, which is what an operator needs to find a client with the wrong CA,
a plaintext client on the TLS port or one still on TLS 1.1. So the socket is accepted as plain TCP, upgraded
with ``loop.start_tls`` (with ``ssl_handshake_timeout``), and only a finished handshake gets a connection.

One short-lived task per handshake (start_tls is a coroutine); it ends when the handshake does, and the
connection after it is the same Reader as on the plain port. The handshake slot (broker/security/handshake_guard.py)
is taken when the socket is accepted, so sockets stuck in TLS count against the cap too.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast

import structlog

from broker.security.tls import handshake_failure_reason

log = structlog.get_logger("leveret.connection")


class _Handoff(asyncio.Protocol):
    """What the TLS transport talks to until the connection takes over: keeps what arrives meanwhile (a TLS
    1.3 client may send its first AMQP bytes with its last handshake message)."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.eof = False
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.received.append(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)


class TLSAcceptor(asyncio.Protocol):
    """The protocol of one accepted TCP socket on the TLS port. ``admit`` takes the handshake slot (None:
    refused, the socket already closed), ``release`` gives it back when the TLS handshake fails; ``factory``
    makes the connection for the address once TLS is up (it holds the slot from then on)."""

    def __init__(self, context: ssl.SSLContext, timeout: float,
                 admit: Callable[[asyncio.BaseTransport], str | None], release: Callable[[str], None],
                 factory: Callable[[str], asyncio.Protocol], tasks: set[asyncio.Task[None]]) -> None:
        self._context = context
        self._timeout = timeout
        self._admit = admit
        self._release = release
        self._factory = factory
        self._tasks = tasks
        self._transport: asyncio.Transport | None = None
        self._early: list[bytes] = []  # the ClientHello, when it came before start_tls took the socket over

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        source = self._admit(transport)
        if source is None:
            return
        tcp = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
        self._transport = tcp
        # The ClientHello should wait for start_tls, but uvloop starts reading once connection_made returns
        # whatever it was told: what it reads before start_tls is kept and handed on (_feed_early).
        tcp.pause_reading()
        task = asyncio.get_running_loop().create_task(self._handshake(tcp, source))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)
        if self._transport is not None:
            self._transport.pause_reading()

    def _feed_early(self, transport: asyncio.Transport) -> None:
        """Hand what was read before start_tls to its TLS protocol. Scheduled just before start_tls is called,
        so it runs after start_tls has installed that protocol and before the protocol starts its handshake
        (both loops' start_tls schedule its connection_made then), i.e. into its incoming buffer, ahead of
        anything read later. The TLS protocol of asyncio and uvloop is a BufferedProtocol."""
        early, self._early = self._early, []
        tls_protocol = transport.get_protocol()
        if not early or tls_protocol is self:
            return
        for data in early:
            view = memoryview(data)
            while view:
                buf = memoryview(cast(asyncio.BufferedProtocol, tls_protocol).get_buffer(len(view)))
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                cast(asyncio.BufferedProtocol, tls_protocol).buffer_updated(n)
                view = view[n:]

    async def _handshake(self, transport: asyncio.Transport, source: str) -> None:
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        handoff = _Handoff()
        asyncio.get_running_loop().call_soon(self._feed_early, transport)
        try:
            tls_transport = await asyncio.get_running_loop().start_tls(
                transport, handoff, self._context, server_side=True, ssl_handshake_timeout=self._timeout)
        except (TimeoutError, OSError, EOFError, RuntimeError) as exc:
            self._release(source)
            if isinstance(exc, ConnectionAbortedError) and "taking longer" in str(exc):
                exc = TimeoutError()
            log.warning("TLS handshake failed", connection=f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}",
                        peer=source, reason=handshake_failure_reason(exc))
            transport.abort()
            return
        except asyncio.CancelledError:
            self._release(source)
            transport.abort()
            raise
        if tls_transport is None:  # the loop found the transport closing
            self._release(source)
            return
        protocol = self._factory(source)
        tls_transport.set_protocol(protocol)
        protocol.connection_made(tls_transport)
        for data in handoff.received:
            protocol.data_received(data)
        if handoff.eof:
            protocol.eof_received()
        if handoff.lost is not None:
            protocol.connection_lost(handoff.lost[0])
