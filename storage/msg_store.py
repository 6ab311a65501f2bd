"""The shared message store (RabbitMQ's ``rabbit_msg_store``): one persistent and one transient per node.

Messages too big to embed in a queue index live here, once each however many queues hold them: a
message is keyed by its ``msg_id`` (an int from :func:`storage.backing_queue.new_msg_id`, the same for every
queue a message is routed to) and carries a reference count; :meth:`MsgStore.write` stores it,
:meth:`incref` adds a reference to a stored one, :meth:`remove` drops one. At zero the record is dead.

On disk: ``<dir>/<n:08d>.msgs`` segment files of records (see :mod:`storage.segment`) whose payload is
the 16-byte little-endian msg id followed by the message bytes. Files fill to ``file_size_limit``; a file
whose records are all dead is deleted, one whose live bytes fall under ``compact_below`` of its size is
rewritten with only its live records by a worker thread (the event loop only swaps the locations in).

Durability: appends are buffered and fsynced by the :class:`~storage.syncer.Syncer` at the end of each
burst; :meth:`is_durable` says whether a message's record is fsynced.

Recovery: a clean :meth:`close` writes ``clean.snapshot`` (every location and reference count, plus
each file's size), which the next start loads and deletes at once; a start without it is *dirty*: the
store scans every file (cutting torn tails, skipping corrupt records) and knows where each message is
but not who needs it, so each durable queue recovering its index calls :meth:`add_recovered_ref` for
the messages it still holds, and :meth:`finish_recovery` then drops the rest. The transient store
(``durable=False``) starts empty.

The in-memory index costs one dict entry per message (location packed in one int); reference counts
above one live in a second, usually tiny, dict.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import struct
import threading
from collections.abc import Iterable

import msgpack

from storage.segment import (
    HEADER_SIZE,
    AppendFile,
    CorruptRecord,
    fsync_dir,
    read_framed_file,
    replace_file,
    scan,
    write_file_atomically,
)
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

ID = struct.Struct("<QQ")
ID_SIZE = ID.size
SNAP_ENTRY = struct.Struct("<QQIIII")  # id low, id high, file, payload offset, payload length, refs
M32 = (1 << 32) - 1
M64 = (1 << 64) - 1
SUFFIX = ".msgs"
SNAPSHOT = "clean.snapshot"



# What a compaction hands back to the loop thread: the file, the moves (msg id, old payload offset, new payload
# offset, length; None if it failed), the new file's size, and the payload-offset ranges of the old file that
# held no valid record (damage the scan reported, or a torn tail).
Compacted = tuple[int, list[tuple[int, int, int, int]] | None, int, list[tuple[int, int]]]

# The current file is replaced by a fresh one when all its records are dead and it is at least this big.
ROLL_DEAD_CURRENT_ABOVE = 1 << 20


def _loc(file: int, off: int, n: int) -> int:
    return (file << 64) | (off << 32) | n


class MsgStore:
    def __init__(self, directory: str, *, syncer: Syncer | None = None, durable: bool = True,
                 loop: asyncio.AbstractEventLoop | None = None, file_size_limit: int = 16 << 20,
                 compact_below: float = 0.5) -> None:
        self.directory = directory
        self.durable = durable
        self._syncer = syncer if durable else None
        self._loop = loop
        self.file_size_limit = file_size_limit
        self.compact_below = compact_below
        self._locs: dict[int, int] = {}
        self._refs: dict[int, int] = {}
        self._files: dict[int, AppendFile] = {}
        self._live: dict[int, int] = {}
        self._compacting: set[int] = set()
        self._candidates: set[int] = set()
        self._worker: threading.Thread | None = None
        self._jobs: queue.Queue[int | None] = queue.Queue()  # files to compact; None stops the worker
        self._results: list[Compacted] = []
        self._results_lock = threading.Lock()
        self.recovering = False
        self.was_clean = False
        self._recovered_refs: dict[int, int] = {}
        self.compactions = 0  # plain counters for metrics and tests
        self.deleted_files = 0
        os.makedirs(directory, exist_ok=True)
        if not durable:
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
        else:
            self._recover()
        self._cur_no = max(self._files, default=-1) + 1
        self._cur = self._new_file(self._cur_no)

    # -- writing and reading (loop thread) ---------------------------------------------------------------
    def contains(self, msg_id: int) -> bool:
        return msg_id in self._locs

    def incref(self, msg_id: int) -> bool:
        """Add a reference to a stored message; False (and nothing done) if it is not stored."""
        if msg_id not in self._locs:
            return False
        self._refs[msg_id] = self._refs.get(msg_id, 1) + 1
        return True

    def write(self, msg_id: int, data: bytes) -> None:
        """Store a message with one reference (use :meth:`incref` first for one that may be stored)."""
        cur = self._cur
        if cur.size >= self.file_size_limit:
            cur = self._roll()
        off = cur.append2(ID.pack(msg_id & M64, msg_id >> 64), data)
        n = ID_SIZE + len(data)
        self._locs[msg_id] = (self._cur_no << 64) | (off << 32) | n
        self._live[self._cur_no] += n + HEADER_SIZE

    def read(self, msg_id: int) -> bytes | None:
        """The message's bytes; None if it is not stored or its record is damaged (logged)."""
        loc = self._locs.get(msg_id)
        if loc is None:
            return None
        f = self._files[loc >> 64]
        try:
            payload = f.read_payload((loc >> 32) & M32, loc & M32)
        except CorruptRecord:
            return None  # reported by the read (storage/corruption.py); the queue drops the message
        return payload[ID_SIZE:]

    def remove(self, msg_id: int) -> None:
        """Drop one reference; the record is dead at zero."""
        refs = self._refs.get(msg_id)
        if refs is not None:
            if refs > 2:
                self._refs[msg_id] = refs - 1
            else:
                del self._refs[msg_id]
            return
        loc = self._locs.pop(msg_id, None)
        if loc is None:
            return
        file = loc >> 64
        self._live[file] -= (loc & M32) + HEADER_SIZE
        if file != self._cur_no:
            self._maybe_gc(file)
        elif self._live[file] == 0 and self._cur.size >= ROLL_DEAD_CURRENT_ABOVE:
            # Everything written so far was consumed: start a new file so this one can go at once,
            # rather than keeping it until it fills up (disk use falls back once messages are acked).
            self._roll()

    def remove_all(self, msg_ids: Iterable[int]) -> None:
        for msg_id in msg_ids:
            self.remove(msg_id)

    def is_durable(self, msg_id: int) -> bool:
        """Whether the message's record is fsynced (always False for the transient store)."""
        loc = self._locs.get(msg_id)
        if loc is None or not self.durable:
            return False
        return self._files[loc >> 64].synced >= ((loc >> 32) & M32) + (loc & M32)

    def refcount(self, msg_id: int) -> int:
        if msg_id not in self._locs:
            return 0
        return self._refs.get(msg_id, 1)

    def __len__(self) -> int:
        return len(self._locs)

    def file_numbers(self) -> list[int]:
        return sorted(self._files)

    def disk_bytes(self) -> int:
        return sum(f.size for f in self._files.values())

    # -- files ----------------------------------------------------------------------------------------------
    def _path(self, n: int) -> str:
        return os.path.join(self.directory, f"{n:08d}{SUFFIX}")

    def _new_file(self, n: int) -> AppendFile:
        f = AppendFile.create(self._path(n), self._syncer)
        self._files[n] = f
        self._live[n] = 0
        return f

    def _roll(self) -> AppendFile:
        old_no = self._cur_no
        self._cur.write_out()
        self._cur_no += 1
        self._cur = self._new_file(self._cur_no)
        self._maybe_gc(old_no)
        return self._cur

    def _maybe_gc(self, file: int) -> None:
        if file in self._compacting:
            return
        f = self._files[file]
        live = self._live[file]
        if live == 0:
            self._delete_file(file)
        elif live < f.size * self.compact_below:
            if self.durable and f.synced < f.size:
                self._candidates.add(file)  # retried once it is synced (see on_synced)
                if self._syncer is not None:
                    self._syncer.wait(self)
                return
            self._start_compaction(file)

    def _delete_file(self, file: int) -> None:
        f = self._files.pop(file)
        del self._live[file]
        self._candidates.discard(file)
        f.abandon()  # every record in it is dead: nothing buffered needs writing
        try:
            os.unlink(f.path)
        except FileNotFoundError:
            pass
        self.deleted_files += 1

    def on_synced(self, generation: int) -> bool:
        """Syncer callback: files waiting to be compacted may now be fully synced."""
        for file in list(self._candidates):
            f = self._files.get(file)
            if f is None:
                self._candidates.discard(file)
            elif f.synced >= f.size:
                self._candidates.discard(file)
                self._maybe_gc(file)
        return bool(self._candidates)

    def on_sync_failed(self, generation: int) -> bool:
        """Syncer callback: candidates stay candidates until a later fsync covers them."""
        return bool(self._candidates)

    # -- compaction -------------------------------------------------------------------------------------
    def _start_compaction(self, file: int) -> None:
        self._candidates.discard(file)
        self._compacting.add(file)
        if self._loop is None:
            self._apply(self._compact_file(file))
            return
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="leveret-compact", daemon=True)
            self._worker.start()
        self._jobs.put(file)

    def _work(self) -> None:
        while True:
            file = self._jobs.get()
            try:
                if file is None:
                    return
                try:
                    result = self._compact_file(file)
                except Exception:
                    log.exception("storage: compaction of file %d failed", file)
                    result = (file, None, 0, [])
                with self._results_lock:
                    self._results.append(result)
                loop = self._loop
                if loop is not None and not loop.is_closed():
                    try:
                        loop.call_soon_threadsafe(self._apply_results)
                    except RuntimeError:
                        pass
            finally:
                self._jobs.task_done()

    def _compact_file(self, file: int) -> Compacted:
        """Worker thread: copy the live records of ``file`` to a new file and rename it over the old one.
        Liveness is checked with single dict reads (atomic under the GIL); a record that dies meanwhile is
        simply dead in the new file, and the loop thread only adopts locations that did not change.

        A record that fails its check cannot be copied (its msg id is not to be trusted): the scan reports it
        (storage/corruption.py) and the byte ranges no valid record covers go back with the result, so that the
        loop thread drops the messages whose locations lie there (see :meth:`_drop_damaged`)."""
        path = self._path(file)
        with open(path, "rb") as fh:
            data = fh.read()
        records, _, _ = scan(data, path)
        moves: list[tuple[int, int, int, int]] = []
        damaged: list[tuple[int, int]] = []
        out = bytearray()
        locs = self._locs
        covered = 0
        for rec_off, start, n in records:
            if rec_off > covered:
                damaged.append((covered, rec_off))
            covered = start + n
            lo, hi = ID.unpack_from(data, start)
            msg_id = (hi << 64) | lo
            if locs.get(msg_id) != _loc(file, start, n):
                continue
            new_start = len(out) + HEADER_SIZE
            out += data[rec_off:start + n]
            moves.append((msg_id, start, new_start, n))
        if covered < len(data):
            damaged.append((covered, len(data)))
        replace_file(path, out, self.durable)  # a partial copy (full disk) never replaces the file
        return file, moves, len(out), damaged

    def _apply_results(self) -> None:
        with self._results_lock:
            results, self._results = self._results, []
        for result in results:
            self._apply(result)

    def _apply(self, result: Compacted) -> None:
        """Loop thread: adopt a compacted file's new locations and open it in place of the old one."""
        file, moves, size, damaged = result
        self._compacting.discard(file)
        if moves is None or file not in self._files:
            return
        if damaged:
            self._drop_damaged(file, damaged)  # before adopting: a new location may lie in an old gap
        locs = self._locs
        live = 0
        for msg_id, old, new, n in moves:
            if locs.get(msg_id) == _loc(file, old, n):
                locs[msg_id] = _loc(file, new, n)
                live += n + HEADER_SIZE
        old_f = self._files[file]
        f = AppendFile.open_existing(self._path(file), self._syncer, size)
        f.synced = size
        self._files[file] = f
        old_f.close()
        self._live[file] = live
        self.compactions += 1
        if live == 0:
            self._delete_file(file)

    def _drop_damaged(self, file: int, damaged: list[tuple[int, int]]) -> None:
        """Forget the messages whose records lay in ``damaged`` byte ranges of ``file``, as compacted away.

        After a clean start the store trusts its snapshot and reads no record, so a damaged one may first be met
        by the compaction of its file, which cannot copy it. Its message is lost (the scan reported the record):
        kept in the index, its location would point into the rewritten file, at bytes that may be another
        message's record, or, once that file is deleted, at no file at all (``KeyError`` in :meth:`read`, a 541
        to the client: the bit-flip lane's seed 654106558, round 18). Dropped here, :meth:`read` answers None
        and the queue drops the message like any damaged one. A pass over the index, paid only when a
        compaction met damage; never on the publish or delivery path."""
        lost = []
        for msg_id, loc in self._locs.items():
            if loc >> 64 == file:
                off = (loc >> 32) & M32
                if any(lo <= off < hi for lo, hi in damaged):
                    lost.append(msg_id)
        for msg_id in lost:
            del self._locs[msg_id]
            self._refs.pop(msg_id, None)
        if lost:
            log.warning("storage: %d messages whose records in %s failed their check were dropped from %s",
                        len(lost), self._path(file), self.directory)

    def abandon(self) -> None:
        """Release every file without writing (after a failed clean stop: the next start scans)."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join()
            self._worker = None
        for f in self._files.values():
            f.abandon()

    def wait_for_compactions(self) -> None:
        """Block until queued compactions finish and are applied (shutdown, tests)."""
        if self._worker is not None:
            self._jobs.join()
        self._apply_results()

    # -- recovery ---------------------------------------------------------------------------------------
    def _recover(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(SUFFIX))
        for name in os.listdir(self.directory):
            if name.endswith((".compact", ".tmp")):
                os.unlink(os.path.join(self.directory, name))  # an interrupted compaction or snapshot
        snap_path = os.path.join(self.directory, SNAPSHOT)
        snap = read_framed_file(snap_path)
        if os.path.exists(snap_path):
            os.unlink(snap_path)  # from here on a crash means a dirty start
            fsync_dir(self.directory)
        if snap is not None and self._load_snapshot(snap, names):
            self.was_clean = True
            return
        self._scan_files(names)

    def _load_snapshot(self, snap: bytes, names: list[str]) -> bool:
        try:
            terms = msgpack.unpackb(snap, strict_map_key=False)
            sizes: dict[int, int] = terms["files"]
            blob: bytes = terms["locs"]
        except Exception:  # noqa: BLE001 - any doubt means a full scan
            log.warning("storage: unreadable snapshot in %s; scanning", self.directory)
            return False
        on_disk = {int(n[:-len(SUFFIX)]): os.path.getsize(os.path.join(self.directory, n)) for n in names}
        if on_disk != sizes:
            log.warning("storage: files in %s differ from the snapshot; scanning", self.directory)
            return False
        for n, size in sizes.items():
            self._files[n] = AppendFile.open_existing(self._path(n), self._syncer, size)
            self._live[n] = 0
        locs, refs, live = self._locs, self._refs, self._live
        for lo, hi, file, off, n, r in SNAP_ENTRY.iter_unpack(blob):
            msg_id = (hi << 64) | lo
            locs[msg_id] = _loc(file, off, n)
            if r > 1:
                refs[msg_id] = r
            live[file] += n + HEADER_SIZE
        return True

    def _scan_files(self, names: list[str]) -> None:
        self.recovering = True
        locs, live = self._locs, self._live
        for name in names:
            n = int(name[:-len(SUFFIX)])
            path = self._path(n)
            with open(path, "rb") as fh:
                data = fh.read()
            records, good_end, _ = scan(data, path)
            self._files[n] = AppendFile.open_existing(path, self._syncer, good_end)
            live[n] = 0
            for _, start, length in records:
                lo, hi = ID.unpack_from(data, start)
                msg_id = (hi << 64) | lo
                prev = locs.get(msg_id)
                if prev is not None:
                    live[prev >> 64] -= (prev & M32) + HEADER_SIZE
                locs[msg_id] = _loc(n, start, length)
                live[n] += length + HEADER_SIZE

    def add_recovered_ref(self, msg_id: int) -> bool:
        """During a dirty recovery, a durable queue still holds ``msg_id``; False if the store lost it.
        After a clean start the snapshot's counts are already right and this only checks presence."""
        if msg_id not in self._locs:
            return False
        if self.recovering:
            rec = self._recovered_refs
            rec[msg_id] = rec.get(msg_id, 0) + 1
        return True

    def finish_recovery(self) -> None:
        """All durable queues have recovered: drop messages nobody referenced, free dead files."""
        if self.recovering:
            rec = self._recovered_refs
            locs = self._locs
            dropped = 0
            for msg_id in [m for m in locs if m not in rec]:
                loc = locs.pop(msg_id)
                self._live[loc >> 64] -= (loc & M32) + HEADER_SIZE
                dropped += 1
            self._refs = {m: r for m, r in rec.items() if r > 1}
            self._recovered_refs = {}
            self.recovering = False
            if dropped:
                log.info("storage: %d unreferenced messages dropped from %s", dropped, self.directory)
        for file in list(self._files):
            if file != self._cur_no and file in self._files:
                self._maybe_gc(file)

    # -- shutdown ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Clean shutdown: finish compactions, sync, and (durable store) leave the snapshot. Raises
        ``OSError`` if something could not be written: then no snapshot is left, and the next start scans."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join()
            self._worker = None
        self._apply_results()
        self._cur.write_out()
        if not self.durable:
            for f in self._files.values():
                f.abandon()  # the transient store starts empty: its files are deleted here anyway
            for name in os.listdir(self.directory):
                os.unlink(os.path.join(self.directory, name))
            return
        if self._syncer is not None:
            self._syncer.sync()
        if self._cur.size == 0 and self._live.get(self._cur_no) == 0:
            self._delete_file(self._cur_no)  # leave no empty file behind
        blob = bytearray()
        refs = self._refs
        pack = SNAP_ENTRY.pack
        for msg_id, loc in self._locs.items():
            blob += pack(msg_id & M64, msg_id >> 64, loc >> 64, (loc >> 32) & M32, loc & M32, refs.get(msg_id, 1))
        sizes = {}
        for n, f in self._files.items():
            f.close()
            sizes[n] = f.written
        write_file_atomically(os.path.join(self.directory, SNAPSHOT),
                              msgpack.packb({"files": sizes, "locs": bytes(blob)}))
