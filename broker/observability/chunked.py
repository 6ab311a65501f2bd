"""Walking every queue, connection or channel from the event loop a chunk at a time.

A pass over 100,000 queues (a scrape, a rate sample) takes most of a second of Python; done in one go it
stalls every client of the broker for that long. :func:`in_chunks` hands the list over in slices and lets the
loop turn between them, so other work waits at most one chunk (a few milliseconds)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")

CHUNK = 2_000  # objects handled between two turns of the event loop (a few ms of reading figures)


async def in_chunks(items: Sequence[T], size: int = CHUNK) -> AsyncIterator[Sequence[T]]:
    """The slices of ``items`` (a snapshot the caller took), a turn of the loop before each after the first."""
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(0)
        yield items[start:start + size]
