"""When a definition written now is committed: the seam between a metadata store that commits later and those
who answer after a write (an AMQP reply, an HTTP API response).

RabbitMQ's Khepri commands reply on commit: declare-ok means the definition is in the store. A running node's
SQLite store (storage/metadata_store.py) hands a commit to the kernel within the call and has the syncer's
thread fsync it, so that a slow disk does not stall the event loop: the reply waits for that fsync. A cluster
member's PostgreSQL table (storage/pg/definitions_store.py) cannot commit within the call
without the event loop waiting for the server, which stalls every connection of the member when PostgreSQL is
slow or frozen; it accepts the write into an ordered journal at once and commits it on the loop's own
connection. The writer's reply then waits for :meth:`Commits.committed` (broker/amqp/channel.py defers it,
holding the channel's later methods; the HTTP API awaits it), while the loop serves everyone else.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Commits(Protocol):
    """What a caller that answers after a write needs of the store: whether its writes are committed yet."""

    @property
    def accepted(self) -> int:
        """Writes accepted so far (it only grows): unchanged across a call that wrote nothing."""
        ...

    def committed(self) -> asyncio.Future[None] | None:
        """None if every write accepted so far is committed; else a future done once they are, or failed with
        storage.metadata_store.MetadataWriteError when they are not within the store's timeout (the writes stay
        queued and are committed when the database answers, as a Khepri command that timed out may still be)."""
        ...


class CommittedAtOnce:
    """A store that commits before a write returns (the node before its storage is open, a tool's store opened
    without a loop): there is never anything to wait for."""

    accepted = 0

    def committed(self) -> asyncio.Future[None] | None:
        return None


COMMITTED_AT_ONCE = CommittedAtOnce()


class AllOf:
    """The commits of several stores (a cluster member's definitions and its directory of node-local queues):
    a reply waits for every one that has writes outstanding."""

    def __init__(self, *parts: Commits) -> None:
        self.parts = parts

    @property
    def accepted(self) -> int:
        return sum(part.accepted for part in self.parts)

    def committed(self) -> asyncio.Future[None] | None:
        waits = [w for w in (part.committed() for part in self.parts) if w is not None]
        if len(waits) <= 1:
            return waits[0] if waits else None
        return asyncio.ensure_future(_all(waits))


async def _all(waits: list[asyncio.Future[None]]) -> None:
    """Every one of ``waits``; the first failure (the others still run to their end)."""
    results = await asyncio.gather(*waits, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
