"""A stream kept in memory: the reference implementation of :mod:`storage.stream_log` for tests.

It behaves like the file store (storage/stream_store.py) in everything the broker can see: offsets from 0,
never reused; records grouped in segments of about ``max_segment_size_bytes`` payload bytes, so retention
removes whole segments, oldest first, never the one being written; a per-segment set of filter values (the
file store's Bloom filter, exact here) so filtered reads skip segments that cannot match. Memory is
"durable" at once: ``on_durable`` is called right after each append (on the next loop iteration when a loop
runs, as the syncer would; synchronously without one). Nothing survives the process.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
from collections.abc import Callable, Iterable

from storage.stream_log import GroupLog, GroupProgress, StreamRecord

DEFAULT_SEGMENT_SIZE = 8 * 1024 * 1024


class MemoryGroupLog(GroupProgress):
    """A consumer group's pulled/acked offsets (QMQ's pull log), in memory."""

    def pulled(self, offsets: Iterable[int]) -> None:
        self._apply_pulled(offsets)

    def acked(self, offsets: Iterable[int]) -> None:
        self._apply_acked(offsets)

    def skip_to(self, offset: int) -> None:
        """Retention removed everything below ``offset``: nothing there can be pulled or acked any more."""
        self._drop_below(offset)


class _Segment:
    __slots__ = ("bytes", "filters", "first", "records")

    def __init__(self, first: int) -> None:
        self.first = first
        self.records: list[StreamRecord] = []
        self.bytes = 0
        self.filters: set[str] = set()  # "" stands for messages without a filter value


class MemoryStreamLog:
    """:class:`storage.stream_log.StreamLog` in memory."""

    def __init__(self, name: str, *, max_segment_size_bytes: int = DEFAULT_SEGMENT_SIZE) -> None:
        self.name = name
        self.max_segment_size_bytes = max(1, max_segment_size_bytes)
        self.on_durable: Callable[[int], None] | None = None
        self.on_durable_failed: Callable[[int], None] | None = None
        self._segments: list[_Segment] = [_Segment(0)]
        self._next = 0
        self._bytes = 0
        self._groups: dict[str, MemoryGroupLog] = {}
        self._durable_scheduled = False
        self.closed = False

    # -- state ----------------------------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        return self._segments[0].first

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def bytes(self) -> int:
        return self._bytes

    # -- writing --------------------------------------------------------------------------------------------
    def append(self, payload: builtins.bytes, timestamp_ms: int, filter_value: str | None = None) -> int:
        seg = self._segments[-1]
        if seg.records and seg.bytes + len(payload) > self.max_segment_size_bytes:
            seg = _Segment(self._next)
            self._segments.append(seg)
        offset = self._next
        seg.records.append(StreamRecord(offset, timestamp_ms, payload))
        seg.bytes += len(payload)
        seg.filters.add(filter_value or "")
        self._bytes += len(payload)
        self._next = offset + 1
        self._schedule_durable()
        return offset

    def append_run(self, payloads: list[builtins.bytes], timestamp_ms: int, filter_value: str | None = None) -> int:
        first = self._next
        for payload in payloads:
            self.append(payload, timestamp_ms, filter_value)
        return first

    def _schedule_durable(self) -> None:
        if self._durable_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._report_durable()
            return
        self._durable_scheduled = True
        loop.call_soon(self._report_durable)

    def _report_durable(self) -> None:
        self._durable_scheduled = False
        if self.on_durable is not None and not self.closed:
            self.on_durable(self._next)

    # -- reading --------------------------------------------------------------------------------------------
    def _segment_index(self, offset: int) -> int:
        firsts = [s.first for s in self._segments]
        return max(0, bisect.bisect_right(firsts, offset) - 1)

    def read(self, offset: int, max_records: int, filter_values: frozenset[str] | None = None
             ) -> list[StreamRecord]:
        offset = max(offset, self.first_offset)
        out: list[StreamRecord] = []
        if offset >= self._next or max_records <= 0:
            return out
        i = self._segment_index(offset)
        while i < len(self._segments) and len(out) < max_records:
            seg = self._segments[i]
            i += 1
            if filter_values is not None and not (seg.filters & filter_values):
                continue  # this segment holds none of the wanted values
            start = max(0, offset - seg.first)
            out.extend(seg.records[start:start + max_records - len(out)])
        return out

    def offset_at(self, timestamp_ms: int) -> int:
        # Timestamps are appended in order in practice; search segments by their last timestamp, then inside.
        segs = [s for s in self._segments if s.records]
        lasts = [s.records[-1].timestamp_ms for s in segs]
        i = bisect.bisect_left(lasts, timestamp_ms)
        if i == len(segs):
            return self._next
        seg = segs[i]
        j = bisect.bisect_left([r.timestamp_ms for r in seg.records], timestamp_ms)
        return seg.first + j

    # -- retention ------------------------------------------------------------------------------------------
    def retain(self, max_bytes: int | None, max_age_ms: int | None, now_ms: float) -> int:
        removed = 0
        while len(self._segments) > 1:
            seg = self._segments[0]
            over_bytes = max_bytes is not None and self._bytes > max_bytes
            too_old = (max_age_ms is not None and bool(seg.records)
                       and seg.records[-1].timestamp_ms < now_ms - max_age_ms)
            if not (over_bytes or too_old):
                break
            self._segments.pop(0)
            self._bytes -= seg.bytes
            removed += 1
        if removed:
            first = self.first_offset
            for g in self._groups.values():
                g.skip_to(first)
        return removed

    # -- groups ---------------------------------------------------------------------------------------------
    def group(self, name: str, start_offset: int) -> GroupLog:
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = MemoryGroupLog(name, max(start_offset, self.first_offset))
        return g

    def groups(self) -> dict[str, GroupLog]:
        return dict(self._groups)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def delete(self) -> None:
        self._segments = [_Segment(self._next)]
        self._bytes = 0
        self._groups.clear()
        self.closed = True

    def close(self) -> None:
        self.closed = True
