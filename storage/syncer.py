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
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from storage.segment import AppendFile, fsync_dir

log = logging.getLogger("leveret.storage")

# Test-only hook, never set in production: LEVERET_TEST_FSYNC_DELAY_MS slows the disk writer. When set,
# the fsync thread sleeps that many milliseconds before each fsync round, as a slow disk would, so that
# tests can make publishes pile up waiting for their fsync (credit flow). Read once, at import.
_TEST_FSYNC_DELAY = max(0.0, float(os.environ.get("LEVERET_TEST_FSYNC_DELAY_MS") or 0) / 1000.0)


class SyncWaiter(Protocol):
    def on_synced(self, generation: int) -> bool:
        """Called on the loop thread; returns True to keep waiting for later generations."""


class Syncer:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._dirty: list[AppendFile] = []
        self._scheduled = False
        self.generation = 1  # the generation the next flush commits
        self.synced = 0  # the newest generation known to be on disk
        self._waiters: dict[int, SyncWaiter] = {}
        self._cond = threading.Condition()
        self._queue: list[tuple[int, list[tuple[AppendFile, int, str, bool]]]] = []
        self._done: list[tuple[int, list[tuple[AppendFile, int]]]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        # After a failed fsync the kernel may have dropped the dirty pages: like PostgreSQL, stop
        # reporting anything as durable (no confirms) rather than retry and lie.
        self.failed = False
        self.fsyncs = 0  # plain counters, read by metrics and tests
        self.rounds = 0

    # -- writers' side (loop thread) ------------------------------------------------------------------------
    def mark(self, f: AppendFile) -> None:
        """``f`` has new appends: include it in the next flush (scheduled at the end of this burst)."""
        self._dirty.append(f)
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def wait(self, waiter: SyncWaiter) -> None:
        """Call ``waiter.on_synced`` after each completed sync until it returns False."""
        self._waiters[id(waiter)] = waiter

    def _take_dirty(self) -> tuple[int, list[tuple[AppendFile, int, str, bool]]]:
        """Write out every dirty buffer and hand back what needs its fsync, under a new generation."""
        self._scheduled = False
        gen = self.generation
        self.generation = gen + 1
        items = []
        for f in self._dirty:  # a file closed since it was marked was written out by close: still fsync it
            f.dirty = False
            f.write_out()
            items.append((f, f.written, f.path, f.new))
            f.new = False
        self._dirty = []
        return gen, items

    def flush(self) -> int:
        """Write out every dirty buffer and start their fsync; returns the generation committed."""
        gen, items = self._take_dirty()
        if self._loop is None:
            self._complete(gen, self._fsync(items))
        else:
            self._ensure_thread()
            with self._cond:
                self._queue.append((gen, items))
                self._cond.notify()
        return gen

    def sync(self) -> None:
        """Make everything written so far durable before returning (shutdown, tests). Blocks."""
        gen, items = self._take_dirty()
        if self._thread is not None:
            with self._cond:  # wait for the thread's queue to drain so generations complete in order
                while self._queue or self._busy:
                    self._cond.wait(0.05)
        ok = self._fsync(items)
        self._drain_done()
        self._complete(gen, ok)

    # -- the sync thread --------------------------------------------------------------------------------
    _busy = False

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="leveret-fsync", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._stopping:
                    cond.wait()
                if not self._queue:
                    return
                self._busy = True
            if _TEST_FSYNC_DELAY:
                time.sleep(_TEST_FSYNC_DELAY)  # test-only: a slow disk writer (see _TEST_FSYNC_DELAY)
            with cond:
                batch, self._queue = self._queue, []
            gen = batch[-1][0]
            merged: dict[int, tuple[AppendFile, int, str, bool]] = {}
            for _, items in batch:
                for item in items:
                    prev = merged.get(id(item[0]))
                    if prev is None or item[1] >= prev[1]:
                        merged[id(item[0])] = (item[0], item[1], item[2], item[3] or (prev is not None and prev[3]))
            ok: list[tuple[AppendFile, int]] = []
            try:
                ok = self._fsync(list(merged.values()))
            finally:
                with cond:
                    self._done.append((gen, ok))
                    self._busy = False
                    cond.notify_all()
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._drain_done)
                except RuntimeError:
                    pass  # the loop closed under us; sync() drains on shutdown

    def _fsync(self, items: list[tuple[AppendFile, int, str, bool]]) -> list[tuple[AppendFile, int]]:
        """fsync each file (and the directory of new ones); returns those now durable."""
        self.rounds += 1
        dirs = set()
        ok = []
        for f, size, path, new in items:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # deleted meanwhile: it held only dead records
            try:
                os.fsync(fd)
                self.fsyncs += 1
            except OSError as e:  # never report as durable what may not be on disk
                log.error("storage: fsync of %s failed, nothing more will be reported durable: %s", path, e)
                self.failed = True
                continue
            finally:
                os.close(fd)
            if new:
                dirs.add(os.path.dirname(path))
            ok.append((f, size))
        for d in dirs:
            try:
                fsync_dir(d)
            except OSError as e:
                log.error("storage: fsync of directory %s failed: %s", d, e)
        return ok

    # -- completion (loop thread) -------------------------------------------------------------------------
    def _drain_done(self) -> None:
        with self._cond:
            done, self._done = self._done, []
        for gen, items in done:
            self._complete(gen, items)

    def _complete(self, gen: int, items: list[tuple[AppendFile, int]]) -> None:
        if self.failed:
            return
        for f, size in items:
            f.synced = max(f.synced, size)
        if gen <= self.synced:
            return
        self.synced = gen
        if self._waiters:
            waiters = self._waiters
            for key, w in list(waiters.items()):
                if not w.on_synced(gen):
                    waiters.pop(key, None)

    def close(self) -> None:
        """Sync what is pending and stop the thread."""
        self.sync()
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
