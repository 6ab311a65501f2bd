"""PgBackingQueue: one node's view of a queue whose messages live in PostgreSQL (docs/decisions/postgres-cluster.md).

It implements storage.backing_queue.BackingQueue as an *asynchronous store*: every call answers at once from
memory, and the node's workers (storage/pg/workers.py, one connection each) carry the work to PostgreSQL once
per event-loop burst:
- ``publish`` numbers the message from the node's seq block (so the seq id is PostgreSQL's ordering key and
  known at once) and buffers it; the publisher inserts the burst in one statement and confirms after it commits.
- ``fetch`` serves a local prefix of rows this node reserved (state 1, owner = the node's epoch); when it is
  empty it answers None, asks the fetcher for a batch (``FOR UPDATE SKIP LOCKED``, up to 100 and no more
  than the owner's consumers here can take: ``set_room``, workers.py ``batch_for``) and calls
  ``on_available`` when rows arrive. With nothing known to be ready the queue is polled about once a second
  (another node may publish).
- acks, requeues, purges go to the acker as ops in call order; a requeue also hands the local prefix back, so
  the requeued message is fetched again at its original place.
- ``returns(seq)`` tells the queue how many times the message just fetched went back to the queue before, on
  any node (quorum queues' ``x-delivery-count`` and delivery limit): PostgreSQL's ``delivery_count`` counts
  reservations, a release (prefix handed back undelivered) takes its own back, so a reserved row's count
  less one is its returns.
- ``when_fetched(callback)``: a basic.get that finds no row at hand waits for one reservation round (rows
  another node published, or this node's own not yet reserved) instead of answering get-empty at once;
  ``when_counted(callback)``: a queue.declare-ok waits for a recount begun after it came, so its message
  count includes what other nodes published before (a passive declare after a confirm from another node).
Counts are kept in memory (exact for this node's own work) and reconciled by a periodic recount, so ``len()``
and ``figures()`` never query.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from storage.backing_queue import Figures

# How long reserved rows may sit in the prefix untouched before they go back to the shared queue: a node
# whose consumers left must not hide messages from the other nodes.
RELEASE_IDLE_AFTER = 2.0
# A message the publishing member dealt to other members' consumers (deal_here) is left to them this long
# after its insert; if none of them reserved it by then, this member's own consumers may (a member whose
# consumers left or filled up meanwhile does not hold it for long).
AWAY_GRACE = 0.2
DEAL_ROOM_MOST = 100  # the local room deal_here weighs is read up to this (a fetch batch)


class Credit(NamedTuple):
    """What another member announced of its consumers of a queue (storage/pg/cluster.py ``CONSUMERS_BELL``)."""

    room: int  # how many more messages they could take (capped at one fetch batch)
    rank: int  # the priority of the highest of them with room (x-priority; 0 by default)
    published: bool  # that member publishes to the queue itself: it feeds its own consumers, none is dealt to it
    until: float  # monotonic time the announcement is stale after


class Node(Protocol):
    """What a queue needs of its node (PgCluster): seq ids, and the three workers' doorbells."""

    fenced: bool
    loop: asyncio.AbstractEventLoop
    epoch: int

    def next_seq(self) -> int: ...

    def schedule_publish(self, q: PgBackingQueue) -> None: ...

    def schedule_ops(self, q: PgBackingQueue) -> int: ...

    def want_fetch(self, q: PgBackingQueue) -> None: ...

    def want_recount(self, q: PgBackingQueue) -> None: ...

    def want_single_active(self, q: PgBackingQueue, wanted: bool) -> None: ...

    def credit(self, queue_id: int) -> list[Credit]: ...


class Row:
    """A published message not yet committed (in the queue's buffer, or in the publisher's statement)."""

    __slots__ = ("away", "confirm", "expiry", "msg", "persistent", "pgen", "redelivered", "seq", "size", "state")

    def __init__(self, seq: int, msg: Any, size: int, persistent: bool, expiry: int | None, state: int,
                 confirm: Any) -> None:
        self.seq = seq
        self.msg = msg
        self.size = size
        self.persistent = persistent
        self.expiry = expiry
        self.state = state  # 0 ready, 1 delivered (publish_delivered)
        self.redelivered = state == 1
        self.confirm = confirm
        self.pgen = 0  # the queue's purge generation when the publisher took it
        self.away = False  # dealt to other members' consumers (deal_here): not reserved here for AWAY_GRACE


class Buffered(NamedTuple):
    seq: int
    msg: Any
    size: int
    redelivered: bool
    expiry: int | None
    returns: int = 0  # times the message went back to the queue before this reservation (any node's)


class Op(NamedTuple):
    """One change for the acker, in call order. kind: ack (delete own rows), requeue (redelivered), release
    (redelivered unchanged), purge (ready rows and ``seqs``, own), delete (every row of the queue)."""

    kind: str
    seqs: list[int]
    n: int  # ready messages this op brings back (requeue/release), moved to the DB count at commit
    nbytes: int
    pgen: int
    epoch: int  # the node's epoch when the op was made: an ack, requeue or release of an older one is dropped


class PgBackingQueue:
    # The queue process hands every message over as persistent (confirmed after its commit), transient ones
    # too, as a quorum queue keeps and confirms every message once a quorum has it: a confirmed message is in
    # PostgreSQL, where every node sees it (and a kill -9 of this node cannot lose it).
    persists_every_message = True
    # Every member publishes to and delivers from this store: the queue process uses the shared-store members
    # of the BackingQueue Protocol (storage/backing_queue.py) with it.
    shared = True

    def __init__(self, node: Node, vhost: str, name: str, priority: int | None = None,
                 on_confirm: Callable[[], None] | None = None, encode: Callable[[Any], bytes] | None = None,
                 decode: Callable[[bytes], Any] | None = None) -> None:
        self.node = node
        self.encode = encode  # the publisher encodes once, at the insert; the fetcher decodes at the reservation
        self.decode = decode
        self.vhost = vhost
        self.name = name
        self.priority = priority
        self.priority_range = (-32768, 32767) if priority is None else (priority, priority)
        self.queue_id: int | None = None
        self.on_confirm: Callable[[], None] | None = on_confirm
        self.on_available: Callable[[], None] | None = None
        self.pub: dict[int, Row] = {}  # not yet taken by the publisher
        self.buffer: deque[Buffered] = deque()  # reserved by this node, not yet fetched
        self.pending: dict[int, tuple[Any, int]] = {}  # fetched with ack required: msg, size
        self.ops: list[Op] = []
        self.unflushed_ready = 0  # ready rows in pub or in the publisher's statement
        self.unflushed_bytes = 0
        self.requeued = 0  # ready rows handed back by ops not yet committed
        self.requeued_bytes = 0
        self.db_ready = 0  # ready rows in PostgreSQL, as far as this node knows
        self.db_ready_bytes = 0
        self.others_unacked = 0  # rows other nodes hold reserved (last recount)
        self.others_unacked_bytes = 0
        self.confirmed: list[Any] = []
        self._confirm_scheduled = False  # _tell_confirmed is due on the next loop turn
        self.failed: list[Any] = []
        self.pgen = 0  # bumped by purge/delete: in-flight work from before no longer counts
        self.rgen = 0  # bumped when the prefix is handed back: an in-flight reservation goes back too
        self.changes = 0  # bumped whenever a commit for this queue lands (recount races)
        self.hungry = False  # a fetch found nothing: the fetcher reserves (now, or at the next poll)
        self.more = False  # the last reservation came back full: there are likely more rows
        self.last_poll = 0.0
        self.last_take = 0.0
        self.last_op_id = 0  # the acker op id of this queue's newest op
        self.purge_op_id = 0  # publishes after a purge wait for it
        self.inflight_publish = 0  # publisher statements holding this queue's rows
        self.closed = False
        self.count_stale = False  # another node's commit changed the queue: the fetcher recounts it soon
        self.last_recount = 0.0
        self.recount_cost = 0.0  # seconds the last recount statement took (spaces doorbell recounts)
        self._fetched_returns = (-1, 0)  # (seq, returns) of the last fetch: ``returns`` answers from it
        # The head's expiry when this node last handed back rows it had reserved only to judge the head
        # (hand_back_unused): a one-element tuple, or None when not known. head_expiry answers it while the
        # buffer is empty, so the owner's TTL timer, not each publish, makes the next reservation.
        self._head_hint: tuple[int | None] | None = None
        # Whether the owner asked for rows to take (a fetch or peek that found the prefix empty): only then does a
        # member whose consumers have no room reserve. Judging the head (its TTL timer, a consumer waiting on an
        # empty queue) reads the head's expiries instead (``head_read``): rows reserved only to be looked at
        # were skipped by the other members' consumers meanwhile (SKIP LOCKED), which then took newer rows first.
        self._take = False
        # How many of those rows the owner will take for itself with no consumer to hand them to (expect_takes:
        # a drop-head's excess): the reservation takes that many, not a batch. 0: not known.
        self.takes_expected = 0
        self._head_read: list[int | None] = []  # the expiries of the head's rows as last read (head_read)
        # The newest expiry the owner judged expired of those (dropwhile/fetchwhile): the next reservation takes
        # only rows that old, to drop them; None when no such reservation is due.
        self.expired_upto: int | None = None
        # How many more messages the owner's consumers here could take (set_room; None: not told): a
        # reservation takes no more than that (workers.py batch_for), so rows they cannot take stay ready for
        # other nodes' consumers; a basic.get where nobody consumes takes one row.
        self.room: Callable[[int], int] | None = None
        # The priority of the highest consumers here with room (set_rank; None: not told, or none has room).
        # While another member's consumers of a higher priority have room, this member's take nothing (fetch).
        self.rank: Callable[[], int | None] | None = None
        self._rank_timer: asyncio.TimerHandle | None = None
        self._fetch_waiters: list[tuple[int, Callable[[], None]]] = []  # ``when_fetched``: (round, callback)
        # ``when_purged``: (the purge op, publishes it dropped here uninserted, callback(count)).
        self._purge_waiters: list[tuple[Op, int, Callable[[int], None]]] = []
        self._purge_local = 0
        self.reserve_rounds = 0  # reservations begun for this queue (a waiter waits for one begun after it)
        self._count_waiters: list[tuple[int, Callable[[], None]]] = []  # ``when_counted``: (round, callback)
        self.recount_rounds = 0  # recounts begun for this queue
        self._count_timer: asyncio.TimerHandle | None = None
        self._waiters_timer: asyncio.TimerHandle | None = None
        # Single active consumer across the cluster: whether this node holds the queue's lock (its consumers
        # are the queue's active ones), and who is told when that changes (the queue process).
        self.sac_active = False
        self.on_sac_change: Callable[[bool], None] | None = None
        # Fair delivery across members (deal_here): the deal's running share of this member, whether the next
        # publish is dealt away, and when the dealt rows of each commit stop being left to the others (oldest
        # first), with the timer that hands the due ones to this member's fetcher.
        self._deal_credit = 0.0
        self._away_next = False
        self._away: deque[tuple[float, int, int]] = deque()
        # Publishes made here since the last credit announcement (storage/pg/cluster.py _announce_credit): a
        # member that publishes to the queue itself feeds its own consumers and announces no credit.
        self.published_here = 0
        self.away_count = 0  # dealt rows committed and still in their grace (a recount leaves them out)
        # The newest seq of the dealt rows whose grace is over: the reservation made for them takes no newer row
        # (one just dealt to the others is theirs for its own grace). None: no such reservation is due.
        self.reserve_below: int | None = None
        self._away_timer: asyncio.TimerHandle | None = None

    # -- publishing --------------------------------------------------------------------------------------------
    def publish(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                confirm: Any = None, msg_id: int | None = None) -> int:
        return self._add(msg, size, persistent, expiry, confirm, 0)

    def publish_delivered(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                          confirm: Any = None, msg_id: int | None = None) -> int:
        return self._add(msg, size, persistent, expiry, confirm, 1)

    def _add(self, msg: Any, size: int, persistent: bool, expiry: int | None, confirm: Any, state: int) -> int:
        seq = self.node.next_seq()
        self.published_here += 1
        row = self.pub[seq] = Row(seq, msg, size, persistent, expiry, state, confirm)
        if self._away_next:
            self._away_next = False
            row.away = state == 0
        if row.away:
            pass  # not counted here, so the publishes after it are still dealt (``len()`` stays 0)
        elif state == 0:
            self.unflushed_ready += 1
            self.unflushed_bytes += size
        else:
            self.pending[seq] = (msg, size)
        if confirm is not None and not persistent:  # no fsync to wait for: confirmed now (the contract)
            self.confirmed.append(confirm)
        self.node.schedule_publish(self)
        return seq

    def take_rows(self) -> list[Row]:
        """The publisher takes every buffered publish for one statement."""
        rows = list(self.pub.values())
        self.pub.clear()
        for r in rows:
            r.pgen = self.pgen
        self.inflight_publish += 1
        return rows

    def rows_committed(self, rows: list[Row]) -> None:
        self.inflight_publish -= 1
        self.changes += 1
        confirmed = False
        away = newest = 0
        for r in rows:
            if r.away:  # the other members' share: not counted here (so not reserved) until AWAY_GRACE
                if r.pgen == self.pgen:
                    away += 1
                    newest = max(newest, r.seq)
            elif r.state == 0 and r.pgen == self.pgen:
                self.unflushed_ready -= 1
                self.unflushed_bytes -= r.size
                self.db_ready += 1
                self.db_ready_bytes += r.size
            if r.persistent and r.confirm is not None:
                self.confirmed.append(r.confirm)
                confirmed = True
        if away:
            self._away.append((time.monotonic() + AWAY_GRACE, away, newest))
            self.away_count += away
            if self._away_timer is None:
                self._away_timer = self.node.loop.call_later(AWAY_GRACE, self._away_due)
        if confirmed and self.on_confirm is not None:
            self.on_confirm()

    # -- fair delivery across members --------------------------------------------------------------------------
    def deal_here(self) -> bool:
        """Whether the message being published may go straight to a consumer here (``attempt_delivery``), or
        is left in PostgreSQL for other members' consumers. RabbitMQ's quorum queue hands messages round-robin
        to every consumer with credit wherever it is connected; here the publishing member's consumers would
        take everything it publishes (its delivery is immediate, the others learn of the row by a doorbell),
        so the member deals: its share of the messages is its consumers' free credit over theirs and the
        other members' (announced every 0.5 s, storage/pg/cluster.py ``CONSUMERS_BELL``); the rest is
        inserted ready, rung, and not reserved here for AWAY_GRACE (``rows_committed``). Consumer priorities
        rank across members: while another member's consumers of a higher priority than any here with room
        have room, everything is dealt away; consumers of a lower priority elsewhere get no share."""
        if self.queue_id is None or self.room is None:
            return True
        credit = self.node.credit(self.queue_id)
        if not credit:
            return True
        mine = self.room(DEAL_ROOM_MOST)
        if mine <= 0:
            return True
        rank = self._rank()
        if any(c.rank > rank for c in credit):
            self._away_next = True  # consumer priorities rank queue-wide: higher ones elsewhere have room
            return False
        others = sum(c.room for c in credit if c.rank == rank and not c.published)
        if others <= 0:
            return True
        self._deal_credit += mine / (mine + others)
        if self._deal_credit >= 1.0:
            self._deal_credit -= 1.0
            return True
        self._away_next = True
        return False

    def _away_due(self) -> None:
        """Dealt rows whose grace is over: if other members' consumers have not reserved them, this member's
        may. They are looked for by one reservation (``more``), not counted as ready: the others have most
        likely taken them, and a count that says ready would turn this member's publishes from direct delivery
        to the store until a reservation or recount put it right."""
        self._away_timer = None
        now = time.monotonic()
        below = None
        while self._away and self._away[0][0] <= now:
            _, n, newest = self._away.popleft()
            self.away_count -= n
            below = newest
        if self._away:
            self._away_timer = self.node.loop.call_at(
                self.node.loop.time() + max(0.0, self._away[0][0] - now), self._away_due)
        if below is not None and (self.room is None or self.room(1) > 0):
            self.reserve_below = max(below, self.reserve_below or 0)
            self.more = True
            self._want()

    def take_reserve_below(self) -> int | None:
        """For the fetcher: the seq bound of its next reservation (``reserve_below``), once; None when rows this
        member counts as ready are wanted too (those are anyone's, whatever their seq)."""
        below, self.reserve_below = self.reserve_below, None
        if self.db_ready or self.requeued or self.unflushed_ready or self._fetch_waiters:
            return None
        return below

    def _forget_away(self) -> None:
        self._away.clear()
        self.away_count = 0
        self.reserve_below = None
        self._away_next = False
        if self._away_timer is not None:
            self._away_timer.cancel()
            self._away_timer = None

    def rows_failed(self, rows: list[Row]) -> None:
        """The statement failed (or its outcome is unknown): persistent confirms come back as failed."""
        self.inflight_publish -= 1
        failed = False
        for r in rows:
            if r.state == 0 and not r.away and r.pgen == self.pgen:
                self.unflushed_ready -= 1
                self.unflushed_bytes -= r.size
            if r.persistent and r.confirm is not None:
                self.failed.append(r.confirm)
                failed = True
        if failed and self.on_confirm is not None:
            self.on_confirm()

    # -- fetching ----------------------------------------------------------------------------------------------
    def knows_ready(self) -> bool:
        """Rows this node knows are (or will be) ready in PostgreSQL: fetch them now rather than at a poll."""
        return self.more or self.db_ready > 0 or self.requeued > 0 or self.unflushed_ready > 0

    def _want(self) -> None:
        # Also while the node is fenced (PostgreSQL out of reach): the fetcher keeps the wish and acts on it
        # once the node has reconnected, so consumers waiting here resume without anyone asking again.
        if not self.closed:
            self.hungry = True
            self.node.want_fetch(self)

    def rows_reserved(self, rows: list[Buffered], rgen: int, pgen: int, asked: int, changes: int,
                      bounded: bool = False) -> None:
        """The fetcher's batch arrived (sorted by priority, then seq). ``bounded``: it took only rows of a bound
        (expired ones: ``expired_upto``), so fewer than asked says nothing of the rows left."""
        self.changes += 1
        self._take = False
        self.takes_expected = 0
        self._head_read = []  # judged by the rows at hand from now on, or read again
        if bounded and not rows:  # others took them meanwhile: the head is read again
            self._head_hint = None
            self._want()
        if self._fetch_waiters:  # after the rows below are at hand (or not)
            self.node.loop.call_soon(self._tell_fetched, self.reserve_rounds)
        n, nbytes = len(rows), sum(r.size for r in rows)
        if pgen != self.pgen:  # purged while reserving: these were ready then
            if rows:
                self._op("ack", [r.seq for r in rows])
            return
        self.more = n >= asked
        self.db_ready = max(0, self.db_ready - n)
        self.db_ready_bytes = max(0, self.db_ready_bytes - nbytes)
        if n < asked and changes == self.changes - 1 and not bounded:  # nothing else landed: none left we know
            self.db_ready = self.db_ready_bytes = 0
        if rgen != self.rgen or self.closed:  # the prefix was handed back meanwhile: so go these
            if rows:
                self.requeued += n
                self.requeued_bytes += nbytes
                self._op("release", [r.seq for r in rows], n, nbytes)
            return
        if not rows:
            return
        self._head_hint = None
        self.buffer.extend(rows)
        self.hungry = False
        self.last_take = time.monotonic()
        if self.on_available is not None:
            self.on_available()

    def wants_rows(self) -> bool:
        """Whether the owner asked for rows to take since the last reservation (fetch, peek, an expired head)."""
        return self._take

    def head_read(self, expiries: list[int | None], rgen: int, changes: int) -> None:
        """The fetcher read the head's expiries (ready rows, in fetch order; none reserved) because nobody here
        could take a row: the owner judges the head by them (``head_expiry``, its TTL timer)."""
        self.changes += 1
        if self._take and not self.closed:  # a fetch came meanwhile: it reserves now
            self._want()
            return
        self.hungry = False
        if rgen != self.rgen or self.buffer or self.closed:
            return
        if not expiries:
            if changes == self.changes - 1:
                self.db_ready = self.db_ready_bytes = 0
            self.more = False
            return
        self._head_read = expiries
        self._head_hint = (expiries[0],)
        if self.on_available is not None:
            self.on_available()

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None:
        if self.rank is not None and self.queue_id is not None and self._outranked():
            return None
        if not self.buffer:
            self._take = True
            self._want()
            return None
        b = self.buffer.popleft()
        self.last_take = time.monotonic()
        self._fetched_returns = (b.seq, b.returns)
        if ack_required:
            self.pending[b.seq] = (b.msg, b.size)
        else:
            self._op("ack", [b.seq])
        return b.seq, b.msg, b.redelivered

    def _rank(self) -> int:
        rank = self.rank() if self.rank is not None else None
        return 0 if rank is None else rank

    def _outranked(self) -> bool:
        """Whether another member's consumers of a higher priority than the highest here with room have room
        (their announcement fresh): this member's consumers then take nothing, as a quorum queue's consumers of
        lower priority get messages only while the higher ones are blocked (RabbitMQ's consumer priorities).
        Rows reserved here meanwhile go back to the others; ``on_available`` is called when the announcement
        goes stale (those consumers filled up, or left), so that the owner asks again. Without consumers
        here, or none with room (a basic.get), nothing is held back."""
        assert self.queue_id is not None and self.rank is not None
        credit = self.node.credit(self.queue_id)
        if not credit:
            return False
        rank = self.rank()
        if rank is None:
            return False
        above = [c.until for c in credit if c.rank > rank]
        if not above:
            return False
        if self.buffer and not self.awaits_fetch():
            self.release_buffer()
        if self._rank_timer is None:
            self._rank_timer = self.node.loop.call_later(max(0.0, max(above) - time.monotonic()), self._rank_due)
        return True

    def _rank_due(self) -> None:
        self._rank_timer = None
        if self.on_available is not None and not self.closed:
            self.on_available()

    def returns(self, seq_id: int) -> int:
        """How many times the message ``fetch`` just answered (``seq_id``) went back to the queue before,
        whichever node delivered it then (PostgreSQL counts; see the module docstring). 0 for any other."""
        seq, n = self._fetched_returns
        return n if seq == seq_id else 0

    def when_fetched(self, callback: Callable[[], None]) -> bool:
        """A fetch found nothing at hand: if the queue is open and PostgreSQL is within reach, reserve now and
        call ``callback`` once that round is over (rows arrived, or none were ready), or after a second at
        most; returns False (no call) otherwise. basic.get waits so rather than answering get-empty while
        rows another node published, or this node's own, are still in PostgreSQL."""
        if self.buffer or self.closed or self.node.fenced:
            return False
        self._fetch_waiters.append((self.reserve_rounds, callback))
        if self._waiters_timer is None:
            self._waiters_timer = self.node.loop.call_later(1.0, self._tell_fetched, None)
        self.more = True  # reserve at once, not at the next poll
        self._want()
        return True

    def when_counted(self, callback: Callable[[], None]) -> bool:
        """Recount the queue now and call ``callback`` once a recount begun after this call is over (or this
        node's own work in flight made it skip the recount: its own figures are exact; or after a second at
        most); returns False (no call) when the queue is closed or PostgreSQL out of reach."""
        if self.closed or self.node.fenced:
            return False
        self._count_waiters.append((self.recount_rounds, callback))
        if self._count_timer is None:
            self._count_timer = self.node.loop.call_later(1.0, self.recount_over, None)
        self.count_stale = True
        self.node.want_recount(self)
        return True

    def wants_count(self) -> bool:
        return bool(self._count_waiters)

    def recount_over(self, rounds: int | None) -> None:
        """A recount (numbered ``rounds``) is over, or was skipped (None: tell every waiter)."""
        if not self._count_waiters:
            return
        told = [w for w in self._count_waiters if rounds is None or w[0] < rounds]
        self._count_waiters = [w for w in self._count_waiters if rounds is not None and w[0] >= rounds]
        if self._count_timer is not None and not self._count_waiters:
            self._count_timer.cancel()
            self._count_timer = None
        for _, callback in told:
            callback()

    def _tell_fetched(self, rounds: int | None) -> None:
        """Call the waiters whose round is over: those that were waiting before the reservation numbered
        ``rounds`` began (a reservation under way when a basic.get came may have missed the rows it wants);
        every waiter when ``rounds`` is None (the time limit, a fence, the queue closed)."""
        told = [w for w in self._fetch_waiters if rounds is None or w[0] < rounds]
        self._fetch_waiters = [w for w in self._fetch_waiters if rounds is not None and w[0] >= rounds]
        if self._waiters_timer is not None and not self._fetch_waiters:
            self._waiters_timer.cancel()
            self._waiters_timer = None
        if self._fetch_waiters and not self.buffer:  # they need a round of their own
            self.more = True
            self._want()
        for _, callback in told:
            callback()

    def head_expiry(self) -> int | None:
        if self.buffer:
            return self.buffer[0].expiry
        if self._head_hint is not None:
            return self._head_hint[0]
        if self.len():
            self._want()
        return None

    def set_room(self, room: Callable[[int], int]) -> None:
        """``room(most)``: how many more messages the owner's consumers on this node could take, at most
        ``most`` (broker/queues/queue_consumers.py ConsumerSet.room)."""
        self.room = room

    def set_rank(self, rank: Callable[[], int | None]) -> None:
        """``rank()``: the priority of the highest of the owner's consumers on this node with room (None: none
        has room; broker/queues/queue_consumers.py ConsumerSet.rank): announced to the other members with the
        room, and compared with theirs (``_outranked``, ``deal_here``)."""
        self.rank = rank

    def awaits_fetch(self) -> bool:
        """Whether a basic.get waits for a reservation round (when_fetched)."""
        return bool(self._fetch_waiters)

    def expect_takes(self, count: int) -> None:
        self.takes_expected = max(0, count)

    def hand_back_unused(self) -> None:
        """None of the owner's consumers here has room (or it has none), and the head was reserved to judge
        it (its TTL, a drop-head), or for consumers that filled up meanwhile: hand the rows back at once, so that other members' consumers and basic.gets have them now rather than when
        the idle prefix goes back (RELEASE_IDLE_AFTER), and keep the head's expiry for :meth:`head_expiry`
        (the owner's TTL timer comes back for it). A basic.get waiting here keeps them."""
        if not self.buffer or self.awaits_fetch():
            return
        hint = (self.buffer[0].expiry,)
        self.release_buffer()
        self._head_hint = hint

    def peek(self) -> Any | None:
        if self.buffer:
            return self.buffer[0].msg
        if self.len():
            self._take = True  # the message itself is wanted (a TTL changed): only a reservation reads it
            self._want()
        return None

    def peek_many(self, count: int) -> list[tuple[int, Any, bool]]:
        """The HTTP API's peek: the messages this node has reserved, in fetch order; rows still only in
        PostgreSQL are not read (the contract lets an asynchronous store answer what it has at hand)."""
        return [(b.seq, b.msg, b.redelivered) for b in list(self.buffer)[:max(0, count)]]

    def _judged(self, pred: Callable[[int | None], bool]) -> None:
        """The prefix is empty and the owner judges the head by the expiries read (head_read): the rows among
        them it finds expired are reserved next, and only those (``expired_upto``), to be dropped."""
        expired = [e for e in self._head_read if e is not None and pred(e)]
        if expired:
            self.expired_upto = max(expired)
            self._take = True

    def dropwhile(self, pred: Callable[[int | None], bool]) -> tuple[int, int | None]:
        if not self.buffer:
            self._judged(pred)
        dropped: list[int] = []
        while self.buffer and pred(self.buffer[0].expiry):
            dropped.append(self.buffer.popleft().seq)
        if dropped:
            self.last_take = time.monotonic()
            self._op("ack", dropped)
        if not self.buffer and self.len():
            self._head_hint = None  # judged expired (or gone): the head is read again
            self._want()
        return len(dropped), self.buffer[0].expiry if self.buffer else None

    def fetchwhile(self, pred: Callable[[int | None], bool]) -> list[tuple[int, Any, bool]]:
        if not self.buffer:
            self._judged(pred)
        out: list[tuple[int, Any, bool]] = []
        while self.buffer and pred(self.buffer[0].expiry):
            b = self.buffer.popleft()
            self.pending[b.seq] = (b.msg, b.size)
            out.append((b.seq, b.msg, b.redelivered))
        if out:
            self.last_take = time.monotonic()
        if not self.buffer and self.len():
            self._head_hint = None  # judged expired (or gone): the head is read again
            self._want()
        return out

    # -- acks and requeues -------------------------------------------------------------------------------------
    def _op(self, kind: str, seqs: list[int], count: int = 0, nbytes: int = 0) -> None:
        self.ops.append(Op(kind, seqs, count, nbytes, self.pgen, self.node.epoch))
        self.last_op_id = self.node.schedule_ops(self)

    def ack(self, seq_ids: Iterable[int]) -> list[Any]:
        out: list[Any] = []
        to_db: list[int] = []
        confirmed = False
        for s in seq_ids:
            got = self.pending.pop(s, None)
            if got is None:
                continue
            out.append(got[0])
            row = self.pub.pop(s, None)
            if row is None:
                to_db.append(s)
            elif row.persistent and row.confirm is not None:
                # A publish_delivered acked before it was inserted is never inserted, so no commit will
                # confirm it: it is confirmed now, as RabbitMQ confirms a message consumed and acked before
                # it reached the disk. (Without this a confirming publisher whose consumer is on the same
                # node, auto-ack or quick, stalled with its window full.) Told on the next loop turn, not
                # from inside this ack: an auto-ack delivery is acked within the publish that made it, before
                # the publisher's channel has counted the publish as waiting for this queue.
                self.confirmed.append(row.confirm)
                confirmed = True
        if to_db:
            self._op("ack", to_db)
        if confirmed and not self._confirm_scheduled:
            self._confirm_scheduled = True
            self.node.loop.call_soon(self._tell_confirmed)
        return out

    def _tell_confirmed(self) -> None:
        self._confirm_scheduled = False
        if self.confirmed and self.on_confirm is not None:
            self.on_confirm()

    def requeue(self, seq_ids: Iterable[int]) -> None:
        to_db: list[int] = []
        n = nbytes = 0
        any_back = False
        for s in seq_ids:
            got = self.pending.pop(s, None)
            if got is None:
                continue
            any_back = True
            row = self.pub.get(s)
            if row is not None:  # publish_delivered not yet taken: it goes in as ready
                row.state = 0
                self.unflushed_ready += 1
                self.unflushed_bytes += row.size
            else:
                to_db.append(s)
                n += 1
                nbytes += got[1]
        if to_db:
            self.requeued += n
            self.requeued_bytes += nbytes
            self._op("requeue", to_db, n, nbytes)
        if any_back:
            self.release_buffer()

    def release_buffer(self) -> None:
        """Hand the prefix back (redelivered unchanged), so that requeued rows come first again, or because
        nobody fetches here. An in-flight reservation goes back as well when it lands."""
        self.rgen += 1
        if not self.buffer:
            return
        seqs = [b.seq for b in self.buffer]
        nbytes = sum(b.size for b in self.buffer)
        self.buffer.clear()
        self.requeued += len(seqs)
        self.requeued_bytes += nbytes
        self._op("release", seqs, len(seqs), nbytes)

    def ops_committed(self, ops: list[Op], matched_acks: int) -> None:
        self.changes += 1
        for op in ops:
            if op.n and op.pgen == self.pgen:
                self.requeued -= op.n
                self.requeued_bytes -= op.nbytes
                self.db_ready += op.n
                self.db_ready_bytes += op.nbytes

    def ops_failed(self, ops: list[Op]) -> None:
        for op in ops:
            if op.kind == "purge" and self._purge_waiters:
                self.purge_done(op, None)
            if op.n and op.pgen == self.pgen:
                self.requeued -= op.n
                self.requeued_bytes -= op.nbytes

    # -- queue-wide ---------------------------------------------------------------------------------------------
    def purge(self) -> int:
        n = self.len()
        self._purge_local = self._drop_unflushed()
        own = [b.seq for b in self.buffer]
        self.buffer.clear()
        self.rgen += 1
        self._zero_ready()
        self._op("purge", own)
        self.purge_op_id = self.last_op_id
        return n

    def when_purged(self, callback: Callable[[int], None]) -> bool:
        """The purge just made (:meth:`purge`) is an op PostgreSQL carries out later: ``callback(count)`` once
        it has committed, with the rows its DELETE removed (other members' confirmed publishes included) and
        the publishes dropped here before they were inserted; with this node's estimate if it failed. So that
        purge-ok comes after the purge and counts what it purged (RabbitMQ's purge-ok does). False: no call."""
        if self.closed or self.node.fenced or self.purge_op_id != self.last_op_id:
            return False
        self._purge_waiters.append((self.ops[-1], self._purge_local, callback))
        return True

    def purge_done(self, op: Op, deleted: int | None) -> None:
        """The acker's word on a purge op: the rows its DELETE removed, or None if it failed."""
        for waiter in [w for w in self._purge_waiters if w[0] is op]:
            self._purge_waiters.remove(waiter)
            _, local, callback = waiter
            callback(local + deleted if deleted is not None else local)

    def purge_asked(self) -> list[int]:
        """Another member purged the queue and marked the rows this member holds (storage/pg/purge.py): the
        prefix goes back now, so none of it is delivered from here on (a marked row is not released: the answer
        deletes it); returns the rows delivered so far, which stay. The counts are taken again soon."""
        self.release_buffer()
        self.count_stale = True
        self.node.want_recount(self)
        return list(self.pending)

    def delete_and_terminate(self) -> int:
        n = self.len() + len(self.pending)
        self._drop_unflushed(delivered_too=True)
        self.buffer.clear()
        self.pending.clear()
        self.rgen += 1
        self._zero_ready()
        self.others_unacked = self.others_unacked_bytes = 0
        self._op("delete", [])
        self.purge_op_id = self.last_op_id
        return n

    def _zero_ready(self) -> None:
        self.pgen += 1
        self._forget_away()
        self.unflushed_ready = self.unflushed_bytes = 0
        self.requeued = self.requeued_bytes = 0
        self.db_ready = self.db_ready_bytes = 0

    def _drop_unflushed(self, delivered_too: bool = False) -> int:
        """Buffered publishes that are dropped before they are inserted: confirmed now (RabbitMQ confirms a
        purged message too). Returns how many."""
        n = 0
        for seq, row in list(self.pub.items()):
            if row.state == 0 or delivered_too:
                del self.pub[seq]
                n += 1
                if row.persistent and row.confirm is not None:
                    self.confirmed.append(row.confirm)
        return n

    def close(self) -> None:
        """Clean stop: the prefix goes back as it was, pending acks go back marked redelivered."""
        self.requeue(list(self.pending))
        self.release_buffer()
        self.closed = True
        self._forget_away()
        if self._rank_timer is not None:
            self._rank_timer.cancel()
            self._rank_timer = None
        if self._fetch_waiters:
            self.node.loop.call_soon(self._tell_fetched, None)
        if self._count_waiters:
            self.node.loop.call_soon(self.recount_over, None)

    def fence(self) -> None:
        """The node lost its lease or its connection to PostgreSQL: whatever it holds under its epoch is the
        reaper's now (its prefix and its deliveries: an ack of one of them matches nothing, and the reaper
        requeues the row as redelivered); publishes not yet sent are failed (their publishers are nacked);
        ops not yet sent are dropped (they name rows of the old epoch). The counts restart from zero and the
        node's recount after it reconnects puts them right."""
        self.buffer.clear()
        self.pending.clear()
        self.rgen += 1
        if self.pub:
            self.rows_failed(self.take_rows())
        if self.ops:
            self.ops_failed(self.ops)
            self.ops = []
        self.db_ready = self.db_ready_bytes = 0
        self.more = False
        self._forget_away()
        if self._fetch_waiters:
            self.node.loop.call_soon(self._tell_fetched, None)
        if self._count_waiters:
            self.node.loop.call_soon(self.recount_over, None)

    # -- counts ------------------------------------------------------------------------------------------------
    def len(self) -> int:
        return self.unflushed_ready + len(self.buffer) + self.requeued + self.db_ready

    def is_empty(self) -> bool:
        return self.len() == 0

    def pending_ack_count(self) -> int:
        return len(self.pending)

    def ready_bytes(self) -> int:
        return (self.unflushed_bytes + sum(b.size for b in self.buffer) + self.requeued_bytes
                + self.db_ready_bytes)

    def figures(self) -> Figures:
        pending_bytes = sum(size for _, size in self.pending.values())
        return Figures(self.len(), len(self.pending) + self.others_unacked, self.ready_bytes(),
                       pending_bytes + self.others_unacked_bytes, 0)

    def recounted(self, ready: int, ready_bytes: int, others: int, others_bytes: int) -> None:
        """A recount (of a moment when no commit for this queue was in flight) replaces the estimates."""
        was_empty = self.len() == 0
        # Rows dealt to the other members and still in their grace are not counted here (rows_committed);
        # nor are they by a recount, as far as the others have not taken them yet.
        self.db_ready, self.db_ready_bytes = max(0, ready - self.away_count), ready_bytes
        self.others_unacked, self.others_unacked_bytes = others, others_bytes
        # Rows another node published, found by the recount: an owner that skips queues whose len() is 0
        # (a priority queue's sub-queues) learns of them here and fetches (which reserves them).
        if was_empty and ready and self.on_available is not None:
            self.on_available()

    def drain_confirmed(self) -> list[Any]:
        out, self.confirmed = self.confirmed, []
        return out

    def drain_failed(self) -> list[Any]:
        out, self.failed = self.failed, []
        return out

    # -- demand: the owner's consumers wait; other nodes may publish ------------------------------------------------
    def want_single_active(self, wanted: bool) -> None:
        """A single-active-consumer queue has consumers on this node (``wanted``), or no longer has: this node
        asks for the queue's cluster-wide lock, or gives it up (storage/pg/cluster.py ``SAC_KEY``). Only the
        holder delivers to consumers; ``on_sac_change`` says when it gains or loses it."""
        self.node.want_single_active(self, wanted)

    def set_demand(self, wanted: bool) -> None:
        """While the owner's consumers wait on an empty queue, the fetcher looks at the next doorbell or poll
        (another node may publish): ``fetch`` is not called while ``len()`` is 0, so it cannot say so itself."""
        if wanted:
            if not self.buffer:
                self._want()
        else:
            self.hungry = False

    # -- memory: the rows live in PostgreSQL, the prefix is at most one batch ----------------------------------
    def set_ram_budget(self, max_bytes: int | None) -> None:
        pass

    def needs_timeout(self) -> bool:
        return False

    def timeout(self) -> None:
        pass

    def ram_bytes(self) -> int:
        return sum(r.size for r in self.pub.values()) + sum(b.size for b in self.buffer)

    def origins_held(self, seqs: set[int]) -> set[int]:
        return set()  # delayed-message dispatches go to node-local queues only
