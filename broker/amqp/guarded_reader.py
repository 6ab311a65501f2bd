"""The AMQP connection as the listeners create it: broker/amqp/reader.py's Reader, with the two defences against
clients that never log in kept out of it: the cap on unfinished handshakes (broker/security/handshake_guard.py) and
the delay of logins from an address that keeps failing (broker/security/login_throttle.py).

The delay is a timer on the clock (no sleeping, no task): the connection stops reading while it waits, its
start-ok is checked when the timer fires, and the AMQP handshake_timeout goes on running meanwhile, so a
delayed client still loses its socket when that is up. The server builds one LoginGuard per node.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import structlog
from pamqp.commands import Connection

from broker.amqp.reader import Reader
from broker.clock import Clock, TimerHandle
from broker.config import Settings
from broker.node import Node
from broker.security.handshake_guard import HandshakeSlots, RefusalLog
from broker.security.login_throttle import LoginThrottle

log = structlog.get_logger("leveret.connection")

_THROTTLED = "login throttle"  # the pause reason while a delayed login waits


class LoginGuard:
    """A node's failed-login table and unfinished-handshake counts, shared by its AMQP listeners."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.clock = clock
        self.throttle = LoginThrottle(settings.login_throttle_after, settings.login_throttle_window,
                                      settings.login_throttle_delay, settings.login_throttle_max_delay,
                                      exempt_loopback=settings.login_throttle_exempt_loopback)
        self.slots = HandshakeSlots(settings.handshake_max_per_source, settings.handshake_max)
        self._refusals = RefusalLog(log.warning)

    def admit(self, transport: asyncio.BaseTransport) -> str | None:
        """Take a handshake slot for a newly accepted socket; if there is none, close it, log it (rate-limited)
        and answer None. Else the client's address (what :meth:`release` takes back)."""
        source = peer_address(transport)
        refusal = self.slots.acquire(source)
        if refusal is None:
            return source
        kind = "total" if "handshake_max)" in refusal else "per_source"
        self._refusals.refused(kind, self.clock.monotonic(), peer=source, reason=refusal)
        cast(asyncio.Transport, transport).abort()
        return None

    def release(self, source: str) -> None:
        self.slots.release(source)

    def login_failed(self, source: str) -> None:
        now = self.clock.monotonic()
        self.throttle.failed(source, now)
        if self.throttle.after and self.throttle.failures(source, now) == self.throttle.after:
            log.warning("repeated failed logins: further logins from this address are delayed", peer=source,
                        failures=self.throttle.after, window=self.throttle.window)


def peer_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer or "")


class GuardedReader(Reader):
    """A Reader holding a handshake slot until connection.open succeeds, whose logins the guard may delay.
    ``source``: the slot is already held for this address (taken by the TLS acceptor before the TLS
    handshake)."""

    # Class defaults until set (see Reader's). The address whose handshake slot this connection holds (None:
    # none, or released once connection.open succeeded).
    _source: str | None = None
    _refused = False
    _login_timer: TimerHandle | None = None

    def __init__(self, node: Node, guard: LoginGuard, source: str | None = None) -> None:
        super().__init__(node)
        self._guard = guard
        if source is not None:
            self._source = source

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._source is None:
            source = self._guard.admit(transport)
            if source is None:
                self._refused = True
                return
            self._source = source
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        self._release_slot()
        super().connection_lost(exc)

    def _release_slot(self) -> None:
        source = self._source
        if source is not None:
            self._source = None
            self._guard.release(source)

    def _open(self, m: Any) -> None:
        super()._open(m)
        if self.state == Reader.RUNNING:
            self._release_slot()

    def _start_ok(self, m: Connection.StartOk) -> None:
        wait = self._guard.throttle.wait_before_login(self._source or "", self.clock.monotonic())
        if wait <= 0:
            self._check_login(m)
            return
        self.pause_for(_THROTTLED)
        self._login_timer = self.clock.call_later(wait, self._delayed_login, m)

    def _delayed_login(self, m: Connection.StartOk) -> None:
        self._login_timer = None
        self.resume_for(_THROTTLED)
        self.flow_blocked_at = 0.0  # the wait was not credit flow: the connection is not shown as "flow"
        if self.state == Reader.STARTING:
            self._check_login(m)

    def _check_login(self, m: Connection.StartOk) -> None:
        super()._start_ok(m)
        if self.state != Reader.TUNING:
            self._guard.login_failed(self._source or "")
