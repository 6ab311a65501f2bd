"""The file-backed stream store, on QMQ's log model (seed 001): one message log per vhost, one consume log per
stream, one pull log per consumer group. RabbitMQ's counterpart is osiris (a segment + index file pair per
stream); here the payloads of every stream of a vhost share one sequentially written message log, so a node
with many streams still does one sequential write (and, with the node's :class:`~storage.syncer.Syncer`, one
fsync) per burst.

Layout under the vhost's directory (``<data_dir>/streams/<vhost dir>/``)::

    messages/<start>.mlog                 the message log: segment files named by the global position (20
                                          digits) their first byte has; records framed as in
                                          storage/segment.py (magic, length, CRC32, payload), the payload
                                          being the message as the broker encoded it
    s/<stream dir>/name                   the stream's name (utf-8; the directory is a digest of it)
    s/<stream dir>/<first offset>.clog    the consume log: segment files named by their first offset (20
                                          digits), fixed-size entries, entry i is offset first + i
    s/<stream dir>/g/<group dir>.plog     a consumer group's pull log

A consume-log entry (``ENTRY``, 40 bytes, little-endian)::

    u64 pos        global message-log position of the payload (segment start + payload offset in it)
    u32 size       payload length
    u32 filter     filter fingerprint: 0 for no filter value, else crc32(value) | 1
    i64 timestamp  ms since the epoch, when appended
    u64 cum_bytes  payload bytes of the stream up to and including this entry (a segment's size is two reads)
    u32 crc        CRC32 of the 32 bytes before it (a torn or stale entry fails it)
    u32 reserved

Fixed-size entries make ``read(offset)`` a position computation (one bisect over the in-memory list of
segments, one pread) and ``offset_at(ts)`` a binary search of preads over the entries; memory holds a few
numbers per *segment*, never per message. Filtered reads skip whole segments whose set of filter
fingerprints holds none of the wanted ones (RabbitMQ 3.13 keeps a Bloom filter per chunk for this; a
segment's set is exact, and says "any" past 256 values), then, per entry, those whose fingerprint cannot be
one of the wanted values, without reading their payloads ("" among the wanted values matches messages
without a filter value, as osiris's ``match_unfiltered``). A collision may return another value: the caller
checks.

A pull-log record is a framed (storage/segment.py) JSON object: ``{"k": "c", "name", "cursor", "committed",
"out", "acked"}`` (a checkpoint: the whole state; always the file's first record), ``{"k": "p", "o": [...]}``
(pulled) or ``{"k": "a", "o": [...]}`` (acked). The file is rewritten as a single checkpoint (replace_file)
once it holds more than ``COMPACT_AT`` bytes, so it never grows with the stream.

Durability: an append buffers the payload in the message log, then its entry in the consume log (in that
order; the syncer writes and fsyncs both in the same generation). ``on_durable(N)`` is called after the fsync
covering offsets < N; a failed fsync calls ``on_durable_failed``. Recovery at open: a torn tail of the
message log's last segment (a record cut short: storage/segment.py's ``torn_at``) and of each consume log (a
partial entry) is cut off; then each stream's newest entries (those whose payload lies in the last
``VERIFY_WINDOW`` bytes of the message log, where data not yet fsynced at a crash can be) are checked against
the message log, and the consume log is cut before the oldest entry that was never written (zeros, or a
payload whose bytes are not there): that one and every later one were never confirmed. An entry or payload
that is there whole but fails its check is damage: reported, kept in place and skipped by reads, and the
entries after it are kept (``FileStreamLog._check_window``). Everything confirmed was fsynced, so it is never
cut: no confirmed offset is ever reused, and a damaged one stays taken.

Retention removes whole consume-log segments, oldest first, never the one being written; a message-log
segment is deleted once no stream's consume log references it (every stream's oldest entry lies past it),
and only after :meth:`StreamStore.finish_recovery` (before, a stream not opened yet may still need it).
"""

from __future__ import annotations

import bisect
import builtins
import hashlib
import json
import logging
import operator
import os
import shutil
import struct
from collections import deque
from collections.abc import Callable, Collection, Iterable

from storage import corruption
from storage.checksum import crc32
from storage.segment import (
    FLUSH_AT,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    AppendFile,
    CorruptRecord,
    replace_file,
    scan,
)
from storage.stream_log import GroupLog, GroupProgress, StreamRecord
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

ENTRY = struct.Struct("<QIIqQII")
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 40
_ENTRY_BODY = struct.Struct("<QIIqQ")
MLOG, CLOG, PLOG = ".mlog", ".clog", ".plog"
DEFAULT_MESSAGE_SEGMENT_SIZE = 64 << 20
VERIFY_WINDOW = 64 << 20
COMPACT_AT = 256 << 10
MAX_OPEN_SEGMENTS = 64
READ_SPAN = 1 << 20  # one pread covers consecutive payloads up to this much
# A segment's filter summary (_CSeg.filters) stops growing past this many distinct values: it then says "any".
MAX_SEGMENT_FILTERS = 256
ANY_FILTER: set[int] = set()  # identity-compared marker: every fingerprint may be there
# The recent records each stream keeps in memory (FileStreamLog's tail), so that consumers that keep up read
# what was just appended without a pread, a CRC check and a copy per record. The store's budget is shared by
# its open streams (each gets at least TAIL_MIN_BYTES): memory stays bounded however many streams there are
# and however long they grow.
TAIL_BUDGET_BYTES = 8 << 20
TAIL_MIN_BYTES = 256 << 10
TAIL_RECORD_OVERHEAD = 120  # what a kept record costs besides its payload (the tuple, the bytes object, the list slot)


def fingerprint(value: str | None) -> int:
    """A filter value's 32-bit fingerprint: 0 for none (or ""), never 0 otherwise."""
    if not value:
        return 0
    return crc32(value.encode()) | 1


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:32]


def _seg_name(n: int, suffix: str) -> str:
    return f"{n:020d}{suffix}"


def _numbered(directory: str, suffix: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-len(suffix)]) for n in names if n.endswith(suffix) and n[:-len(suffix)].isdigit())


class _Entry:
    __slots__ = ("crc_ok", "cum", "filter", "pos", "size", "ts")

    def __init__(self, data: bytes | memoryview, at: int = 0) -> None:
        self.pos, self.size, self.filter, self.ts, self.cum, crc, _ = ENTRY.unpack_from(data, at)
        self.crc_ok = crc == crc32(data[at:at + 32])


# The CRC (of the entry's first 32 bytes) and the reserved word that end a consume-log entry.
_ENTRY_TAIL = struct.Struct("<II")
# StreamRecord built from a tuple (``tuple.__new__``): a third of the NamedTuple constructor's cost, once per
# message appended.
_new_record = tuple.__new__
_PAYLOAD = operator.itemgetter(2)  # a StreamRecord's payload, for C-level loops over the tail


def write_behind(f: AppendFile) -> AppendFile:
    """``f``, whose writes may wait for the syncer's round in progress: a stream's publishers keep up to
    thousands of confirms outstanding, so what counts is the writes saved per round, not a round's latency
    (storage.syncer.Syncer.flush)."""
    f.write_behind = True
    return f


# -- the message log (one per vhost) ----------------------------------------------------------------------


class MessageLog:
    """The vhost's shared message log: segment files of framed payloads, addressed by global position."""

    def __init__(self, directory: str, syncer: Syncer | None, segment_size: int) -> None:
        self.dir = directory
        self.syncer = syncer
        self.segment_size = segment_size
        os.makedirs(directory, exist_ok=True)
        self.starts = _numbered(directory, MLOG)  # every segment's start, ascending
        self._files: dict[int, AppendFile] = {}
        if not self.starts:
            self.starts = [0]
            self.active = write_behind(AppendFile.create(self._path(0), syncer))
        else:
            last = self.starts[-1]
            with open(self._path(last), "rb") as f:
                data = f.read()
            # Damage to the last record is kept in place (skipped): the consume logs' entries after it point
            # past it, and cutting it would let new payloads take positions that old entries name.
            _, good_end, _ = scan(data, self._path(last), keep_damaged_tail=True)
            self.active = write_behind(AppendFile.open_existing(self._path(last), syncer, good_end))
        self._files[self.starts[-1]] = self.active

    def _path(self, start: int) -> str:
        return os.path.join(self.dir, _seg_name(start, MLOG))

    @property
    def end(self) -> int:
        return self.starts[-1] + self.active.size

    def append(self, payload: bytes) -> int:
        """Buffer one payload; returns its global position."""
        active = self.active
        if active.written + len(active.buf) >= self.segment_size:  # AppendFile.size, without the property call
            start = self.end
            active = self.active = write_behind(AppendFile.create(self._path(start), self.syncer))
            self.starts.append(start)
            self._files[start] = active
        return self.starts[-1] + active.append(payload)

    def _file(self, start: int) -> AppendFile:
        f = self._files.get(start)
        if f is None:
            if len(self._files) >= MAX_OPEN_SEGMENTS:
                for s in list(self._files):
                    if self._files[s] is not self.active and not self._files[s].dirty:
                        self._files.pop(s).close()
                        break
            path = self._path(start)
            f = AppendFile.open_existing(path, None, os.path.getsize(path))
            self._files[start] = f
        return f

    def locate(self, pos: int) -> tuple[int, int]:
        """(segment start, offset in that segment) of a global position."""
        i = bisect.bisect_right(self.starts, pos) - 1
        if i < 0:
            raise CorruptRecord(f"position {pos} precedes the message log")
        return self.starts[i], pos - self.starts[i]

    def read(self, pos: int, size: int) -> bytes:
        start, off = self.locate(pos)
        return self._file(start).read_payload(off, size)

    def read_span(self, pos: int, length: int) -> tuple[int, bytes]:
        """Raw bytes from the record header before ``pos`` over ``length`` bytes (same segment)."""
        start, off = self.locate(pos)
        return off, self._file(start).pread(off - HEADER_SIZE, length)

    def collect(self, min_ref: int | None) -> int:
        """Delete the segments that end at or before ``min_ref`` (None: no stream references anything:
        everything but the active segment). Returns how many."""
        removed = 0
        while len(self.starts) > 1:
            seg_end = self.starts[1]
            if min_ref is not None and seg_end > min_ref:
                break
            start = self.starts.pop(0)
            f = self._files.pop(start, None)
            if f is not None:
                f.close()
            try:
                os.unlink(self._path(start))
            except FileNotFoundError:
                pass
            removed += 1
        return removed

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


# -- the pull log (one per consumer group) ----------------------------------------------------------------


class FileGroupLog(GroupProgress):
    """A consumer group's pulled/acked offsets (QMQ's pull log) in an append-only file, compacted into a
    checkpoint when it grows past ``COMPACT_AT``."""

    def __init__(self, path: str, name: str, start_offset: int, syncer: Syncer | None) -> None:
        super().__init__(name, start_offset)
        self.path = path
        self._syncer = syncer
        self._file: AppendFile | None = None

    @classmethod
    def create(cls, path: str, name: str, start_offset: int, syncer: Syncer | None) -> FileGroupLog:
        g = cls(path, name, start_offset, syncer)
        g._checkpoint()
        return g

    @classmethod
    def load(cls, path: str, syncer: Syncer | None) -> FileGroupLog | None:
        with open(path, "rb") as f:
            data = f.read()
        records, good_end, _ = scan(data, path)
        g: FileGroupLog | None = None
        for _, start, n in records:
            try:
                rec = json.loads(data[start:start + n])
            except ValueError:
                continue
            if rec.get("k") == "c":
                g = cls(path, rec["name"], rec["committed"], syncer)
                g._cursor = rec["cursor"]
                g._pulled = set(rec["out"])
                g._acked = set(rec["acked"])
            elif g is not None and rec.get("k") == "p":
                g._apply_pulled(rec["o"])
            elif g is not None and rec.get("k") == "a":
                g._apply_acked(rec["o"])
        if g is None:
            log.warning("storage: ignoring pull log %s without a checkpoint", path)
            return None
        g._file = write_behind(AppendFile.open_existing(path, syncer, good_end))
        return g

    def _write(self, rec: dict[str, object]) -> None:
        assert self._file is not None
        self._file.append(json.dumps(rec, separators=(",", ":")).encode())
        if self._file.size > COMPACT_AT:
            self._checkpoint()

    def pulled(self, offsets: Iterable[int]) -> None:
        o = list(offsets)
        if o:
            self._apply_pulled(o)
            self._write({"k": "p", "o": o})

    def acked(self, offsets: Iterable[int]) -> None:
        o = list(offsets)
        if o:
            self._apply_acked(o)
            self._write({"k": "a", "o": o})

    def skip_to(self, offset: int) -> None:
        """Retention removed everything below ``offset``."""
        if self._drop_below(offset):
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Rewrite the file as one checkpoint record (atomically, fsynced: compaction is rare)."""
        if self._file is not None:
            self._file.close()
        rec = {"k": "c", "name": self.name, "cursor": self._cursor, "committed": self._committed,
               "out": sorted(self._pulled), "acked": sorted(self._acked)}
        body = json.dumps(rec, separators=(",", ":")).encode()
        replace_file(self.path, HEADER.pack(MAGIC, len(body), crc32(body)) + body)
        self._file = write_behind(AppendFile.open_existing(self.path, self._syncer, os.path.getsize(self.path)))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# -- the consume log (one per stream) ---------------------------------------------------------------------


class _CSeg:
    """One consume-log segment: a few numbers, kept in memory (never per message)."""

    __slots__ = ("base_cum", "count", "file", "filters", "first", "first_ts", "last_cum", "last_ts", "min_pos")

    def __init__(self, first: int, file: AppendFile, filters: set[int] | None = None) -> None:
        self.first = first
        self.file = file
        # The filter fingerprints its entries carry (the chunk filter of RabbitMQ 3.13's stream filtering, exact
        # rather than a Bloom filter): a filtered read skips a segment holding none of the wanted ones. None:
        # not known yet (a segment recovered at open is summarised on the first filtered read that reaches
        # it); ANY_FILTER: too many distinct values to be worth keeping.
        self.filters = filters
        self.count = 0
        self.base_cum = 0  # cum_bytes before its first entry
        self.last_cum = 0
        self.first_ts = 0
        self.last_ts = 0
        self.min_pos = -1  # message-log position of its first entry (-1: empty)

    @property
    def bytes(self) -> int:
        return self.last_cum - self.base_cum


class FileStreamLog:
    """:class:`storage.stream_log.StreamLog` over the vhost's message log and the stream's consume log."""

    def __init__(self, store: StreamStore, directory: str, name: str, max_segment_size_bytes: int) -> None:
        self.name = name
        self.dir = directory
        self._store = store
        self._mlog = store.mlog
        self._syncer = store.syncer
        self.max_segment_size_bytes = max(1, max_segment_size_bytes)
        self.on_durable: Callable[[int], None] | None = None
        self.on_durable_failed: Callable[[int], None] | None = None
        self._pending: deque[tuple[int, int]] = deque()  # (syncer generation, next offset after it)
        self.index_reads = 0  # entries read by position (tests count them)
        self.deleted = False
        self.closed = False
        os.makedirs(os.path.join(directory, "g"), exist_ok=True)
        name_path = os.path.join(directory, "name")
        try:
            with open(name_path, "rb") as f:
                stored: bytes | None = f.read()
        except FileNotFoundError:
            stored = None
        if stored != name.encode():
            if stored is not None:
                # The directory is the digest of the name, so the stream is found whatever the file says; the
                # file only names a directory left over (finish_recovery): damage there is mended here.
                corruption.report(name_path, 0, f"holds {stored[:60]!r}, not the stream's name {name!r}",
                                  "rewritten")
            replace_file(name_path, name.encode())
        self._segs: list[_CSeg] = []
        self._recover()
        # The newest records, contiguous from ``_tail_first`` (possibly below first_offset once retention ran).
        self._tail: list[StreamRecord] = []
        self._tail_first = self.next_offset
        self._tail_bytes = 0
        self.tail_cap = TAIL_BUDGET_BYTES  # this stream's share of the budget (StreamStore._share_tail sets it)
        self._groups: dict[str, FileGroupLog] = {}
        gdir = os.path.join(directory, "g")
        for n in sorted(os.listdir(gdir)):
            if n.endswith(PLOG):
                g = FileGroupLog.load(os.path.join(gdir, n), self._syncer)
                if g is not None:
                    self._groups[g.name] = g
                    g.skip_to(self.first_offset)

    # -- recovery -------------------------------------------------------------------------------------------
    def _cpath(self, first: int) -> str:
        return os.path.join(self.dir, _seg_name(first, CLOG))

    def _recover(self) -> None:
        firsts = _numbered(self.dir, CLOG)
        if not firsts:
            self._segs = [_CSeg(0, write_behind(AppendFile.create(self._cpath(0), self._syncer)), set())]
            return
        for first in firsts:
            path = self._cpath(first)
            size = os.path.getsize(path)
            whole = size - size % ENTRY_SIZE
            f = write_behind(AppendFile.open_existing(path, self._syncer, whole))
            seg = _CSeg(first, f)
            seg.count = whole // ENTRY_SIZE
            self._segs.append(seg)
        self._cut_after_gap()
        self._check_window()
        prev_cum = 0
        for seg in self._segs:
            self._load_bounds(seg, prev_cum)
            prev_cum = seg.last_cum

    def _check_window(self) -> None:
        """Check the newest entries (those whose payload lies in the last ``VERIFY_WINDOW`` bytes of the message
        log, where data not fsynced at a crash can be) and their payloads; cut a torn tail, keep damage.

        An entry fails in one of two ways, told apart by what its bytes are, not by where it is:

        * *never written*: the entry is zeros, or its payload's bytes are not in the message log (the file
          ends before them, or they are zeros). Only a write that had not landed leaves that, and such an entry
          was never confirmed; nor was any after it, as ``on_durable`` confirms a prefix of the offsets. So the
          stream is cut before the oldest one (a warning, not corruption: nothing confirmed is lost, and the
          offsets, never confirmed, are taken again). Later entries can be whole, when a write to a newer
          message-log segment landed while an older one's failed (tests/unit/storage/test_stream_write_faults.py).
        * *damaged*: a whole entry that fails its CRC, or a whole payload that fails its record's check: a
          kill -9 keeps every byte written, and a confirmed entry was fsynced whole, so only damage explains it.
          It is reported (storage/corruption.py: the file and offset that hold the damage) and kept in place:
          reads skip it (its offset is simply missing: a stream offset is never given to another message, as
          a consumer may have read it or stored it as its position), and every entry after it is kept and
          served. Cutting at the first bad entry is how NATS lost acknowledged messages (nats-server #7549)."""
        window_start = self._mlog.end - VERIFY_WINDOW
        cut: tuple[int, int] | None = None  # (segment index, entry index): the oldest never-written entry
        damaged: list[tuple[int, int, _Entry, str]] = []
        for si in range(len(self._segs) - 1, -1, -1):
            seg = self._segs[si]
            stop = False
            for i in range(seg.count - 1, -1, -1):
                e = self._entry(seg, i)
                state = self._entry_state(seg, i, e)
                if state == "missing":
                    cut = (si, i)
                elif state != "ok":
                    damaged.append((si, i, e, state))
                elif e.pos < window_start:
                    stop = True
                    break
            if stop:
                break
        for si, i, e, state in damaged:
            if cut is None or (si, i) < cut:  # after the cut: never confirmed, cut with it
                self._report_damage(self._segs[si], i, e, state)
        if cut is None:
            return
        si, i = cut
        log.warning("storage: stream %r: cut %d entries at offset %d whose writes had not landed (a crash before "
                    "they were written: never confirmed)", self.name, sum(s.count for s in self._segs[si:]) - i,
                    self._segs[si].first + i)
        for seg in self._segs[si + 1:]:
            seg.file.abandon()
            os.unlink(seg.file.path)
        del self._segs[si + 1:]
        seg = self._segs[si]
        seg.count = i
        os.truncate(seg.file.path, i * ENTRY_SIZE)
        seg.file.written = i * ENTRY_SIZE
        seg.file.synced = min(seg.file.synced, seg.file.written)

    def _entry_state(self, seg: _CSeg, i: int, e: _Entry) -> str:
        """``"ok"``; ``"missing"`` (the entry or its payload was never written); ``"entry"`` (the entry is
        damaged) or ``"payload"`` (its payload is)."""
        if not e.crc_ok:
            raw = seg.file.pread(i * ENTRY_SIZE, ENTRY_SIZE)
            return "missing" if not any(raw) else "entry"
        try:
            start, off = self._mlog.locate(e.pos)
            f = self._mlog._file(start)
            data = f.pread(off - HEADER_SIZE, HEADER_SIZE + e.size)
        except (CorruptRecord, OSError):
            return "missing"
        if len(data) < HEADER_SIZE + e.size or not any(data):
            return "missing"
        magic, n, crc = HEADER.unpack_from(data, 0)
        if magic != MAGIC or n != e.size or crc32(memoryview(data)[HEADER_SIZE:]) != crc:
            return "payload"
        return "ok"

    def _report_damage(self, seg: _CSeg, i: int, e: _Entry, state: str) -> None:
        """Report a damaged entry (its consume-log file) or payload (its message-log file) kept in place. The
        keys are those the read path reports the same damage under, so it is counted once."""
        offset = seg.first + i
        if state == "payload":
            start, off = self._mlog.locate(e.pos)
            corruption.report(self._mlog._path(start), off - HEADER_SIZE, f"the payload of offset {offset} of stream "
                              f"{self.name!r} fails its check", "skipped; the offset stays, the entries after it "
                              "are kept", store="stream")
        else:
            corruption.report(seg.file.path, i * ENTRY_SIZE, f"entry of offset {offset} fails its CRC", "skipped; "
                              "the offset stays, the entries after it are kept", store="stream")

    def _cut_after_gap(self) -> None:
        """Offsets stay contiguous: a segment that ends short of the next one's first offset lost its newest
        entries (the process died before they were written, after the next segment was created, or even after
        the next segment's write went through while theirs failed), so every later segment goes. None of that
        was confirmed: a syncer generation is confirmed only once every write in it has landed."""
        for si in range(len(self._segs) - 1):
            seg = self._segs[si]
            if seg.first + seg.count == self._segs[si + 1].first:
                continue
            log.warning("storage: stream %r: dropped %d unconfirmed entries after a gap at offset %d",
                        self.name, sum(s.count for s in self._segs[si + 1:]), seg.first + seg.count)
            for later in self._segs[si + 1:]:
                later.file.abandon()
                os.unlink(later.file.path)
            del self._segs[si + 1:]
            return

    def _load_bounds(self, seg: _CSeg, prev_cum: int) -> None:
        if seg.count == 0:
            seg.base_cum = seg.last_cum = prev_cum
            return
        # The first and last entries that pass their CRC: a damaged one kept in place (``_check_window``) holds
        # nothing to trust. Its payload bytes are then left out of the stream's byte count, nothing more.
        first = next((e for e in (self._entry(seg, k) for k in range(seg.count)) if e.crc_ok), None)
        if first is None:
            seg.base_cum = seg.last_cum = prev_cum
            return
        last = next(e for e in (self._entry(seg, k) for k in range(seg.count - 1, -1, -1)) if e.crc_ok)
        seg.base_cum = first.cum - first.size
        seg.last_cum = last.cum
        seg.first_ts, seg.last_ts = first.ts, last.ts
        seg.min_pos = first.pos

    def _entry(self, seg: _CSeg, i: int) -> _Entry:
        self.index_reads += 1
        data = seg.file.pread(i * ENTRY_SIZE, ENTRY_SIZE)
        if len(data) != ENTRY_SIZE:
            raise CorruptRecord(f"short entry {i} in {seg.file.path}")
        return _Entry(data)

    # -- state ----------------------------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        return self._segs[0].first

    @property
    def next_offset(self) -> int:
        s = self._segs[-1]
        return s.first + s.count

    @property
    def segment_count(self) -> int:
        return len(self._segs)

    @property
    def bytes(self) -> int:
        return self._segs[-1].last_cum - self._segs[0].base_cum

    @property
    def min_ref(self) -> int | None:
        """The oldest message-log position this stream still references (None: nothing)."""
        for s in self._segs:
            if s.count:
                return s.min_pos
        return None

    # -- writing --------------------------------------------------------------------------------------------
    def append(self, payload: builtins.bytes, timestamp_ms: int, filter_value: str | None = None) -> int:
        """Append one record (message log first, consume log second); returns its offset."""
        offset = self._append_record(payload, timestamp_ms, fingerprint(filter_value) if filter_value else 0)
        if self._tail_bytes > self.tail_cap:
            self._trim_tail()
        self._note_pending(offset + 1)
        return offset

    def append_run(self, payloads: list[builtins.bytes], timestamp_ms: int, filter_value: str | None = None) -> int:
        """Append records one after the other, as :meth:`append` each; returns the first one's offset. The tail's
        trim and the wait for the fsync are looked at once for the run."""
        fp = fingerprint(filter_value) if filter_value else 0
        append = self._append_record
        first = self.next_offset
        for payload in payloads:
            append(payload, timestamp_ms, fp)
        if self._tail_bytes > self.tail_cap:
            self._trim_tail()
        self._note_pending(first + len(payloads))
        return first

    def _append_record(self, payload: builtins.bytes, timestamp_ms: int, fp: int) -> int:
        """One record into the message log and the consume log, and the tail; returns its offset.

        Once per message a stream takes, so written out flat: the consume-log entry is packed and buffered
        here, and the entry's CRC covers its first 32 bytes (``_Entry`` checks it on read), and the record kept
        for the tail is built without NamedTuple's keyword handling. ``fp``: the filter value's fingerprint
        (0: none)."""
        seg = self._segs[-1]
        size = len(payload)
        if seg.count and seg.last_cum - seg.base_cum + size > self.max_segment_size_bytes:
            first = seg.first + seg.count
            new = _CSeg(first, write_behind(AppendFile.create(self._cpath(first), self._syncer)), set())
            new.base_cum = new.last_cum = seg.last_cum
            self._segs.append(new)
            seg = new
        pos = self._mlog.append(payload)
        cum = seg.last_cum + size
        body = _ENTRY_BODY.pack(pos, size, fp, timestamp_ms, cum)
        f = seg.file
        buf = f.buf
        buf += body
        buf += _ENTRY_TAIL.pack(crc32(body), 0)
        if not f.dirty and self._syncer is not None:
            f.dirty = True
            self._syncer.mark(f)
        if len(buf) >= FLUSH_AT:  # handed to the kernel even inside a burst
            f.write_out()
        filters = seg.filters
        if filters is not None and filters is not ANY_FILTER and fp not in filters:
            filters.add(fp)
            if len(filters) > MAX_SEGMENT_FILTERS:
                seg.filters = ANY_FILTER
        count = seg.count
        if count == 0:
            seg.first_ts = timestamp_ms
            seg.min_pos = pos
        seg.count = count + 1
        seg.last_cum = cum
        seg.last_ts = timestamp_ms
        offset = seg.first + count
        self._tail.append(_new_record(StreamRecord, (offset, timestamp_ms, payload)))
        self._tail_bytes += size + TAIL_RECORD_OVERHEAD
        return offset

    def _trim_tail(self) -> None:
        """Past this stream's share of the tail budget: drop the older half of the kept records."""
        tail = self._tail
        half = len(tail) // 2
        self._tail_bytes -= sum(map(len, map(_PAYLOAD, tail[:half]))) + half * TAIL_RECORD_OVERHEAD
        del tail[:half]
        self._tail_first += half

    def _note_pending(self, end: int) -> None:
        syncer = self._syncer
        if syncer is None:
            if self.on_durable is not None:
                self.on_durable(end)
            return
        gen = syncer.generation
        p = self._pending
        if p and p[-1][0] == gen:
            p[-1] = (gen, end)
            return
        if not p:
            syncer.wait(self)
        p.append((gen, end))

    def on_synced(self, generation: int) -> bool:
        """Syncer callback (loop thread): offsets written up to this generation are durable."""
        p = self._pending
        end = -1
        while p and p[0][0] <= generation:
            end = p.popleft()[1]
        if end >= 0 and self.on_durable is not None and not self.closed:
            self.on_durable(end)
        return bool(p)

    def on_sync_failed(self, generation: int) -> bool:
        p = self._pending
        end = -1
        while p and p[0][0] <= generation:
            end = p.popleft()[1]
        if end >= 0 and self.on_durable_failed is not None and not self.closed:
            self.on_durable_failed(end)
        return bool(p)

    # -- reading --------------------------------------------------------------------------------------------
    def _seg_index(self, offset: int) -> int:
        lo, hi = 0, len(self._segs) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._segs[mid].first <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def read(self, offset: int, max_records: int, filter_values: frozenset[str] | None = None
             ) -> list[StreamRecord]:
        offset = max(offset, self.first_offset)
        out: list[StreamRecord] = []
        if offset >= self.next_offset or max_records <= 0:
            return out
        if offset >= self._tail_first and filter_values is None:
            at = offset - self._tail_first
            return self._tail[at:at + max_records]
        wanted = None if filter_values is None else {fingerprint(v) for v in filter_values}
        si = self._seg_index(offset)
        while si < len(self._segs) and len(out) < max_records:
            seg = self._segs[si]
            if wanted is not None and not self._may_hold(seg, wanted):
                si += 1
                if si < len(self._segs):
                    offset = self._segs[si].first
                continue
            i = offset - seg.first
            while i < seg.count and len(out) < max_records:
                n = min(seg.count - i, 4096, max_records - len(out) if wanted is None else 512)
                data = seg.file.pread(i * ENTRY_SIZE, n * ENTRY_SIZE)
                self.index_reads += 1
                entries = []
                for k in range(len(data) // ENTRY_SIZE):
                    e = _Entry(data, k * ENTRY_SIZE)
                    if not e.crc_ok:
                        corruption.report(seg.file.path, (i + k) * ENTRY_SIZE, f"entry of offset {seg.first + i + k} "
                                          "fails its CRC", "skipped")
                        continue
                    if wanted is None or e.filter in wanted:
                        entries.append((seg.first + i + k, e))
                        if len(out) + len(entries) >= max_records:
                            break
                out.extend(self._payloads(entries))
                i += n
            si += 1
            if si < len(self._segs):
                offset = self._segs[si].first
        return out[:max_records]

    def _may_hold(self, seg: _CSeg, wanted: set[int]) -> bool:
        """Whether the segment may hold an entry with one of the wanted fingerprints (its summary is built
        once, by reading its entries, for a segment recovered at open)."""
        filters = seg.filters
        if filters is None:
            filters = set()
            for i in range(0, seg.count, 4096):
                data = seg.file.pread(i * ENTRY_SIZE, min(4096, seg.count - i) * ENTRY_SIZE)
                self.index_reads += 1
                filters.update(ENTRY.unpack_from(data, k)[2] for k in range(0, len(data), ENTRY_SIZE))
                if len(filters) > MAX_SEGMENT_FILTERS:
                    filters = ANY_FILTER
                    break
            seg.filters = filters
        return filters is ANY_FILTER or not filters.isdisjoint(wanted)

    def _payloads(self, entries: list[tuple[int, _Entry]]) -> list[StreamRecord]:
        """Read the payloads, one pread per run of entries that lie together in one message-log segment."""
        out: list[StreamRecord] = []
        j = 0
        mlog = self._mlog
        while j < len(entries):
            _, first = entries[j]
            seg_i = bisect.bisect_right(mlog.starts, first.pos)
            seg_end = mlog.starts[seg_i] if seg_i < len(mlog.starts) else 1 << 62
            k = j + 1
            end = first.pos + first.size
            while k < len(entries):
                e = entries[k][1]
                if e.pos != end + HEADER_SIZE or e.pos + e.size > seg_end or \
                        e.pos + e.size - first.pos > READ_SPAN:
                    break
                end = e.pos + e.size
                k += 1
            seg_off, data = mlog.read_span(first.pos, end - first.pos + HEADER_SIZE)
            view = memoryview(data)
            for off, e in entries[j:k]:
                at = e.pos - first.pos
                if len(data) < at + HEADER_SIZE + e.size:
                    self._skip_bad(seg_off + at - HEADER_SIZE, first.pos, off, "short read")
                    continue
                magic, n, crc = HEADER.unpack_from(view, at)
                payload = bytes(view[at + HEADER_SIZE:at + HEADER_SIZE + n])
                if magic != MAGIC or n != e.size or crc32(payload) != crc:
                    self._skip_bad(seg_off + at - HEADER_SIZE, first.pos, off, "bad record (magic, length or CRC)")
                    continue
                out.append(StreamRecord(off, e.ts, payload))
            view.release()
            j = k
        return out

    def _skip_bad(self, file_off: int, pos: int, offset: int, what: str) -> None:
        """A payload that fails its check is reported (its message-log file and offset) and left out."""
        start, _ = self._mlog.locate(pos)
        corruption.report(self._mlog._path(start), file_off, f"{what}: the payload of offset {offset} of stream "
                          f"{self.name!r}", "skipped")

    def offset_at(self, timestamp_ms: int) -> int:
        segs = [s for s in self._segs if s.count]
        lo, hi = 0, len(segs)
        while lo < hi:  # the first segment whose newest entry is ≥ timestamp_ms
            mid = (lo + hi) // 2
            if segs[mid].last_ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(segs):
            return self.next_offset
        seg = segs[lo]
        a, b = 0, seg.count - 1  # the last entry qualifies
        while a < b:
            mid = (a + b) // 2
            if self._entry(seg, mid).ts < timestamp_ms:
                a = mid + 1
            else:
                b = mid
        return seg.first + a

    # -- retention ------------------------------------------------------------------------------------------
    def retain(self, max_bytes: int | None, max_age_ms: int | None, now_ms: float) -> int:
        removed = 0
        while len(self._segs) > 1:
            seg = self._segs[0]
            over = max_bytes is not None and self.bytes > max_bytes
            old = max_age_ms is not None and seg.count > 0 and seg.last_ts < now_ms - max_age_ms
            if not (over or old):
                break
            self._segs.pop(0)
            seg.file.close()
            try:
                os.unlink(seg.file.path)
            except FileNotFoundError:
                pass
            removed += 1
        if removed:
            for g in self._groups.values():
                g.skip_to(self.first_offset)
            self._store.collect()
        return removed

    # -- groups ---------------------------------------------------------------------------------------------
    def group(self, name: str, start_offset: int) -> GroupLog:
        g = self._groups.get(name)
        if g is None:
            path = os.path.join(self.dir, "g", _digest(name) + PLOG)
            g = FileGroupLog.create(path, name, max(start_offset, self.first_offset), self._syncer)
            self._groups[name] = g
        return g

    def groups(self) -> dict[str, GroupLog]:
        return dict(self._groups)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def delete(self) -> None:
        self._tail.clear()
        self._close_files(abandon=True)
        self._groups.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.deleted = self.closed = True
        self._store.forget(self, None)
        self._store.collect()

    def _close_files(self, abandon: bool = False) -> None:
        for s in self._segs:
            if abandon:
                s.file.abandon()
            else:
                s.file.close()
        for g in self._groups.values():
            g.close()

    def close(self) -> None:
        if not self.closed:
            self._tail.clear()
            self._close_files()
            self.closed = True
            self._store.forget(self, self.min_ref)



# -- the vhost's store ------------------------------------------------------------------------------------


class StreamStore:
    """Every stream of one vhost: the shared message log and the streams' consume and pull logs."""

    def __init__(self, directory: str, syncer: Syncer | None, *,
                 message_segment_size: int = DEFAULT_MESSAGE_SEGMENT_SIZE, recovering: bool = False) -> None:
        self.dir = directory
        self.syncer = syncer
        os.makedirs(os.path.join(directory, "s"), exist_ok=True)
        self.mlog = MessageLog(os.path.join(directory, "messages"), syncer, message_segment_size)
        self.streams: dict[str, FileStreamLog] = {}
        self._closed_refs: dict[str, int] = {}  # streams closed (not deleted) while the store stays open
        self.recovering = recovering
        self.closed = False

    def stream_dir(self, name: str) -> str:
        return os.path.join(self.dir, "s", _digest(name))

    def open_stream(self, name: str, *, max_segment_size_bytes: int) -> FileStreamLog:
        s = self.streams.get(name)
        if s is None:
            self._closed_refs.pop(name, None)
            s = FileStreamLog(self, self.stream_dir(name), name, max_segment_size_bytes)
            self.streams[name] = s
            self._share_tail()
        return s

    def _share_tail(self) -> None:
        """Each open stream's share of the in-memory tail budget (at least TAIL_MIN_BYTES)."""
        cap = max(TAIL_MIN_BYTES, TAIL_BUDGET_BYTES // max(1, len(self.streams)))
        for s in self.streams.values():
            s.tail_cap = cap

    def forget(self, stream: FileStreamLog, min_ref: int | None) -> None:
        """A stream was closed (its oldest reference, ``min_ref``, still protects the message log) or
        deleted (``None``)."""
        if self.streams.get(stream.name) is stream:
            del self.streams[stream.name]
            self._share_tail()
        if min_ref is None:
            self._closed_refs.pop(stream.name, None)
        else:
            self._closed_refs[stream.name] = min_ref

    def collect(self) -> int:
        """Delete the message-log segments no open stream references (never while recovering)."""
        if self.recovering or self.closed:
            return 0
        refs = [r for r in (s.min_ref for s in self.streams.values()) if r is not None]
        refs += self._closed_refs.values()
        return self.mlog.collect(min(refs) if refs else None)

    def finish_recovery(self, keep: Collection[str] | None = None) -> list[str]:
        """Every stream that exists has been opened: delete the directories of the others (returns their
        names) and start collecting message-log segments."""
        root = os.path.join(self.dir, "s")
        gone: list[str] = []
        opened = {os.path.basename(s.dir) for s in self.streams.values()}
        for d in sorted(os.listdir(root)):
            if d in opened:
                continue
            try:
                with open(os.path.join(root, d, "name"), "rb") as f:
                    name = f.read().decode(errors="replace")
            except OSError:
                name = d
            if keep is not None and name in keep:
                continue
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
            gone.append(name)
        self.recovering = False
        self.collect()
        return gone

    def close(self) -> None:
        if self.closed:
            return
        for s in list(self.streams.values()):
            s.close()
        self.mlog.close()
        self.closed = True
