"""The broker's one source of time, injectable so tests of time need no sleeps.

Everything that reads the time or waits for it — message TTL and queue expiry, consumer ack timeouts,
heartbeats, handshake and close timeouts, dead-letter timestamps — asks a :class:`Clock` instead of calling
``time.time()`` or ``loop.call_later`` itself. The server hands every part the same :class:`LoopClock`; a unit
test hands them a :class:`ManualClock` and moves time with :meth:`ManualClock.advance`, which runs every timer
that falls due, in order, synchronously.

Two readings, as RabbitMQ keeps them apart: ``now_ms()`` is wall-clock time in milliseconds since the epoch
(what a message's timestamp, ``x-death`` time and TTL deadlines are stated in), ``monotonic()`` is seconds on a
clock that never jumps (what intervals and timeouts are measured with).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol


class TimerHandle(Protocol):
    """A scheduled call that can be cancelled (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the broker's parts need to know about time."""

    def now_ms(self) -> float:
        """Wall-clock milliseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` once, ``delay`` seconds from now."""
        ...


class _CallLater(Protocol):
    """:meth:`Clock.call_later`'s signature, for the attribute that holds it in :class:`LoopClock`."""

    def __call__(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle: ...


class LoopClock:
    """The real clock: the wall clock for timestamps, the event loop's clock and timers for the rest.

    Parts are often built before the loop runs (and tests build them without one), so the loop is found on first
    use; from then on ``monotonic`` and ``call_later`` are the loop's own bound methods, stored on the instance,
    so a reading costs what ``loop.time()`` costs (they are read per delivery when a consumer timeout is set).
    """

    # Attributes, not methods, so that _bind can put the loop's bound methods in their place.
    monotonic: Callable[[], float]
    call_later: _CallLater

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if loop is not None:
            self._bind(loop)
        else:
            self.monotonic = self._first_monotonic
            self.call_later = self._first_call_later

    def _bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        self.monotonic = loop.time
        self.call_later = loop.call_later
        return loop

    def now_ms(self) -> float:
        return time.time() * 1000.0

    def _first_monotonic(self) -> float:
        return self._bind(asyncio.get_running_loop()).time()

    def _first_call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        return self._bind(asyncio.get_running_loop()).call_later(delay, callback, *args)


class _ManualTimer:
    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to: for unit tests and simulations.

    ``advance(seconds)`` moves both readings forward together and runs every timer whose time has come, earliest
    first (timers scheduled by a callback for a time inside the step run in the same call).
    """

    def __init__(self, start_ms: float = 1_700_000_000_000.0) -> None:
        self._wall_ms = start_ms
        self._mono = 0.0
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def now_ms(self) -> float:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._mono

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        timer = _ManualTimer(self._mono + max(0.0, delay), callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    @property
    def pending(self) -> int:
        """How many timers are scheduled and not cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running the timers that fall due on the way."""
        target = self._mono + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._wall_ms += (when - self._mono) * 1000.0
            self._mono = when
            timer.callback(*timer.args)
        self._wall_ms += (target - self._mono) * 1000.0
        self._mono = target
