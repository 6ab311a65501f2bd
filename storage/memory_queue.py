"""A BackingQueue that keeps everything in memory: for non-durable use where paging is not wanted, and
the reference the conformance suite holds the variable queue to.

Ready messages sit in a deque in seq_id order. Requeued messages always have seq_ids below the deque's
head (anything fetched was taken from the front), so they wait in a heap that ``fetch`` empties first:
that puts them back at their original place, as RabbitMQ does. Nothing reaches disk, so every confirm
is ready at once and nothing survives ``close``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from storage.backing_queue import Figures, LocalStore


class MsgStatus:
    """One message in the queue (the seed's msg_status, reduced to what memory needs)."""

    __slots__ = ("expiry", "is_delivered", "is_persistent", "msg", "seq_id", "size")

    def __init__(self, seq_id: int, msg: Any, size: int, is_persistent: bool, is_delivered: bool,
                 expiry: int | None = None) -> None:
        self.seq_id = seq_id
        self.msg = msg
        self.size = size
        self.is_persistent = is_persistent
        self.is_delivered = is_delivered
        self.expiry = expiry

    def __lt__(self, other: MsgStatus) -> bool:
        return self.seq_id < other.seq_id


class MemoryBackingQueue(LocalStore):
    def __init__(self) -> None:
        self._ready: deque[MsgStatus] = deque()
        self._requeued: list[MsgStatus] = []
        self._pending: dict[int, MsgStatus] = {}
        self._next_seq_id = 0
        self._ready_bytes = 0
        self._pending_bytes = 0
        self._confirmed: list[Any] = []
        self.on_confirm: Callable[[], None] | None = None  # never called: nothing is confirmed late
        self.on_available: Callable[[], None] | None = None  # never called: every ready message is at hand

    def publish(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                confirm: Any = None, msg_id: int | None = None) -> int:
        seq_id = self._next_seq_id
        self._next_seq_id = seq_id + 1
        self._ready.append(MsgStatus(seq_id, msg, size, persistent, False, expiry))
        self._ready_bytes += size
        if confirm is not None:
            self._confirmed.append(confirm)
        return seq_id

    def publish_delivered(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                          confirm: Any = None, msg_id: int | None = None) -> int:
        seq_id = self._next_seq_id
        self._next_seq_id = seq_id + 1
        self._pending[seq_id] = MsgStatus(seq_id, msg, size, persistent, True, expiry)
        self._pending_bytes += size
        if confirm is not None:
            self._confirmed.append(confirm)
        return seq_id

    def _head(self) -> MsgStatus | None:
        if self._requeued:
            return self._requeued[0]
        if self._ready:
            return self._ready[0]
        return None

    def _take(self) -> MsgStatus | None:
        if self._requeued:
            status = heapq.heappop(self._requeued)
        elif self._ready:
            status = self._ready.popleft()
        else:
            return None
        self._ready_bytes -= status.size
        return status

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None:
        status = self._take()
        if status is None:
            return None
        delivered = status.is_delivered
        if ack_required:
            status.is_delivered = True
            self._pending[status.seq_id] = status
            self._pending_bytes += status.size
        return status.seq_id, status.msg, delivered

    def peek(self) -> Any | None:
        """The message ``fetch`` would return next, left in place (for TTL checks at the head)."""
        status = self._head()
        return None if status is None else status.msg

    def peek_many(self, count: int) -> list[tuple[int, Any, bool]]:
        """Up to ``count`` ready messages in fetch order (requeued first), left in place."""
        out: list[tuple[int, Any, bool]] = []
        for part in (sorted(self._requeued), self._ready):
            for status in part:
                if len(out) >= count:
                    return out
                out.append((status.seq_id, status.msg, status.is_delivered))
        return out

    def head_expiry(self) -> int | None:
        status = self._head()
        return None if status is None else status.expiry

    def dropwhile(self, pred: Callable[[int | None], bool]) -> tuple[int, int | None]:
        n = 0
        while True:
            status = self._head()
            if status is None or not pred(status.expiry):
                return n, None if status is None else status.expiry
            self._take()
            n += 1

    def fetchwhile(self, pred: Callable[[int | None], bool]) -> list[tuple[int, Any, bool]]:
        out: list[tuple[int, Any, bool]] = []
        while True:
            status = self._head()
            if status is None or not pred(status.expiry):
                return out
            fetched = self.fetch(True)
            assert fetched is not None  # the head exists
            out.append(fetched)

    def ack(self, seq_ids: Iterable[int]) -> list[Any]:
        pending = self._pending
        out = []
        for seq_id in seq_ids:
            status = pending.pop(seq_id, None)
            if status is not None:
                self._pending_bytes -= status.size
                out.append(status.msg)
        return out

    def requeue(self, seq_ids: Iterable[int]) -> None:
        pending = self._pending
        for seq_id in seq_ids:
            status = pending.pop(seq_id, None)
            if status is not None:
                status.is_delivered = True
                heapq.heappush(self._requeued, status)
                self._ready_bytes += status.size
                self._pending_bytes -= status.size

    def purge(self) -> int:
        n = len(self._ready) + len(self._requeued)
        self._ready.clear()
        self._requeued.clear()
        self._ready_bytes = 0
        return n

    def len(self) -> int:
        return len(self._ready) + len(self._requeued)

    def is_empty(self) -> bool:
        return not self._ready and not self._requeued

    def pending_ack_count(self) -> int:
        return len(self._pending)

    def ready_bytes(self) -> int:
        return self._ready_bytes

    def figures(self) -> Figures:
        return Figures(self.len(), len(self._pending), self._ready_bytes, self._pending_bytes, 0)

    def drain_confirmed(self) -> list[Any]:
        out = self._confirmed
        if out:
            self._confirmed = []
        return out

    def drain_failed(self) -> list[Any]:
        return []  # nothing is written: no write can fail

    def set_ram_budget(self, max_bytes: int | None) -> None:
        """Nothing to page to: the budget is ignored."""

    def set_demand(self, wanted: bool) -> None:
        """Only the owner publishes here: nothing to look for."""

    def needs_timeout(self) -> bool:
        return False

    def timeout(self) -> None:
        pass

    def ram_bytes(self) -> int:
        """Everything is in RAM: the ready messages' bytes (what a budget could ask it to give up)."""
        return self._ready_bytes

    def delete_and_terminate(self) -> int:
        n = self.purge() + len(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        return n

    def close(self) -> None:
        self.delete_and_terminate()

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Nothing survives a restart here: no dispatch is ever in doubt in this queue."""
        return set()
