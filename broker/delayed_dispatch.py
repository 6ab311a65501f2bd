"""The node's dispatcher of delayed messages (issue 14): one per delay store, shared by every
``x-delayed-message`` exchange of every vhost, which register under their ``xref``.

What it does, on the node's clock:

- **Confirms**: a publisher waiting for a persistent delayed message is confirmed from the store's
  ``on_durable`` (every seq below the number it reports is fsynced in the WAL), nacked from
  ``on_durable_failed``: a publisher is never told "safe" before the record is on disk.
- **Dispatch**: one timer, armed for ``next_due_ms`` (and re-armed after each ``on_durable``, since a record
  is handed out only once durable). When it fires, ``due()`` batches are let go through each exchange's
  ``release_due`` (the one publish path, bindings as they are then).
- **Marking dispatched** (the store's ``dispatched``) waits for the target queues' confirms: the dispatcher is
  itself a :class:`~broker.publish.Publisher`, so a persistent message routed to durable queues is marked only
  once every queue has it on disk; a message that reached no queue, or only queues that confirm at once,
  is marked at once. So a confirmed message is never lost: a crash before the mark hands it out again after
  the restart. The price is at-least-once: a crash after the queues' fsync and before the ``.disp`` record's
  fsync delivers it a second time (a window of one group commit). A queue that failed its fsync (nack) gives
  the record back (``release``) to be dispatched again.
- **Checkpoint** every :data:`CHECKPOINT_EVERY` seconds while anything was written (it blocks on fsyncs, a
  few per interval; the store checkpoints by itself too every ``checkpoint_bytes`` of WAL).
- A record whose exchange is no longer known (a non-durable exchange from before a restart) has its ``xref``
  dropped (``drop_exchange``) when it comes due.
"""

from __future__ import annotations

import bisect
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from broker.clock import Clock, TimerHandle
from storage.delay import DelayStore, DueRecord

log = structlog.get_logger("leveret.delayed")

BATCH = 500  # records per due() call; the loop yields between batches
CHECKPOINT_EVERY = 5.0  # seconds
# The timer's fallback when the head is due but cannot be handed out yet (not durable, or held in flight):
# look again after RETRY_MIN, doubling up to RETRY_MAX while nothing comes out. A fixed second here made
# dispatch lateness spread evenly over 0-1.16 s at 1k msg/s coming due (bench/delay_lateness.py).
RETRY_MIN = 0.01
RETRY_MAX = 1.0


# Upper bounds (seconds) of the dispatch lateness histogram's buckets; the target is p99 <= 100 ms.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Lateness:
    """How late due messages were let go (now - due time, at ``release_due``), pre-bucketed in plain
    integers: observing is a bisect and two additions per message; the exporter (broker/metrics.py)
    reads it when Prometheus scrapes, so nothing here knows prometheus_client."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BUCKETS) + 1)  # the last one: above every bound (+Inf only)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.counts[bisect.bisect_left(LATENESS_BUCKETS, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' ``le`` buckets: ``(bound, observations <= bound)``, ending with ``+Inf``."""
        out, running = [], 0
        for bound, n in zip((*(str(b) for b in LATENESS_BUCKETS), "+Inf"), self.counts):
            running += n
            out.append((bound, running))
        return out


class Holder(Protocol):
    """What the dispatcher needs of a delayed exchange: let a due record go; the result is the publish
    path's (broker/publish.py), its ``>> PENDING`` part the queues that confirm later to the dispatcher."""

    def release_due(self, due: DueRecord, publisher: Any, confirm_seq: int) -> int: ...


class DelayDispatcher:
    """The publisher of due messages and the confirmer of delayed publishes for one delay store."""

    def __init__(self, store: DelayStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.reader: Any = None  # Publisher: no connection for credit flow to pause
        self.published_to: set[Any] = set()
        self._holders: dict[int, Holder] = {}
        self._waiting: deque[tuple[int, Any, int]] = deque()  # (store seq, publisher, confirm seq), by seq
        self._inflight: dict[int, tuple[DueRecord, int, bool]] = {}  # confirm seq -> (record, answers due, ok)
        self._next_confirm = 0
        self._done: list[DueRecord] = []
        self._flush_handle: TimerHandle | None = None
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._retry = RETRY_MIN  # the fallback's next wait (see RETRY_MIN)
        self._checkpoint_timer: TimerHandle | None = None
        self._dirty = False
        self.lateness = Lateness()
        store.on_durable = self._on_durable
        store.on_durable_failed = self._on_durable_failed

    # -- exchanges ------------------------------------------------------------------------------------------
    def register(self, xref: int, holder: Holder) -> None:
        self._holders[xref] = holder
        self.schedule()
        if self._checkpoint_timer is None:
            self._checkpoint_timer = self.clock.call_later(CHECKPOINT_EVERY, self._checkpoint)

    def unregister(self, xref: int) -> None:
        self._holders.pop(xref, None)
        if not self._holders:
            self.stop()

    def stop(self) -> None:
        """No exchange left (the node stops): timers off; what is pending stays in the store."""
        for handle in (self._timer, self._checkpoint_timer, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._timer = self._checkpoint_timer = self._flush_handle = None
        self._timer_at = None

    # -- publishers' confirms -------------------------------------------------------------------------------
    def confirm_when_durable(self, seq: int, publisher: Any, confirm_seq: int) -> None:
        """Confirm ``publisher``'s ``confirm_seq`` once the record ``seq`` is fsynced (nack if that fails)."""
        self._waiting.append((seq, publisher, confirm_seq))

    def _answer(self, seq_end: int, ok: bool) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] < seq_end:
            _, publisher, confirm_seq = waiting.popleft()
            publisher.confirm_from_queue(confirm_seq, ok)

    def _on_durable(self, seq_end: int) -> None:
        self._dirty = True
        self._answer(seq_end, True)
        self.schedule()

    def _on_durable_failed(self, seq_end: int) -> None:
        self._answer(seq_end, False)

    # -- dispatch -------------------------------------------------------------------------------------------
    def schedule(self) -> None:
        """Arm the timer for the earliest due record (earlier than the armed one, if any)."""
        if not self._holders or self.store.closed:
            return
        nxt = self.store.next_due_ms()
        if nxt is None:
            return
        now = self.clock.now_ms()
        at = max(nxt, now)
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later((at - now) / 1000.0, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.store.closed:
            return
        # The store's clock (whole ms) as due() reads it: "due but not handed out" is judged by it, not by the
        # loop's clock read later (a timer firing a fraction of a millisecond early made the head look due
        # yet unavailable, and sent dispatch to the fallback below).
        store_now = self.store.now()
        batch = self.store.due(BATCH)
        now = self.clock.now_ms()
        if batch:
            self._retry = RETRY_MIN
        for due in batch:
            self._release(due, now)
        if len(batch) == BATCH:
            self._timer_at = self.clock.now_ms()
            self._timer = self.clock.call_later(0, self._fire)
            return
        nxt = self.store.next_due_ms()
        if nxt is not None and nxt <= store_now:
            # Due but not handed out: not durable yet (on_durable re-arms) or being dispatched; a fallback.
            retry = self._retry
            self._retry = min(retry * 2, RETRY_MAX)
            self._timer_at = self.clock.now_ms() + retry * 1000
            self._timer = self.clock.call_later(retry, self._fire)
        else:
            self.schedule()

    def _release(self, due: DueRecord, now_ms: float) -> None:
        holder = self._holders.get(due.record.xref)
        if holder is None:
            log.info("delayed messages of an exchange that no longer exists dropped", xref=due.record.xref)
            self.store.release([due])
            self.store.drop_exchange(due.record.xref)
            return
        self._next_confirm += 1
        cseq = self._next_confirm
        try:
            pending = holder.release_due(due, self, cseq) >> 2  # broker.publish.PENDING
        except Exception:
            log.exception("a due delayed message could not be published; it is kept", xref=due.record.xref)
            self.store.release([due])
            return
        self.lateness.observe((now_ms - due.record.due_ms) / 1000.0)
        if pending:
            self._inflight[cseq] = (due, pending, True)
        else:
            self._mark(due)

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        """Publisher: a target queue has a dispatched message on disk (or failed to)."""
        entry = self._inflight.get(seq)
        if entry is None:
            return
        due, left, ok = entry
        ok = ok and stored
        if left > 1:
            self._inflight[seq] = (due, left - 1, ok)
            return
        del self._inflight[seq]
        if ok:
            self._mark(due)
        elif not self.store.closed:
            self.store.release([due])
            self.schedule()

    def _mark(self, due: DueRecord) -> None:
        """Mark ``due`` dispatched, in one store call per burst."""
        self._done.append(due)
        if self._flush_handle is None:
            self._flush_handle = self.clock.call_later(0, self._flush_done)

    def _flush_done(self) -> None:
        self._flush_handle = None
        done, self._done = self._done, []
        if done and not self.store.closed:
            self.store.dispatched(done)
            self._dirty = True

    def _checkpoint(self) -> None:
        self._checkpoint_timer = None
        if self.store.closed or not self._holders:
            return
        if self._dirty:
            self._dirty = False
            try:
                self.store.checkpoint()
            except OSError as e:
                log.error("delay store checkpoint failed; retried later", error=str(e))
        self._checkpoint_timer = self.clock.call_later(CHECKPOINT_EVERY, self._checkpoint)


_DISPATCHERS: weakref.WeakKeyDictionary[DelayStore, DelayDispatcher] = weakref.WeakKeyDictionary()


def dispatcher_for(open_store: Callable[[Callable[[], int]], DelayStore], clock: Clock) -> DelayDispatcher:
    """The dispatcher of the node's delay store (``open_store``: NodeStorage.open_delay_store), made on first
    use with ``clock`` (the vhosts share the node's clock)."""
    store = open_store(lambda: int(clock.now_ms()))
    d = _DISPATCHERS.get(store)
    if d is None:
        d = _DISPATCHERS[store] = DelayDispatcher(store, clock)
    return d
