"""A BackingQueue of backing queues, one per priority (RabbitMQ's ``rabbit_priority_queue``).

``fetch`` serves the highest priority that has a ready message. Each sub-queue numbers its messages
itself; the seq_id this queue hands out packs the sub-queue's seq_id and the priority,
``sub_seq_id << 8 | priority``, so acks and requeues find their sub-queue without a lookup table and
seq_ids still grow with publish order within a priority.
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

    def _sub(self, msg: Any) -> tuple[int, BackingQueue]:
        p = self._priority_of(msg)
        p = 0 if p < 0 else min(p, self.max_priority)
        return p, self._queues[p]

    def publish(self, msg: Any, size: int, persistent: bool, **kw: Any) -> int:
        p, q = self._sub(msg)
        return (q.publish(msg, size, persistent, **kw) << _SHIFT) | p

    def publish_delivered(self, msg: Any, size: int, persistent: bool, **kw: Any) -> int:
        p, q = self._sub(msg)
        return (q.publish_delivered(msg, size, persistent, **kw) << _SHIFT) | p

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None:
        for p in range(self.max_priority, -1, -1):
            q = self._queues[p]
            if not q.is_empty():
                got = q.fetch(ack_required)
                if got is not None:
                    seq_id, msg, delivered = got
                    return (seq_id << _SHIFT) | p, msg, delivered
        return None

    def peek(self) -> Any | None:
        for p in range(self.max_priority, -1, -1):
            q = self._queues[p]
            if not q.is_empty():
                return q.peek()  # type: ignore[attr-defined]
        return None

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

    # Memory budget: shared out evenly between the sub-queues that hold messages.
    def set_ram_budget(self, max_bytes: int | None) -> None:
        busy = [q for q in self._queues if not q.is_empty()] or self._queues
        for q in self._queues:
            setter = getattr(q, "set_ram_budget", None)
            if setter is not None:
                setter(None if max_bytes is None else (max_bytes // len(busy) if q in busy else 0))

    def needs_timeout(self) -> bool:
        return any(getattr(q, "needs_timeout", lambda: False)() for q in self._queues)

    def timeout(self) -> None:
        for q in self._queues:
            if getattr(q, "needs_timeout", lambda: False)():
                q.timeout()  # type: ignore[attr-defined]

    def ram_bytes(self) -> int:
        return sum(getattr(q, "ram_bytes", lambda: 0)() for q in self._queues)
