"""The three workers that carry a node's queue work to PostgreSQL, one connection each (docs/decisions/postgres-cluster.md):
the publisher (one INSERT … unnest() per burst, every queue in it), the acker (acks, requeues, purges of the
burst in one transaction) and the fetcher (one reservation at a time, for the queues that want rows, and
the 1 s poll and the periodic recount).

Why separate connections: a fetch's ``FOR UPDATE SKIP LOCKED`` locks rows it skips until it commits, and an
ack on the same connection would wait behind it (docs/decisions/postgres-cluster.md). Why ordering between them: an ack must not
reach PostgreSQL before the insert of the row it acks, a fetch must follow the requeue before it (or the
requeued message would not come first again), and a publish after a purge must not be purged; the
:class:`~storage.pg.progress.Progress` counters below express exactly those waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import asyncpg

from storage.pg import purge as purging
from storage.pg.backing_queue import Buffered, Op, PgBackingQueue
from storage.pg.progress import Progress

log = logging.getLogger("leveret.pg")

FETCH_BATCH = 100
POLL_INTERVAL = 1.0
RECOUNT_INTERVAL = 5.0
# A queue another member's commit changed (its doorbell) is recounted at once, then at most once per this many
# seconds, or per 20 times what its last recount took (a long queue costs its count: never a recount per ring).
RECOUNT_GAP = 0.05

# delivery_count: a row inserted delivered (publish_delivered), or delivered and requeued before its insert, has
# been reserved once (see RESERVE).
INSERT = """
INSERT INTO leveret.message (seq, queue_id, priority, state, owner, redelivered, persistent, expiry, size, body,
                             delivery_count)
SELECT s, q, p, st, CASE WHEN st = 1 THEN $10::bigint END, r, pe, e, sz, b, r::int
  FROM unnest($1::bigint[], $2::int[], $3::smallint[], $4::smallint[], $5::bool[], $6::bool[], $7::bigint[],
              $8::int[], $9::bytea[]) AS t(s, q, p, st, r, pe, e, sz, b)
"""
INSERT_AND_BLOCK = "WITH ins AS (" + INSERT + " RETURNING 1) SELECT nextval('leveret.seq_block')"
# delivery_count counts reservations, less releases (RELEASE): the count a row comes back with, less one, is the
# number of times its message went back to the queue before (x-delivery-count), whichever node delivered it.
RESERVE = """
WITH c AS (SELECT seq FROM leveret.message
            WHERE queue_id = $1 AND state = 0 AND priority BETWEEN $2 AND $3
            ORDER BY priority DESC, seq LIMIT $4 FOR UPDATE SKIP LOCKED)
UPDATE leveret.message m SET state = 1, owner = $5, delivery_count = m.delivery_count + 1
  FROM c WHERE m.seq = c.seq
RETURNING m.seq, m.priority, m.redelivered, m.expiry, m.size, m.body, m.delivery_count
"""
# The same, for rows a member dealt to other members' consumers whose grace is over (backing_queue.deal_here):
# none newer than the newest of them, so rows dealt since stay the others' for their own grace.
RESERVE_BELOW = RESERVE.replace("AND state = 0 AND", "AND state = 0 AND seq <= $6 AND")
# The same, for the rows at the head the owner judged expired (backing_queue.expired_upto): only those.
RESERVE_EXPIRED = RESERVE.replace("AND state = 0 AND", "AND state = 0 AND expiry <= $6 AND")
# The head's expiries, read without reserving (nobody here could take a row, the owner judges the head).
HEAD = ("SELECT expiry FROM leveret.message WHERE queue_id = $1 AND state = 0 AND priority BETWEEN $2 AND $3 "
        "ORDER BY priority DESC, seq LIMIT $4")
ACK = "DELETE FROM leveret.message WHERE seq = ANY($1::bigint[]) AND owner = $2"
REQUEUE = ("UPDATE leveret.message SET state = 0, owner = NULL, redelivered = true "
           "WHERE seq = ANY($1::bigint[]) AND owner = $2")
# A prefix handed back undelivered: redelivered unchanged, and its reservation does not count as a delivery.
# A row another member's purge marked (state 2, storage/pg/purge.py) is not released: the answer deletes it.
RELEASE = ("UPDATE leveret.message SET state = 0, owner = NULL, delivery_count = greatest(delivery_count - 1, 0) "
           "WHERE seq = ANY($1::bigint[]) AND owner = $2 AND state = 1")
PURGE = ("DELETE FROM leveret.message WHERE queue_id = $1 AND priority BETWEEN $2 AND $3 "
         "AND (state = 0 OR (owner = $4 AND seq = ANY($5::bigint[])))")
DELETE_ALL = "DELETE FROM leveret.message WHERE queue_id = $1 AND priority BETWEEN $2 AND $3"
RECOUNT = """
SELECT count(*) FILTER (WHERE state = 0), coalesce(sum(size) FILTER (WHERE state = 0), 0),
       count(*) FILTER (WHERE state <> 0 AND owner <> $4),
       coalesce(sum(size) FILTER (WHERE state <> 0 AND owner <> $4), 0)
  FROM leveret.message WHERE queue_id = $1 AND priority BETWEEN $2 AND $3
"""
QUEUE_ID = """
WITH ins AS (INSERT INTO leveret.queue (vhost, name) VALUES ($1, $2) ON CONFLICT (vhost, name) DO NOTHING
             RETURNING queue_id)
SELECT queue_id FROM ins UNION ALL SELECT queue_id FROM leveret.queue WHERE vhost = $1 AND name = $2 LIMIT 1
"""


def batch_for(q: PgBackingQueue) -> int:
    """How many rows to reserve: what the node's consumers of the queue can take now (their free prefetch),
    up to a batch; one for a basic.get on a node where nobody has room. Rows reserved beyond that would wait
    here (for a slow consumer, or unused until the idle prefix goes back) while other nodes' consumers with
    room got nothing, or got later messages first. Where no consumer has room, a reservation the owner asked
    for to take rows takes a batch (a peek), or as many as the owner said it will take (``takes_expected``: a
    drop-head's excess), and what it leaves goes back at once (hand_back_unused); one that would only judge the head (its TTL timer, consumers waiting on a queue their
    member counts as empty) is 0: the fetcher reads the head's expiries instead (HEAD), so no row is hidden from
    other members' consumers meanwhile, and then reserves only the rows the owner judged expired. A priority
    queue's levels are each bounded by the same room (together they may reserve more)."""
    if q.room is None:
        return FETCH_BATCH
    room = q.room(FETCH_BATCH)
    if room:
        return room
    if q.awaits_fetch():
        return 1
    if not q.wants_rows():
        return 0
    return min(FETCH_BATCH, q.takes_expected) if q.takes_expected else FETCH_BATCH


async def queue_id(conn: asyncpg.Connection, q: PgBackingQueue) -> int:
    """The queue's id in ``leveret.queue``, made on first use (open_queue stays synchronous)."""
    while q.queue_id is None:
        qid = await conn.fetchval(QUEUE_ID, q.vhost, q.name)
        if qid is not None:  # None: another node inserted it concurrently, and this snapshot missed it
            q.queue_id = int(qid)
    return q.queue_id


# What a statement raises when the server went away (restarted, shut down, crashed) or the link to it broke.
# (OSError covers TimeoutError: a bounded statement or connect that got no answer.)
DISCONNECTED = (asyncpg.PostgresConnectionError, asyncpg.exceptions.AdminShutdownError,
                asyncpg.exceptions.CrashShutdownError, asyncpg.exceptions.CannotConnectNowError, OSError)


def disconnected(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """Whether ``exc``, raised by a statement on ``conn``, means the session is gone (asyncpg's "connection
    is closed" is an InterfaceError raised once it knows: ``is_closed()``)."""
    return conn.is_closed() or isinstance(exc, DISCONNECTED)


class WorkerNode(Protocol):
    """What the workers need of their node (storage/pg/cluster.py's PgCluster, which imports this module)."""

    loop: asyncio.AbstractEventLoop
    epoch: int
    fenced: bool
    last_recount: float
    queues: dict[tuple[str, str, int | None], PgBackingQueue]
    publisher: Publisher
    acker: Acker
    purge_waits: purging.Waits

    def fence(self, reason: str, epoch: int | None = None) -> None: ...

    def block_stale(self) -> bool: ...

    def new_block(self, block: int) -> None: ...

    def ring(self, queue_ids: set[int]) -> None: ...


class Worker:
    """A loop woken once per event-loop burst (``request`` schedules one ``call_soon``, however many calls)."""

    def __init__(self, node: WorkerNode, conn: asyncpg.Connection, progress: Progress) -> None:
        self.node = node
        self.conn = conn
        self.progress = progress
        self.started = 0  # steps begun
        self.done = 0  # steps finished
        self._scheduled = False
        self._wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def request(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.node.loop.call_soon(self._ring)

    def _ring(self) -> None:
        self._scheduled = False
        self._wake.set()

    def start(self) -> None:
        self.task = self.node.loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self._wait()
            self._wake.clear()
            conn, epoch = self.conn, self.node.epoch
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the step released what it held (failed confirms, dropped ops)
                if disconnected(e, conn):
                    if epoch == self.node.epoch:  # else the node has reconnected since: old news
                        log.error("pg worker %s lost its connection: %s", type(self).__name__, e)
                    # The node fences itself and reconnects (storage/pg/cluster.py). Keep stepping: fenced
                    # steps no longer touch PostgreSQL, but they still fail what arrives (publishes come
                    # back from drain_failed: the publisher nacks, never a lost confirm).
                    self.node.fence(f"{type(self).__name__}: {e}", epoch)
                else:
                    log.exception("pg worker %s: step failed", type(self).__name__)
            self.progress.changed()

    async def _wait(self) -> None:
        await self._wake.wait()

    async def step(self) -> None:
        raise NotImplementedError

    def idle(self) -> bool:
        raise NotImplementedError


class Publisher(Worker):
    """One INSERT per burst for every queue's buffered publishes; confirms after it returns (it commits alone)."""

    def __init__(self, node: WorkerNode, conn: asyncpg.Connection, progress: Progress) -> None:
        super().__init__(node, conn, progress)
        self.dirty: dict[PgBackingQueue, None] = {}
        self.numbering = False

    def idle(self) -> bool:
        return not self.dirty and not self.numbering and self.started == self.done

    async def step(self) -> None:
        # A queue with a purge in flight waits for it, or the purge would remove these later publishes.
        acker = self.node.acker
        waits = [q.purge_op_id for q in self.dirty if q.purge_op_id > acker.done_op]
        if waits:
            target = max(waits)
            await self.progress.until(lambda: acker.done_op >= target or self.node.fenced)
        queues = [q for q in self.dirty if q.pub]
        self.dirty.clear()
        if not queues or self.node.fenced:
            for q in queues:
                q.rows_failed(q.take_rows())
            return
        # A queue's first statement looks its id up first; not idle meanwhile (the rows are in no statement yet,
        # and no longer in ``dirty``).
        self.numbering = True
        try:
            for q in queues:
                await queue_id(self.conn, q)
        finally:
            self.numbering = False
        self.started += 1
        taken = [(q, q.take_rows()) for q in queues]
        try:
            cols: list[list[Any]] = [[] for _ in range(9)]
            for q, rows in taken:
                prio = 0 if q.priority is None else q.priority
                encode = q.encode
                for r in rows:
                    body = r.msg if encode is None else encode(r.msg)
                    for col, v in zip(cols, (r.seq, q.queue_id, prio, r.state, r.redelivered, r.persistent,
                                             r.expiry, r.size, body)):
                        col.append(v)
            args = (*cols, self.node.epoch)
            if self.node.block_stale():
                block = await self.conn.fetchval(INSERT_AND_BLOCK, *args)
                self.node.new_block(int(block))
            else:
                await self.conn.execute(INSERT, *args)
        except BaseException:
            for q, rows in taken:
                q.rows_failed(rows)
            self.done += 1
            raise
        self.done += 1
        for q, rows in taken:
            q.rows_committed(rows)
        self.node.ring({q.queue_id for q, rows in taken if q.queue_id is not None and any(r.state == 0 for r in rows)})


class Acker(Worker):
    """The burst's acks (one DELETE), requeues (one UPDATE each kind), purges and answers to other members'
    purges (storage/pg/purge.py), in one transaction that first takes its queues' purge locks."""

    def __init__(self, node: WorkerNode, conn: asyncpg.Connection, progress: Progress) -> None:
        super().__init__(node, conn, progress)
        self.dirty: dict[PgBackingQueue, None] = {}
        self.answers: list[purging.Answer] = []
        self.enqueued_op = 0
        self.done_op = 0

    def idle(self) -> bool:
        return not self.dirty and not self.answers and self.done_op == self.enqueued_op

    def answer(self, answer: purging.Answer) -> None:
        """Answer another member's purge after the ops made here so far (storage/pg/purge.py, step 2)."""
        self.answers.append(answer)
        self.request()

    def add(self, q: PgBackingQueue) -> int:
        self.dirty[q] = None
        self.enqueued_op += 1
        self.request()
        return self.enqueued_op

    async def step(self) -> None:
        taken = [(q, q.ops) for q in self.dirty]
        for q, _ in taken:
            q.ops = []
        self.dirty.clear()
        answers, self.answers = self.answers, []
        upto = self.enqueued_op
        publisher = self.node.publisher
        target = publisher.started  # every row these ops touch was inserted by a statement begun by now
        await self.progress.until(lambda: publisher.done >= target or self.node.fenced)
        if self.node.fenced:
            for q, ops in taken:
                q.ops_failed(ops)
            self.done_op = upto
            return
        epoch = self.node.epoch
        stale = [(q, [op for op in ops if op.epoch != epoch and op.kind in ("ack", "requeue", "release")])
                 for q, ops in taken]
        for q, old in stale:  # made before the node reconnected: their rows are the reaper's now
            if old:
                q.ops_failed(old)
        taken = [(q, [op for op in ops if op.epoch == epoch or op.kind not in ("ack", "requeue", "release")])
                 for q, ops in taken]
        purged: list[tuple[PgBackingQueue, Op, int, purging.Request]] = []  # purge ops, rows deleted, request
        try:
            locks: dict[int, bool] = {a.request.queue_id: False for a in answers}
            for q, ops in taken:
                qid = await queue_id(self.conn, q)
                locks[qid] = locks.get(qid, False) or any(op.kind == "purge" for op in ops)
            async with self.conn.transaction():
                if locks:
                    order = sorted(locks)
                    await self.conn.execute(purging.LOCK_QUEUES, purging.PURGE_LOCK_CLASS, order,
                                            [locks[qid] for qid in order])
                acks: list[int] = []
                requeues: list[int] = []
                releases: list[int] = []

                async def flush() -> None:
                    if acks:
                        await self.conn.execute(ACK, acks, epoch)
                    if requeues:
                        await self.conn.execute(REQUEUE, requeues, epoch)
                    if releases:
                        await self.conn.execute(RELEASE, releases, epoch)
                    acks.clear()
                    requeues.clear()
                    releases.clear()

                for q, ops in taken:
                    lo, hi = q.priority_range
                    for op in ops:
                        if op.kind == "ack":
                            acks.extend(op.seqs)
                        elif op.kind == "requeue":
                            requeues.extend(op.seqs)
                        elif op.kind == "release":
                            releases.extend(op.seqs)
                        else:
                            await flush()
                            if op.kind == "purge":
                                assert q.queue_id is not None
                                status = await self.conn.execute(PURGE, q.queue_id, lo, hi, epoch, op.seqs)
                                holders = await self.conn.fetch(purging.MARK, q.queue_id, lo, hi, epoch)
                                request = purging.Request(q.queue_id, lo, hi, self.node.purge_waits.token(),
                                                          tuple(int(h[0]) for h in holders))
                                purged.append((q, op, int(status.rsplit(" ", 1)[-1]), request))
                                if request.holders:  # (expected first: an answer can beat the commit's reply)
                                    self.node.purge_waits.expect(request.token, request.holders)
                                    await self.conn.execute("SELECT pg_notify($1, $2)", purging.PURGE_BELL,
                                                            request.payload())
                            else:
                                await self.conn.execute(DELETE_ALL, q.queue_id, lo, hi)
                await flush()
                for a in answers:
                    if a.epoch != epoch:
                        continue
                    r = a.request
                    await self.conn.execute(purging.ANSWER, r.queue_id, r.lo, r.hi, epoch, a.delivered,
                                            purging.PURGED_BELL, f"{r.token} {epoch} ")
        except BaseException:
            for _, _, _, request in purged:
                self.node.purge_waits.forget(request.token)
            for q, ops in taken:
                q.ops_failed(ops)
            self.done_op = upto
            raise
        self.done_op = upto
        for q, ops in taken:
            q.ops_committed(ops, 0)
        for q, op, deleted, request in purged:
            # purge-ok once the holders answered: with what they deleted of the rows they had not delivered
            self.node.purge_waits.wait(request.token, _purge_done(q, op, deleted))
        self.node.ring({q.queue_id for q, ops in taken
                        if q.queue_id is not None and any(op.kind in ("requeue", "release") for op in ops)})


def _purge_done(q: PgBackingQueue, op: Op, deleted: int) -> Callable[[int], None]:
    """The call that tells ``q`` its purge ``op`` is done: the rows it deleted plus those its answers did."""
    return lambda others: q.purge_done(op, deleted + others)


class Fetcher(Worker):
    """Reserves batches for the queues that want rows: at once when rows are known to be ready, else at the
    next poll; also hands back prefixes nobody fetches and recounts the queues now and then."""

    def __init__(self, node: WorkerNode, conn: asyncpg.Connection, progress: Progress) -> None:
        super().__init__(node, conn, progress)
        self.wanting: dict[PgBackingQueue, None] = {}
        self.unnumbered: dict[PgBackingQueue, None] = {}  # opened here, queue_id not looked up yet
        self.busy = False

    def idle(self) -> bool:
        return not self.busy and not any(q.knows_ready() and q.hungry for q in self.wanting)

    def _stale_due(self, now: float) -> list[PgBackingQueue]:
        return [q for q in self.node.queues.values() if q.count_stale and (
            q.wants_count() or now - q.last_recount >= max(RECOUNT_GAP, 20 * q.recount_cost))]

    def want(self, q: PgBackingQueue) -> None:
        new = q not in self.wanting
        self.wanting[q] = None
        if new or q.knows_ready():
            self.request()

    async def _wait(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), POLL_INTERVAL / 2)
        except TimeoutError:
            pass

    async def step(self) -> None:
        if self.node.fenced:
            return
        now = time.monotonic()
        self.busy = True
        try:
            for q in self._stale_due(now):  # recounts someone waits for (a queue.declare-ok) come first
                if q.wants_count():
                    await self._recount(q)
            while self.unnumbered:
                q = next(iter(self.unnumbered))
                if q.queue_id is None and not q.closed:
                    await queue_id(self.conn, q)
                    # Counted at once: until then its estimate is 0 whatever other members hold, and a
                    # max-length judged on it would let a publish here through a full queue.
                    q.count_stale = True
                    self.request()
                self.unnumbered.pop(q, None)
            for q in list(self.wanting):
                if q.closed or not q.hungry:
                    self.wanting.pop(q, None)
                    continue
                if q.buffer:
                    continue
                if q.knows_ready() or now - q.last_poll >= POLL_INTERVAL or q.last_poll == 0.0:
                    await self._reserve(q)
            self._housekeeping(now)
            if now - self.node.last_recount >= RECOUNT_INTERVAL:
                self.node.last_recount = now
                for q in list(self.node.queues.values()):
                    await self._recount(q)
            for q in self._stale_due(time.monotonic()):
                await self._recount(q)
        finally:
            self.busy = False

    async def _reserve(self, q: PgBackingQueue) -> None:
        publisher, acker = self.node.publisher, self.node.acker
        # This node's publishes and ops so far first (a requeued row must be ready again before we look), but
        # not later ones: under a steady publish load there is always a newer one.
        pub_target = publisher.started + (1 if q.pub else 0)
        if q.pub:
            publisher.request()
        last_op = q.last_op_id
        await self.progress.until(lambda: self.node.fenced or (
            publisher.done >= pub_target and acker.done_op >= last_op))
        if self.node.fenced:
            return
        qid = await queue_id(self.conn, q)
        rgen, pgen, changes = q.rgen, q.pgen, q.changes
        lo, hi = q.priority_range
        batch = batch_for(q)
        if batch == 0:
            head = await self.conn.fetch(HEAD, qid, lo, hi, FETCH_BATCH)
            q.last_poll = time.monotonic()
            q.head_read([r[0] for r in head], rgen, changes)
            return
        q.reserve_rounds += 1
        below = q.take_reserve_below()
        upto, q.expired_upto = q.expired_upto, None
        # (Consumers here with room take rows as they come, expired ones dropped from the prefix by the owner.)
        if upto is not None and q.room is not None and not q.room(1) and not q.awaits_fetch():
            records = await self.conn.fetch(RESERVE_EXPIRED, qid, lo, hi, batch, self.node.epoch, upto)
        elif below is None:
            upto = None
            records = await self.conn.fetch(RESERVE, qid, lo, hi, batch, self.node.epoch)
        else:
            upto = None
            records = await self.conn.fetch(RESERVE_BELOW, qid, lo, hi, batch, self.node.epoch, below)
        decode = q.decode
        rows = [Buffered(r[0], r[5] if decode is None else decode(r[5]), r[4], r[2], r[3], max(0, r[6] - 1))
                for r in sorted(records, key=lambda r: (-r[1], r[0]))]
        q.last_poll = time.monotonic()
        q.rows_reserved(rows, rgen, pgen, batch, changes, bounded=upto is not None)

    def _housekeeping(self, now: float) -> None:
        for q in self.node.queues.values():
            if q.buffer and now - q.last_take >= 2.0:
                q.hungry = False
                q.release_buffer()

    async def _recount(self, q: PgBackingQueue) -> None:
        if q.pub or q.ops or q.inflight_publish or q.requeued:
            # (A doorbell's recount stays due: the next step tries again. A declare-ok waiting for it goes with
            # the figures at hand: this node's own work is in them, and it is under way.)
            q.recount_over(None)
            return
        if q.queue_id is None:  # opened here, used only elsewhere so far (declared, consumed on other nodes)
            await queue_id(self.conn, q)
        changes = q.changes
        lo, hi = q.priority_range
        began = time.monotonic()
        q.count_stale = False
        q.recount_rounds += 1
        rounds = q.recount_rounds
        try:
            r = await self.conn.fetchrow(RECOUNT, q.queue_id, lo, hi, self.node.epoch)
        finally:
            q.node.loop.call_soon(q.recount_over, rounds)  # after recounted() below
        q.last_recount = time.monotonic()
        q.recount_cost = q.last_recount - began
        if changes == q.changes and not q.pub and not q.ops and not q.inflight_publish and not q.requeued:
            q.recounted(int(r[0]), int(r[1]), int(r[2]), int(r[3]))
        else:
            q.count_stale = True  # this node's own work landed meanwhile: count again after it
