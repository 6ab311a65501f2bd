"""The in-RAM window of the delay store: index entries due soon, ordered by ``(due_ms, seq)``. Pure: no I/O,
no clock (the store passes ``now``).

It holds every pending entry whose key is at most ``hi`` and none above; the store widens it by loading
from the buckets' indexes (:meth:`admit`), a few minutes ahead and never more than ``cap`` entries, so
memory is bounded whatever the number pending and however they bunch up (everything due in the same
millisecond is loaded ``cap`` at a time). A heap plays the part of QMQ's 500 ms wheel: an exact order,
and the caller's timer can fire at the exact due time of the head.
"""

from __future__ import annotations

import heapq

from storage.delay.record import MAX_SEQ

# (due_ms, seq, bucket start, data offset, data length, xref)
Entry = tuple[int, int, int, int, int, int]


class Window:
    __slots__ = ("cancelled", "cap", "heap", "hi")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.heap: list[Entry] = []
        self.hi: tuple[int, int] = (-(1 << 63), 0)  # every pending entry with a key <= hi is in the heap
        self.cancelled: set[int] = set()  # seqs cancelled while in the heap (skipped when they surface)

    def __len__(self) -> int:
        return len(self.heap)

    def covers(self, due_ms: int, seq: int) -> bool:
        return (due_ms, seq) <= self.hi

    def push(self, e: Entry) -> None:
        """An entry appended (or released) inside the window."""
        heapq.heappush(self.heap, e)

    def wants(self, now_ms: int, lookahead_ms: int) -> bool:
        """Time to load more: the window ends less than half a look-ahead from now and has room."""
        return self.hi < (now_ms + lookahead_ms // 2, MAX_SEQ) and len(self.heap) < self.cap // 2

    def admit(self, candidates: list[Entry], target: tuple[int, int]) -> None:
        """Add the smallest candidates (every pending entry with hi < key <= target, found by the store)
        up to the room left; ``hi`` becomes ``target`` or, when some did not fit, the last one admitted."""
        room = self.cap - len(self.heap)
        candidates.sort()
        if len(candidates) > room:
            del candidates[room:]
            if candidates:
                last = candidates[-1]
                self.hi = (last[0], last[1])
        else:
            self.hi = target
        self.heap.extend(candidates)
        heapq.heapify(self.heap)

    def head(self) -> Entry | None:
        return self.heap[0] if self.heap else None

    def pop(self) -> Entry:
        return heapq.heappop(self.heap)

    def forget(self) -> None:
        """Drop everything (the store reloads from disk, e.g. after an exchange is dropped)."""
        self.heap = []
        self.hi = (-(1 << 63), 0)
        self.cancelled = set()
