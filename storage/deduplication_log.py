"""The durable part of a message-deduplication cache: an append-only log of the entries it admitted, so that a
restart (clean or ``kill -9``) brings the cache back and a message re-published after its confirm is still a
duplicate (broker/deduplication.py has the cache and the semantics; this module stores bytes).

One log per cache, its files under ``<data dir>/deduplication/``, named ``<id>.<n>.dlog`` (``<id>`` a digest
of what the cache belongs to, ``n`` counting up). Every record is a storage/segment.py record (magic,
length, CRC32) whose payload is::

    offset 0   u64  the entry's expiry, wall-clock ms since the epoch (0: never expires), with bit 63
                    (DIGESTED) set when the key is a digest
    offset 8   ..   the key: the cache's 16-byte digest of the header value (broker/deduplication.py); the
                    header value itself in records written before digests, which the cache digests on replay

Writes go through the node's one :class:`~storage.syncer.Syncer`, the same one the queue index, the message
store and the stream store use, so an entry appended in a burst is fsynced with the messages of that burst:
a queue's publisher confirm, which waits for the fsync of the message's generation, never precedes the
fsync of an entry appended before it in the same or an earlier burst. :attr:`DedupLog.durable` and
:meth:`DedupLog.call_when_durable` say when the last entry is on disk (a duplicate's confirm waits for it).

Replaying the files oldest first reproduces the cache: an entry re-inserted moves to the newest place, and
the cache's own size limit drops the oldest, as it did when they were written. The log never shrinks in
place: once a file holds many more records than the cache has entries, :meth:`DedupLog.start_rotation` starts
the next file, the cache copies its live entries into it a few with each admission (so that a cache of
millions never stalls the loop), and the older files are deleted once that snapshot is complete and
durable. A crash before then leaves both, and replaying both still gives the live entries (only their order
among themselves may differ). A torn tail is cut at open, as everywhere in storage/.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
import struct
from collections.abc import Callable

from storage.segment import AppendFile, Scan
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

DIRECTORY = "deduplication"
SUFFIX = ".dlog"
ENTRY = struct.Struct("<Q")
assert ENTRY.size == 8
# Set in a record's expiry when its key is the cache's digest (broker/deduplication_ring.py); records written
# before digests (the header value as the key) lack it. Expiries are ms since the epoch, far below 2^63.
DIGESTED = 1 << 63
# Set in the records of a snapshot (the first records of a file that a rotation started): replayed only when
# no older file is there, since an older file holds the history the snapshot summarizes.
SNAPSHOT = 1 << 62
_FILE = re.compile(r"([0-9a-f]{32})\.([0-9]+)" + re.escape(SUFFIX))


def log_id(kind: str, vhost: str, name: str) -> str:
    """The file name stem of a cache: a digest, since vhost, queue and exchange names may hold any character."""
    return hashlib.sha256(f"{kind}\0{vhost}\0{name}".encode()).hexdigest()[:32]


def _files_of(directory: str, ident: str) -> list[tuple[int, str]]:
    """(number, path) of every file of the cache ``ident``, oldest first."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for n in names:
        m = _FILE.fullmatch(n)
        if m is not None and m.group(1) == ident:
            found.append((int(m.group(2)), os.path.join(directory, n)))
    return sorted(found)


def log_ids(directory: str) -> set[str]:
    """The ids of every cache with a file in ``directory``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {m.group(1) for m in map(_FILE.fullmatch, names) if m is not None}


def remove_files(directory: str, ident: str) -> None:
    for _, path in _files_of(directory, ident):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _replay_file(path: str, replay: Callable[[bytes, int, bool], None], base: bool) -> tuple[int, int]:
    """Feed one file's entries to ``replay`` (its snapshot records only when it is the ``base``, the oldest file
    there); returns (valid records, where the last valid one ends)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0, 0
        data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    found = Scan(data, path)
    walk = iter(found)
    try:
        records = 0
        unpack = ENTRY.unpack_from
        for _, start, n in walk:
            records += 1
            if n >= ENTRY.size:
                stamp = unpack(data, start)[0]
                if stamp & SNAPSHOT and not base:
                    continue
                replay(data[start + ENTRY.size:start + n], stamp & ~(DIGESTED | SNAPSHOT), bool(stamp & DIGESTED))
        return records, found.good_end
    finally:
        walk.close()  # type: ignore[attr-defined]  # a generator: releases its view of the map before the map closes
        data.close()


class DedupLog:
    """The open log of one cache (see the module docstring). Built by :meth:`open`."""

    def __init__(self, directory: str, ident: str, syncer: Syncer, number: int, file: AppendFile,
                 older: list[str], records: int) -> None:
        self.directory = directory
        self.ident = ident
        self._syncer = syncer
        self._number = number
        self._file: AppendFile | None = file
        self._older = older  # files the current one's snapshot replaces, deleted once it is durable
        self._next: AppendFile | None = None  # the file a rotation in progress writes its snapshot to
        self._next_records = 0
        self.records = records  # records in the current file
        self._last_generation = 0  # the syncer generation of the last append (0: none since open)
        self._waiting: list[tuple[int, Callable[[bool], None]]] = []  # (generation, callback), in order
        self.deleted = False

    @classmethod
    def open(cls, directory: str, ident: str, syncer: Syncer, fresh: bool,
             replay: Callable[[bytes, int, bool], None]) -> DedupLog:
        """The cache's log; ``replay(key, expires_at_ms, digested)`` is called with each entry its files hold,
        oldest first (``digested``: the key is the cache's digest; else it was written as the header value by
        an older version). ``fresh``: a new cache whose name was used before (a queue deleted and declared
        again): whatever is there is removed first. Files are read through a memory map, record by record, so
        replaying millions of entries holds none of them but in the cache."""
        os.makedirs(directory, exist_ok=True)
        files = _files_of(directory, ident)
        if fresh:
            remove_files(directory, ident)
            files = []
        records = 0
        good_end = 0
        for i, (_, path) in enumerate(files):
            records, good_end = _replay_file(path, replay, base=i == 0)
        if files:
            number, path = files[-1]
            file = AppendFile.open_existing(path, syncer, good_end)
        else:
            number = 0
            file = AppendFile.create(os.path.join(directory, f"{ident}.{number}{SUFFIX}"), syncer)
        older = [p for _, p in files[:-1]]
        return cls(directory, ident, syncer, number, file, older, records)

    # -- writing --------------------------------------------------------------------------------------------
    def append(self, digest: bytes, expires_at_ms: int) -> None:
        """Log one admitted entry by its digest (buffered; written and fsynced at the end of the burst by the
        syncer)."""
        f = self._file
        if f is None:
            return
        f.append(ENTRY.pack(expires_at_ms | DIGESTED) + digest)
        self.records += 1
        self._last_generation = self._syncer.generation

    def start_rotation(self) -> None:
        """Open the next file for a snapshot of the cache: the cache copies its live entries into it, oldest first,
        a few with each admission (:meth:`append_snapshot`, so that a cache of millions never stalls the loop),
        while admissions still go to the current file; when the copy has caught up with the newest entry it
        calls :meth:`finish_rotation`, and admissions follow the snapshot in the new file. Until then the new
        file's snapshot records are ignored on replay whenever an older file is there (that file holds the
        history they summarize), so a crash at any point replays exactly what the cache held."""
        if self._file is None or self._next is not None:
            return
        self._next = AppendFile.create(os.path.join(self.directory, f"{self.ident}.{self._number + 1}{SUFFIX}"),
                                       self._syncer)
        self._next_records = 0

    @property
    def rotating(self) -> bool:
        return self._next is not None

    def append_snapshot(self, digest: bytes, expires_at_ms: int) -> None:
        """Copy one live entry into the next file (between :meth:`start_rotation` and :meth:`finish_rotation`)."""
        f = self._next
        if f is None:
            return
        f.append(ENTRY.pack(expires_at_ms | DIGESTED | SNAPSHOT) + digest)
        self._next_records += 1
        self._last_generation = self._syncer.generation

    def finish_rotation(self) -> None:
        """The snapshot holds every live entry: admissions go to the new file from now on, and the files before
        it are deleted once it is durable."""
        old, new = self._file, self._next
        if old is None or new is None:
            return
        self._older.append(old.path)
        try:
            old.close()
        except OSError:
            old.abandon()  # what it did not write is in the snapshot
        self._file, self._next = new, None
        self._number += 1
        self.records = self._next_records
        if self.records == 0:  # nothing live: the empty new file still has to be durable (its directory entry)
            self._syncer.mark(new)
            new.dirty = True
            self._last_generation = self._syncer.generation
        self.call_when_durable(self._drop_older)

    def _drop_older(self, ok: bool) -> None:
        if not ok or self.deleted:
            return  # keep them: the snapshot may not be on disk; the next rotation tries again
        older, self._older = self._older, []
        for path in older:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- durability -----------------------------------------------------------------------------------------
    @property
    def durable(self) -> bool:
        """Whether every entry appended so far is on disk."""
        return self._last_generation <= self._syncer.synced

    def call_when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once every entry appended so far is on disk (now, if it is), or
        ``callback(False)`` if the fsync meant to cover them failed."""
        gen = self._last_generation
        if gen <= self._syncer.synced:
            callback(True)
            return
        if not self._waiting:
            self._syncer.wait(self)
        self._waiting.append((gen, callback))

    def on_synced(self, generation: int) -> bool:
        """Syncer callback (loop thread)."""
        return self._settle(generation, True)

    def on_sync_failed(self, generation: int) -> bool:
        """Syncer callback: the fsync covering these generations failed."""
        return self._settle(generation, False)

    def _settle(self, generation: int, ok: bool) -> bool:
        waiting = self._waiting
        n = 0
        while n < len(waiting) and waiting[n][0] <= generation:
            n += 1
        if n:
            done, self._waiting = waiting[:n], waiting[n:]
            for _, callback in done:
                callback(ok)
        return bool(self._waiting)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Write out the buffers and close (the node stops; the syncer's last sync makes it durable). A snapshot
        in progress stays as it is: replay ignores it beside the older file."""
        for f in (self._file, self._next):
            if f is None:
                continue
            try:
                f.close()
            except OSError as e:
                log.error("storage: could not write the deduplication log %s at close: %s", f.path, e)
                f.abandon()
        self._file = self._next = None

    def delete(self) -> None:
        """The cache is gone (its queue or exchange was deleted): its files go."""
        for f in (self._file, self._next):
            if f is not None:
                f.abandon()
        self._file = self._next = None
        self.deleted = True
        remove_files(self.directory, self.ident)
        for _, callback in self._waiting:
            callback(True)  # whoever waited is answered: what it waited for no longer matters
        self._waiting = []
