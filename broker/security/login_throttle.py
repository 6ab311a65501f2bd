"""Failed logins per client address: how long the next login from an address waits before it is checked.

RabbitMQ has no such delay (it waits 3 s before closing a refused handshake, but a client may run many
handshakes at once): about 2,400 password guesses a second succeed against it and against an unthrottled
Leveret. Here, once an address has failed ``after`` logins within ``window`` seconds, each further login
from it is checked only after ``delay`` seconds, doubling with every further failure up to ``max_delay``.
Every login from that address waits, a correct one too: if only failures waited, a guesser would give up on
any answer slower than a success and go on at full speed. Together with the cap on unfinished handshakes per
address (broker/security/handshake_guard.py) this bounds the guesses one address can make (64 at a time, one
per ``max_delay`` seconds each).

A success does not clear the address's failures (many clients may share one address behind a NAT: one of
them logging in must not let a guesser beside it go on at full speed); they expire ``window`` seconds after
the last one. Successes and failures of one address never touch another's entry. The table holds at most
``max_sources`` addresses (least recently failed dropped first), so a flood of addresses cannot grow memory.

Pure: no I/O, no timers; the caller passes the time (a monotonic clock's seconds) and does the waiting.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict

MAX_SOURCES = 10_000


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class LoginThrottle:
    """The failure table. ``after`` = 0 turns the delay off (failures are still not counted then)."""

    __slots__ = ("_failures", "after", "delay", "exempt_loopback", "max_delay", "max_sources", "window")

    def __init__(self, after: int, window: float, delay: float, max_delay: float, *,
                 exempt_loopback: bool = False, max_sources: int = MAX_SOURCES) -> None:
        self.after = after
        self.window = window
        self.delay = delay
        self.max_delay = max_delay
        self.exempt_loopback = exempt_loopback
        self.max_sources = max_sources
        # address -> (failures counted, time of the last one); oldest failure first.
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def _applies(self, address: str) -> bool:
        return self.after > 0 and not (self.exempt_loopback and is_loopback(address))

    def _count(self, address: str, now: float) -> int:
        entry = self._failures.get(address)
        if entry is None:
            return 0
        if now - entry[1] > self.window:
            del self._failures[address]
            return 0
        return entry[0]

    def wait_before_login(self, address: str, now: float) -> float:
        """Seconds the login now starting from ``address`` waits before its credentials are checked."""
        if not self._applies(address):
            return 0.0
        excess = self._count(address, now) - self.after
        if excess < 0:
            return 0.0
        return min(self.max_delay, self.delay * 2.0 ** min(excess, 62))

    def failed(self, address: str, now: float) -> None:
        if not self._applies(address):
            return
        count = self._count(address, now) + 1
        self._failures[address] = (count, now)
        self._failures.move_to_end(address)
        while len(self._failures) > self.max_sources:
            self._failures.popitem(last=False)

    def failures(self, address: str, now: float) -> int:
        """Failures from ``address`` within the window (what the delay is computed from)."""
        return self._count(address, now)

    def __len__(self) -> int:
        return len(self._failures)
