"""PgCluster: one node's membership of a Leveret cluster on PostgreSQL (docs/decisions/postgres-cluster.md).

A node start takes a new *epoch* (``leveret.node_epoch``), the fencing token its reservations carry. Every
one of its four connections (lease, publish, fetch, ack) holds the advisory key ``(LEASE_KEY, epoch)`` in
shared mode from connect on, and only then is the node row inserted: a peer that can take that key
*exclusively* therefore knows that every session of the node has ended, including one still finishing a
reservation, and requeues the node's rows (redelivered) and marks it dead. Holding the key on the lease
session alone lost 50 messages in a prototype's kill -9 runs (docs/decisions/postgres-cluster.md); registering before the key is held
let a peer reap a node that was still starting. A node that stays connected but stops (SIGSTOP) lets its
``lease_until`` pass, and peers terminate its sessions, which frees the key.

**PostgreSQL out of reach** (restarted, failed over, the link cut): the first statement that meets a dead
session *fences* the node: it ends its other sessions at once (so its epoch's key is free and whoever
reconnects first requeues its rows), forgets what it held under the epoch (an ack of a delivery made under
it matches nothing: the row comes back redelivered, at least once), and nacks every publish it has not
committed. It then reconnects with backoff (:data:`RECONNECT_FIRST` doubling to :data:`RECONNECT_MAX`) and
comes back under a **new** epoch, so no statement of the new sessions can touch a row reserved under the
old one; it reaps its own old epoch at once. Publishes meanwhile are nacked (never confirmed unless
committed), and the queues' wish for rows is kept, so consumers resume when the node is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from storage.pg import purge as purging
from storage.pg import schema
from storage.pg.backing_queue import Credit, PgBackingQueue
from storage.pg.connections import stop_tasks
from storage.pg.forget import NAME_LOCK_CLASS, Forgotten, NotForgettable, forget_member
from storage.pg.planner_statistics import PlannerStatistics
from storage.pg.progress import Progress
from storage.pg.workers import DISCONNECTED, Acker, Fetcher, Publisher, disconnected

log = logging.getLogger("leveret.pg")

LEASE_KEY = 4242  # pg_advisory_lock_shared(LEASE_KEY, epoch) on every connection of a node
# pg_try_advisory_lock(SAC_KEY, queue_id) on the lease session: the member whose consumers are a single-active-
# consumer queue's active ones. On the lease session because it holds the epoch's key: a member that dies loses
# it with its session, one that hangs loses it when a peer terminates its sessions past its lease.
SAC_KEY = 4261
CLOSE_DRAIN_TIMEOUT = 5.0  # seconds a clean stop waits for its publishes and acks to be applied
BLOCK_BITS = 18  # seq ids per block: 2^18; a block is renewed when half used or BLOCK_MAX_AGE old
# Seconds a seq block serves before a fresh one is taken: by the next INSERT while the node publishes, by
# _block_loop while it does not. Publishes on two members are ordered by their blocks, so this is the window
# within which two publishes on different members may come out in either order.
BLOCK_MAX_AGE = 0.05
REAP_INTERVAL = 0.5
RECONNECT_FIRST = 0.1  # seconds before the first attempt to reconnect after a fence; doubled per failure
RECONNECT_MAX = 1.0  # a refused connect costs the server nothing: come back within a second of it
CONNECT_TIMEOUT = 5.0  # one attempt to open a session (a server that does not answer at all)

# (State 2: reserved and marked by a purge the holder has not answered: storage/pg/purge.py. Written as two
# arms so that each uses its partial index.)
REAP = ("UPDATE leveret.message SET state = 0, owner = NULL, redelivered = true "
        "WHERE (state = 1 AND owner = $1) OR (state = 2 AND owner = $1)")
SWEEP = ("UPDATE leveret.message SET state = 0, owner = NULL, redelivered = true WHERE state IN (1, 2) AND owner IN "
         "(SELECT epoch FROM leveret.node WHERE dead_at IS NOT NULL OR stopped_at IS NOT NULL)")
PEERS = ("SELECT epoch, lease_until < now() AS expired FROM leveret.node "
         "WHERE dead_at IS NULL AND stopped_at IS NULL AND epoch <> $1")
HOLDERS = ("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND database = "
           "(SELECT oid FROM pg_database WHERE datname = current_database()) AND classid::bigint = $1 "
           "AND objid::bigint = $2 AND objsubid = 2 AND granted AND mode = 'ShareLock' AND pid <> pg_backend_pid()")
# (ShareLock: the node's own sessions; an ExclusiveLock holder is a peer reaping it, left alone. pg_locks lists
# every database's locks, and another cluster's database on the same server numbers its epochs from 1 too: the
# database must match, or ending a hung epoch here ends that cluster's namesake epoch's sessions as well.)
DOORBELL = "leveret_queue"  # NOTIFY channel; payload: a queue_id that has new ready rows
RING_EVERY = 0.01  # at most one doorbell statement per 10 ms per node (docs/decisions/postgres-cluster.md: never one per message)
NEXT_BLOCK = "SELECT nextval('leveret.seq_block')"
# The runs of a name that neither stopped nor were reaped, and whether any session still holds their epoch's key
# (pg_locks lists every database's locks: the key is this database's only when its database matches).
NAMESAKES = ("SELECT n.epoch, n.started_at, n.lease_until > now() AS leased, EXISTS (SELECT 1 FROM pg_locks l "
             "WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database "
             "WHERE datname = current_database()) AND l.classid::bigint = $2 AND l.objid::bigint = n.epoch "
             "AND l.objsubid = 2 AND l.granted AND l.mode = 'ShareLock') AS held "
             "FROM leveret.node n WHERE n.name = $1 AND n.dead_at IS NULL AND n.stopped_at IS NULL")
END_SESSIONS = ("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) AND classid::bigint = $1 "
                "AND objid::bigint = $2 AND objsubid = 2 AND granted AND mode = 'ShareLock'")
# The cluster's name (leveret.cluster_setting, schema version 8): a change is NOTIFYed on this channel in the
# transaction that makes it (payload: the name), and every heartbeat reads it too (a notification missed while
# a member was cut off).
CLUSTER_NAME_BELL = "leveret_cluster_name"
# Fair delivery across members (issue 35): every lease round (0.5 s) a member NOTIFYs, on this channel, the free
# credit of its consumers of each shared queue (payload "epoch part part ...", a part "qid:room", or
# "qid:room:rank" when their highest priority with room is not 0, with ":p" added when the member publishes to
# the queue itself); the others keep it for CREDIT_FRESH seconds and the publishing member deals its direct
# deliveries by it (backing_queue.deal_here), a member outranked by higher consumer priorities elsewhere
# holds back (backing_queue._outranked).
CONSUMERS_BELL = "leveret_consumers"
CREDIT_FRESH = 1.5
CREDIT_MOST = 100  # a member's announced room per queue is capped here (one fetch batch)
READ_CLUSTER_NAME = "SELECT value FROM leveret.cluster_setting WHERE key = 'cluster_name'"
HEARTBEAT = ("UPDATE leveret.node SET lease_until = now() + $2 * interval '1 second' WHERE epoch = $1 "
             "RETURNING dead_at")


class NameTaken(Exception):
    """Another running member of the cluster has this node's name: refused at start, as RabbitMQ refuses a
    second node with a running node's name (two runs of one name would share its node-local queues' directory
    and forwarded messages, and each would serve half of them)."""


class PgCluster:
    """One node's membership of a Leveret cluster on PostgreSQL: its epoch, its connections (each holding the
    epoch's advisory key in shared mode), heartbeat, the reaper of dead peers' reservations, queue registry."""

    epoch: int
    node_name: str

    def __init__(self, node_name: str, epoch: int, lease_seconds: float, conns: list[asyncpg.Connection],
                 dsn: str = "") -> None:
        self.node_name = node_name
        self.dsn = dsn
        self.epoch = epoch
        self.loop = asyncio.get_running_loop()  # the workers' doorbells ring on it, whoever calls
        self.lease_seconds = lease_seconds
        self.lease_conn, pub_conn, fetch_conn, ack_conn = conns
        self.conns = conns
        self.progress = Progress()
        self.publisher = Publisher(self, pub_conn, self.progress)
        self.acker = Acker(self, ack_conn, self.progress)
        # Purges made here waiting for the other members' answers (storage/pg/purge.py).
        self.purge_waits = purging.Waits(self.loop, lambda: self.epoch)
        self.fetcher = Fetcher(self, fetch_conn, self.progress)
        self.queues: dict[tuple[str, str, int | None], PgBackingQueue] = {}
        self.fenced = False
        self.fence_reason = ""
        self.on_fenced: Callable[[str], None] | None = None
        self.on_reconnected: Callable[[int], None] | None = None
        # The cluster's name as last read or notified (None until init_cluster_name), and who is told when it
        # changes (broker/clustering/cluster.py: the node's cluster_name, read by the HTTP API, Prometheus, AMQP).
        self.cluster_name: str | None = None
        self.on_cluster_name: Callable[[str], None] | None = None
        self.epochs: list[int] = [epoch]  # this node's epochs, oldest first (one more per reconnect)
        self.reconnect_failures = 0  # attempts that failed since the last fence
        self._reconnect_task: asyncio.Task[None] | None = None
        self.last_recount = time.monotonic()
        self.reaped: list[int] = []  # epochs this node reaped (for logs and tests)
        self._lease_lock = asyncio.Lock()
        self._lease_task: asyncio.Task[None] | None = None
        self._block_task: asyncio.Task[None] | None = None
        self._last_heartbeat = time.monotonic()
        self._block_next = 0
        self._block_end = 0
        self._block_taken = 0.0
        self._fresh_block: int | None = None  # drawn, used from the next seq on
        self._fresh_taken = 0.0  # when it was drawn
        self._closing = False
        self._rings: set[int] = set()  # queue ids whose doorbell rings at the next ring
        self._ring_task: asyncio.Task[None] | None = None
        # Single active consumer: queues whose lock this node wants (it has consumers for them), and the locks
        # it holds by queue id.
        self._sac_wanted: dict[PgBackingQueue, None] = {}
        self._sac_held: dict[int, PgBackingQueue] = {}
        self._sac_task: asyncio.Task[None] | None = None
        # Other members' consumers' free credit by queue id: {epoch: (room, fresh until)} (CONSUMERS_BELL).
        self._credit: dict[int, dict[int, Credit]] = {}
        # The planner's statistics of leveret.message, looked at from the lease loop (planner_statistics.py).
        self.planner_statistics = PlannerStatistics(dsn) if dsn else None

    # -- start ---------------------------------------------------------------------------------------------
    @classmethod
    async def connect(cls, dsn: str, node_name: str, *, lease_seconds: float = 15.0) -> PgCluster:
        """Migrate the schema, take an epoch, hold its key on all four connections, then register."""
        epoch, conns, block = await _join(dsn, node_name, lease_seconds, migrate=True, refuse_namesake=True)
        node = cls(node_name, epoch, lease_seconds, conns, dsn)
        node.new_block(block)
        for w in (node.publisher, node.acker, node.fetcher):
            w.start()
        node._lease_task = asyncio.get_running_loop().create_task(node._lease_loop(epoch))
        node._block_task = asyncio.get_running_loop().create_task(node._block_loop(epoch))
        await conns[0].add_listener(DOORBELL, node._doorbell)
        await conns[0].add_listener(CLUSTER_NAME_BELL, node._cluster_name_bell)
        await conns[0].add_listener(CONSUMERS_BELL, node._consumers_bell)
        await conns[0].add_listener(purging.PURGE_BELL, node._purge_bell)
        await conns[0].add_listener(purging.PURGED_BELL, node._purged_bell)
        log.info("pg cluster: node %s joined with epoch %d", node_name, epoch)
        return node

    # -- reconnecting after a fence ------------------------------------------------------------------------
    async def _reconnect_loop(self) -> None:
        delay = RECONNECT_FIRST
        while not self._closing:
            await asyncio.sleep(delay)
            try:
                epoch, conns, block = await _join(self.dsn, self.node_name, self.lease_seconds)
            except (*DISCONNECTED, asyncpg.InterfaceError, asyncpg.PostgresError) as e:
                # Refused, starting up, too many connections...: all worth another try.
                self.reconnect_failures += 1
                if self.reconnect_failures == 1 or self.reconnect_failures % 30 == 0:
                    log.warning("pg cluster: node %s cannot reach PostgreSQL yet (%d attempts): %s",
                                self.node_name, self.reconnect_failures, e)
                delay = min(delay * 2, RECONNECT_MAX)
                continue
            if self._closing:
                for c in conns:
                    c.terminate()
                return
            await self._resume(epoch, conns, block)
            return

    async def _resume(self, epoch: int, conns: list[asyncpg.Connection], block: int) -> None:
        """Carry on under the new ``epoch``: new sessions for the workers, the doorbell, the old epoch's rows
        back to the queues (redelivered) at once, a new lease loop; then the workers go on (``fenced`` is
        cleared last: until then they keep failing what arrives, touching no session)."""
        old = self.epoch
        if self._lease_task is not None and not self._lease_task.done():
            self._lease_task.cancel()
        self.epoch = epoch
        self.epochs.append(epoch)
        self.conns = conns
        self.lease_conn = conns[0]
        self.publisher.conn, self.fetcher.conn, self.acker.conn = conns[1], conns[2], conns[3]
        self._block_end = 0  # the new block at once (the old one's seqs are still ours, but why keep it)
        self._fresh_block = None
        self.new_block(block)
        try:
            await self.lease_conn.add_listener(DOORBELL, self._doorbell)
            await self.lease_conn.add_listener(CLUSTER_NAME_BELL, self._cluster_name_bell)
            await self.lease_conn.add_listener(CONSUMERS_BELL, self._consumers_bell)
            await self.lease_conn.add_listener(purging.PURGE_BELL, self._purge_bell)
            await self.lease_conn.add_listener(purging.PURGED_BELL, self._purged_bell)
            async with self._lease_lock:
                # Our old sessions are gone from here; any the server still counts (a half-open TCP link)
                # is ended, so the key is free and the reap below (or the lease loop's next) requeues them.
                await self.lease_conn.execute(HOLDERS, LEASE_KEY, old)
                await self._reap()
        except (*DISCONNECTED, asyncpg.InterfaceError, asyncpg.PostgresError) as e:
            # The lease loop reaps at its next round (and fences again if this session died already).
            log.warning("pg cluster: first reap after reconnecting failed: %s", e)
        self._last_heartbeat = time.monotonic()
        self.last_recount = 0.0  # recount every queue at the fetcher's next step: rows came back meanwhile
        failures, self.reconnect_failures = self.reconnect_failures, 0
        self.fenced = False
        self.fence_reason = ""
        self._reconnect_task = None
        self._lease_task = self.loop.create_task(self._lease_loop(epoch))
        self._block_task = self.loop.create_task(self._block_loop(epoch))
        log.warning("pg cluster: node %s reconnected with epoch %d (was %d) after %d failed attempts",
                    self.node_name, epoch, old, failures)
        for q in self.queues.values():
            if q.hungry:
                q.more = True  # look at once rather than at the next poll
        if self._rings:
            self.ring(set(self._rings))
        for w in (self.publisher, self.acker, self.fetcher):
            w.request()
        self.progress.changed()
        if self.on_reconnected is not None:
            self.on_reconnected(epoch)

    # -- seq ids -------------------------------------------------------------------------------------------
    def new_block(self, block: int) -> None:
        """A block drawn from ``leveret.seq_block``: used at once if none is, else from the next seq on. One
        older than the block in use (or than one already waiting) is dropped: two draws may answer out of
        order (the publisher's and _block_loop's), and seqs must only grow."""
        if self._block_end == 0:
            self._use_block(block, time.monotonic())
            return
        in_use = (self._block_end >> BLOCK_BITS) - 1
        if block > in_use and (self._fresh_block is None or block > self._fresh_block):
            self._fresh_block = block
            self._fresh_taken = time.monotonic()

    def _use_block(self, block: int, drawn: float) -> None:
        self._block_next = block << BLOCK_BITS
        self._block_end = self._block_next + (1 << BLOCK_BITS)
        self._block_taken = drawn  # its age counts from its draw, not from its first use

    def next_seq(self) -> int:
        """The next seq id: larger than every one this node gave before, and ordered with other nodes' by the
        sequence that hands out blocks."""
        if self._fresh_block is not None:
            self._use_block(self._fresh_block, self._fresh_taken)
            self._fresh_block = None
        if self._block_next >= self._block_end:
            raise RuntimeError("seq block exhausted within one burst (2^18 publishes before one commit)")
        seq = self._block_next
        self._block_next += 1
        return seq

    def block_stale(self) -> bool:
        if self._fresh_block is not None:
            return time.monotonic() - self._fresh_taken > BLOCK_MAX_AGE
        used = (1 << BLOCK_BITS) - (self._block_end - self._block_next)
        return used * 2 >= (1 << BLOCK_BITS) or time.monotonic() - self._block_taken > BLOCK_MAX_AGE

    async def _block_loop(self, epoch: int) -> None:
        """Keep the seq block fresh while this node does not publish (busy, each INSERT renews it when stale):
        a publish after a quiet spell is then ordered after what other members published more than about
        BLOCK_MAX_AGE before it (before, a quiet node's block was up to a second old). One ``nextval`` per
        BLOCK_MAX_AGE on the lease session (on every member: a queue opened and published to at once must not
        start from an old block)."""
        while True:
            await asyncio.sleep(BLOCK_MAX_AGE)
            if self.fenced or self.epoch != epoch or self._closing:
                return
            drawn = self._block_taken if self._fresh_block is None else self._fresh_taken
            if time.monotonic() - drawn <= BLOCK_MAX_AGE:
                continue  # (a block drawn and not used yet gets old too: it is replaced by a newer one)
            try:
                async with self._lease_lock:
                    if self.fenced or self.epoch != epoch:
                        return
                    block = await asyncio.wait_for(self.lease_conn.fetchval(NEXT_BLOCK), self.lease_seconds)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 (the lease loop notices a lost session and fences)
                await asyncio.sleep(REAP_INTERVAL)
                continue
            self.new_block(int(block))

    # -- queues --------------------------------------------------------------------------------------------
    def open_queue(self, vhost: str, name: str, *, priority: int | None = None,
                   on_confirm: Callable[[], None] | None = None, encode: Callable[[Any], bytes] | None = None,
                   decode: Callable[[bytes], Any] | None = None) -> PgBackingQueue:
        """This node's backing queue for ``vhost``/``name`` (at one ``priority`` when a priority queue keeps one
        PgBackingQueue per level). Synchronous: the queue's row is made by the first worker that needs it.
        ``encode``/``decode``: messages are objects, stored as ``encode(msg)`` (else they must be bytes)."""
        key = (vhost, name, priority)
        q = self.queues.get(key)
        if q is None or q.closed:
            q = PgBackingQueue(self, vhost, name, priority, on_confirm, encode, decode)
            self.queues[key] = q
            self.fetcher.unnumbered[q] = None  # its queue_id soon: the doorbell names queues by id
            self.fetcher.request()
        elif on_confirm is not None:
            q.on_confirm = on_confirm
        return q

    def schedule_publish(self, q: PgBackingQueue) -> None:
        self.publisher.dirty[q] = None
        self.publisher.request()

    def schedule_ops(self, q: PgBackingQueue) -> int:
        return self.acker.add(q)

    def want_fetch(self, q: PgBackingQueue) -> None:
        self.fetcher.want(q)

    def want_recount(self, q: PgBackingQueue) -> None:
        self.fetcher.request()

    # -- single active consumer across the cluster -----------------------------------------------------------
    def want_single_active(self, q: PgBackingQueue, wanted: bool) -> None:
        if wanted:
            self._sac_wanted[q] = None
        else:
            self._sac_wanted.pop(q, None)
        if self._sac_task is None and not self._closing and not self.fenced:
            self._sac_task = self.loop.create_task(self._sac_now())

    async def _sac_now(self) -> None:
        try:
            async with self._lease_lock:
                if not self.fenced:
                    await self._sac_step()
        except (*DISCONNECTED, asyncpg.InterfaceError, asyncpg.PostgresError) as e:
            log.warning("pg cluster: single-active-consumer lock step failed (the lease loop retries): %s", e)
        finally:
            self._sac_task = None

    async def _sac_step(self) -> None:
        """Give up the locks of queues this node no longer wants, try to take those it wants (also every lease
        round: a holder that gives its lock up or dies is followed within half a second)."""
        conn = self.lease_conn
        for qid, q in list(self._sac_held.items()):
            if q not in self._sac_wanted or q.closed:
                del self._sac_held[qid]
                self._sac_set(q, False)
                await conn.execute("SELECT pg_advisory_unlock($1, $2)", SAC_KEY, qid)
        for q in list(self._sac_wanted):
            if q.closed:
                self._sac_wanted.pop(q, None)
            elif q.queue_id is not None and q.queue_id not in self._sac_held and \
                    await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", SAC_KEY, q.queue_id):
                self._sac_held[q.queue_id] = q
                self._sac_set(q, True)

    def _sac_set(self, q: PgBackingQueue, active: bool, fenced: bool = False) -> None:
        q.sac_active = active
        if not active and not fenced:
            q.release_buffer()  # rows reserved ahead of consumers that are no longer active: to the holder
        if q.on_sac_change is not None:
            q.on_sac_change(active)

    # -- doorbell: a commit here wakes the idle fetchers of other nodes at once, not at their next poll ------
    def ring(self, queue_ids: set[int]) -> None:
        """After a commit made rows ready: NOTIFY, outside that transaction and debounced (docs/decisions/postgres-cluster.md)."""
        if not queue_ids:
            return
        self._rings |= queue_ids
        if self._ring_task is None and not self._closing:
            self._ring_task = self.loop.create_task(self._ring_soon())

    async def _ring_soon(self) -> None:
        try:
            while self._rings and not self.fenced:
                ids, self._rings = sorted(self._rings), set()
                async with self._lease_lock:
                    await self.lease_conn.execute(
                        "SELECT pg_notify($1, x::text) FROM unnest($2::int[]) x", DOORBELL, ids)
                await asyncio.sleep(RING_EVERY)
        except asyncio.CancelledError:
            raise
        except Exception:  # the poll still finds the rows; a lost lease connection fences elsewhere
            log.warning("pg cluster: doorbell failed", exc_info=True)
        finally:
            self._ring_task = None

    def _doorbell(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if pid == conn.get_server_pid():
            return  # our own ring
        self._wake({int(payload)})

    def _wake(self, qids: set[int]) -> None:
        """Rows of these queues became ready: the queues waiting for rows here reserve at once, and the others
        are recounted soon (so a passive declare here counts what another member published; the fetcher
        spaces the recounts of a busy queue)."""
        recount = False
        for q in self.queues.values():
            if q.queue_id in qids:
                if q.hungry and not q.buffer:
                    q.more = True
                    self.fetcher.want(q)
                q.count_stale = recount = True
        if recount:
            self.fetcher.request()

    # -- fair delivery: the members' consumers' free credit ----------------------------------------------------
    async def _announce_credit(self, conn: asyncpg.Connection, epoch: int) -> None:
        """Tell the other members how much the consumers here could take of each shared queue (one NOTIFY per
        round, none when no consumer here has room), so a publishing member leaves them their share rather than
        handing every message to its own consumers (backing_queue.deal_here). Single-active-consumer queues
        are left out: one consumer is active cluster-wide and the lock, not a share, decides. So are queues
        this member published to since the last round are marked so: its own publishes feed its consumers
        (direct delivery, confirmed at their ack), and dealing the others' publishes to them as well cost two
        members each publishing and consuming 2.8x their throughput (bench/cluster_quorum.py, 9.3k -> 3.3k
        msg/s); their consumers' priority still counts (x-priority ranks consumers queue-wide)."""
        parts: list[str] = []
        for q in self.queues.values():
            published, q.published_here = q.published_here, 0
            if q.queue_id is None or q.room is None or q.closed or q in self._sac_wanted:
                continue
            room = q.room(CREDIT_MOST)
            if room <= 0:
                continue
            rank = q.rank() if q.rank is not None else None
            if published:  # not dealt to, but its consumers' priority still ranks them queue-wide
                parts.append(f"{q.queue_id}:{room}:{rank or 0}:p")
            elif rank:
                parts.append(f"{q.queue_id}:{room}:{rank}")
            else:
                parts.append(f"{q.queue_id}:{room}")
        # Payloads stay under PostgreSQL's 8,000 bytes: one NOTIFY per chunk, all in one statement.
        chunks, size, cur = [], 0, [str(epoch)]
        for part in parts:
            if size + len(part) > 7000:
                chunks.append(" ".join(cur))
                cur, size = [str(epoch)], 0
            cur.append(part)
            size += len(part) + 1
        if len(cur) > 1:
            chunks.append(" ".join(cur))
        if chunks:
            await conn.execute("SELECT pg_notify($1, x) FROM unnest($2::text[]) x", CONSUMERS_BELL, chunks)

    def _consumers_bell(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if pid == conn.get_server_pid():
            return  # our own announcement
        try:
            epoch_s, *parts = payload.split()
            epoch = int(epoch_s)
            until = time.monotonic() + CREDIT_FRESH
            for part in parts:
                fields = part.split(":")
                rank = int(fields[2]) if len(fields) > 2 else 0
                credit = Credit(int(fields[1]), rank, fields[3:] == ["p"], until)
                self._credit.setdefault(int(fields[0]), {})[epoch] = credit
        except ValueError:
            log.warning("pg cluster: unreadable consumer credit announcement %r", payload[:80])

    # -- purges across members (storage/pg/purge.py) ----------------------------------------------------------
    def _purge_bell(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        """Another member purged a queue and marked the rows this member holds: the queue's prefix goes back at
        once (nothing of it is delivered from now on) and the acker answers after the ops made before."""
        request = purging.Request.parse(payload)
        if request is None or self.fenced or self.epoch not in request.holders:
            return
        delivered: list[int] = []
        for q in self.queues.values():
            lo, hi = q.priority_range
            if q.queue_id == request.queue_id and lo <= request.hi and request.lo <= hi and not q.closed:
                delivered.extend(q.purge_asked())
        self.acker.answer(purging.Answer(request, delivered, self.epoch))

    def _purged_bell(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self.purge_waits.answered(payload)

    def credit(self, queue_id: int) -> list[Credit]:
        """What other members announced of their consumers of the queue within CREDIT_FRESH seconds."""
        members = self._credit.get(queue_id)
        if not members:
            return []
        now = time.monotonic()
        fresh = []
        for epoch, credit in list(members.items()):
            if credit.until < now:
                del members[epoch]
            else:
                fresh.append(credit)
        if not members:
            del self._credit[queue_id]
        return fresh

    # -- the cluster's name -----------------------------------------------------------------------------------
    async def init_cluster_name(self, configured: str | None, default: str) -> str:
        """The cluster's name at this member's start: ``configured`` (the ``cluster_name`` key) is set for the
        whole cluster, as RabbitMQ applies its configured cluster_name at boot; without it the stored name is
        kept, and a new cluster takes ``default`` (its first member's node name, RabbitMQ's default)."""
        async with self._lease_lock, self.lease_conn.transaction():
            if configured is not None:
                await self._write_cluster_name(configured)
                name = configured
            else:
                await self.lease_conn.execute(
                    "INSERT INTO leveret.cluster_setting (key, value, writer) VALUES ('cluster_name', $1, $2) "
                    "ON CONFLICT (key) DO NOTHING", default, self.node_name)
                name = str(await self.lease_conn.fetchval(READ_CLUSTER_NAME))
        self._cluster_name_is(name)
        return name

    async def set_cluster_name(self, name: str) -> None:
        """PUT /api/cluster-name: the cluster's new name, committed and NOTIFYed to every member in one
        transaction (awaited on the lease session: the loop is not blocked, and the reply waits for the commit)."""
        async with self._lease_lock, self.lease_conn.transaction():
            await self._write_cluster_name(name)
        self._cluster_name_is(name)

    async def _write_cluster_name(self, name: str) -> None:
        await self.lease_conn.execute(
            "INSERT INTO leveret.cluster_setting (key, value, writer) VALUES ('cluster_name', $1, $2) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, writer = excluded.writer, updated_at = now()",
            name, self.node_name)
        await self.lease_conn.execute("SELECT pg_notify($1, $2)", CLUSTER_NAME_BELL, name)

    def _cluster_name_bell(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self._cluster_name_is(payload)

    def _cluster_name_is(self, name: str) -> None:
        if name != self.cluster_name:
            self.cluster_name = name
            if self.on_cluster_name is not None:
                self.on_cluster_name(name)

    async def delete_queue(self, vhost: str, name: str) -> int:
        """Drop the queue's rows (every node's) and its registry row; returns how many messages went."""
        for key, q in list(self.queues.items()):
            if key[:2] == (vhost, name):
                q.delete_and_terminate()
                q.closed = True
                del self.queues[key]
        await self.wait_idle()
        async with self._lease_lock, self.lease_conn.transaction():
            qid = await self.lease_conn.fetchval(
                "DELETE FROM leveret.queue WHERE vhost = $1 AND name = $2 RETURNING queue_id", vhost, name)
            if qid is None:
                return 0
            status = await self.lease_conn.execute("DELETE FROM leveret.message WHERE queue_id = $1", qid)
        return int(status.split()[-1])

    async def members(self) -> list[dict[str, Any]]:
        async with self._lease_lock:
            rows = await self.lease_conn.fetch(
                "SELECT name, epoch, started_at, lease_until, "
                "(dead_at IS NULL AND stopped_at IS NULL AND lease_until > now()) AS alive "
                "FROM leveret.node ORDER BY epoch")
        return [dict(r) for r in rows]

    async def forget(self, name: str) -> Forgotten:
        """Remove the member ``name``, which is not running, from the cluster (storage/pg/forget.py); raises
        NotForgettable for this node itself, a running member or an unknown name. On a session of its own,
        not the lease session: deleting a long backlog forwarded to that member must not hold up this node's
        heartbeat (it would fence itself)."""
        if name == self.node_name:
            raise NotForgettable(f"node {name} is the node asked: it cannot forget itself")
        conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT)
        try:
            gone = await forget_member(conn, name)
        finally:
            conn.terminate()
        self._wake(set(gone.requeued_in))  # its reservations are ready again: fetchers here, and (the doorbell)
        self.ring(set(gone.requeued_in))  # every other member's, as the reaper does
        return gone

    # -- lease, reaper, fencing ----------------------------------------------------------------------------
    def fence(self, reason: str, epoch: int | None = None) -> None:
        """This node can no longer vouch for its reservations: drop them locally (peers requeue them), end
        every session, and reconnect under a new epoch. ``epoch``: the epoch the failure was seen under (a
        failure of a session from before the last reconnect is ignored)."""
        if self.fenced or (epoch is not None and epoch != self.epoch):
            return
        self.fenced = True
        self.fence_reason = reason
        log.error("pg cluster: node %s (epoch %d) fenced: %s", self.node_name, self.epoch, reason)
        for q in self.queues.values():
            q.fence()
        self.purge_waits.finish_all()  # (purge_done of a fenced queue answers with its estimate)
        for q in self._sac_held.values():  # the locks went with the sessions
            self._sac_set(q, False, fenced=True)
        self._sac_held.clear()
        # End every session now: with one of them gone the others would keep the key, and this node's
        # reservations would wait for a clean close instead of going to a peer's reaper at once.
        for c in self.conns:
            c.terminate()
        self.progress.changed()
        if not self._closing and self.dsn and self._reconnect_task is None:
            self._reconnect_task = self.loop.create_task(self._reconnect_loop())
        if self.on_fenced is not None:
            self.on_fenced(reason)

    async def _lease_loop(self, epoch: int) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL)
            left = self.lease_seconds - (time.monotonic() - self._last_heartbeat)
            if left <= 0:  # we were stopped or cut off past our lease
                self.fence("lease expired before the heartbeat", epoch)
                return
            conn = self.lease_conn
            try:
                # Bounded by what is left of the lease: a server that stopped answering (no reset, no reply)
                # must not hold the loop past it, or nothing would notice that the lease is gone.
                if await asyncio.wait_for(self._lease_step(epoch, conn), left):
                    return
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                self.fence(f"PostgreSQL did not answer within the lease ({self.lease_seconds:g} s)", epoch)
                return
            except Exception as e:
                if disconnected(e, conn):
                    self.fence(f"lease connection: {e}", epoch)
                    return
                log.exception("pg cluster: lease step failed")

    async def _lease_step(self, epoch: int, conn: asyncpg.Connection) -> bool:
        """One round: the heartbeat when due, the reaper, the single-active-consumer locks. True: stop."""
        now = time.monotonic()
        async with self._lease_lock:
            if self.fenced or self.epoch != epoch:
                return True
            if now - self._last_heartbeat >= self.lease_seconds / 3:
                row = await conn.fetchrow(HEARTBEAT, epoch, self.lease_seconds)
                if row is None or row["dead_at"] is not None:  # (no row: forgotten, storage/pg/forget.py)
                    self.fence("a peer declared this node dead" if row is not None else "this node's row is gone",
                               epoch)
                    return True
                self._last_heartbeat = now
                name = await conn.fetchval(READ_CLUSTER_NAME)  # a rename missed while cut off
                if name is not None:
                    self._cluster_name_is(str(name))
            await self._reap()
            if self._sac_wanted or self._sac_held:
                await self._sac_step()
            await self._announce_credit(conn, epoch)
            if self.planner_statistics is not None:
                await self.planner_statistics.check(conn)
        return False

    async def reap(self) -> None:
        """Requeue the reservations of every peer none of whose sessions remains; terminate the sessions of a
        peer whose lease has passed (it is hung), so that the next round can reap it. (The lease loop does
        this every 0.5 s; a test may call it to make a round happen now.)"""
        async with self._lease_lock:
            await self._reap()

    async def _reap(self) -> None:
        conn = self.lease_conn
        for peer in await conn.fetch(PEERS, self.epoch):
            epoch = int(peer["epoch"])
            if await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LEASE_KEY, epoch):
                try:
                    async with conn.transaction():
                        back = await conn.fetch(REAP + " RETURNING queue_id", epoch)
                        await conn.execute("UPDATE leveret.node SET dead_at = now() WHERE epoch = $1", epoch)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock($1, $2)", LEASE_KEY, epoch)
                self.reaped.append(epoch)
                log.warning("pg cluster: reaped node epoch %d, requeued %d rows", epoch, len(back))
                qids = {int(r[0]) for r in back}
                self._wake(qids)  # this node's waiting fetchers, and (the doorbell) the other nodes'
                self.ring(qids)
            elif peer["expired"]:
                log.warning("pg cluster: node epoch %d is past its lease: terminating its sessions", epoch)
                await conn.execute(HOLDERS, LEASE_KEY, epoch)
        await conn.execute(SWEEP)

    # -- stop ----------------------------------------------------------------------------------------------
    def idle(self) -> bool:
        return self.fenced or (self.publisher.idle() and self.acker.idle() and self.fetcher.idle())

    async def wait_idle(self) -> None:
        """Until every buffered publish is committed, every op applied and no wanted fetch is pending."""
        self.publisher.request()
        await self.progress.until(self.idle)

    async def close(self) -> None:
        """Clean stop: hand back what this node holds, requeue any reservation left, mark the row stopped."""
        if self._closing:
            return
        self._closing = True
        for q in self.queues.values():
            q.close()
        if not self.fenced:
            try:
                await asyncio.wait_for(self.progress.until(
                    lambda: self.fenced or (self.publisher.idle() and self.acker.idle())), CLOSE_DRAIN_TIMEOUT)
            except TimeoutError:
                # A stop must not hang (once seen in CI on a loaded machine: a unit test's teardown waited
                # more than 10 s). What is left is requeued below, so it is delivered again, not lost.
                log.warning("pg cluster: node %s stops with work not done after %g s (publisher idle: %s, "
                            "acker idle: %s); its reservations go back to the queues", self.node_name,
                            CLOSE_DRAIN_TIMEOUT, self.publisher.idle(), self.acker.idle())
        self.purge_waits.finish_all()
        tasks = [t for t in (self._lease_task, self._block_task, self._ring_task, self._reconnect_task,
                             self._sac_task,
                             self.publisher.task,
                             self.acker.task, self.fetcher.task) if t]
        if self.planner_statistics is not None:
            await self.planner_statistics.close()
        if tasks:
            # Cancelled again while running (a cancel that wait_for swallowed: storage/pg/connections.py).
            pending = await stop_tasks(*tasks, timeout=CLOSE_DRAIN_TIMEOUT)
            if pending:  # a task stuck in a statement that ignores the cancel: end the sessions under it
                log.warning("pg cluster: node %s: tasks still running %g s after their cancel: %s", self.node_name,
                            CLOSE_DRAIN_TIMEOUT, [t.get_coro() for t in pending])
                for c in self.conns:
                    c.terminate()
                await asyncio.wait(pending, timeout=2)
        try:
            if not self.fenced and not self.lease_conn.is_closed():
                async with self.lease_conn.transaction():
                    await self.lease_conn.execute(REAP, self.epoch)
                    await self.lease_conn.execute(
                        "UPDATE leveret.node SET stopped_at = now() WHERE epoch = $1", self.epoch)
        except (*DISCONNECTED, asyncpg.InterfaceError) as e:  # gone meanwhile: a peer (or our next start) reaps us
            log.warning("pg cluster: node %s could not record its clean stop: %s", self.node_name, e)
        finally:
            for c in self.conns:
                if self.fenced or c.is_closed():
                    c.terminate()
                else:
                    try:
                        await c.close(timeout=2)
                    except (*DISCONNECTED, asyncpg.InterfaceError, asyncpg.PostgresError):
                        c.terminate()
        log.info("pg cluster: node %s (epoch %d) stopped", self.node_name, self.epoch)


async def _refuse_live_namesake(conn: asyncpg.Connection, node_name: str) -> None:
    """Raise NameTaken if a run of ``node_name`` is alive: a session still holds its epoch's key and its lease
    is live. A run whose sessions have all ended (the same node killed -9 and started again) is no obstacle:
    PostgreSQL ended its sessions with its process, so the restart goes on at once and a peer's reaper (or
    this node's own, for a lone member) requeues what it held. A run whose key is still held past its lease
    is hung, or its host died without closing its sockets: its sessions are ended, as a peer's reaper does,
    so that a member restarted after a host crash does not wait for TCP keepalives. Called under the name's
    lock (two starts of one name are serialised), before this run's row is inserted."""
    for row in await conn.fetch(NAMESAKES, node_name, LEASE_KEY):
        if not row["held"]:
            continue
        if row["leased"]:
            raise NameTaken(
                f"node name {node_name} is taken by a running member of this cluster (epoch {row['epoch']}, "
                f"started {row['started_at']:%Y-%m-%d %H:%M:%S%z}): give this node another with "
                f"leveret.nodename (or LEVERET_NODENAME)")
        log.warning("pg cluster: an earlier run of node %s (epoch %d) is past its lease: ending its sessions",
                    node_name, row["epoch"])
        await conn.execute(END_SESSIONS, LEASE_KEY, row["epoch"])


async def _join(dsn: str, node_name: str, lease_seconds: float, *, migrate: bool = False,
                refuse_namesake: bool = False) -> tuple[int, list[asyncpg.Connection], int]:
    """Open a node's four sessions under a new epoch: (migrate,) draw the epoch, hold its key in shared mode
    on every session, then register the node row. Returns (epoch, connections, a seq block).
    ``refuse_namesake`` (a start, not a reconnect: a fenced run's own old epoch may still look alive): raise
    NameTaken when another running member has this name."""
    conns: list[asyncpg.Connection] = []
    try:
        conns.append(await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT))
        if migrate:
            await schema.migrate(conns[0])
        epoch = int(await conns[0].fetchval("SELECT nextval('leveret.node_epoch')"))
        for _ in range(3):
            conns.append(await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT))
        for c in conns:
            await c.execute("SELECT pg_advisory_lock_shared($1, $2)", LEASE_KEY, epoch)
        block = int(await conns[0].fetchval(NEXT_BLOCK))
        async with conns[0].transaction():
            # Under the name's lock: a forget of this name (storage/pg/forget.py) runs wholly before or after.
            await conns[0].execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", NAME_LOCK_CLASS, node_name)
            if refuse_namesake:
                await _refuse_live_namesake(conns[0], node_name)
            await conns[0].execute(
                "INSERT INTO leveret.node (epoch, name, lease_pid, lease_until) "
                "VALUES ($1, $2, pg_backend_pid(), now() + $3 * interval '1 second')",
                epoch, node_name, lease_seconds)
            # The node-wide counters of its previous run are not this run's (its overview figures start again).
            await conns[0].execute("DELETE FROM leveret.node_stats WHERE node = $1", node_name)
    except BaseException:
        for c in conns:
            c.terminate()  # not close(): a session to a server gone away would wait for its answer
        raise
    return epoch, conns, block
