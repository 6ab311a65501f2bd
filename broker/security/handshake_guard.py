"""A cap on connections that have not finished their handshake, per client address and in all.

A connection holds a slot from the moment its socket is accepted (before TLS, on the TLS listener) until
``connection.open`` succeeds or the socket closes. The handshake timeouts (``ssl_handshake_timeout``,
``handshake_timeout``) bound how long a slot is held; this caps how many are held at once, so one address (or
a botnet) opening sockets that never log in cannot take every file descriptor, nor run thousands of password
guesses in parallel (broker/security/login_throttle.py delays each). One more is closed at once, logged (at
most once a second per kind, with the number refused since, so a flood does not flood the log too).

RabbitMQ has no such cap (its ``handshake_timeout`` alone); the keys are Leveret's:
``leveret.handshake_max_per_source`` (512) and ``leveret.handshake_max`` (4096), 0 for no limit.
"""

from __future__ import annotations

from collections.abc import Callable


class HandshakeSlots:
    """Counts of unfinished handshakes by address; pure (the caller closes what is refused)."""

    __slots__ = ("_by_source", "per_source", "total", "used")

    def __init__(self, per_source: int, total: int) -> None:
        self.per_source = per_source
        self.total = total
        self.used = 0
        self._by_source: dict[str, int] = {}

    def acquire(self, source: str) -> str | None:
        """Take a slot for a new connection from ``source``: None when admitted, else why it is refused."""
        if self.total and self.used >= self.total:
            return f"{self.used} connections have not finished their handshake (leveret.handshake_max)"
        held = self._by_source.get(source, 0)
        if self.per_source and held >= self.per_source:
            return (f"{held} connections from {source} have not finished their handshake "
                    "(leveret.handshake_max_per_source)")
        self._by_source[source] = held + 1
        self.used += 1
        return None

    def release(self, source: str) -> None:
        held = self._by_source.get(source, 0)
        if held <= 0:
            return
        if held == 1:
            del self._by_source[source]
        else:
            self._by_source[source] = held - 1
        self.used -= 1

    def held(self, source: str) -> int:
        return self._by_source.get(source, 0)


class RefusalLog:
    """Logs a refusal at most once per ``interval`` seconds per reason kind, with the count since the last."""

    __slots__ = ("_last", "_log", "_suppressed", "interval")

    def __init__(self, log: Callable[..., None], interval: float = 1.0) -> None:
        self._log = log
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def refused(self, kind: str, now: float, **fields: object) -> None:
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        self._log("connection refused before its handshake", **fields,
                  **({"refused_since_last_logged": more} if more else {}))
