"""Group commit: one fsync per file per burst, done by a background thread, never by the event loop.

Writers append to :class:`storage.segment.AppendFile` buffers; the first append of a burst marks the file
dirty here, which schedules :meth:`Syncer.flush` once with ``loop.call_soon``, so it runs after the
callbacks of the current loop iteration: the end of the burst. ``flush`` hands every dirty buffer to
the kernel (``os.write``, fast) and queues the files for the sync thread, tagged with a *generation*.
The thread fsyncs all queued files (requests that pile up while it is busy are merged into its next
round: that is the group commit) and reports back on the loop thread with ``call_soon_threadsafe``.

Whoever needs to know when data is durable (a queue waiting to confirm a publish) notes
``syncer.generation`` right after its writes and registers with :meth:`wait`; it is called back with
the newest durable generation. A write made before ``flush`` of generation g is durable once ``synced``
is g or more.

Without a loop (unit tests, tools) nothing happens in the background: ``flush`` fsyncs inline.

The thread fsyncs a file by opening its path, never by a descriptor its owner may close or reuse; a file
deleted meanwhile holds only dead records and is skipped.

Failures never turn into a confirm for bytes that aren't readable, and never into a silent stall:

- A *write* that fails (ENOSPC, EIO) leaves the unwritten bytes in the file's buffer (see
  :mod:`storage.segment`). The generation is then not committed: it stays open (later writes join it),
  every dirty file stays queued, and the flush is retried on a timer with back-off until the writes go
  through; only then is the generation fsynced and its waiters released. ``write_failing`` says so
  meanwhile and ``on_write_failure`` (the node's disk alarm) is told when it starts and stops.
- An *fsync* that fails may have lost dirty pages (the kernel marks them clean), so retrying it could
  lie. The generations it covered are reported to the waiters as failed (``on_sync_failed``: their
  publishers are nacked, not confirmed) and later generations go on as usual.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from storage.segment import fsync_dir

log = logging.getLogger("leveret.storage")

# Test-only hook, never set in production: LEVERET_TEST_FSYNC_DELAY_MS slows the disk writer. When set,
# the fsync thread sleeps that many milliseconds before each fsync round, as a slow disk would, so that
# tests can make publishes pile up waiting for their fsync (credit flow). Read when the fsync thread starts
# (not at import: the suite forks its brokers from a process that imported this module once, tests/broker_forks.py).
def _test_fsync_delay() -> float:
    return max(0.0, float(os.environ.get("LEVERET_TEST_FSYNC_DELAY_MS") or 0) / 1000.0)


# Back-off between retries of a flush whose writes failed (seconds): soon at first, then once a second.
RETRY_DELAYS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class SyncedFile(Protocol):
    """A file the syncer fsyncs (by ``path``) once its appends are written out: storage/segment.py's AppendFile,
    whose ``write_out`` hands its buffer to the kernel, and the metadata store's write-ahead log
    (storage/metadata_store.py), which SQLite has already written when a commit returns. ``written``/``synced``
    are positions (or counts) that only grow; ``new``: its directory entry needs an fsync too; ``write_behind``:
    its flush may wait for the round in progress (see :meth:`Syncer.flush`)."""

    path: str
    dirty: bool
    new: bool
    written: int
    synced: int
    write_behind: bool
    error: OSError | None

    def write_out(self) -> bool:
        """Hand what is buffered to the kernel; False (``error`` set) if a write failed."""
        ...


class SyncWaiter(Protocol):
    def on_synced(self, generation: int) -> bool:
        """Called on the loop thread; returns True to keep waiting for later generations."""

    def on_sync_failed(self, generation: int) -> bool:
        """An fsync covering the generations up to ``generation`` failed: what they wrote may not be on
        disk and must not be confirmed. Called on the loop thread; True to keep waiting for later ones."""


class Syncer:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._dirty: list[SyncedFile] = []
        self._scheduled = False
        self.generation = 1  # the generation the next flush commits
        self.synced = 0  # the newest generation known to be on disk
        self._waiters: dict[int, SyncWaiter] = {}
        self._cond = threading.Condition()
        self._queue: list[tuple[int, list[tuple[SyncedFile, int, str, bool]]]] = []
        self._done: list[tuple[int, list[tuple[SyncedFile, int]], bool]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.write_failing = False  # the last flush could not write everything: retrying
        self.last_error: OSError | None = None
        self._retries = 0
        self._retry_handle: asyncio.TimerHandle | None = None
        self._flush_after_round = False  # a flush came while the thread was busy: run it when the round ends
        self._urgent = False  # a dirty file is not write_behind: the next flush goes out at once
        # Told True when writes start failing and False when they go through again (the disk alarm).
        self.on_write_failure: Callable[[bool], None] | None = None
        # Told how many bytes each flush handed to the kernel (the disk monitor's write-rate trigger).
        self.on_written: Callable[[int], None] | None = None
        self.fsyncs = 0  # plain counters, read by metrics and tests
        self.rounds = 0
        self.write_failures = 0
        self.fsync_failures = 0

    # -- writers' side (loop thread) ------------------------------------------------------------------------
    def mark(self, f: SyncedFile) -> None:
        """``f`` has new appends: include it in the next flush (scheduled at the end of this burst)."""
        self._dirty.append(f)
        if not f.write_behind and not self._urgent:
            self._urgent = True
            if self._flush_after_round and self._loop is not None:
                # A stream's flush is waiting for the round in progress; this file's writers wait for a round's
                # latency (a classic queue's): the flush goes out now, as it would have without the stream.
                self._flush_after_round = False
                self._loop.call_soon(self.flush)
                return
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def wait(self, waiter: SyncWaiter) -> None:
        """Call ``waiter.on_synced`` after each completed sync until it returns False."""
        self._waiters[id(waiter)] = waiter

    def _take_dirty(self) -> tuple[int, list[tuple[SyncedFile, int, str, bool]]] | None:
        """Write out every dirty buffer and hand back what needs its fsync, under a new generation.

        None if some buffer could not be written: nothing is committed, every file stays dirty, and (with
        a loop) a retry is scheduled; the generation stays open for the writes still to come."""
        self._scheduled = False
        written = 0
        error: OSError | None = None
        for f in self._dirty:  # a file closed since it was marked was written out by close: still fsync it
            before = f.written
            if not f.write_out():
                error = f.error
            written += f.written - before
        if written and self.on_written is not None:
            self.on_written(written)
        if error is not None:
            self._write_failed(error)
            return None
        if self.write_failing:
            self._write_recovered()
        gen = self.generation
        self.generation = gen + 1
        items = []
        for f in self._dirty:
            f.dirty = False
            items.append((f, f.written, f.path, f.new))
            f.new = False
        self._dirty = []
        self._urgent = False
        return gen, items

    def _write_failed(self, error: OSError) -> None:
        self.write_failures += 1
        self.last_error = error
        if not self.write_failing:
            self.write_failing = True
            log.error("storage: writes are failing (%s); holding %d files' data in memory and retrying; "
                      "nothing written since is confirmed until the retry succeeds", error, len(self._dirty))
            if self.on_write_failure is not None:
                self.on_write_failure(True)
        if self._loop is not None and self._retry_handle is None:
            delay = RETRY_DELAYS[min(self._retries, len(RETRY_DELAYS) - 1)]
            self._retries += 1
            self._scheduled = True  # new appends wait for the retry rather than schedule flushes of their own
            self._retry_handle = self._loop.call_later(delay, self._retry)

    def _retry(self) -> None:
        self._retry_handle = None
        self.flush()

    def _write_recovered(self) -> None:
        self.write_failing = False
        self._retries = 0
        log.warning("storage: writes go through again; the held data is written")
        if self.on_write_failure is not None:
            self.on_write_failure(False)

    def flush(self) -> int:
        """Write out every dirty buffer and start their fsync; returns the generation committed (0 when
        a write failed and nothing was: see :meth:`_take_dirty`; 0 too when the flush waits for the thread).

        When every dirty file is ``write_behind`` (a stream's logs) and the thread is busy with a round (or
        has one queued), the flush waits for it: the buffers keep growing (each is written out at
        :data:`storage.segment.FLUSH_AT` regardless) and the thread's completion runs this flush
        (:meth:`_drain_done`). A burst of loop turns then costs one ``pwrite`` per file and one generation
        per round instead of one per turn (S8: 5.8 % of the event loop's time was those writes), at the cost
        of the hop through the loop between two rounds. Any other dirty file (a classic queue's, whose
        publishers keep few confirms outstanding, so that a round's latency is their throughput: S3 lost
        ~15 % with the wait) makes it a flush as before, written out and queued at once, so that the thread
        starts the next round the moment this one ends."""
        if not self._urgent and self._thread is not None and (self._busy or self._queue) \
                and self._loop is not None:
            self._flush_after_round = True  # _scheduled stays True: appends meanwhile schedule nothing
            return 0
        taken = self._take_dirty()
        if taken is None:
            return 0
        gen, items = taken
        if self._loop is None:
            ok, failed = self._fsync(items)
            self._complete(gen, ok, failed)
        else:
            self._ensure_thread()
            with self._cond:
                self._queue.append((gen, items))
                self._cond.notify()
        return gen

    def sync(self) -> None:
        """Make everything written so far durable before returning (shutdown, tests). Blocks. Raises
        ``OSError`` when some of it could not be written or fsynced."""
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None
        taken = self._take_dirty()
        if self._thread is not None:
            with self._cond:  # wait for the thread's queue to drain so generations complete in order
                while self._queue or self._busy:
                    self._cond.wait(0.05)
        self._drain_done()
        if taken is None:
            assert self.last_error is not None
            raise self.last_error
        gen, items = taken
        ok, failed = self._fsync(items)
        self._complete(gen, ok, failed)
        if failed:
            raise OSError(f"fsync failed: {self.last_error}")

    # -- the sync thread --------------------------------------------------------------------------------
    _busy = False

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="leveret-fsync", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        test_delay = _test_fsync_delay()
        while True:
            with cond:
                while not self._queue and not self._stopping:
                    cond.wait()
                if not self._queue:
                    return
                self._busy = True
            if test_delay:
                time.sleep(test_delay)  # test-only: a slow disk writer (see _test_fsync_delay)
            with cond:
                batch, self._queue = self._queue, []
            gen = batch[-1][0]
            merged: dict[int, tuple[SyncedFile, int, str, bool]] = {}
            for _, items in batch:
                for item in items:
                    prev = merged.get(id(item[0]))
                    if prev is None or item[1] >= prev[1]:
                        merged[id(item[0])] = (item[0], item[1], item[2], item[3] or (prev is not None and prev[3]))
            ok: list[tuple[SyncedFile, int]] = []
            failed = True
            try:
                ok, failed = self._fsync(list(merged.values()))
            finally:
                with cond:
                    self._done.append((gen, ok, failed))
                    self._busy = False
                    cond.notify_all()
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._drain_done)
                except RuntimeError:
                    pass  # the loop closed under us; sync() drains on shutdown

    def _fsync(self, items: list[tuple[SyncedFile, int, str, bool]]) -> tuple[list[tuple[SyncedFile, int]], bool]:
        """fsync each file (and the directory of new ones); returns those now durable, and whether any
        fsync failed (then the whole round counts as failed: its waiters are not confirmed)."""
        self.rounds += 1
        dirs = set()
        ok = []
        failed = False
        for f, size, path, new in items:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # deleted meanwhile: it held only dead records
            try:
                os.fsync(fd)
                self.fsyncs += 1
            except OSError as e:  # never report as durable what may not be on disk
                log.error("storage: fsync of %s failed; the messages it covered are not confirmed: %s", path, e)
                self.fsync_failures += 1
                self.last_error = e
                failed = True
                continue
            finally:
                os.close(fd)
            if new:
                dirs.add(os.path.dirname(path))
            ok.append((f, size))
        for d in dirs:
            try:
                fsync_dir(d)
            except OSError as e:  # a new file's name may not be on disk: its data is not durable either
                log.error("storage: fsync of directory %s failed: %s", d, e)
                self.fsync_failures += 1
                self.last_error = e
                failed = True
        return ok, failed

    # -- completion (loop thread) -------------------------------------------------------------------------
    def _drain_done(self) -> None:
        with self._cond:
            done, self._done = self._done, []
        for gen, items, failed in done:
            self._complete(gen, items, failed)
        if self._flush_after_round and self._retry_handle is None:
            self._flush_after_round = False
            self.flush()

    def _complete(self, gen: int, items: list[tuple[SyncedFile, int]], failed: bool = False) -> None:
        for f, size in items:
            f.synced = max(f.synced, size)
        waiters = self._waiters
        if failed:
            for key, w in list(waiters.items()):
                if not w.on_sync_failed(gen):
                    waiters.pop(key, None)
            return
        if gen <= self.synced:
            return
        self.synced = gen
        if waiters:
            for key, w in list(waiters.items()):
                if not w.on_synced(gen):
                    waiters.pop(key, None)

    def close(self) -> None:
        """Sync what is pending and stop the thread (raises like :meth:`sync`, after stopping it)."""
        try:
            self.sync()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the thread and any retry, without syncing (after a failed clean stop)."""
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None
        if self._thread is not None:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            self._thread.join()
            self._thread = None
            self._drain_done()


def on_loop_thread(fn: Callable[[], None], loop: asyncio.AbstractEventLoop | None) -> None:
    """Run ``fn`` on the loop thread (now if there is no loop)."""
    if loop is None:
        fn()
    else:
        loop.call_soon_threadsafe(fn)
