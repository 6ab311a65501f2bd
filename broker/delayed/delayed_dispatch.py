"""The node's dispatcher of delayed messages (docs/decisions/delayed-messages.md): one per delay store, shared by every
``x-delayed-message`` exchange of every vhost, which register under their ``xref``.

What it does, on the node's clock:

- **Confirms**: a publisher waiting for a persistent delayed message is confirmed from the store's
  ``on_durable`` (every seq below the number it reports is fsynced in the WAL), nacked from
  ``on_durable_failed``: a publisher is never told "safe" before the record is on disk.
- **Dispatch**: one timer, armed for ``next_due_ms`` (and re-armed after each ``on_durable``, since a record
  is handed out only once durable). When it fires, ``due()`` batches are let go through each exchange's
  ``release_due`` (the one publish path, bindings as they are then).
- **Exactly once** (docs/decisions/delayed-messages.md), for a persistent message and durable target queues:
  1. a due batch is logged ``BEGUN`` in the store and let go only once that record is fsynced, as one
     *epoch* (storage/dispatch_evidence.py); each persistent message goes out with the origin id
     ``(epoch, seq)`` as its message id, which every queue index keeps with it;
  2. it is marked dispatched (the store's ``dispatched``) once every target queue has confirmed it, i.e. has
     it on disk (the dispatcher is itself a :class:`~broker.publish.Publisher`); a message that reached no
     queue, or only queues that confirm at once, is marked at once; a queue that failed its fsync (nack)
     gives the record back (``release``) to be dispatched again;
  3. the checkpoint makes those marks durable, then *settles* the epochs they close, which lets the queues
     delete the acked segments that prove the dispatches (until then they are pinned);
  4. after a crash, a record begun and not marked is *in doubt*: once every exchange, queue and binding is
     back (``resolve_in_doubt``), its exchange routes it again and it goes only to the durable target
     queues that do not already hold its origin id; if all of them hold it, it is just marked. A
     transient message in doubt is marked without being sent again (at most once: a crash may lose a
     transient message, as in RabbitMQ); so is a message whose copies could only be in non-durable queues.
  Not covered: a target that keeps no origin ids (a stream) gets an in-doubt message again (at least once).
- **Checkpoint** every :data:`CHECKPOINT_EVERY` seconds while anything was written (its writes and fsyncs run
  off the loop; the store checkpoints by itself too every ``checkpoint_bytes`` of WAL).
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
from storage.dispatch_evidence import PIN

log = structlog.get_logger("leveret.delayed")

BATCH = 500  # records per due() call; the loop yields between batches
CHECKPOINT_EVERY = 5.0  # seconds
# The timer's fallback when the head is due but cannot be handed out yet (not durable, or held in flight):
# look again after RETRY_MIN, doubling up to RETRY_MAX while nothing comes out. A fixed second here made
# dispatch lateness spread evenly over 0-1.16 s at 1k msg/s coming due (bench/delay_lateness.py).
RETRY_MIN = 0.01
RETRY_MAX = 1.0
# The longest the timer sleeps: it runs on the loop's monotonic clock while due times are wall-clock times, so
# after a jump of the wall clock it must look again soon (a forward jump of a day left messages that had
# become due waiting for a timer armed an hour ahead: tests/integration/delayed/test_delayed_time.py).
MAX_SLEEP = 1.0


# Upper bounds (seconds) of the dispatch lateness histogram's buckets; the target is p99 <= 100 ms.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Lateness:
    """How late due messages were let go (now - due time, at ``release_due``), pre-bucketed in plain
    integers: observing is a bisect and two additions per message; the exporter (broker/prometheus/metrics.py)
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
    """What the dispatcher needs of a delayed exchange: let a due record go (with origin id ``epoch``, and to
    none of the queues named in ``skip``); the result is the publish path's (broker/publish.py), its
    ``>> PENDING`` part the queues that confirm later to the dispatcher. And for records in doubt after a
    crash: which queues already hold each (None: nothing to send again)."""

    def release_due(self, due: DueRecord, publisher: Any, confirm_seq: int, epoch: int,
                    skip: frozenset[str] = frozenset()) -> int: ...

    def in_doubt_plan(self, dues: list[DueRecord]) -> list[tuple[DueRecord, frozenset[str] | None]]: ...


class DelayDispatcher:
    """The publisher of due messages and the confirmer of delayed publishes for one delay store."""

    def __init__(self, store: DelayStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.reader: Any = None  # Publisher: no connection for credit flow to pause
        self.published_to: set[Any] = set()
        self._holders: dict[int, Holder] = {}
        self._waiting: deque[tuple[int, Any, int]] = deque()  # (store seq, publisher, confirm seq), by seq
        # confirm seq -> (record, answers due, ok, epoch)
        self._inflight: dict[int, tuple[DueRecord, int, bool, int]] = {}
        self._next_confirm = 0
        self._done: list[DueRecord] = []
        self._epoch_left: dict[int, int] = {}  # epoch -> its records not yet marked or given back
        self._epochs_closed: list[int] = []  # epochs whose records are all marked: settled at the checkpoint
        self._begun = 0  # records begun and not yet let go (waiting for the BEGUN fsync)
        self._resolved_doubt = False
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
        sleep = min((at - now) / 1000.0, MAX_SLEEP)
        self._timer_at = now + sleep * 1000
        self._timer = self.clock.call_later(sleep, self._fire)

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
        if batch:
            self._retry = RETRY_MIN
            self._begin(batch)
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

    def _begin(self, batch: list[DueRecord]) -> None:
        """Log ``batch`` begun; let it go once that is on disk (step 1 of the module docstring)."""
        known = []
        for due in batch:
            if due.record.xref in self._holders:
                known.append(due)
            else:
                log.info("delayed messages of an exchange that no longer exists dropped", xref=due.record.xref)
                self.store.release([due])
                self.store.drop_exchange(due.record.xref)
        if not known:
            return
        self.store.begin(known)
        self._begun += len(known)
        self.store.when_durable(lambda ok: self._let_go(known, ok))

    def _let_go(self, batch: list[DueRecord], ok: bool) -> None:
        self._begun -= len(batch)
        if self.store.closed:
            return
        if not ok:
            log.error("the dispatch log could not be synced; the due messages are kept", count=len(batch))
            self.store.release(batch)
            self.schedule()
            return
        epoch = PIN.begin()
        self._epoch_left[epoch] = len(batch)
        now = self.clock.now_ms()
        for due in batch:
            self.lateness.observe((now - due.record.due_ms) / 1000.0)
            self._release(due, epoch)

    def _release(self, due: DueRecord, epoch: int, skip: frozenset[str] = frozenset()) -> None:
        holder = self._holders.get(due.record.xref)
        if holder is None:  # deleted while its BEGUN record was being synced
            self.store.release([due])
            self._epoch_done(epoch)
            return
        self._next_confirm += 1
        cseq = self._next_confirm
        try:
            pending = holder.release_due(due, self, cseq, epoch, skip) >> 2  # broker.publish.PENDING
        except Exception:
            log.exception("a due delayed message could not be published; it is kept", xref=due.record.xref)
            self.store.release([due])
            self._epoch_done(epoch)
            return
        if pending:
            self._inflight[cseq] = (due, pending, True, epoch)
        else:
            self._mark(due, epoch)

    def resolve_in_doubt(self) -> None:
        """After recovery (every exchange, queue and binding back): settle the records whose dispatch was in
        progress when the node last stopped (step 4 of the module docstring). Once per dispatcher."""
        if self._resolved_doubt or self.store.closed:
            return
        self._resolved_doubt = True
        records = self.store.take_in_doubt()
        if not records:
            return
        by_xref: dict[int, list[DueRecord]] = {}
        for due in records:
            by_xref.setdefault(due.record.xref, []).append(due)
        epoch = PIN.begin()
        self._epoch_left[epoch] = len(records)
        resent = marked = 0
        for xref, dues in by_xref.items():
            holder = self._holders.get(xref)
            if holder is None:
                self.store.release(dues)
                self.store.drop_exchange(xref)
                self._epoch_done(epoch, len(dues))
                continue
            for due, skip in holder.in_doubt_plan(dues):
                if skip is None:
                    marked += 1
                    self._mark(due, epoch)
                else:
                    resent += 1
                    self._release(due, epoch, skip)
        log.warning("delayed dispatches in doubt resolved", already_delivered=marked, sent_again=resent)
        self._dirty = True

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        """Publisher: a target queue has a dispatched message on disk (or failed to)."""
        entry = self._inflight.get(seq)
        if entry is None:
            return
        due, left, ok, epoch = entry
        ok = ok and stored
        if left > 1:
            self._inflight[seq] = (due, left - 1, ok, epoch)
            return
        del self._inflight[seq]
        if ok:
            self._mark(due, epoch)
        elif not self.store.closed:
            self.store.release([due])
            self._epoch_done(epoch)
            self.schedule()

    def _mark(self, due: DueRecord, epoch: int) -> None:
        """Mark ``due`` dispatched, in one store call per burst."""
        self._done.append(due)
        self._epoch_done(epoch)
        if self._flush_handle is None:
            self._flush_handle = self.clock.call_later(0, self._flush_done)

    def _epoch_done(self, epoch: int, n: int = 1) -> None:
        left = self._epoch_left[epoch] - n
        if left:
            self._epoch_left[epoch] = left
        else:
            del self._epoch_left[epoch]
            self._epochs_closed.append(epoch)
            self._dirty = True

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
            if self._flush_handle is not None:  # marks not yet logged: log them, so this checkpoint covers them
                self._flush_handle.cancel()
                self._flush_done()
            closed, self._epochs_closed = self._epochs_closed, []
            self.store.checkpoint_soon(lambda error: self._checkpointed(closed, error))
        self._checkpoint_timer = self.clock.call_later(CHECKPOINT_EVERY, self._checkpoint)

    def _checkpointed(self, closed: list[int], error: BaseException | None) -> None:
        """The checkpoint started by :meth:`_checkpoint` is over (its writes ran off the loop)."""
        if error is not None:
            log.error("delay store checkpoint failed; retried later", error=str(error))
            self._epochs_closed[:0] = closed
            self._dirty = True
        else:
            PIN.settle(closed)  # their marks are on disk: the queues may delete the proof


_DISPATCHERS: weakref.WeakKeyDictionary[DelayStore, DelayDispatcher] = weakref.WeakKeyDictionary()


def dispatcher_for(open_store: Callable[[Callable[[], int]], DelayStore], clock: Clock) -> DelayDispatcher:
    """The dispatcher of the node's delay store (``open_store``: NodeStorage.open_delay_store), made on first
    use with ``clock`` (the vhosts share the node's clock)."""
    store = open_store(lambda: int(clock.now_ms()))
    d = _DISPATCHERS.get(store)
    if d is None:
        d = _DISPATCHERS[store] = DelayDispatcher(store, clock)
    return d
