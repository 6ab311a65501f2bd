"""The delay store (issue 14): records held on disk until their due time, handed out in ``(due_ms, seq)``
order, whatever the horizon, in bounded memory.

Path of a record: :meth:`DelayStore.append` writes it to the WAL (durable after the syncer's fsync:
``on_durable``) and applies it at once to its time bucket's buffered ``.data``/``.idx``; the checkpoint
(:meth:`DelayStore.checkpoint_soon`, started by the owner every few seconds and by the store itself every
``checkpoint_bytes`` of WAL) fsyncs the buckets, records their lengths in the manifest, and deletes the WAL
segments and the drained buckets. Recovery cuts every bucket back to its checkpointed length and replays
the WAL after the checkpoint, so no record is applied twice and replay time is bounded by the checkpoint
interval, not by the number pending.

The checkpoint's writes are off the loop (a ``background``: storage/background.py). On the loop it takes a
snapshot: the buckets' buffers (readable until written), their lengths and counters, the dispatch logs'
lengths, and it rolls the WAL, so everything appended from then on is in segments the snapshot's manifest
replays. The thread writes and syncs the buckets, then saves that manifest; back on the loop the older WAL
segments and the buckets found drained at the snapshot go, those not touched since (one touched meanwhile
stays: the next manifest has it, and until then a crash rebuilds it from the WAL). One checkpoint runs at a
time; one asked for meanwhile starts when it ends. :meth:`checkpoint` is the synchronous form (a clean
stop, an exchange dropped): it waits for the one running first. Writing thousands of bucket files on the
loop stalled every client of the node for seconds (bench/delay_loop_stall.py).

Dispatch contract (the store's half of exactly-once dispatch; the broker's half is
broker/delayed/delayed_dispatch.py and storage/dispatch_evidence.py):

- :meth:`due` hands out the records due at ``now_ms()`` in ``(due_ms, seq)`` order, at most ``limit``, and
  never a record before the WAL fsync covering it (so nothing handed out can vanish in a crash);
- the caller logs the batch :meth:`begin` (a ``BEGUN`` record in each bucket's ``.disp``) and enqueues it only
  once that is durable (:meth:`when_durable`);
- the caller calls :meth:`dispatched` with a batch once it is safely enqueued (the broker: after its target
  queues' fsync); the batch's ``DISPATCHED`` record goes to the bucket's ``.disp`` through the syncer, and
  once that is on disk the records never come out again, across any restart;
- a record begun and not marked dispatched or cancelled when the process dies is *in doubt* after the
  restart: it is not handed out by :meth:`due`; :meth:`take_in_doubt` gives it to the caller, who finds out
  whether its enqueue happened (the queues keep the proof) and marks it or enqueues it where it is missing.
  A record handed out and not begun comes out again as usual; :meth:`release` gives back a batch that
  could not be enqueued.

Time: the store never reads the wall clock; ``now_ms`` is injected. Due times are absolute, on the clock
the records were appended by, so a clock that jumps backwards makes the records pending at the jump wait
until it reads their due time again (late by the size of the jump) and records appended after it are on
time: nothing comes out early, and nothing twice (the dispatch log says what went). A forward jump lets
out what became due (early relative to the time that really passed: unavoidable with absolute times).
An earlier version read the clock through a ratchet (never backwards); that made records appended after a
backward jump come out early, by the size of the jump.

Memory: per bucket, a few counters (about 8,760 buckets for a year); in the window, at most
``max_loaded`` index entries (about 150 B each as Python tuples) for the next ``lookahead_ms``; bodies are
read only when handed out. Listing and cancelling read a bucket's index from disk a chunk at a time.

Exchange references (``xref``) are integers assigned by the broker, one per exchange incarnation, never
reused: :meth:`drop_exchange` makes every pending record of one disappear at once (the disk space goes
when their buckets drain or at the next checkpoint for buckets holding nothing else).
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from storage import corruption
from storage.background import Background, Inline
from storage.delay.bucket import SLICES, Bucket, BucketWrite, XrefCount, syncfs
from storage.delay.manifest import BucketState, Manifest
from storage.delay.record import (
    BEGUN,
    CANCELLED,
    DISPATCHED,
    IDX,
    IDX_SIZE,
    MAX_SEQ,
    RECORD_HEAD,
    RESOLVING,
    DelayRecord,
    DueRecord,
    PendingEntry,
)
from storage.delay.wal import DelayWal
from storage.delay.window import Entry, Window
from storage.segment import CorruptRecord, fsync_dir
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

MANIFEST = "checkpoint"
MAX_OPEN_READERS = 32  # bucket .data descriptors kept open for reads
MIN_KEY = (-(1 << 63), 0)
FSYNC_EACH_UP_TO = 64  # a checkpoint with more dirty buckets syncs the file system once instead
SPLIT_MIN = 16_384  # index entries: a window load reads a smaller bucket's index whole rather than slice it
PRESPLIT_MIN = 65_536  # index entries of the next bucket split ahead of time per window load, at least


@dataclass(slots=True, frozen=True)
class ExchangeStats:
    count: int
    nbytes: int
    next_due_ms: int | None


class DelayStore:
    def __init__(self, directory: str, syncer: Syncer | None, now_ms: Callable[[], int], *,
                 bucket_ms: int = 3_600_000, lookahead_ms: int = 120_000, max_loaded: int = 100_000,
                 checkpoint_bytes: int = 16 << 20, background: Background | None = None) -> None:
        self.dir = directory
        self._syncer = syncer
        self._background: Background = background if background is not None else Inline()
        self._running: _Checkpoint | None = None  # the checkpoint being written off the loop
        # Asked for while one was running (their callbacks; None: the store's own): started when it ends.
        self._again: list[Callable[[BaseException | None], None] | None] = []
        self._now = now_ms
        self._last_now = -(1 << 63)
        self.lookahead_ms = lookahead_ms
        self.checkpoint_bytes = checkpoint_bytes
        self._bdir = os.path.join(directory, "buckets")
        os.makedirs(self._bdir, exist_ok=True)
        self._mpath = os.path.join(directory, MANIFEST)
        m = Manifest.load(self._mpath) or Manifest(bucket_ms=bucket_ms)
        if m.bucket_ms != bucket_ms:
            log.warning("delay store: buckets were made %d ms long; keeping that (configured: %d)",
                        m.bucket_ms, bucket_ms)
        self.bucket_ms = m.bucket_ms
        self._dead = set(m.dead)
        self._next_seq = m.next_seq
        self._buckets: dict[int, Bucket] = {}
        self._starts: list[int] = []
        self._window = Window(max_loaded)
        self._inflight: dict[int, Entry] = {}
        self._in_doubt: list[int] = []  # seqs begun and not resolved before the last stop (see take_in_doubt)
        self._readers: OrderedDict[int, Bucket] = OrderedDict()
        self._xstats: dict[int, list[int]] = {}  # xref -> [pending count, pending bytes]
        self._durable_seq = 0
        self.on_durable: Callable[[int], None] | None = None
        self.on_durable_failed: Callable[[int], None] | None = None
        self.dispatched_total = 0
        self.cancelled_total = 0
        self.corrupt_dropped = 0  # due records dropped because they failed their check (reported)
        self.checkpoint_failures = 0  # checkpoints append() started that failed (a full disk): retried later
        self._checkpoint_backoff = 0  # WAL bytes the next inline checkpoint waits for beyond checkpoint_bytes
        # Window loads (_fill): where the window ended at the last one, and what they cost, for tests and
        # benches: index entries examined, entries written to slices, dispatch-log bytes read.
        self._fill_lo = MIN_KEY
        self.fill_scanned = 0
        self.fill_split = 0
        self.fill_disp_read = 0
        self.closed = False
        self._wal = DelayWal(os.path.join(directory, "wal"), syncer)
        self._wal.on_durable = self._wal_durable
        self._wal.on_durable_failed = self._wal_durable_failed
        self._recover(m)

    # -- recovery -------------------------------------------------------------------------------------------
    def _recover(self, m: Manifest) -> None:
        for start, st in m.buckets.items():
            b = Bucket(self._bdir, start, st.data_len, st.idx_len, st.disp_len, st.counts)
            b.cut_to_checkpoint()
            b.verify_index(st.idx_crc)
            self._add_bucket(b)
        orphans: set[int] = set()
        for name in os.listdir(self._bdir):
            stem, _, suffix = name.partition(".")
            if not stem.isdigit() or int(stem) in self._buckets:
                continue
            if suffix == "disp":
                orphans.add(int(stem))  # a bucket made after the checkpoint: kept until the replay says
            else:
                os.unlink(os.path.join(self._bdir, name))  # rebuilt by the replay (or a drained leftover)
        replayed = 0
        for payload in self._wal.replay(m.wal):
            seq, due, _, xref, _, _, _ = RECORD_HEAD.unpack_from(payload, 0)
            self._next_seq = max(self._next_seq, seq + 1)
            if xref not in self._dead:
                self._apply(bytes(payload), due, seq, xref)
            replayed += 1
        for start in orphans - set(self._buckets):
            os.unlink(os.path.join(self._bdir, f"{start:020d}.disp"))
        for b in self._buckets.values():  # resolutions logged after the checkpoint: count them
            path = b.path(".disp")
            if os.path.exists(path) and os.path.getsize(path) > b.disp_len:
                # A bucket the checkpoint left out as drained and that took records before it was deleted is
                # rebuilt from the WAL with those alone; its dispatch log still holds the resolutions of the
                # records it had before, which are counted only where they are the rebuilt index's.
                mine = {e[1] for e in b.index()} if b.start in orphans else None
                for kind, entries in b.disp_records(self._syncer, b.disp_len):
                    if kind in RESOLVING:
                        self._count_resolved(b, entries if mine is None else [e for e in entries if e[1] in mine])
        for b in self._buckets.values():
            for xref, c in b.counts.items():
                if xref not in self._dead:
                    s = self._xstats.setdefault(xref, [0, 0])
                    s[0] += c.count - c.resolved
                    s[1] += c.nbytes - c.resolved_bytes
        self._find_in_doubt()
        self._wal.roll()
        self._durable_seq = self._next_seq
        if replayed or m.wal == 0:
            self.checkpoint()
        log.info("delay store: %d buckets, %d records replayed from the WAL", len(self._buckets), replayed)

    def _find_in_doubt(self) -> None:
        """Entries begun and never resolved: held in flight (so :meth:`due` skips them) for
        :meth:`take_in_doubt`."""
        for start, b in self._buckets.items():
            begun: dict[int, tuple[int, int, int, int]] = {}
            resolved: set[int] = set()
            for kind, entries in b.disp_records(self._syncer):
                if kind == BEGUN:
                    begun.update((e[1], e) for e in entries)
                else:
                    resolved.update(e[1] for e in entries)
            doubt = {seq for seq, e in begun.items() if seq not in resolved and e[2] not in self._dead}
            if not doubt:
                continue
            for due, seq, off, n, xref in b.index():
                if seq in doubt:
                    self._inflight[seq] = (due, seq, start, off, n, xref)
                    self._in_doubt.append(seq)
        if self._in_doubt:
            log.warning("delay store: %d dispatches were in progress at the last stop (in doubt)",
                        len(self._in_doubt))

    def take_in_doubt(self) -> list[DueRecord]:
        """The records whose dispatch was begun and not resolved before the last stop, once: the caller
        resolves each with :meth:`dispatched` (its enqueue happened, or is done now) or :meth:`release`."""
        out = []
        for seq in self._in_doubt:
            e = self._inflight.get(seq)
            if e is not None and e[5] not in self._dead:
                out.append(DueRecord(DelayRecord.decode(self._reader(e[2]).read(e[3], e[4])), e[2], e[4]))
        self._in_doubt = []
        return out

    def _count_resolved(self, b: Bucket, entries: Iterable[tuple[int, int, int, int]]) -> None:
        for _, _, xref, size in entries:
            c = b.counts.get(xref)
            if c is not None:
                c.resolved += 1
                c.resolved_bytes += size

    def _add_bucket(self, b: Bucket) -> None:
        self._buckets[b.start] = b
        bisect.insort(self._starts, b.start)

    # -- appending ------------------------------------------------------------------------------------------
    def append(self, record: DelayRecord) -> int:
        """Store ``record`` (its ``seq`` is ignored); returns the seq assigned. Durable once ``on_durable``
        reports a number above it; handed out by :meth:`due` only then."""
        if record.xref in self._dead:
            raise ValueError(f"exchange reference {record.xref} was dropped")
        seq = self._next_seq
        self._next_seq = seq + 1
        framed = record.frame(seq)  # the same bytes go to the WAL and to the bucket's .data
        self._wal.append_frame(framed, seq + 1)
        n = self._apply(framed, record.due_ms, seq, record.xref, True)
        s = self._xstats.setdefault(record.xref, [0, 0])
        s[0] += 1
        s[1] += n
        if (self._wal.bytes_since_roll >= self.checkpoint_bytes + self._checkpoint_backoff
                and self._running is None):
            self.checkpoint_soon(self._own_checkpoint_done)
        return seq

    def _own_checkpoint_done(self, error: BaseException | None) -> None:
        if error is None:
            self._checkpoint_backoff = 0
            return
        # Not tried again here before another checkpoint_bytes of WAL (each try costs fsyncs).
        self._checkpoint_backoff = self._wal.bytes_since_roll
        # A full disk (or EIO) while checkpointing: the records are kept all the same, in the WAL (retried
        # by the syncer like any append, confirmed once on disk), and the buckets' buffers are written again
        # at the next checkpoint (the owner's timer, or the next append here). Raising reached the publisher
        # as 541 INTERNAL_ERROR with a traceback (issue 31); the classic and stream paths keep the write and
        # block on the disk alarm.
        self.checkpoint_failures += 1
        log.error("delay store: checkpoint failed (%s); retried later, the record is kept", error)

    def _apply(self, payload: bytes, due: int, seq: int, xref: int, framed: bool = False) -> int:
        """Add one record (``framed``: as :meth:`DelayRecord.frame` built it) to its bucket and, when it
        falls inside it, to the window; returns its payload length."""
        start = due - due % self.bucket_ms
        b = self._buckets.get(start)
        if b is None:
            b = Bucket(self._bdir, start)
            self._add_bucket(b)
        off, n = b.add(payload, due, seq, xref, framed)
        if (due, seq) <= self._window.hi:  # Window.covers, inlined (once per append)
            self._window.push((due, seq, start, off, n, xref))
        return n

    def _wal_durable(self, seq_end: int) -> None:
        self._durable_seq = max(self._durable_seq, seq_end)
        if self.on_durable is not None and not self.closed:
            self.on_durable(seq_end)

    def _wal_durable_failed(self, seq_end: int) -> None:
        if self.on_durable_failed is not None and not self.closed:
            self.on_durable_failed(seq_end)

    # -- dispatch -------------------------------------------------------------------------------------------
    def now(self) -> int:
        """The store's clock: the injected one (see the module docstring on jumps)."""
        t = self._now()
        self._last_now = max(self._last_now, t)
        return t

    def due(self, limit: int = 1000) -> list[DueRecord]:
        """Hand out up to ``limit`` records due now (see the module's dispatch contract)."""
        now = self.now()
        w = self._window
        out: list[DueRecord] = []
        while len(out) < limit:
            if w.wants(now, self.lookahead_ms):
                self._fill(now)
            e = w.head()
            if e is None or e[0] > now or e[1] >= self._durable_seq:
                break
            w.pop()
            seq = e[1]
            if seq in w.cancelled:
                w.cancelled.discard(seq)
                continue
            if e[5] in self._dead:
                continue
            try:
                rec = DelayRecord.decode(self._reader(e[2]).read(e[3], e[4]))
            except CorruptRecord:  # reported by the read
                self._drop_damaged(e)
                continue
            if (rec.seq, rec.due_ms, rec.xref) != (seq, e[0], e[5]):
                b = self._buckets[e[2]]
                corruption.report(b.path(".idx"), b.index_position((e[0], seq, e[3], e[4], e[5])),
                                  f"index entry (due {e[0]}, seq {seq}, exchange {e[5]}) does not match its record "
                                  f"(due {rec.due_ms}, seq {rec.seq}, exchange {rec.xref})", "not dispatched; dropped")
                self._drop_damaged(e)
                continue
            self._inflight[seq] = e
            out.append(DueRecord(rec, e[2], e[4]))
        return out

    def _drop_damaged(self, e: Entry) -> None:
        """A due entry whose record fails its check (already reported): resolved as cancelled, so that it
        is counted out of its exchange's pending figures, its bucket can drain, and it never comes out again
        (storage/corruption.py: damaged records are dropped and reported, the others are served)."""
        b = self._buckets[e[2]]
        entries = [(e[0], e[1], e[5], e[4])]
        b.log_disp(self._syncer, CANCELLED, entries)
        self._resolve(b, entries)
        self.corrupt_dropped += 1

    def next_due_ms(self) -> int | None:
        """When :meth:`due` may next have something (the owner's timer; call it again after ``on_durable``
        too, since a record is not handed out before it is durable). None when nothing is pending."""
        head = self._window.head()
        if head is not None:
            return head[0]
        hi = self._window.hi[0]
        for start in self._starts[max(0, bisect.bisect_right(self._starts, hi) - 1):]:
            if start + self.bucket_ms > hi and self._buckets[start].pending(self._dead):
                return max(start, hi)
        return None

    def _reader(self, start: int) -> Bucket:
        b = self._buckets[start]
        self._readers[start] = b
        self._readers.move_to_end(start)
        if len(self._readers) > MAX_OPEN_READERS:
            self._readers.popitem(last=False)[1].close_reader()
        return b

    def _fill(self, now: int) -> None:
        """Load into the window every pending entry with hi < key <= now + look-ahead, at most its room.

        Costs what the range holds, not what the buckets hold: a bucket's entries are read from the slices
        (bucket.py) covering the range, made by one pass over its index the first time a load touches it
        and extended with what was appended since (the next bucket is split a part per load ahead of time:
        :meth:`_presplit`); its dispatch log is read from where the last load stopped, keeping only the
        resolutions ahead of the window (what was dispatched was in the window then, and a cancel of an
        entry in the window is in ``window.cancelled``)."""
        w = self._window
        lo = w.hi
        ceiling = (now + self.lookahead_ms, MAX_SEQ)
        room = w.cap - len(w)
        cands: list[Entry] = []
        dead = self._dead
        inflight = self._inflight
        if lo < self._fill_lo:  # the window went back: resolutions behind the old one matter again
            for b in self._buckets.values():
                b.disp_seen = 0
                b.ahead = {}
        self._fill_lo = lo
        following = None
        for start in self._starts[max(0, bisect.bisect_right(self._starts, lo[0]) - 1):]:
            if start > ceiling[0]:
                following = start
                break
            b = self._buckets[start]
            if start + self.bucket_ms <= lo[0] or not b.pending(dead):
                continue
            done = self._resolved_ahead(b, lo)
            if b.split_len < 0 and b.idx_len < SPLIT_MIN * IDX_SIZE:
                parts: Iterable[int | None] = (None,)  # small: the whole index, no slices
            else:
                self.fill_split += b.split(self.bucket_ms)
                parts = range(b.slice_of(lo[0]), SLICES)
            for k in parts:
                if k is not None and start + k * b.slice_ms > ceiling[0]:
                    break
                for chunk in b.index_chunks(0) if k is None else b.slice_chunks(k):
                    self.fill_scanned += len(chunk) // IDX_SIZE
                    for due, seq, off, n, xref in IDX.iter_unpack(chunk):
                        key = (due, seq)
                        if key <= lo or key > ceiling or xref in dead or seq in done or seq in inflight:
                            continue
                        cands.append((due, seq, start, off, n, xref))
                        if len(cands) > 2 * room + 1024:
                            cands.sort()
                            del cands[room:]
                            ceiling = (cands[-1][0], cands[-1][1]) if cands else lo
        w.admit(cands, ceiling)
        if following is not None and following - ceiling[0] <= self.bucket_ms:
            self._presplit(self._buckets[following], following - ceiling[0])

    def _presplit(self, b: Bucket, until: int) -> None:
        """Split part of the next bucket ahead of time (``until`` ms before a load reaches it), so that no
        single load pays for splitting a whole big bucket: what is left, over the loads expected before it
        is reached (one per half look-ahead, more when the window's cap binds, which only makes it done
        sooner), at least PRESPLIT_MIN entries per load."""
        left = (b.idx_len - max(b.split_len, 0)) // IDX_SIZE
        if not left or (b.split_len < 0 and b.idx_len < SPLIT_MIN * IDX_SIZE) or not b.pending(self._dead):
            return
        loads = max(1, until // max(1, self.lookahead_ms // 2))
        self.fill_split += b.split(self.bucket_ms, max(PRESPLIT_MIN, -(-left // loads)))

    def _resolved_ahead(self, b: Bucket, lo: tuple[int, int]) -> dict[int, tuple[int, int]]:
        """The seqs of ``b`` dispatched or cancelled with a key above ``lo`` (the window's end), brought up
        to date from the part of its dispatch log not read yet."""
        records, end = b.disp_since(b.disp_seen)
        self.fill_disp_read += end - b.disp_seen
        b.disp_seen = end
        ahead = b.ahead
        for kind, entries in records:
            if kind in RESOLVING:
                for due, seq, _, _ in entries:
                    if (due, seq) > lo:
                        ahead[seq] = (due, seq)
        if ahead:
            for seq in [s for s, key in ahead.items() if key <= lo]:
                del ahead[seq]
        return ahead

    def begin(self, batch: Iterable[DueRecord]) -> None:
        """``batch`` (handed out by :meth:`due`) is about to be enqueued: log it ``BEGUN``, so that a crash
        from here until :meth:`dispatched` leaves it in doubt rather than simply pending. Durable after
        :meth:`when_durable` calls back."""
        by_bucket: dict[int, list[tuple[int, int, int, int]]] = {}
        for d in batch:
            e = self._inflight.get(d.record.seq)
            if e is not None:
                by_bucket.setdefault(e[2], []).append((e[0], e[1], e[5], e[4]))
        for start, entries in by_bucket.items():
            self._buckets[start].log_disp(self._syncer, BEGUN, entries)

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(True)`` once everything logged so far is fsynced (``False`` if that fsync failed);
        at once without a syncer."""
        if self._syncer is None:
            for b in self._buckets.values():
                if b.disp is not None and b.disp.write_out():
                    os.fsync(b.disp.fd)
            callback(True)
            return
        self._syncer.wait(_Durable(self._syncer.generation, callback))

    def dispatched(self, batch: Iterable[DueRecord]) -> None:
        """``batch`` (handed out by :meth:`due`) is safely enqueued: log it, so it never comes out again."""
        by_bucket: dict[int, list[tuple[int, int, int, int]]] = {}
        for d in batch:
            e = self._inflight.pop(d.record.seq, None)
            if e is None:
                continue
            by_bucket.setdefault(e[2], []).append((e[0], e[1], e[5], e[4]))
        for start, entries in by_bucket.items():
            b = self._buckets[start]
            b.log_disp(self._syncer, DISPATCHED, entries)
            self._resolve(b, entries)
            self.dispatched_total += len(entries)

    def release(self, batch: Iterable[DueRecord]) -> None:
        """Give back records handed out and not enqueued: they come out again from :meth:`due`."""
        for d in batch:
            e = self._inflight.pop(d.record.seq, None)
            if e is not None and self._window.covers(e[0], e[1]):
                # Beyond the window's end (a record in doubt after a restart): a later load finds it, and
                # pushing it too would put it in the window twice.
                self._window.push(e)

    def _resolve(self, b: Bucket, entries: list[tuple[int, int, int, int]]) -> None:
        self._count_resolved(b, entries)
        for _, _, xref, size in entries:
            s = self._xstats.get(xref)
            if s is not None:
                s[0] -= 1
                s[1] -= size

    # -- operations -----------------------------------------------------------------------------------------
    def _find(self, seq: int, due_ms: int) -> tuple[Bucket, tuple[int, int, int, int, int]] | None:
        """A pending entry by id: its bucket and index entry, None if unknown, dispatched or cancelled."""
        b = self._buckets.get(due_ms - due_ms % self.bucket_ms)
        if b is None:
            return None
        found = next((e for e in b.index() if e[1] == seq and e[0] == due_ms), None)
        if found is None or found[4] in self._dead:
            return None
        for kind, entries in b.disp_records(self._syncer):
            if kind in RESOLVING and any(s == seq for _, s, _, _ in entries):
                return None
        return b, found

    def get(self, seq: int, due_ms: int) -> DelayRecord | None:
        """One pending record, body included (an operator's "show one")."""
        f = self._find(seq, due_ms)
        if f is None:
            return None
        b, e = f
        return DelayRecord.decode(self._reader(b.start).read(e[2], e[3]))

    def cancel(self, seq: int, due_ms: int) -> bool:
        """Cancel one pending record (id: its seq and due time, as listed). False if it is not pending or
        is being dispatched right now (handed out and not yet marked or released)."""
        if seq in self._inflight:
            return False
        f = self._find(seq, due_ms)
        if f is None:
            return False
        b, (due, _, _, n, xref) = f
        if seq >= self._durable_seq:  # its WAL record must be on disk before its cancellation is
            self._wal.sync_now()
            self._durable_seq = self._next_seq
        entries = [(due, seq, xref, n)]
        b.log_disp(self._syncer, CANCELLED, entries)
        self._resolve(b, entries)
        if self._window.covers(due, seq):
            self._window.cancelled.add(seq)
        self.cancelled_total += 1
        return True

    def drop_exchange(self, xref: int) -> None:
        """Forget every pending record of ``xref`` (exchange deleted); durable when this returns."""
        self._dead.add(xref)
        self._xstats.pop(xref, None)
        self.checkpoint()

    def list_pending(self, xref: int, after: tuple[int, int] | None = None, limit: int = 100) -> list[PendingEntry]:
        """Pending records of ``xref`` by ``(due_ms, seq)``, those after ``after`` (the last of the previous
        page), at most ``limit``. Reads bucket indexes from disk, from the first bucket that may hold some."""
        return [PendingEntry(due, seq, xref, n) for due, seq, _, _, n in self._pending(xref, after, limit)]

    def list_records(self, xref: int, after: tuple[int, int] | None = None, limit: int = 100) -> list[DelayRecord]:
        """As :meth:`list_pending`, with each record read whole (an operator's page of routing keys and
        properties): one read per record at the offset its index entry gives, no index scan per record."""
        return [DelayRecord.decode(self._reader(start).read(off, n))
                for _, _, start, off, n in self._pending(xref, after, limit)]

    def purge_exchange(self, xref: int) -> int:
        """Cancel every pending record of ``xref`` at once (an operator's purge): the reference is dropped as
        on exchange deletion, so the owner must use a fresh one for what it holds next. Returns how many
        were pending (counted in ``cancelled_total``)."""
        n = self._xstats.get(xref, [0, 0])[0]
        self.drop_exchange(xref)
        self.cancelled_total += n
        return n

    def _pending(self, xref: int, after: tuple[int, int] | None,
                 limit: int) -> list[tuple[int, int, int, int, int]]:
        """``(due_ms, seq, bucket start, data offset, data length)`` of the pending records of ``xref``."""
        if xref in self._dead or limit <= 0:
            return []
        lo = after or MIN_KEY
        out: list[tuple[int, int, int, int, int]] = []
        for start in self._starts[max(0, bisect.bisect_right(self._starts, lo[0]) - 1):]:
            b = self._buckets[start]
            c = b.counts.get(xref)
            if c is None or c.count == c.resolved:
                continue
            done: set[int] = set()
            for kind, entries in b.disp_records(self._syncer):
                if kind in RESOLVING:
                    done.update(s for _, s, x, _ in entries if x == xref)
            out.extend((due, seq, start, off, n) for due, seq, off, n, x in b.index()
                       if x == xref and (due, seq) > lo and seq not in done)
            if len(out) >= limit:
                break
        out.sort()
        return out[:limit]

    def exchange_stats(self, xref: int) -> ExchangeStats:
        """Pending count and bytes (counters, O(1)) and next due time (reads one bucket's index)."""
        s = self._xstats.get(xref, [0, 0])
        first = self.list_pending(xref, limit=1) if s[0] else []
        return ExchangeStats(s[0], s[1], first[0].due_ms if first else None)

    def pending_count(self) -> int:
        return sum(s[0] for s in self._xstats.values())

    def bucket_starts(self) -> list[int]:
        return list(self._starts)

    @property
    def loaded(self) -> int:
        """Index entries in the window (the memory bound's subject)."""
        return len(self._window)

    # -- checkpoint, close ----------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Make the buckets durable, record their lengths, delete what is no longer needed: here and now
        (a clean stop, an exchange dropped), after the checkpoint running in the background, if any.
        Raises what failed (OSError: nothing lost, the next checkpoint writes it all)."""
        again = self._settle()
        error: BaseException | None = None
        try:
            cp = self._take_snapshot()
            self._write(cp)
            self._adopt(cp)
        except BaseException as e:
            error = e
            raise
        finally:
            for done in again:
                if done is not None:
                    done(error)

    def checkpoint_soon(self, done: Callable[[BaseException | None], None] | None = None) -> None:
        """Start a checkpoint whose writes run off the loop (at once without a loop); ``done(error)`` on the
        loop once it is over (``error`` None: durable). One running already: this one starts when it ends, so
        that it covers what was logged up to now."""
        if self.closed:
            return
        if self._running is not None:
            self._again.append(done)
            return
        try:
            cp = self._take_snapshot()
        except OSError as e:
            if done is not None:
                done(e)
            return
        cp.done = done
        self._running = cp
        try:
            self._background.submit(lambda: self._write(cp), lambda: self._finished(cp))
        except Exception as e:  # noqa: BLE001 -- no thread to write it (one could not be started): nothing taken
            self._running = None
            for fd in cp.disp_fds:
                os.close(fd)
            cp.disp_fds = []
            for b, w in cp.writes:
                b.restore(w)
            log.error("delay store: a checkpoint could not be handed to its thread; the buffers stay: %s", e)
            if done is not None:
                done(e)

    def _finished(self, cp: _Checkpoint) -> None:
        """Loop thread: the background write of ``cp`` is over."""
        if self._running is not cp or self.closed:
            return  # applied already (by checkpoint(), which waited for it), or the store is gone
        self._running = None
        error: BaseException | None = None
        try:
            self._adopt(cp)
        except OSError as e:
            error = e
        if cp.done is not None:
            cp.done(error)
        again, self._again = self._again, []
        if again:
            self.checkpoint_soon(_all(again))

    def _settle(self) -> list[Callable[[BaseException | None], None] | None]:
        """Wait for the background checkpoint and apply it (its callback told of the outcome); returns the
        callbacks of those asked for meanwhile, which the caller's own checkpoint covers."""
        again, self._again = self._again, []
        cp = self._running
        if cp is None:
            return again
        self._background.wait()
        self._running = None
        error: BaseException | None = None
        try:
            self._adopt(cp)
        except OSError as e:
            error = e
        if cp.done is not None:
            cp.done(error)
        return again

    def _take_snapshot(self) -> _Checkpoint:
        """On the loop: what the checkpoint writes and the manifest it saves then. Raises OSError (a dispatch
        log that cannot be written out, the WAL's roll) before anything is taken."""
        disp: list[tuple[Bucket, int]] = []
        for b in self._buckets.values():
            if b.disp is not None:
                if not b.disp.write_out():
                    assert b.disp.error is not None
                    raise b.disp.error
                disp.append((b, b.disp.size))
        first = self._wal.roll()
        # One pass (8,760 buckets for a year, all of them dirty when records are spread over it: this is the
        # loop's share of the checkpoint): each bucket's buffers taken, and its state for the manifest.
        disp_lens = {b.start: n for b, n in disp}
        busy = {e[2] for e in self._inflight.values()}
        dead_now = self._dead
        writes: list[tuple[Bucket, BucketWrite]] = []
        drained: dict[int, int] = {}
        states: dict[int, BucketState] = {}
        for s, b in self._buckets.items():
            w = b.detach() if b.buffered else None
            if w is not None:
                writes.append((b, w))
            if s not in busy and not b.pending(dead_now):
                drained[s] = b.changes
                continue
            states[s] = BucketState(b.data_len, b.idx_len, disp_lens.get(s, b.disp_len),
                                    {x: XrefCount(c.count, c.nbytes, c.resolved, c.resolved_bytes)
                                     for x, c in b.counts.items()},
                                    w.crc if w is not None else b.idx_crc)
        many = len(writes) > FSYNC_EACH_UP_TO  # then one syncfs covers the buckets and the dispatch logs
        fds: list[int] = []
        if not many:
            try:
                for b, _ in disp:
                    assert b.disp is not None
                    fds.append(os.dup(b.disp.fd))  # the thread's own: the loop may close the file meanwhile
            except BaseException:
                for fd in fds:
                    os.close(fd)
                for b, w in writes:
                    b.restore(w)
                raise
        dead = {x for x in dead_now if any(x in st.counts for st in states.values())}
        manifest = Manifest(first, self._next_seq, self.bucket_ms, dead, states)
        return _Checkpoint(writes, many, fds, disp, manifest, drained)

    def _write(self, cp: _Checkpoint) -> None:
        """The checkpoint's writes, on whatever thread (it touches only ``cp`` and the files): the buckets'
        buffers, their sync, the dispatch logs' sync, the directory's, then the manifest. Keeps what failed."""
        try:
            wrote = False
            for _, w in cp.writes:
                wrote = w.write(fsync=not cp.many) or wrote
            if cp.many:
                syncfs(self._bdir)
            for fd in cp.disp_fds:
                os.fsync(fd)
            if wrote:
                fsync_dir(self._bdir)
            cp.manifest.save(self._mpath)
            cp.error = None
        except Exception as e:  # noqa: BLE001 -- not lost: _adopt raises it on the loop
            cp.error = e
        finally:
            for fd in cp.disp_fds:
                os.close(fd)
            cp.disp_fds = []

    def _adopt(self, cp: _Checkpoint) -> None:
        """On the loop, once ``cp`` was written: the buckets read what it wrote from their files, the WAL
        before it and the drained buckets not touched since go. A failed write goes back to the buffers and
        its error is raised."""
        if cp.error is not None:
            for b, w in cp.writes:
                b.restore(w)
            raise cp.error
        for b, w in cp.writes:
            b.written(w)
        for b, n in cp.disp_lens:
            b.disp_len = n
        self._wal.delete_below(cp.manifest.wal)
        busy = {e[2] for e in self._inflight.values()}
        gone = [s for s, changes in cp.drained.items()
                if (left := self._buckets.get(s)) is not None and left.changes == changes and s not in busy
                and not left.pending(self._dead)]
        for s in gone:
            self._buckets.pop(s).delete()
            self._readers.pop(s, None)
        if gone:
            self._starts = sorted(self._buckets)
        self._dead = {x for x in self._dead if any(x in b.counts for b in self._buckets.values())}
        # every record appended before the snapshot is now in fsynced buckets
        self._durable_seq = max(self._durable_seq, cp.manifest.next_seq)
        now = self._last_now
        # Dispatch logs of buckets not due soon: no descriptor kept, unless something was logged after the
        # snapshot (a cancel meanwhile): its disp_len is still the old one, which the next manifest would save
        # with counts that include what came after it, so recovery would count that twice.
        for b in self._buckets.values():
            if b.disp is not None and b.start > now + self.lookahead_ms and b.disp.size == b.disp_len:
                b.disp.close()
                b.disp = None

    def close(self) -> None:
        """A clean stop: a last checkpoint, then every file closed."""
        if self.closed:
            return
        try:
            self.checkpoint()
        except OSError:
            self._close(abandon=True)  # what is not in a bucket file is in the WAL, which the next start replays
            raise
        self._close(abandon=False)

    def abandon(self) -> None:
        """Drop everything not yet handed to the kernel and close (what a crash does; tests). A checkpoint
        being written runs to its end first (as it may in a crash) and is not applied."""
        self._close(abandon=True)

    def _close(self, abandon: bool) -> None:
        self._background.close()
        cp, self._running = self._running, None
        waiting = ([cp.done] if cp is not None else []) + self._again
        self._again = []
        self.closed = True
        if waiting:  # abandoned with a checkpoint not applied: those waiting for it learn it did not happen
            _all(waiting)(OSError("the delay store closed before its checkpoint was applied"))
        for b in self._buckets.values():
            b.close(abandon)
        self._wal.close(abandon)


class _Checkpoint:
    """One checkpoint: what the snapshot took (the buckets' writes, the dispatch logs' lengths and the
    descriptors the thread syncs them by, the manifest to save, the buckets drained then with their
    ``changes``), and what became of it."""

    __slots__ = ("disp_fds", "disp_lens", "done", "drained", "error", "manifest", "many", "writes")

    def __init__(self, writes: list[tuple[Bucket, BucketWrite]], many: bool, disp_fds: list[int],
                 disp_lens: list[tuple[Bucket, int]], manifest: Manifest, drained: dict[int, int]) -> None:
        self.writes = writes
        self.many = many
        self.disp_fds = disp_fds
        self.disp_lens = disp_lens
        self.manifest = manifest
        self.drained = drained
        # Until _write says otherwise, the checkpoint did not happen: a job that never ran (or died before its
        # end) is not adopted as written.
        self.error: BaseException | None = OSError("the checkpoint's writes did not run to their end")
        self.done: Callable[[BaseException | None], None] | None = None


def _all(callbacks: list[Callable[[BaseException | None], None] | None]) -> Callable[[BaseException | None], None]:
    def done(error: BaseException | None) -> None:
        for callback in callbacks:
            if callback is not None:
                callback(error)
    return done


class _Durable:
    """A syncer waiter for :meth:`DelayStore.when_durable`: one generation, one callback."""

    __slots__ = ("callback", "generation")

    def __init__(self, generation: int, callback: Callable[[bool], None]) -> None:
        self.generation = generation
        self.callback = callback

    def on_synced(self, generation: int) -> bool:
        if generation < self.generation:
            return True
        self.callback(True)
        return False

    def on_sync_failed(self, generation: int) -> bool:
        if generation < self.generation:
            return True
        self.callback(False)
        return False
