"""The queue index (RabbitMQ's ``rabbit_queue_index``): where a queue's message positions live on disk.

One directory per queue holding segment files ``<n:08d>.idx``; segment n covers seq_ids
``[n * SEGMENT_ENTRIES, (n + 1) * SEGMENT_ENTRIES)``. Each file is a log of framed records (see
:mod:`storage.segment`) of three kinds, little-endian:

    publish  PUB = <B Q Q Q B Q q>  kind=1, seq_id, msg id low, msg id high, flags, size, expiry (-1: none),
             followed by the message bytes when the message is embedded (flag 2)
    deliver  EVT = <B Q>            kind=2, seq_id
    ack      EVT = <B Q>            kind=3, seq_id
    acks     <B Q...>               kind=4, the seq_ids of several acks in one segment (one record for a
                                    consumer's multiple ack or a run of acks in one call: one header and CRC
                                    instead of one per ack)

flags: 1 persistent, 2 embedded, 4 delivered (publish_delivered writes one record instead of two).
Messages smaller than ``queue_index_embed_msgs_below`` are embedded: one write, no store entry.

A segment file is deleted when every publish written to it has been acked, so a drained queue leaves
nothing behind, except for a short while a segment holding a delayed message's dispatch whose record in the
delay store is not yet durable (storage/dispatch_evidence.py: the proof that the queue had it). The index is also the paging area of non-durable queues (``durable=False``: no fsync,
emptied on open). Durable queues' transient messages are written here only when paged out; their
entries are dead after a restart, which recovery skips (``transient_floor``).

A clean :meth:`close` leaves ``clean.terms`` (the owner's counters plus the per-segment counts), which
lets the next start skip reading the segments; without it :meth:`scan_all` reads them all.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from collections.abc import Iterator
from typing import Any

import msgpack

from storage.dispatch_evidence import PIN, origin_epoch, origins_in
from storage.segment import (
    AppendFile,
    CorruptRecord,
    fsync_dir,
    read_framed_file,
    scan,
    write_file_atomically,
)
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

SEGMENT_ENTRIES = 4096
PUB = struct.Struct("<BQQQBQq")
EVT = struct.Struct("<BQ")
PUB_SIZE = PUB.size
assert PUB_SIZE == 42 and EVT.size == 9
K_PUB, K_DEL, K_ACK, K_ACKS = 1, 2, 3, 4
F_PERSISTENT, F_EMBEDDED, F_DELIVERED = 1, 2, 4
M64 = (1 << 64) - 1
SUFFIX = ".idx"
TERMS = "clean.terms"
# Segment files kept open at once; others are closed (and reopened on demand).
MAX_OPEN = 16


class IndexEntry:
    """An unacked publish read back from a segment. ``body_pos`` is the offset of an embedded body in its
    segment file (-1 if the message is in the store)."""

    __slots__ = ("body_pos", "delivered", "expiry", "msg_id", "persistent", "seq_id", "size")

    def __init__(self, seq_id: int, msg_id: int | None, persistent: bool, delivered: bool, size: int,
                 expiry: int | None, body_pos: int) -> None:
        self.seq_id = seq_id
        self.msg_id = msg_id
        self.persistent = persistent
        self.delivered = delivered
        self.size = size
        self.expiry = expiry
        self.body_pos = body_pos


def segment_of(seq_id: int) -> int:
    return seq_id // SEGMENT_ENTRIES


def next_segment_boundary(seq_id: int) -> int:
    return (seq_id // SEGMENT_ENTRIES + 1) * SEGMENT_ENTRIES


class QueueIndex:
    def __init__(self, directory: str, syncer: Syncer | None, durable: bool) -> None:
        self.directory = directory
        self.durable = durable
        self._syncer = syncer if durable else None
        self._files: dict[int, AppendFile] = {}
        self._unacked: dict[int, int] = {}  # per segment: publishes written and not yet acked
        self._transient: dict[int, int] = {}  # per segment: how many of those are transient
        # The segment publishes go to now. It is kept while written even when everything in it is acked (a
        # consumer that keeps up acks each message before the next arrives: deleting the file then made every
        # publish create it again and every ack unlink it); it goes once publishes have moved on.
        self._write_seg = -1
        # Per segment, the newest dispatch epoch of the delayed messages in it (dispatch_evidence.py), and
        # the fully acked segments kept until those epochs settle; the dispatches found in fully acked
        # segments deleted at recovery.
        self._seg_epoch: dict[int, int] = {}
        self._deferred: set[int] = set()
        self._acked_origins: set[int] = set()
        # The directory is made when the first file is (_open): a queue that never held a message on disk has
        # none, so a declare costs no mkdir (a definitions import makes thousands of queues, and a mkdir waits
        # on the file system's journal behind every fsync in flight: ~0.3 ms each here) and a restart reads
        # nothing for it.
        if not durable and os.path.isdir(directory):
            shutil.rmtree(directory)
        self._made = durable and os.path.isdir(directory)
        self.found = self._made
        """Whether a durable queue's directory was there at start (else it has nothing to recover)."""

    # -- writing (loop thread) -------------------------------------------------------------------------
    def publish(self, seq_id: int, msg_id: int | None, persistent: bool, delivered: bool, size: int,
                expiry: int | None, body: bytes | None) -> int:
        """Record a message at ``seq_id``; returns where an embedded body starts (-1 if not embedded)."""
        seg = seq_id // SEGMENT_ENTRIES
        if seg != self._write_seg:
            self._move_write_segment(seg)
        f = self._files.get(seg) or self._open(seg)
        mid = msg_id or 0
        if mid >> 127:
            epoch = origin_epoch(mid >> 64)
            if epoch > self._seg_epoch.get(seg, 0):
                self._seg_epoch[seg] = epoch
        flags = (F_PERSISTENT if persistent else 0) | (F_DELIVERED if delivered else 0)
        self._unacked[seg] = self._unacked.get(seg, 0) + 1
        if not persistent:
            self._transient[seg] = self._transient.get(seg, 0) + 1
        if body is None:
            f.append(PUB.pack(K_PUB, seq_id, mid & M64, mid >> 64, flags, size,
                              -1 if expiry is None else expiry))
            return -1
        head = PUB.pack(K_PUB, seq_id, mid & M64, mid >> 64, flags | F_EMBEDDED, size,
                        -1 if expiry is None else expiry)
        return f.append2(head, body) + PUB_SIZE

    def deliver(self, seq_id: int) -> None:
        seg = seq_id // SEGMENT_ENTRIES
        (self._files.get(seg) or self._open(seg)).append(EVT.pack(K_DEL, seq_id))

    def ack(self, seq_id: int, persistent: bool = True) -> None:
        """``persistent`` must be the flag the entry was published with (it keeps the counts right)."""
        self._ack_run(seq_id // SEGMENT_ENTRIES, [seq_id], 0 if persistent else 1)

    def ack_many(self, acks: list[tuple[int, bool]]) -> None:
        """:meth:`ack` for each ``(seq_id, persistent)``, one record per run of acks in the same segment."""
        i, n = 0, len(acks)
        while i < n:
            seg = acks[i][0] // SEGMENT_ENTRIES
            run: list[int] = []
            transient = 0
            while i < n:
                seq_id, persistent = acks[i]
                if seq_id // SEGMENT_ENTRIES != seg:
                    break
                run.append(seq_id)
                transient += not persistent
                i += 1
            self._ack_run(seg, run, transient)

    def _ack_run(self, seg: int, run: list[int], transient: int) -> None:
        """Acks of ``run`` (seq_ids of segment ``seg``, ``transient`` of them published transient)."""
        if transient:
            self._transient[seg] = self._transient.get(seg, 0) - transient
        left = self._unacked.get(seg, 0) - len(run)
        if left > 0:
            self._unacked[seg] = left
            self._append_acks(seg, run)
            return
        self._unacked.pop(seg, None)
        self._transient.pop(seg, None)
        if seg != self._write_seg and not self._pinned(seg):
            self._delete_segment(seg)  # everything in it is acked: no need to even write these acks
            return
        # The segment being written (deleted once publishes move on), or one that is the proof of a
        # dispatch not yet settled (deleted when it is): kept, with the acks recorded.
        self._append_acks(seg, run)
        if seg != self._write_seg:
            self._defer(seg)

    def _append_acks(self, seg: int, seq_ids: list[int]) -> None:
        f = self._files.get(seg) or self._open(seg)
        if len(seq_ids) == 1:
            f.append(EVT.pack(K_ACK, seq_ids[0]))
        else:
            f.append(struct.pack(f"<B{len(seq_ids)}Q", K_ACKS, *seq_ids))

    # -- reading -------------------------------------------------------------------------------------------
    def read_segment(self, seg: int, lo: int, hi: int, transient_floor: int = 0) -> list[IndexEntry]:
        """Unacked publishes with ``lo <= seq_id < hi`` in segment ``seg``, by seq_id. Transient entries
        below ``transient_floor`` (written before the last restart) are dead and left out."""
        data = self._read(seg)
        if not data:
            return []
        entries, _, _ = self._parse(data, self._path(seg))
        out = [e for e in entries.values()
               if lo <= e.seq_id < hi and (e.persistent or e.seq_id >= transient_floor)]
        out.sort(key=_seq_key)
        return out

    def read_body(self, seq_id: int, body_pos: int, size_hint: int) -> bytes | None:
        """An embedded message's bytes (checked against its record's CRC); None if damaged.
        ``size_hint`` is the message's size; its encoded form is usually a little longer."""
        seg = seq_id // SEGMENT_ENTRIES
        f = self._files.get(seg) or self._open(seg)
        try:
            payload = f.read_payload_hint(body_pos - PUB_SIZE, PUB_SIZE + size_hint + 512)
        except CorruptRecord:
            return None  # reported by the read (storage/corruption.py); the queue drops the message
        return payload[PUB_SIZE:]

    def _read(self, seg: int) -> bytes:
        f = self._files.get(seg)
        if f is not None:
            return f.read_all()
        try:
            with open(self._path(seg), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return b""

    @staticmethod
    def _parse(data: bytes, name: str) -> tuple[dict[int, IndexEntry], int, int]:
        """Replay a segment's records: ``(unacked publishes by seq_id with their delivered flags, the
        highest seq_id any record names, where the valid data ends)``."""
        records, good_end, _ = scan(data, name)
        entries: dict[int, IndexEntry] = {}
        delivered: set[int] = set()
        top = -1
        for _, start, n in records:
            kind = data[start]
            if n >= EVT.size:
                seq_id = EVT.unpack_from(data, start)[1]
                top = max(top, seq_id)
            if kind == K_PUB and n >= PUB_SIZE:
                _, seq_id, lo, hi, flags, size, expiry = PUB.unpack_from(data, start)
                mid = (hi << 64) | lo
                entries[seq_id] = IndexEntry(seq_id, mid or None, bool(flags & F_PERSISTENT),
                                             bool(flags & F_DELIVERED) or seq_id in delivered, size,
                                             None if expiry < 0 else expiry,
                                             start + PUB_SIZE if flags & F_EMBEDDED else -1)
            elif kind == K_DEL and n == EVT.size:
                seq_id = EVT.unpack_from(data, start)[1]
                e = entries.get(seq_id)
                if e is not None:
                    e.delivered = True
                else:
                    delivered.add(seq_id)
            elif kind == K_ACK and n == EVT.size:
                entries.pop(EVT.unpack_from(data, start)[1], None)
            elif kind == K_ACKS and n > 1 and (n - 1) % 8 == 0:
                for acked in struct.unpack_from(f"<{(n - 1) // 8}Q", data, start + 1):
                    entries.pop(acked, None)
        return entries, top, good_end

    # -- files -------------------------------------------------------------------------------------------
    def _path(self, seg: int) -> str:
        return os.path.join(self.directory, f"{seg:08d}{SUFFIX}")

    def _open(self, seg: int) -> AppendFile:
        if len(self._files) >= MAX_OPEN:
            victim = min(self._files)  # the oldest segment: the head's, written least from now on
            # Evicted only once its buffer is written: a file closed with appends still buffered would
            # be reopened at a size that misses them (a full disk keeps it open until the syncer's retry).
            if self._files[victim].write_out():
                self._files.pop(victim).close()
        if not self._made:
            os.makedirs(self.directory, exist_ok=True)
            self._made = True
        path = self._path(seg)
        if os.path.exists(path):
            f = AppendFile.open_existing(path, self._syncer, os.path.getsize(path))
        else:
            f = AppendFile.create(path, self._syncer)
        self._files[seg] = f
        return f

    def _move_write_segment(self, seg: int) -> None:
        """Publishes go on in segment ``seg``: the one they leave goes if nothing in it waits for an ack."""
        prev = self._write_seg
        self._write_seg = seg
        if prev >= 0 and not self._unacked.get(prev):
            if self._pinned(prev):
                self._defer(prev)
            else:
                self._delete_segment(prev)

    # -- dispatch evidence (storage/dispatch_evidence.py) -------------------------------------------------
    def _pinned(self, seg: int) -> bool:
        epoch = self._seg_epoch.get(seg)
        return epoch is not None and PIN.pinned(epoch)

    def _defer(self, seg: int) -> None:
        self._deferred.add(seg)
        PIN.wait(self)

    def retry_deferred(self) -> bool:
        """Epochs settled: delete the deferred segments that are still fully acked and no longer pinned."""
        for seg in list(self._deferred):
            if self._unacked.get(seg) or seg == self._write_seg:
                self._deferred.discard(seg)  # live again: the usual rules delete it later
            elif not self._pinned(seg):
                self._delete_segment(seg)
        return bool(self._deferred)

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Which delay-store ``seqs`` this queue received as dispatches, acked since or not (recovery's
        question for a message in doubt): every segment on disk is read, plus what recovery kept from
        the fully acked ones it deleted."""
        found = self._acked_origins & seqs
        for seg in self.segment_numbers():
            data = self._read(seg)
            records, _, _ = scan(data, self._path(seg))
            found |= origins_in(records, data) & seqs
        return found

    def _keep_origins(self, data: bytes, name: str) -> None:
        """Recovery deletes a fully acked segment: remember the dispatches it proves first."""
        records, _, _ = scan(data, name)
        self._acked_origins |= origins_in(records, data)

    def _delete_segment(self, seg: int) -> None:
        self._seg_epoch.pop(seg, None)
        self._deferred.discard(seg)
        f = self._files.pop(seg, None)
        if f is not None:
            f.abandon()  # every entry is acked: nothing buffered needs writing
        try:
            os.unlink(self._path(seg))
        except FileNotFoundError:
            pass

    def segment_numbers(self) -> list[int]:
        if not self._made:
            return []
        return sorted(int(n[:-len(SUFFIX)]) for n in os.listdir(self.directory) if n.endswith(SUFFIX))

    def disk_bytes(self) -> int:
        total = 0
        for n in os.listdir(self.directory) if self._made else ():
            total += os.path.getsize(os.path.join(self.directory, n))
        for f in self._files.values():
            total += len(f.buf)
        return total

    # -- recovery ----------------------------------------------------------------------------------------
    def recover_terms(self) -> dict[str, Any] | None:
        """The terms a clean close left (then deleted, so a crash from now on is a dirty start), or None."""
        path = os.path.join(self.directory, TERMS)
        raw = read_framed_file(path)
        if os.path.exists(path):
            os.unlink(path)
            if self.durable:
                fsync_dir(self.directory)
        if raw is None:
            return None
        try:
            terms: dict[str, Any] = msgpack.unpackb(raw, strict_map_key=False)
            self._unacked = {int(k): v for k, v in terms.pop("unacked").items()}
        except Exception:  # noqa: BLE001 - doubt means a full scan
            log.warning("storage: unreadable terms in %s; scanning", self.directory)
            return None
        for seg in self.segment_numbers():
            if seg not in self._unacked:  # held only transient (now dead) or acked entries
                path = self._path(seg)
                with open(path, "rb") as fh:
                    self._keep_origins(fh.read(), path)
                os.unlink(path)
        return terms

    def scan_all(self) -> Iterator[tuple[int, int, list[IndexEntry]]]:
        """Dirty recovery: for each segment, ``(segment, highest seq_id seen, unacked persistent entries)``.
        Torn tails are cut; the per-segment counts are rebuilt from what survives (the caller acks any
        entry it cannot use)."""
        self._unacked = {}
        self._transient = {}
        for seg in self.segment_numbers():
            path = self._path(seg)
            with open(path, "rb") as fh:
                data = fh.read()
            entries, top, good_end = self._parse(data, path)
            AppendFile.open_existing(path, None, good_end).close()  # cut a torn tail, if any
            live = sorted((e for e in entries.values() if e.persistent), key=_seq_key)
            if live:
                self._unacked[seg] = len(live)
            else:
                self._keep_origins(data, path)
                os.unlink(path)
            yield seg, top, live

    def recount_live(self) -> None:
        """Rebuild the per-segment counts from what the files really hold. Used when a clean start's counts
        turn out wrong (records lost to damage): without it a segment waits for acks that never come and
        stays on disk. Segments with nothing live left are deleted."""
        for seg in self.segment_numbers():
            path = self._path(seg)
            with open(path, "rb") as fh:
                data = fh.read()
            entries, _top, _end = self._parse(data, path)
            live = sum(1 for e in entries.values() if e.persistent)
            if live:
                self._unacked[seg] = live
            elif seg in self._unacked:
                self._unacked.pop(seg, None)
                self._keep_origins(data, path)
                self._delete_segment(seg)

    # -- shutdown -----------------------------------------------------------------------------------------
    def close(self, terms: dict[str, Any] | None) -> None:
        """Close the files; with ``terms`` (a durable queue's clean shutdown, after the caller synced)
        write them with the per-segment counts so the next start need not scan."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        if terms is not None and self.durable and self._made:  # (no directory: nothing a restart could find)
            # After a restart only the persistent entries count: transient ones are dead then.
            transient = self._transient
            persistent = {seg: n - transient.get(seg, 0) for seg, n in self._unacked.items()}
            terms = dict(terms, unacked={seg: n for seg, n in persistent.items() if n > 0})
            write_file_atomically(os.path.join(self.directory, TERMS), msgpack.packb(terms))

    def delete(self) -> None:
        for f in self._files.values():
            f.abandon()  # the queue is gone: nothing buffered needs writing
        self._files.clear()
        self._unacked.clear()
        self._transient.clear()
        self._seg_epoch.clear()
        self._deferred.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
        self._made = False


def _seq_key(e: IndexEntry) -> int:
    return e.seq_id

