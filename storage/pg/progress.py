"""A wake-everyone signal for the PostgreSQL store's workers: ``changed()`` when any of them finishes a step,
``until(pred)`` to wait for a condition over their counters.

Why one signal rather than a future per dependency: the orderings the store keeps (an ack after the insert it
acks, a fetch after the requeue before it, a publish after the purge before it) are conditions over a few
counters; re-checking them on every step is cheaper to get right than wiring a future to each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Progress:
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def changed(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def until(self, pred: Callable[[], bool]) -> None:
        while not pred():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut
