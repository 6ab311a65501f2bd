"""The figures of the cluster's shared queues as PostgreSQL holds them (docs/decisions/postgres-cluster.md: "the queue figures identical
whichever node is asked").

A node's own figures of a shared queue (storage/pg/backing_queue.py) are an estimate: exact for its own work,
the other members' part recounted every 5 s. What the HTTP API, ``leveret ctl`` and Prometheus show comes
from here instead, one source every member reads the same way: ``leveret.message`` counted per queue and
state (0 ready, 1 reserved by a member), so every member answers the same figures at the same moment.

One grouped statement counts every queue (``SELECT queue_id, state, count(*), sum(size) … GROUP BY``), never a
statement per queue, and its answer is kept :data:`MAX_AGE` seconds, never past the end of the rate slot it was
read in (PostgreSQL's clock): a scrape of many queues, or many scrapes at once, costs one read-only transaction
a second per member (and one more per slot), and every member asked during a slot answers that slot's rates
(kept up to a second across the slot's end, a reading answered the previous slot's rates beside another
member's reading of the new one: two members asked at once could disagree for a second after a slot began). The same
read-only transaction lists the live members (``leveret.node``: neither stopped nor reaped, lease not run out),
which the API shows as a quorum queue's ``members`` and ``online``; and the queues' message counters and rates
summed over the members (storage/pg/queue_stats.py: ``message_stats``, the same on every member asked in the
same rate slot).

What "reserved" counts: the rows a member took for its consumers, which includes the small prefix a member
reserves ahead of its consumers (up to their free prefetch, at most a fetch batch; handed back after 2 s
untouched, RELEASE_IDLE_AFTER in backing_queue.py). While consumers are busy the unacknowledged figure can therefore run ahead of the messages
actually delivered by up to that prefix; at rest the two agree.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import NamedTuple

import asyncpg

from storage.pg.connections import close_connection
from storage.pg.queue_stats import NO_ACTIVITY, Activity, MemberDelta, read_activity, read_member_deltas

log = logging.getLogger("leveret.pg.queue_figures")

MAX_AGE = 1.0  # seconds an answer is reused
CONNECT_TIMEOUT = 5.0
STATEMENT_TIMEOUT = 5.0

COUNTS = """
SELECT q.vhost, q.name, c.state, c.n, c.bytes
  FROM (SELECT queue_id, state, count(*) AS n, coalesce(sum(size), 0) AS bytes
          FROM leveret.message GROUP BY queue_id, state) c
  JOIN leveret.queue q ON q.queue_id = c.queue_id
"""
NODE_COUNTERS = "SELECT node, counters FROM leveret.node_stats WHERE node = ANY($1::text[])"
NOW = "SELECT extract(epoch FROM now())::float8"  # the transaction's start: its rate slot's clock
LIVE_MEMBERS = ("SELECT DISTINCT name FROM leveret.node WHERE dead_at IS NULL AND stopped_at IS NULL "
                "AND lease_until > now() ORDER BY name")


class QueueCounts(NamedTuple):
    ready: int
    unacked: int  # reserved by some member (see the module docstring)
    ready_bytes: int
    unacked_bytes: int


ZERO = QueueCounts(0, 0, 0, 0)


class Snapshot(NamedTuple):
    """The cluster's shared queues as counted at one moment (a queue without rows is absent: all zero)."""

    taken: float  # time.monotonic() of the count
    queues: dict[tuple[str, str], QueueCounts]
    members: tuple[str, ...]  # live members' names, sorted
    # The queues' message counters and rates over every member (storage/pg/queue_stats.py), and the rate slot
    # they were read in (PostgreSQL's clock: two snapshots of the same slot show the same rates).
    activities: dict[tuple[str, str], Activity]
    rate_slot: int
    # Each live member's node-wide counters as it last wrote them (storage/pg/queue_stats.py NODE_FLUSH, at
    # most a flush old): the overview sums them.
    member_counters: dict[str, dict[str, int]]
    # The live members' node-wide counter growth over their last sampled rate slot (queue_stats.py, schema
    # version 7), in member order: the overview's message rates, the same on every member asked in one slot.
    member_deltas: list[MemberDelta]

    def counts(self, vhost: str, name: str) -> QueueCounts:
        return self.queues.get((vhost, name), ZERO)

    def activity(self, vhost: str, name: str) -> Activity:
        return self.activities.get((vhost, name), NO_ACTIVITY)

    def reporter(self, vhost: str, name: str) -> str | None:
        """The live member that reports this shared queue's figures to Prometheus and shows as its ``leader``
        (None: no live member is known). Every member serves a shared queue and reads the same figures, so a
        sum over the members' scrapes would count the queue once per member; RabbitMQ reports a quorum queue on
        its leader's node only. Chosen by rendezvous hashing over :attr:`members`: every member with the same
        list picks the same one, and a member joining or leaving moves only the queues it wins or held."""
        if not self.members:
            return None
        key = f"\0{vhost}\0{name}".encode()
        return max(self.members, key=lambda m: hashlib.blake2b(m.encode() + key, digest_size=8).digest())

    def leader(self, vhost: str, name: str, asker: str) -> str:
        """:meth:`reporter` as seen by the member ``asker``: ``asker`` itself when it does not see itself among
        the live members (PostgreSQL out of reach, its lease lapsed), so that it goes on reporting the queue
        (better counted twice than not at all). The one rule for the HTTP API's ``leader`` and Prometheus."""
        if asker not in self.members:
            return asker
        return self.reporter(vhost, name) or asker


class PgQueueFigures:
    """Counts the shared queues on a connection of its own, at most once per ``max_age`` seconds and once more
    as a rate slot begins (callers meanwhile get the last answer; callers arriving during a count wait for it)."""

    def __init__(self, dsn: str, max_age: float = MAX_AGE, rate_slot_ms: int = 5000) -> None:
        """``rate_slot_ms``: the slot of the rates (storage/pg/queue_stats.py; the node's
        ``collect_statistics_interval``, which must be the same on every member)."""
        self.dsn = dsn
        self.max_age = max_age
        self.rate_slot_ms = rate_slot_ms
        self.last: Snapshot | None = None
        self._fresh_until = 0.0  # time.monotonic() until which the last count is answered again
        self.counts_taken = 0  # statements run (tests)
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._failing = False
        self._closed = False

    async def snapshot(self) -> Snapshot | None:
        """A count at most ``max_age`` old and of the current rate slot; while PostgreSQL does not answer, the
        last one (None if never)."""
        last = self.last
        if self._closed or (last is not None and time.monotonic() < self._fresh_until):
            return last
        async with self._lock:
            last = self.last
            if last is not None and time.monotonic() < self._fresh_until:
                return last  # counted while this caller waited for the lock
            try:
                counted, fresh_for = await asyncio.wait_for(self._count(), STATEMENT_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (PostgreSQL out of reach: the last count stands)
                if not self._failing:
                    log.warning("cannot count the cluster's queues: %s", exc)
                self._failing = True
                self._drop()
                return self.last
            self._failing = False
            self.last, self._fresh_until = counted, counted.taken + fresh_for
            return counted

    async def _count(self) -> tuple[Snapshot, float]:
        """A count, and how long it is answered again: ``max_age``, or less if its rate slot ends sooner."""
        conn = self._conn
        if conn is None or conn.is_closed():
            conn = self._conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        queues: dict[tuple[str, str], list[int]] = {}
        # now() is the transaction's start: the slot's time left is reckoned from before it began, so that the
        # count is never answered past its slot's end (a count that took long is answered for less).
        started = time.monotonic()
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(COUNTS)
            members = tuple(r[0] for r in await conn.fetch(LIVE_MEMBERS))
            slot, activities = await read_activity(conn, self.rate_slot_ms)
            counters = {r[0]: json.loads(r[1]) for r in await conn.fetch(NODE_COUNTERS, list(members))}
            deltas = await read_member_deltas(conn, self.rate_slot_ms, members)
            slot_left = (slot + 1) * self.rate_slot_ms / 1000 - float(await conn.fetchval(NOW))
        self.counts_taken += 1
        for vhost, name, state, n, nbytes in rows:
            c = queues.setdefault((vhost, name), [0, 0, 0, 0])
            if state == 0:
                c[0] += n
                c[2] += nbytes
            else:
                c[1] += n
                c[3] += nbytes
        taken = time.monotonic()
        return Snapshot(taken, {k: QueueCounts(*v) for k, v in queues.items()}, members,
                        activities, slot, counters, deltas), min(self.max_age, slot_left - (taken - started))

    def _drop(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            self._conn.terminate()
        self._conn = None

    async def close(self) -> None:
        """No more counting (the last count is still answered)."""
        self._closed = True
        conn, self._conn = self._conn, None
        await close_connection(conn)
