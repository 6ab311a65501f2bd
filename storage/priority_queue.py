"""A BackingQueue of backing queues, one per priority (RabbitMQ's ``rabbit_priority_queue``).

``fetch`` serves the highest priority that has a ready message. Each sub-queue numbers its messages
itself; the seq_id this queue hands out packs the sub-queue's seq_id and the priority,
``sub_seq_id << 8 | priority``, so acks and requeues find their sub-queue without a lookup table and
seq_ids still grow with publish order within a priority.

The head of the queue (for TTL: ``head_expiry``, ``dropwhile``, ``fetchwhile``, ``peek``) is the head of
the highest priority that has a ready message, the one ``fetch`` would take. The sub-queues' ``on_confirm``
and ``on_available`` are forwarded to this queue's own, which its owner sets like any backing queue's.
Every member of the BackingQueue Protocol is here, so it runs the conformance suite like the others.

Its levels are all stores of one kind (the node's, or a cluster's shared store for a priority quorum queue),
and it is shared when they are: the shared-store members pass on to the levels, so a priority quorum queue's
``x-delivery-count`` counts the returns on every member, its basic.get and declare-ok wait for PostgreSQL's
rows as a plain one's do, and a single active consumer is single cluster-wide (the lock is the queue's: the
level 0 store asks for it). Over local levels they are the levels' null members.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from storage.backing_queue import BackingQueue, Figures

_SHIFT = 8
_MASK = (1 << _SHIFT) - 1


class PriorityBackingQueue:
    def __init__(self, max_priority: int, priority_of: Callable[[Any], int],
                 make_queue: Callable[[int], BackingQueue]) -> None:
        if not 1 <= max_priority <= 255:
            raise ValueError("max_priority must be within 1..255")
        self.max_priority = max_priority
        self._priority_of = priority_of
        self._queues = [make_queue(p) for p in range(max_priority + 1)]
        self.on_confirm: Callable[[], None] | None = None
        self.on_available: Callable[[], None] | None = None
        for q in self._queues:
            q.on_confirm = self._sub_confirmed
            q.on_available = self._sub_available
        level0 = self._queues[0]
        self.shared = level0.shared
        self.persists_every_message = level0.persists_every_message
        self.on_sac_change: Callable[[bool], None] | None = None
        level0.on_sac_change = self._sac_changed

    def _sub_confirmed(self) -> None:
        if self.on_confirm is not None:
            self.on_confirm()

    def _sub_available(self) -> None:
        if self.on_available is not None:
            self.on_available()

    def _sub(self, msg: Any) -> tuple[int, BackingQueue]:
        p = self._priority_of(msg)
        p = 0 if p < 0 else min(p, self.max_priority)
        return p, self._queues[p]

    def _head_queue(self) -> tuple[int, BackingQueue] | None:
        """The highest priority with a ready message, and its sub-queue."""
        for p in range(self.max_priority, -1, -1):
            q = self._queues[p]
            if not q.is_empty():
                return p, q
        return None

    def publish(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                confirm: Any = None, msg_id: int | None = None) -> int:
        p, q = self._sub(msg)
        return (q.publish(msg, size, persistent, expiry, confirm, msg_id) << _SHIFT) | p

    def publish_delivered(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                          confirm: Any = None, msg_id: int | None = None) -> int:
        p, q = self._sub(msg)
        return (q.publish_delivered(msg, size, persistent, expiry, confirm, msg_id) << _SHIFT) | p

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None:
        for p in range(self.max_priority, -1, -1):
            q = self._queues[p]
            if not q.is_empty():
                got = q.fetch(ack_required)
                if got is not None:
                    seq_id, msg, delivered = got
                    return (seq_id << _SHIFT) | p, msg, delivered
        return None

    # -- the head: TTL -------------------------------------------------------------------------------------
    def peek(self) -> Any | None:
        head = self._head_queue()
        return None if head is None else head[1].peek()

    def peek_many(self, count: int) -> list[tuple[int, Any, bool]]:
        """Up to ``count`` ready messages in fetch order: the highest priority's first."""
        out: list[tuple[int, Any, bool]] = []
        for p in range(self.max_priority, -1, -1):
            if len(out) >= count:
                break
            q = self._queues[p]
            if not q.is_empty():
                out.extend(((seq_id << _SHIFT) | p, msg, delivered)
                           for seq_id, msg, delivered in q.peek_many(count - len(out)))
        return out

    def head_expiry(self) -> int | None:
        head = self._head_queue()
        return None if head is None else head[1].head_expiry()

    def dropwhile(self, pred: Callable[[int | None], bool]) -> tuple[int, int | None]:
        """Drop from the head while ``pred`` holds, going down the priorities as each one empties."""
        dropped = 0
        while True:
            head = self._head_queue()
            if head is None:
                return dropped, None
            q = head[1]
            n, expiry = q.dropwhile(pred)
            dropped += n
            if not q.is_empty():
                return dropped, expiry

    def fetchwhile(self, pred: Callable[[int | None], bool]) -> list[tuple[int, Any, bool]]:
        out: list[tuple[int, Any, bool]] = []
        while True:
            head = self._head_queue()
            if head is None:
                return out
            p, q = head
            out.extend(((seq_id << _SHIFT) | p, msg, delivered) for seq_id, msg, delivered in q.fetchwhile(pred))
            if not q.is_empty():
                return out

    # -- acks ---------------------------------------------------------------------------------------------
    def _split(self, seq_ids: Iterable[int]) -> dict[int, list[int]]:
        by_priority: dict[int, list[int]] = {}
        for seq_id in seq_ids:
            by_priority.setdefault(seq_id & _MASK, []).append(seq_id >> _SHIFT)
        return by_priority

    def ack(self, seq_ids: Iterable[int]) -> list[Any]:
        out: list[Any] = []
        for p, ids in self._split(seq_ids).items():
            if p < len(self._queues):
                out.extend(self._queues[p].ack(ids))
        return out

    def requeue(self, seq_ids: Iterable[int]) -> None:
        for p, ids in self._split(seq_ids).items():
            if p < len(self._queues):
                self._queues[p].requeue(ids)

    # -- queue-wide -----------------------------------------------------------------------------------------
    def purge(self) -> int:
        return sum(q.purge() for q in self._queues)

    def len(self) -> int:
        return sum(q.len() for q in self._queues)

    def is_empty(self) -> bool:
        return all(q.is_empty() for q in self._queues)

    def pending_ack_count(self) -> int:
        return sum(q.pending_ack_count() for q in self._queues)

    def ready_bytes(self) -> int:
        return sum(q.ready_bytes() for q in self._queues)

    def figures(self) -> Figures:
        """The sums of the sub-queues' figures."""
        ready = unacked = ready_bytes = unacked_bytes = paged_out = 0
        for q in self._queues:
            f = q.figures()
            ready += f.ready
            unacked += f.unacked
            ready_bytes += f.ready_bytes
            unacked_bytes += f.unacked_bytes
            paged_out += f.paged_out
        return Figures(ready, unacked, ready_bytes, unacked_bytes, paged_out)

    def drain_confirmed(self) -> list[Any]:
        out: list[Any] = []
        for q in self._queues:
            out.extend(q.drain_confirmed())
        return out

    def drain_failed(self) -> list[Any]:
        out: list[Any] = []
        for q in self._queues:
            out.extend(q.drain_failed())
        return out

    def delete_and_terminate(self) -> int:
        return sum(q.delete_and_terminate() for q in self._queues)

    def close(self) -> None:
        for q in self._queues:
            q.close()

    def origins_held(self, seqs: set[int]) -> set[int]:
        return set().union(*(q.origins_held(seqs) for q in self._queues))

    def set_demand(self, wanted: bool) -> None:
        """Every level looks (one of them may be filled by someone else)."""
        for q in self._queues:
            q.set_demand(wanted)

    # -- a store shared by a cluster's members: passed on to the levels -----------------------------------------
    def set_room(self, room: Callable[[int], int]) -> None:
        """Every level's reservations are bounded by the consumers' room (a shared store's; see its own)."""
        for q in self._queues:
            q.set_room(room)

    def set_rank(self, rank: Callable[[], int | None]) -> None:
        """Not passed on: a priority quorum queue is not dealt (``deal_here``), so its consumers' priorities
        rank within their own member only (a documented difference, docs/cluster.md)."""

    def awaits_fetch(self) -> bool:
        return any(q.awaits_fetch() for q in self._queues)

    def deal_here(self) -> bool:
        """Not dealt: the level a publish goes to is chosen after this answer, so a priority quorum queue's
        publishing member still delivers straight to its own consumers (a documented difference)."""
        return True

    def expect_takes(self, count: int) -> None:
        """Every level: the takes may come from any of them (each reserves at most ``count``)."""
        for q in self._queues:
            q.expect_takes(count)

    def hand_back_unused(self) -> None:
        """Every level's rows reserved only to judge the head go back (a shared store's; see its own), unless
        a basic.get waits on any level: it waits for every level's round and then takes the highest."""
        if self.awaits_fetch():
            return
        for q in self._queues:
            q.hand_back_unused()

    def returns(self, seq_id: int) -> int:
        """How many times the message just fetched went back to the queue before, on any member."""
        p = seq_id & _MASK
        return self._queues[p].returns(seq_id >> _SHIFT) if p < len(self._queues) else 0

    def when_fetched(self, callback: Callable[[], None]) -> bool:
        """Every level reserves now; ``callback`` once all of them are done (each within a second)."""
        return self._when_all([q.when_fetched for q in self._queues], callback)

    def when_counted(self, callback: Callable[[], None]) -> bool:
        """Every level recounts now; ``callback`` once all of them are done (each within a second)."""
        return self._when_all([q.when_counted for q in self._queues], callback)

    def when_purged(self, callback: Callable[[int], None]) -> bool:
        """False: purge-ok answers the sum of the levels' ``purge`` at once (the levels' PostgreSQL purges are
        not waited for, as before the levels' calls were declared)."""
        return False

    @staticmethod
    def _when_all(asks: list[Callable[[Callable[[], None]], bool]], callback: Callable[[], None]) -> bool:
        left = 1  # held until every level is asked, so that a level answering at once cannot finish early

        def one_done() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                callback()

        asked = 0
        for ask in asks:
            left += 1
            if ask(one_done):
                asked += 1
            else:
                left -= 1
        if not asked:
            return False
        one_done()
        return True

    @property
    def sac_active(self) -> bool:
        return self._queues[0].sac_active

    def want_single_active(self, wanted: bool) -> None:
        self._queues[0].want_single_active(wanted)

    def _sac_changed(self, active: bool) -> None:
        if self.on_sac_change is not None:
            self.on_sac_change(active)

    # -- memory: the budget is shared out evenly between the sub-queues that hold messages ---------------
    def set_ram_budget(self, max_bytes: int | None) -> None:
        busy = [q for q in self._queues if not q.is_empty()] or self._queues
        for q in self._queues:
            q.set_ram_budget(None if max_bytes is None else (max_bytes // len(busy) if q in busy else 0))

    def needs_timeout(self) -> bool:
        return any(q.needs_timeout() for q in self._queues)

    def timeout(self) -> None:
        for q in self._queues:
            if q.needs_timeout():
                q.timeout()

    def ram_bytes(self) -> int:
        return sum(q.ram_bytes() for q in self._queues)

