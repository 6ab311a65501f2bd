"""Shares the memory watermark out between the queues (RabbitMQ's ``rabbit_memory_monitor``).

Twice a second it compares the process's resident memory with the watermark. Once memory passes half of
it (RabbitMQ's default paging ratio), every queue that holds messages in RAM is given a byte budget, in
proportion to what it holds, so that messages in RAM come back under that half; the variable queues then
page out (q1/q4 alphas to betas, then betas to delta, seed 000). Below 40% the budgets are lifted.
Paging itself runs in bounded steps (``page``) from the loop, so no single call blocks it for long.

Memory given back: a backlog that drains (or a queue deleted with one) frees its messages, but glibc keeps
the freed blocks in its heap, so the resident size would stay at the peak for good (measured: 836 MB after
an S2 run, 611 MB with the queue gone, 81 MB after one ``malloc_trim``). So, once a second, when the
resident size is :data:`RELEASE_STEP` above what it was after the last release and the queues hold at least
that much less than at their peak since then, the free memory is handed back (``release_free_memory``).
The check reads one /proc file; the queues are summed only when the process has grown.

It sees a queue only as a :class:`PagedQueue` (the part of broker/queues/queue_types.py's Queue seam it needs),
never its backing queue: a queue type that keeps nothing in RAM answers with no-ops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import structlog

from broker.clock import Clock, LoopClock, TimerHandle
from broker.resources.alarms import ResourceMonitor
from broker.resources.os_probes import release_free_memory, resident_memory

log = structlog.get_logger("leveret.memory")

PAGING_RATIO = 0.5
RELEASE_RATIO = 0.4
# Python keeps a message in more bytes than its body: budgets are in body bytes, scaled by this.
OVERHEAD_FACTOR = 2.0
MIN_QUEUE_BUDGET = 64 * 1024
INTERVAL = 0.2
# Memory given back (module docstring): checked every RELEASE_EVERY ticks, once the resident size grew by
# RELEASE_STEP since the last release and the queues' RAM fell by as much from its peak.
RELEASE_EVERY = 5
RELEASE_STEP = 64 * 1024 * 1024
# A queue without consumers keeps at most this much of its ready messages in RAM even without memory
# pressure (as RabbitMQ's classic queues keep only a short head in memory since 3.12): a backlog nobody
# is reading lives on disk, so memory does not grow with it. A queue that is being consumed keeps its
# messages in RAM until memory pressure, so its consumers are not slowed by reading them back from disk.
DEFAULT_QUEUE_BUDGET = 16 * 1024 * 1024
# The memory limit the defaults are derived from (set by the node at start; 0 until then).
_limit = 0
# Whether budgets are shares of the watermark now (MemoryBudget.limited): the defaults do not apply meanwhile.
_pressure = False
# The once-a-second passes over every queue (default budgets, memory given back) take at most about this share
# of the loop: with many queues they run less often (10,000 idle queues: ~15 ms a pass; 100,000: ~150 ms).
PASS_SHARE = 0.01


def set_memory_limit(limit: int) -> None:
    global _limit
    _limit = limit


def consumers_changed(queue: PagedQueue) -> None:
    """``queue`` gained its first consumer or lost its last: its default budget (default_budget) changes
    now, not at the next pass over every queue, which comes seconds apart when there are many."""
    if not _pressure:
        queue.set_ram_budget(default_budget(queue))


class PagedQueue(Protocol):
    """What the memory budget asks of a queue."""

    @property
    def consumer_count(self) -> int: ...

    def set_ram_budget(self, max_bytes: int | None) -> None: ...

    def ram_bytes(self) -> int: ...

    def needs_paging(self) -> bool: ...

    def page(self) -> None: ...


class HasQueues(Protocol):
    queues: Iterable[PagedQueue]


class QueueSource(Protocol):
    """The node (broker/node.py's Node), as the memory budget sees it: its vhosts, each with its queues."""

    @property
    def vhosts(self) -> Mapping[str, Any]: ...  # each a HasQueues (broker/vhost.py's VHost)


def default_budget(queue: PagedQueue) -> int | None:
    """A queue's RAM budget without memory pressure: a short head for a queue nobody reads (16 MiB, or a
    tenth of the watermark if that is less), a quarter of the watermark for a queue being consumed."""
    if not _limit:
        return None if queue.consumer_count else DEFAULT_QUEUE_BUDGET
    if queue.consumer_count:
        return _limit // 4
    return min(DEFAULT_QUEUE_BUDGET, _limit // 10)


class MemoryBudget:
    def __init__(self, node: QueueSource, monitor: ResourceMonitor | None, clock: Clock | None = None) -> None:
        self.node = node
        self.monitor = monitor
        # Ticks, and the cost of a pass over the queues that spaces the passes out (PASS_SHARE), are read on
        # this clock: the server's loop clock, a ManualClock in unit tests (a costly pass is then one that
        # advances it), so no test of the spacing depends on how loaded the machine is.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.limited = False
        self._next_pass = 0.0  # loop time of the next pass over every queue (PASS_SHARE)
        self._handle: TimerHandle | None = None
        self._paging_scheduled = False
        self._ticks = 0
        self._released_at = resident_memory()  # the lowest resident size seen at start or after a release
        self._queue_ram_peak = 0  # the most the queues held in RAM since the last release
        self.releases = 0  # plain counter, read by tests

    @property
    def limited(self) -> bool:
        """Whether the queues' budgets are shares of the watermark (memory pressure) rather than defaults. Kept
        in the module (one budget per process) so that :func:`consumers_changed` reads the same flag."""
        return _pressure

    @limited.setter
    def limited(self, value: bool) -> None:
        global _pressure
        _pressure = value

    def start(self) -> None:
        self._handle = self.clock.call_later(INTERVAL, self.tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _queues(self) -> Iterator[PagedQueue]:
        for vh in self.node.vhosts.values():
            yield from vh.queues

    def tick(self) -> None:
        try:
            used = resident_memory()
            limit = self.monitor.memory_limit if self.monitor is not None else 0
            if limit and used > limit * PAGING_RATIO:
                release_free_memory()
                used = resident_memory()
            self.rebalance(used)
            self._ticks += 1
            if self._ticks % RELEASE_EVERY == 0 and self.clock.monotonic() >= self._next_pass:
                # Once a second at most, not every tick: a default only changes when a queue gains or loses
                # its consumers (told at once: consumers_changed) or its mean message size moves. With many
                # queues a pass costs more, so the next one waits in proportion (PASS_SHARE).
                started = self.clock.monotonic()
                if not self.limited:
                    self.refresh_default_budgets()
                self.give_back(used)
                finished = self.clock.monotonic()
                self._next_pass = finished + (finished - started) / PASS_SHARE
        finally:
            self._handle = self.clock.call_later(INTERVAL, self.tick)

    def give_back(self, used: int) -> bool:
        """Hand freed message memory back to the OS once the queues hold much less than they did (module
        docstring). Returns whether it did."""
        if used < self._released_at + RELEASE_STEP:
            self._released_at = min(self._released_at, used)
            return False
        queue_ram = sum(q.ram_bytes() for q in self._queues())
        self._queue_ram_peak = max(self._queue_ram_peak, queue_ram)
        if self._queue_ram_peak - queue_ram < RELEASE_STEP // OVERHEAD_FACTOR:
            return False  # still growing, or holding what it holds: nothing freed to give back
        release_free_memory()
        after = resident_memory()
        log.info("memory given back", resident_before=used, resident_after=after, in_queues=queue_ram)
        self.releases += 1
        # The lowest resident size seen, not this one: a trim in the middle of a drain gives back little
        # (live messages pin the heap), and the drain's end must still be given back.
        self._released_at = min(self._released_at, after)
        self._queue_ram_peak = queue_ram
        return True

    def rebalance(self, used: int) -> None:
        limit = self.monitor.memory_limit if self.monitor is not None else 0
        if not limit:
            return
        if used < limit * RELEASE_RATIO:
            if self.limited:
                self.limited = False
                self.refresh_default_budgets()
                log.info("memory budgets lifted", used=used, limit=limit)
            return
        if used < limit * PAGING_RATIO and not self.limited:
            return
        in_ram = {q: q.ram_bytes() for q in self._queues()}
        queue_ram = sum(in_ram.values())
        baseline = max(0, used - int(queue_ram * OVERHEAD_FACTOR))
        available = max(0, int((limit * PAGING_RATIO - baseline) / OVERHEAD_FACTOR))
        if not self.limited:
            log.info("memory budgets set: paging queues to disk", used=used, limit=limit, in_queues=queue_ram)
        self.limited = True
        for q, ram in in_ram.items():
            share = available * ram // queue_ram if queue_ram else available // max(1, len(in_ram))
            q.set_ram_budget(max(MIN_QUEUE_BUDGET, share))
        self.schedule_paging()

    def refresh_default_budgets(self) -> None:
        """Without pressure, re-derive each queue's default budget (its mean message size changes)."""
        for q in self._queues():
            q.set_ram_budget(default_budget(q))

    def schedule_paging(self) -> None:
        if not self._paging_scheduled:
            self._paging_scheduled = True
            asyncio.get_event_loop().call_soon(self._page)

    def _page(self) -> None:
        """One bounded step of paging for every queue that needs it; again on the next loop turn."""
        self._paging_scheduled = False
        busy = False
        for q in self._queues():
            if q.needs_paging():
                q.page()
                busy = busy or q.needs_paging()
        if busy:
            self.schedule_paging()
