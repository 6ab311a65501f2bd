"""The message counters and rates of the cluster's shared queues, kept in PostgreSQL so that every member
answers the same ``message_stats`` (docs/decisions/postgres-cluster.md: "the queue figures (ready, unacked, rates) identical whichever
node is asked").

Why in PostgreSQL: each member counts what happens on it (publishes it took, deliveries and acks of its
consumers). Summing those counts needs one place every member reads the same way, and the cluster has one
already; a node-to-node exchange would add a protocol, and two members would still add at different moments.

**Writing** (:class:`PgQueueStatsWriter`, one per member, on a connection of its own). About once a second
(:data:`FLUSH_EVERY`, or half the rate slot if that is shorter) the member sends, in **one** statement for all
its shared queues (:data:`FLUSH`), each queue's cumulative counters (:data:`COUNTERS`), never a statement per
message. ``leveret.queue_stats`` holds one row per queue and member *name*: ``publish`` … ``ack`` are the
member's totals over all its runs, ``src_*`` what its current counters (``source``: one queue object of one
process) had counted at the last flush. A flush adds the growth since then; a new source (the member
restarted, or the queue was declared anew there) adds its counts to the totals instead of replacing them, so
a member that restarts or dies keeps what it counted in the totals, and the totals never go down. Sending
cumulative counters rather than increments makes a flush safe to repeat: one whose commit's answer was lost
adds nothing the second time. Rows that did not change are left alone (``WHERE`` of the upsert).

**Rates** come from samples stored in PostgreSQL and timed by PostgreSQL's clock. Time is cut into slots of
``slot_ms`` (the node's ``collect_statistics_interval``, 5 s by default; every member must use the same
value: samples of another slot length are ignored). The same statement writes each queue's totals of the
member into ``leveret.queue_stats_sample`` once per slot (``ON CONFLICT DO NOTHING``: the first flush in the
slot, taken at ``now()``). A member asked during slot K (:data:`RATES`) takes, for every member that wrote
one, its newest sample before K (which must be of slot K-1 or K-2) and the one before it, and sums
``(difference) / (seconds between their taken_at)`` over the members, in ``numeric`` (exact, so the order of
the sum cannot change the last digit), rounded to 0.1 as RabbitMQ shows rates. Samples before K are never
written again during K, so **every member asked during the same slot answers the same rates**; the rate
shown is the average over about the previous slot (it lags one to two slots behind the traffic, as
RabbitMQ's rate lags its sampling interval). A member that stopped writing samples (dead) drops out of the
rates after two slots.

The rates of each queue's message **counts** (``messages``, ``messages_ready``, ``messages_unacknowledged``)
come from the same samples: the statement that writes a member's sample of a slot also has PostgreSQL count
the queue's ready and reserved rows (schema version 5), and the reader takes one member's two newest samples
(the first by name that has both), so they too are the same on every member asked within a slot.

What "identical" means, and its window: two members' answers agree when both are asked in the same slot
(rates: each member's reading is cached up to a second, never past the end of its slot,
storage/pg/queue_figures.py) and no flush committed between their reads (totals). Each member's flush is up to
:data:`FLUSH_EVERY` late, so the totals any member shows are up to about 2 s behind the traffic, the same on
every member once it settles; under traffic two members asked at once may differ by what was flushed between
their reads. A member killed with SIGKILL loses from the totals what it counted since its last flush (at most a
second of its traffic); a clean stop flushes last.

**Deleting**: a member that no longer has a queue it had (deleted there, or declared anew: another queue
object) deletes the queue's rows and samples, every member's, before its next upsert; every member does so
as it learns of the delete, so the rows of a member that had died with counts of the old queue go too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import asyncpg

from storage.pg.connections import close_connection, stop_tasks

log = logging.getLogger("leveret.pg.queue_stats")

# The counters kept per queue and member, in this order everywhere (the broker's QueueStats: published,
# delivered to consumers, basic.get answers, redelivered, acked).
COUNTERS = ("publish", "deliver", "get", "redeliver", "ack")
# The rates shown: one per counter, and deliver_get (deliver + get).
RATES = (*COUNTERS, "deliver_get")
FLUSH_EVERY = 1.0  # seconds between two flushes of a member (at most; half the slot if that is shorter)
KEEP_SLOTS = 4  # samples of a member kept per queue: this many slots back (two are read)
CONNECT_TIMEOUT = 5.0
STATEMENT_TIMEOUT = 5.0
CLOSE_FLUSH_TIMEOUT = 2.0

_SET = ",\n    ".join(
    [f"{c} = s.{c} + CASE WHEN s.source = excluded.source THEN greatest(excluded.src_{c} - s.src_{c}, 0) "
     f"ELSE excluded.src_{c} END" for c in COUNTERS]
    + [f"src_{c} = CASE WHEN s.source = excluded.source THEN greatest(excluded.src_{c}, s.src_{c}) "
       f"ELSE excluded.src_{c} END" for c in COUNTERS])
_CHANGED = " OR ".join(f"excluded.src_{c} > s.src_{c}" for c in COUNTERS)
_C = ", ".join(COUNTERS)

# $1 node name, $2 slot length (ms), $3 vhosts, $4 names, $5 sources, $6.. the counters (arrays, one entry a
# queue). Returns the rows changed, the samples written, and the slot (PostgreSQL's clock).
FLUSH = f"""
WITH k AS (SELECT floor(extract(epoch FROM now()) * 1000 / $2)::bigint AS slot),
i AS (SELECT q.queue_id, u.source, {", ".join(f"u.{c}" for c in COUNTERS)}
        FROM unnest($3::text[], $4::text[], $5::bigint[], {", ".join(f"${6 + n}::bigint[]" for n in range(len(COUNTERS)))})
             AS u(vhost, name, source, {_C})
        JOIN leveret.queue q ON q.vhost = u.vhost AND q.name = u.name),
up AS (
  INSERT INTO leveret.queue_stats AS s (queue_id, node, source, {_C}, {", ".join(f"src_{c}" for c in COUNTERS)})
  SELECT queue_id, $1, source, {_C}, {_C} FROM i
  ON CONFLICT (queue_id, node) DO UPDATE SET
    {_SET},
    source = excluded.source, updated_at = now()
  WHERE s.source <> excluded.source OR {_CHANGED}
  RETURNING queue_id, {_C}),
due AS (
  SELECT i.queue_id, k.slot, {", ".join(f"coalesce(up.{c}, s.{c}) AS {c}" for c in COUNTERS)}
    FROM i CROSS JOIN k
    LEFT JOIN up ON up.queue_id = i.queue_id
    LEFT JOIN leveret.queue_stats s ON s.queue_id = i.queue_id AND s.node = $1
   WHERE (up.queue_id IS NOT NULL OR s.queue_id IS NOT NULL)
     AND NOT EXISTS (SELECT 1 FROM leveret.queue_stats_sample x
                      WHERE x.queue_id = i.queue_id AND x.node = $1 AND x.slot = k.slot)),
counted AS (
  SELECT m.queue_id, count(*) FILTER (WHERE m.state = 0) AS ready, count(*) FILTER (WHERE m.state <> 0) AS unacked
    FROM leveret.message m WHERE m.queue_id IN (SELECT queue_id FROM due) GROUP BY m.queue_id),
sampled AS (
  INSERT INTO leveret.queue_stats_sample (queue_id, node, slot_ms, slot, taken_at, {_C}, ready, unacked)
  SELECT d.queue_id, $1, $2, d.slot, now(), {", ".join(f"d.{c}" for c in COUNTERS)},
         coalesce(c.ready, 0), coalesce(c.unacked, 0)
    FROM due d LEFT JOIN counted c ON c.queue_id = d.queue_id
  ON CONFLICT DO NOTHING
  RETURNING 1)
SELECT (SELECT count(*) FROM up) AS changed, (SELECT count(*) FROM sampled) AS sampled, (SELECT slot FROM k) AS slot
"""
# A member's samples older than it reads (or of another slot length): once per slot. $1 node, $2 slot ms,
# $3 the current slot.
PRUNE = ("DELETE FROM leveret.queue_stats_sample WHERE node = $1 AND (slot < $3::bigint - $4::int "
         "OR slot_ms <> $2::int)")
# Queues this member no longer has: every member's rows and samples of them. $1 vhosts, $2 names.
FORGET = """
WITH gone AS (SELECT q.queue_id FROM unnest($1::text[], $2::text[]) AS u(vhost, name)
                JOIN leveret.queue q ON q.vhost = u.vhost AND q.name = u.name),
stats_gone AS (DELETE FROM leveret.queue_stats WHERE queue_id IN (SELECT queue_id FROM gone) RETURNING 1)
DELETE FROM leveret.queue_stats_sample WHERE queue_id IN (SELECT queue_id FROM gone)
"""

# A member's node-wide counters, as its current run counted them (a restart starts them again, as RabbitMQ's
# node statistics do): the row written when they changed, and a sample once per slot (schema version 7; the
# first flush of the slot, at now()), from which every member reads the same overview rates. $1 node, $2 the
# counters (JSON), $3 slot length (ms). Returns the slot.
NODE_FLUSH = """
WITH k AS (SELECT floor(extract(epoch FROM now()) * 1000 / $3)::bigint AS slot),
up AS (INSERT INTO leveret.node_stats AS s (node, counters) VALUES ($1, $2::jsonb) ON CONFLICT (node)
       DO UPDATE SET counters = excluded.counters, updated_at = now()
       WHERE s.counters IS DISTINCT FROM excluded.counters RETURNING 1),
sampled AS (INSERT INTO leveret.node_stats_sample (node, slot_ms, slot, taken_at, counters)
            SELECT $1, $3, k.slot, now(), $2::jsonb FROM k ON CONFLICT DO NOTHING RETURNING 1)
SELECT slot FROM k
"""
NODE_PRUNE = ("DELETE FROM leveret.node_stats_sample WHERE node = $1 AND (slot < $3::bigint - $4::int "
              "OR slot_ms <> $2::int)")

# Reading (in storage/pg/queue_figures.py's read-only transaction).
TOTALS = f"""
SELECT q.vhost, q.name, {", ".join(f"t.{c}" for c in COUNTERS)}
  FROM (SELECT queue_id, {", ".join(f"sum({c})::bigint AS {c}" for c in COUNTERS)}
          FROM leveret.queue_stats GROUP BY queue_id) t
  JOIN leveret.queue q ON q.queue_id = t.queue_id
"""
_DELTAS = ", ".join([f"greatest(a.{c} - b.{c}, 0) AS {c}" for c in COUNTERS]
                    + ["greatest((a.deliver + a.get) - (b.deliver + b.get), 0) AS deliver_get"])
# The rates of the queues' message counts (the samples' ``ready`` / ``unacked``, counted by PostgreSQL), named as
# the HTTP API shows them (``messages_ready_details`` …).
FIGURE_RATES = ("messages_ready", "messages_unacknowledged", "messages")
# $1 slot length (ms). The first row (vhost NULL) carries the slot read; then one row per queue with rates:
# the counters' summed over the members; the counts' from one member's two samples (the count is the whole
# queue's, whoever took it: the first member by name that has both, so every reader picks the same pair).
RATES_SQL = f"""
WITH k AS (SELECT floor(extract(epoch FROM now()) * 1000 / $1)::bigint AS slot),
r AS (SELECT d.*, row_number() OVER (PARTITION BY d.queue_id, d.node ORDER BY d.slot DESC) AS n
        FROM leveret.queue_stats_sample d, k WHERE d.slot_ms = $1 AND d.slot < k.slot),
p AS (SELECT a.queue_id, a.node, extract(epoch FROM a.taken_at - b.taken_at)::numeric AS dt, {_DELTAS},
             a.ready - b.ready AS d_ready, a.unacked - b.unacked AS d_unacked
        FROM r a JOIN r b ON b.queue_id = a.queue_id AND b.node = a.node AND b.n = 2, k
       WHERE a.n = 1 AND a.slot >= k.slot - 2 AND a.taken_at > b.taken_at),
g AS (SELECT queue_id, {", ".join(f"round(sum({c} / dt), 1)::float8 AS {c}" for c in RATES)}
        FROM p GROUP BY queue_id),
f AS (SELECT DISTINCT ON (queue_id) queue_id, round(d_ready / dt, 1)::float8 AS messages_ready,
             round(d_unacked / dt, 1)::float8 AS messages_unacknowledged,
             round((d_ready + d_unacked) / dt, 1)::float8 AS messages
        FROM p WHERE d_ready IS NOT NULL AND d_unacked IS NOT NULL ORDER BY queue_id, node)
SELECT NULL::text AS vhost, NULL::text AS name, slot,
       {", ".join(f"NULL::float8 AS {c}" for c in (*RATES, *FIGURE_RATES))} FROM k
UNION ALL
SELECT q.vhost, q.name, NULL, {", ".join(f"g.{c}" for c in RATES)},
       {", ".join(f"coalesce(f.{c}, 0)" for c in FIGURE_RATES)}
  FROM g JOIN leveret.queue q ON q.queue_id = g.queue_id LEFT JOIN f ON f.queue_id = g.queue_id
"""


# The live members' two newest samples of their node-wide counters before the current slot (the newest of slot
# K-1 or K-2), oldest member name first. $1 slot length (ms), $2 the live members.
NODE_RATES_SQL = """
WITH k AS (SELECT floor(extract(epoch FROM now()) * 1000 / $1)::bigint AS slot),
r AS (SELECT d.*, row_number() OVER (PARTITION BY d.node ORDER BY d.slot DESC) AS n
        FROM leveret.node_stats_sample d, k
       WHERE d.slot_ms = $1 AND d.slot < k.slot AND d.node = ANY($2::text[]))
SELECT a.node, extract(epoch FROM a.taken_at - b.taken_at)::float8 AS dt, a.counters AS now, b.counters AS before
  FROM r a JOIN r b ON b.node = a.node AND b.n = 2, k
 WHERE a.n = 1 AND a.slot >= k.slot - 2 AND a.taken_at > b.taken_at
 ORDER BY a.node
"""


class MemberDelta(NamedTuple):
    """What one member's node-wide counters grew by between its two newest samples, and over how long."""

    node: str
    seconds: float
    growth: dict[str, int]  # counter name -> growth (never negative: a restart starts the counters again)


async def read_member_deltas(conn: asyncpg.Connection, slot_ms: int, members: Sequence[str]) -> list[MemberDelta]:
    """The live ``members``' counter growth over their last sampled slot (in the figures' read-only
    transaction): every member reading in the same slot gets the same list, in the same order."""
    out = []
    for r in await conn.fetch(NODE_RATES_SQL, slot_ms, list(members)):
        now, before = json.loads(r["now"]), json.loads(r["before"])
        out.append(MemberDelta(r["node"], float(r["dt"]),
                               {name: max(0, int(v) - int(before.get(name, 0))) for name, v in now.items()}))
    return out


class Activity(NamedTuple):
    """One shared queue's message counters summed over the members, and their rates per second (the same
    names: :data:`COUNTERS`, and ``deliver_get`` among the rates)."""

    counts: dict[str, int]
    rates: dict[str, float]  # RATES, then FIGURE_RATES: the rates of its message counts


NO_ACTIVITY = Activity({c: 0 for c in COUNTERS}, {r: 0.0 for r in (*RATES, *FIGURE_RATES)})


async def read_activity(conn: asyncpg.Connection, slot_ms: int) -> tuple[int, dict[tuple[str, str], Activity]]:
    """Every shared queue's totals and rates as PostgreSQL holds them now: (the slot read, {(vhost, name):
    Activity}). Run it inside one REPEATABLE READ transaction with the other figures, so the slot and the
    rows are of one moment. A queue without rows is absent (:data:`NO_ACTIVITY`)."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for r in await conn.fetch(TOTALS):
        counts[(r["vhost"], r["name"])] = {c: int(r[c]) for c in COUNTERS}
    rates: dict[tuple[str, str], dict[str, float]] = {}
    slot = 0
    for r in await conn.fetch(RATES_SQL, slot_ms):
        if r["vhost"] is None:
            slot = int(r["slot"])
        else:
            rates[(r["vhost"], r["name"])] = {c: float(r[c]) for c in (*RATES, *FIGURE_RATES)}
    out = {key: Activity(counts.get(key, NO_ACTIVITY.counts), rates.get(key, NO_ACTIVITY.rates))
           for key in counts.keys() | rates.keys()}
    return slot, out


# What a member's counters look like to the writer: (vhost, name, the object counting, its counters in
# COUNTERS order). The object only tells one queue object from the next (a queue deleted and declared anew).
Counted = tuple[str, str, object, Sequence[int]]


class PgQueueStatsWriter:
    """Flushes this member's counters of the shared queues (``collect()``, called on the event loop) to
    ``leveret.queue_stats`` every :data:`FLUSH_EVERY` seconds (see the module docstring)."""

    def __init__(self, dsn: str, node: str, collect: Callable[[], Iterable[Counted]], slot_ms: int = 5000,
                 every: float | None = None, collect_node: Callable[[], dict[str, int]] | None = None) -> None:
        """``collect_node``: the member's node-wide counters (written to ``leveret.node_stats`` when changed)."""
        self.dsn = dsn
        self.node = node
        self.collect = collect
        self.collect_node = collect_node
        self._node_pruned_slot: int | None = None
        self.slot_ms = slot_ms
        self.every = every if every is not None else min(FLUSH_EVERY, slot_ms / 2000)
        self.flushes = 0  # statements that committed (tests)
        self.last_slot: int | None = None
        self._pruned_slot: int | None = None
        # (vhost, name) -> (the object counting it, its source id): a new object is a new source.
        self._sources: dict[tuple[str, str], tuple[object, int]] = {}
        self._gone: set[tuple[str, str]] = set()  # queues to forget at the next flush
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._halting = False
        self._failing = False

    def start(self) -> None:
        self._halting = False
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        # The flag, not the cancel alone, ends the loop: a cancel that comes as a flush's statement completes
        # is swallowed by wait_for in Python 3.11 (storage/pg/connections.py stop_tasks).
        while not self._halting:
            await asyncio.sleep(self.every)
            if not self._halting:
                await self.flush()

    async def flush(self, timeout: float = STATEMENT_TIMEOUT) -> bool:
        """One flush now; False if PostgreSQL did not take it within ``timeout`` seconds (the next one carries
        the same counters)."""
        async with self._lock:
            batch = self._batch()
            node_counters = json.dumps(self.collect_node(), sort_keys=True) if self.collect_node else None
            try:
                await asyncio.wait_for(self._write(*batch), timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (PostgreSQL out of reach: the counters wait for the next)
                if not self._failing:
                    log.warning("cannot write the queue statistics: %s", exc)
                self._failing = True
                self._drop()
                return False
            self._failing = False
            self._gone -= batch[0]
            self.flushes += 1
            if node_counters is not None:
                try:  # apart: the queues' flush above has committed whatever happens here
                    await asyncio.wait_for(self._write_node(node_counters), timeout)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 (written again at the next flush)
                    log.warning("cannot write the node's counters: %s", exc)
                    self._drop()
            return True

    def _batch(self) -> tuple[set[tuple[str, str]], list[list[object]]]:
        """What to send: the queues to forget, and the counters of every queue (one list per column)."""
        seen: dict[tuple[str, str], tuple[object, int]] = {}
        cols: list[list[object]] = [[] for _ in range(3 + len(COUNTERS))]
        for vhost, name, counting, values in self.collect():
            key = (vhost, name)
            known = self._sources.get(key)
            if known is None or known[0] is not counting:
                if known is not None:
                    self._gone.add(key)  # the same name, another queue: the old one's rows go first
                known = (counting, secrets.randbits(62))
            seen[key] = known
            if any(values):
                for col, v in zip(cols, (vhost, name, known[1], *values)):
                    col.append(v)
        self._gone |= self._sources.keys() - seen.keys()
        self._sources = seen
        return set(self._gone), cols

    async def _write(self, gone: set[tuple[str, str]], cols: list[list[object]]) -> None:
        conn = self._conn
        if conn is None or conn.is_closed():
            conn = self._conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        if gone:  # rare (a queue deleted): the forget and the flush after it in one transaction
            g = sorted(gone)
            async with conn.transaction():
                await conn.execute(FORGET, [k[0] for k in g], [k[1] for k in g])
                row = await conn.fetchrow(FLUSH, self.node, self.slot_ms, *cols) if cols[0] else None
        elif cols[0]:
            row = await conn.fetchrow(FLUSH, self.node, self.slot_ms, *cols)
        else:
            return
        if row is None:
            return
        self.last_slot = slot = int(row["slot"])
        if self._pruned_slot != slot:
            await conn.execute(PRUNE, self.node, self.slot_ms, slot, KEEP_SLOTS)
            self._pruned_slot = slot

    async def _write_node(self, counters: str) -> None:
        conn = self._conn
        if conn is None or conn.is_closed():
            conn = self._conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        slot = int(await conn.fetchval(NODE_FLUSH, self.node, counters, self.slot_ms))
        if self._node_pruned_slot != slot:
            await conn.execute(NODE_PRUNE, self.node, self.slot_ms, slot, KEEP_SLOTS)
            self._node_pruned_slot = slot

    def _drop(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            self._conn.terminate()
        self._conn = None

    async def halt(self) -> None:
        """Stop the periodic flushes, without the last one :meth:`close` makes (tests: a member that dies)."""
        self._halting = True
        await stop_tasks(self._task)
        self._task = None

    async def close(self) -> None:
        """Stop, after a last flush (a clean stop leaves every count in the totals); one that PostgreSQL does
        not take within :data:`CLOSE_FLUSH_TIMEOUT` is given up, so a stop while it is out of reach stays short."""
        await self.halt()
        await self.flush(CLOSE_FLUSH_TIMEOUT)
        conn, self._conn = self._conn, None
        await close_connection(conn)
