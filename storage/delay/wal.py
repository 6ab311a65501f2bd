"""The delay store's write-ahead log: where an append becomes durable, with one fsync per burst.

Segments ``wal/<n:020d>.wal`` hold framed records (:mod:`storage.segment`). A new segment is started at
every checkpoint and at every open, so that a position is simply "segment n from its start": a checkpoint
names the first segment not yet applied to the buckets, and records appended after a crash never land in
a segment the checkpoint has already passed. Segments below the checkpoint are deleted.

Durability is reported like :attr:`storage.stream_store.FileStreamLog.on_durable`: ``on_durable(n)`` is
called (on the loop thread, after the syncer's fsync) when every record with a seq below ``n`` is on
disk; ``on_durable_failed(n)`` when an fsync covering them failed (they must not be confirmed).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator

from storage.segment import FLUSH_AT, HEADER_SIZE, AppendFile, scan
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

SUFFIX = ".wal"


class DelayWal:
    """Append and replay; the owner (the store) applies every appended record to its bucket itself."""

    def __init__(self, directory: str, syncer: Syncer | None) -> None:
        self.dir = directory
        self._syncer = syncer
        os.makedirs(directory, exist_ok=True)
        self.segments = sorted(int(n[:-len(SUFFIX)]) for n in os.listdir(directory)
                               if n.endswith(SUFFIX) and n[:-len(SUFFIX)].isdigit())
        self.active: AppendFile | None = None
        self._pending: deque[tuple[int, int]] = deque()  # (syncer generation, seq end) not yet durable
        self.on_durable: Callable[[int], None] | None = None
        self.on_durable_failed: Callable[[int], None] | None = None
        self.bytes_since_roll = 0

    def path(self, n: int) -> str:
        return os.path.join(self.dir, f"{n:020d}{SUFFIX}")

    def replay(self, first: int) -> Iterator[memoryview]:
        """The payloads of every valid record in segments ``>= first``, in order; a torn tail is cut."""
        for n in [s for s in self.segments if s >= first]:
            path = self.path(n)
            with open(path, "rb") as f:
                data = f.read()
            records, good_end, _ = scan(data, path)
            if good_end < len(data):
                log.warning("delay store: cut a torn tail of %d bytes from %s", len(data) - good_end, path)
                os.truncate(path, good_end)
            view = memoryview(data)
            for _, start, length in records:
                yield view[start:start + length]

    def roll(self) -> int:
        """Start a new segment (at open and at each checkpoint); returns its number."""
        if self.active is not None:
            self.active.close()
        n = (self.segments[-1] + 1) if self.segments else 1
        self.segments.append(n)
        self.active = AppendFile.create(self.path(n), self._syncer)
        self.bytes_since_roll = 0
        return n

    def delete_below(self, n: int) -> None:
        """Delete the segments wholly applied and checkpointed (a fsync on them by the syncer then finds
        nothing and skips: their records are durable in the buckets, fsynced by the checkpoint)."""
        for s in [s for s in self.segments if s < n]:
            try:
                os.unlink(self.path(s))
            except FileNotFoundError:
                pass
            self.segments.remove(s)

    def append(self, payload: bytes, seq_end: int) -> None:
        """Buffer one record; ``seq_end`` (its seq + 1) is reported through ``on_durable`` once fsynced."""
        assert self.active is not None
        self.active.append(payload)
        self.bytes_since_roll += len(payload) + HEADER_SIZE
        self._appended(seq_end)

    def append_frame(self, framed: bytes, seq_end: int) -> None:
        """As :meth:`append`, for a record already framed (magic, length, CRC32, payload: what
        :meth:`AppendFile.append` would buffer; :meth:`DelayRecord.frame` builds it), buffered as it is."""
        f = self.active
        assert f is not None
        buf = f.buf
        buf += framed
        if not f.dirty and f.syncer is not None:
            f.dirty = True
            f.syncer.mark(f)
        if len(buf) >= FLUSH_AT:
            f.write_out()
        self.bytes_since_roll += len(framed)
        self._appended(seq_end)

    def _appended(self, seq_end: int) -> None:
        syncer = self._syncer
        if syncer is None:
            if self.on_durable is not None:
                self.on_durable(seq_end)
            return
        gen = syncer.generation
        p = self._pending
        if p and p[-1][0] == gen:
            p[-1] = (gen, seq_end)
            return
        if not p:
            syncer.wait(self)
        p.append((gen, seq_end))

    def sync_now(self) -> None:
        """Write out and fsync the active segment on this thread (rare: a cancel of a record just appended)."""
        if self.active is not None and self.active.write_out():
            os.fsync(self.active.fd)

    def on_synced(self, generation: int) -> bool:
        """Syncer callback (loop thread)."""
        end = self._pop_upto(generation)
        if end >= 0 and self.on_durable is not None:
            self.on_durable(end)
        return bool(self._pending)

    def on_sync_failed(self, generation: int) -> bool:
        end = self._pop_upto(generation)
        if end >= 0 and self.on_durable_failed is not None:
            self.on_durable_failed(end)
        return bool(self._pending)

    def _pop_upto(self, generation: int) -> int:
        p = self._pending
        end = -1
        while p and p[0][0] <= generation:
            end = p.popleft()[1]
        return end

    def close(self, abandon: bool = False) -> None:
        if self.active is not None:
            if abandon:
                self.active.abandon()
            else:
                self.active.close()
            self.active = None
