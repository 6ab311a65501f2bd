"""One time bucket of the delay store: ``<start>.data`` (full records), ``<start>.idx`` (32-byte entries)
and ``<start>.disp`` (what was dispatched or cancelled), under ``buckets/``, ``start`` being the bucket's
first ms (UTC, 20 digits).

Appends to ``.data`` and ``.idx`` are buffered in memory and written, fsynced and closed only by the
store's checkpoint: records spread over a year touch thousands of buckets, and keeping a descriptor and
an fsync per bucket per burst would cost far more than the WAL's one sequential write (the WAL is what
makes an append durable; these files are its applied, checkpointed form). Their lengths at the last
checkpoint are what recovery cuts them back to before replaying the WAL, so no record is applied twice.

The checkpoint takes the buffers on the loop (:meth:`Bucket.detach`, a :class:`BucketWrite`) and writes them
on a thread of its own (:meth:`BucketWrite.write`): thousands of files opened, written and synced took the
loop away from every client for seconds (bench/delay_loop_stall.py). Until the write is over its bytes are
read from the :class:`BucketWrite`, appends go on into new buffers after it, and a write that failed is put
back in front of them (:meth:`Bucket.restore`).

``.disp`` is never cut back: it goes through the node's syncer like any append file, and a record in it
is the proof that an entry must not be handed out again.

*Slices* (``<start>.s00`` .. ``.s59``): the index entries of the bucket grouped by due time, one file per
sixtieth of the bucket (a minute of an hour bucket), in append order within each, so that a window load
reads only the minutes it covers instead of the whole index. They are a cache derived from ``.idx`` (made
by one streaming pass the first time a load touches the bucket, then extended with what was appended since),
never fsynced and never read by recovery: a new process overwrites them on its first split, and they go
with the bucket.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Generator, Iterator, Sequence

from storage import corruption
from storage.checksum import crc32
from storage.delay.record import IDX, IDX_SIZE, RECORD_HEAD, pack_disp, unpack_disp
from storage.segment import HEADER, HEADER_SIZE, MAGIC, AppendFile, CorruptRecord, scan
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

SEAL_EVERY = 64  # framed records buffered before they are joined into one chunk of the bucket's .data buffer
READ_CHUNK = 4096 * IDX_SIZE  # index entries read per pread when scanning a bucket
SLICES = 60  # slice files per bucket (see the module docstring)
SLICE_WRITE_AT = 256 << 10  # bytes buffered per slice while splitting (at most 60 of them) before a write
_NATIVE_LE = sys.byteorder == "little"  # the index is little-endian: due times read as a native array
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _pwrite_all(fd: int, buf: bytes | bytearray, pos: int) -> None:
    view = memoryview(buf)
    try:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], pos + done)
    finally:
        view.release()


def syncfs(directory: str) -> None:
    """Flush the whole file system holding ``directory`` in one call (Linux ``syncfs``): a checkpoint
    after appends spread over a year has thousands of bucket files to make durable, and one fsync each
    would take seconds. Falls back to ``os.sync``."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fn = getattr(_libc, "syncfs", None)
        if fn is None:
            os.sync()
        elif fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), directory)
    finally:
        os.close(fd)


class XrefCount:
    """Per exchange in one bucket: entries and bytes stored, and how many of them were resolved
    (dispatched or cancelled). Pending = stored - resolved, unless the exchange was dropped."""

    __slots__ = ("count", "nbytes", "resolved", "resolved_bytes")

    def __init__(self, count: int = 0, nbytes: int = 0, resolved: int = 0, resolved_bytes: int = 0) -> None:
        self.count = count
        self.nbytes = nbytes
        self.resolved = resolved
        self.resolved_bytes = resolved_bytes

    def to_list(self) -> list[int]:
        return [self.count, self.nbytes, self.resolved, self.resolved_bytes]


class BucketWrite:
    """A bucket's buffered appends as one checkpoint took them: ``.data`` chunks from ``data_at`` on, index
    entries from ``idx_at`` on, and the index's CRC once they are written. :meth:`write` needs nothing else of
    the bucket, so it runs off the loop while the bucket goes on taking appends."""

    __slots__ = ("chunk_offs", "chunks", "crc", "data_at", "data_len", "directory", "idx", "idx_at", "start")

    def __init__(self, directory: str, start: int, chunks: list[bytes], chunk_offs: list[int], data_at: int,
                 data_len: int, idx: bytes, idx_at: int, crc: int) -> None:
        self.directory = directory  # (the paths are made by write(), off the loop: 8,760 buckets took 60 ms)
        self.start = start
        self.chunks = chunks
        self.chunk_offs = chunk_offs  # where each chunk starts, counted from data_at
        self.data_at = data_at
        self.data_len = data_len
        self.idx = idx
        self.idx_at = idx_at
        self.crc = crc

    def write(self, fsync: bool) -> bool:
        """Write both parts at their offsets (and fsync them; without ``fsync`` the caller makes them durable
        with :func:`syncfs`); True if anything was written. Any thread."""
        bufs: Sequence[bytes]
        wrote = False
        for suffix, bufs, pos in ((".data", self.chunks, self.data_at), (".idx", (self.idx,), self.idx_at)):
            if not any(bufs):
                continue
            fd = os.open(os.path.join(self.directory, f"{self.start:020d}{suffix}"),
                         os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                for buf in bufs:
                    _pwrite_all(fd, buf, pos)
                    pos += len(buf)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            wrote = True
        return wrote

    def read(self, at: int, n: int) -> bytes:
        """``n`` bytes of ``.data`` from offset ``at`` (within this write)."""
        b = at - self.data_at
        i = bisect.bisect_right(self.chunk_offs, b) - 1
        return self.chunks[i][b - self.chunk_offs[i]:b - self.chunk_offs[i] + n] if i >= 0 else b""


class Bucket:
    __slots__ = ("_buf_at", "_chunk_offs", "_chunks", "_data_buffered", "_frames", "_idx_at", "_idx_buf", "_reader",
                 "_sealed", "_writing", "ahead", "changes", "counts", "data_disk", "dir", "disp", "disp_len",
                 "disp_seen", "idx_crc", "idx_disk", "slice_len", "slice_ms", "split_len", "start")

    def __init__(self, directory: str, start: int, data_len: int = 0, idx_len: int = 0, disp_len: int = 0,
                 counts: dict[int, XrefCount] | None = None) -> None:
        self.dir = directory
        self.start = start
        self.data_disk = data_len  # bytes of .data / .idx on disk (as of the last checkpoint or flush)
        self.idx_disk = idx_len
        # A checkpoint's write in progress (off the loop), and where the buffers below start: after it.
        self._writing: BucketWrite | None = None
        self._buf_at = data_len
        self._idx_at = idx_len
        self.changes = 0  # appends and dispatch-log records so far (a checkpoint tells a drained bucket touched)
        self.idx_crc = 0  # CRC-32 of .idx's first idx_disk bytes (the checkpoint records it: verify_index)
        self.disp_len = disp_len  # .disp length at the last checkpoint (recovery re-counts what follows)
        # ``.data`` not yet written: framed records as they were appended (``_frames``, no copy made), joined
        # every SEAL_EVERY into ``_chunks`` (``_chunk_offs``: where each starts, counted from ``data_disk``;
        # ``_sealed``: their length). A growing bytearray copied every byte about nine times over as it grew.
        self._frames: list[bytes] = []
        self._chunks: list[bytes] = []
        self._chunk_offs: list[int] = []
        self._sealed = 0
        self._data_buffered = 0
        self._idx_buf = bytearray()
        self._reader = -1
        self.disp: AppendFile | None = None
        self.counts = counts if counts is not None else {}
        # Window loads (DelayStore._fill): the slices, made on first use; split_len is how much of the
        # index (bytes, counting the unwritten buffer) they hold, slice_len each one's length in bytes.
        self.slice_ms = 0
        self.split_len = -1  # not split (yet) by this process
        self.slice_len: list[int] = []
        # .disp bytes already read by window loads, and the resolutions read there whose key was ahead of
        # the window then (seq -> (due_ms, seq)); dropped once the window passes them.
        self.disp_seen = 0
        self.ahead: dict[int, tuple[int, int]] = {}

    def path(self, suffix: str) -> str:
        return os.path.join(self.dir, f"{self.start:020d}{suffix}")

    @property
    def data_len(self) -> int:
        return self._buf_at + self._data_buffered

    @property
    def idx_len(self) -> int:
        return self._idx_at + len(self._idx_buf)

    @property
    def buffered(self) -> int:
        return self._data_buffered + len(self._idx_buf)

    def pending(self, dead: set[int] | frozenset[int]) -> int:
        return sum(c.count - c.resolved for x, c in self.counts.items() if x not in dead)

    # -- appending (the applier) ----------------------------------------------------------------------------
    def add(self, payload: bytes, due_ms: int, seq: int, xref: int, framed: bool = False) -> tuple[int, int]:
        """Buffer one record and its index entry; returns (payload offset, payload length). ``framed``:
        ``payload`` is the record already framed (:meth:`DelayRecord.frame`), kept as it is."""
        if framed:
            frame = payload
            n = len(frame) - HEADER_SIZE
        else:
            n = len(payload)
            frame = HEADER.pack(MAGIC, n, crc32(payload)) + payload
        off = self._buf_at + self._data_buffered + HEADER_SIZE
        self.changes += 1
        frames = self._frames
        frames.append(frame)
        self._data_buffered += len(frame)
        if len(frames) >= SEAL_EVERY:
            self._seal()
        self._idx_buf += IDX.pack(due_ms, seq, off, n, xref)
        c = self.counts.get(xref)
        if c is None:
            c = self.counts[xref] = XrefCount()
        c.count += 1
        c.nbytes += n
        return off, n

    def _seal(self) -> None:
        """Join the frames appended since the last seal into one chunk."""
        if self._frames:
            chunk = b"".join(self._frames)
            self._frames = []
            self._chunk_offs.append(self._sealed)
            self._chunks.append(chunk)
            self._sealed += len(chunk)

    def detach(self) -> BucketWrite | None:
        """Hand the buffers to a checkpoint (None: nothing buffered). Appends go on into new buffers; until
        :meth:`written` (or :meth:`restore`) the bytes handed over are read from the write."""
        assert self._writing is None, "one checkpoint at a time"
        self._seal()
        if not self.buffered:
            return None
        idx = bytes(self._idx_buf)
        w = BucketWrite(self.dir, self.start, self._chunks, self._chunk_offs, self._buf_at, self._sealed, idx,
                        self._idx_at, crc32(idx, self.idx_crc))
        self._writing = w
        self._buf_at += w.data_len
        self._idx_at += len(idx)
        self._chunks = []
        self._chunk_offs = []
        self._sealed = 0
        self._data_buffered = 0
        self._idx_buf = bytearray()
        return w

    def written(self, w: BucketWrite) -> None:
        """The checkpoint wrote ``w`` (and made it durable): those bytes are read from the files now."""
        assert w is self._writing
        self.data_disk = w.data_at + w.data_len
        self.idx_disk = w.idx_at + len(w.idx)
        self.idx_crc = w.crc  # what was written, once per checkpoint (not per append)
        self._writing = None

    def restore(self, w: BucketWrite) -> None:
        """The checkpoint failed to write ``w``: its bytes go back in front of the buffers, for the next one
        (which writes them at the same offsets, over whatever part of them did land)."""
        assert w is self._writing
        self._seal()
        self._chunk_offs = w.chunk_offs + [o + w.data_len for o in self._chunk_offs]
        self._chunks = w.chunks + self._chunks
        self._sealed += w.data_len
        self._data_buffered += w.data_len
        self._idx_buf = bytearray(w.idx) + self._idx_buf
        self._buf_at = w.data_at
        self._idx_at = w.idx_at
        self._writing = None

    def flush(self, fsync: bool = True) -> bool:
        """Write the buffers to the files here and now, and fsync them (without ``fsync`` the caller makes them
        durable with :func:`syncfs`); True if anything was written."""
        w = self.detach()
        if w is None:
            return False
        try:
            wrote = w.write(fsync)
        except BaseException:
            self.restore(w)
            raise
        self.written(w)
        return wrote

    def cut_to_checkpoint(self) -> None:
        """Recovery: cut ``.data`` and ``.idx`` back to their checkpointed lengths (what follows is replayed
        from the WAL). A file shorter than that lost checkpointed bytes: said loudly, and its length kept."""
        for suffix, want in ((".data", self.data_disk), (".idx", self.idx_disk)):
            path = self.path(suffix)
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                size = 0
            if size > want:
                os.truncate(path, want)
            elif size < want:
                log.error("delay store: %s holds %d bytes, the checkpoint says %d", path, size, want)
                if suffix == ".data":
                    self.data_disk = size
                else:
                    self.idx_disk = size - size % IDX_SIZE
        self._buf_at = self.data_disk
        self._idx_at = self.idx_disk

    def verify_index(self, want: int | None) -> None:
        """Recovery, after :meth:`cut_to_checkpoint`: check ``.idx`` against the CRC the checkpoint recorded
        (``want``; None: a checkpoint of the previous format, which recorded none: the index is taken as it is).

        Index entries carry no checksum of their own (a window load reads them as an array of due times), and
        a damaged one was blamed on ``.data`` (a bad offset or length) or never found (a due time moved into the
        future). On a mismatch the index is rebuilt from ``.data``, whose framed records (each with its CRC)
        hold everything an entry says (due time, seq, exchange; offset and length from the framing), and the
        first entry that differs is reported against ``.idx``: the index is derived data, so nothing is lost.
        Costs one read of the index per start (32 bytes per pending record)."""
        got = 0
        if self.idx_disk:
            with open(self.path(".idx"), "rb") as f:
                idx = f.read(self.idx_disk)
            got = crc32(idx)
        else:
            idx = b""
        if want is None or got == want:
            self.idx_crc = got
            return
        try:
            with open(self.path(".data"), "rb") as f:
                data = f.read(self.data_disk)
        except FileNotFoundError:
            data = b""
        records, _, _ = scan(data, self.path(".data"))
        rebuilt = bytearray()
        for _, start, n in records:
            seq, due, _, xref, _, _, _ = RECORD_HEAD.unpack_from(data, start)
            rebuilt += IDX.pack(due, seq, start, n, xref)
        at = next((i for i in range(0, max(len(idx), len(rebuilt)), IDX_SIZE)
                   if idx[i:i + IDX_SIZE] != rebuilt[i:i + IDX_SIZE]), 0)
        corruption.report(self.path(".idx"), at, "the index fails the checksum its checkpoint recorded (the first "
                          "entry that differs from .data is here)", "rebuilt from .data (nothing lost)",
                          store="delay")
        fd = os.open(self.path(".idx"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _pwrite_all(fd, rebuilt, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.idx_disk = self._idx_at = len(rebuilt)
        self.idx_crc = crc32(rebuilt)

    # -- reading --------------------------------------------------------------------------------------------
    def _fd(self) -> int:
        if self._reader < 0:
            self._reader = os.open(self.path(".data"), os.O_RDONLY | os.O_CLOEXEC)
        return self._reader

    def read(self, off: int, n: int) -> bytes:
        """The payload at ``off``, checked against its framing (from the buffer if not yet written)."""
        start = off - HEADER_SIZE
        if start - self._buf_at >= self._sealed:
            self._seal()  # it is among the frames not sealed yet
        if start >= self._buf_at:
            b = start - self._buf_at
            i = bisect.bisect_right(self._chunk_offs, b) - 1
            data = self._chunks[i][b - self._chunk_offs[i]:b - self._chunk_offs[i] + HEADER_SIZE + n] if i >= 0 else b""
        elif start >= self.data_disk and self._writing is not None:
            data = self._writing.read(start, HEADER_SIZE + n)
        else:
            data = os.pread(self._fd(), HEADER_SIZE + n, start)
        if len(data) != HEADER_SIZE + n:
            corruption.report(self.path(".data"), start, "short read", "not dispatched; dropped")
            raise CorruptRecord(f"short read at {off} in {self.path('.data')}")
        magic, length, crc = HEADER.unpack_from(data, 0)
        if magic != MAGIC or length != n or crc32(memoryview(data)[HEADER_SIZE:]) != crc:
            corruption.report(self.path(".data"), start, "bad record (magic, length or CRC)", "not dispatched; dropped")
            raise CorruptRecord(f"bad record at {off} in {self.path('.data')}")
        return data[HEADER_SIZE:]

    def index_position(self, entry: tuple[int, int, int, int, int]) -> int:
        """Where an index entry ``(due_ms, seq, data offset, data length, xref)`` lies in ``.idx`` (-1: not
        found); only for a report, after damage."""
        for i, e in enumerate(self.index()):
            if e == entry:
                return i * IDX_SIZE
        return -1

    def index(self) -> Iterator[tuple[int, int, int, int, int]]:
        """Every index entry ``(due_ms, seq, data offset, data length, xref)``, in append order, read a
        chunk at a time (a bucket's index is never held whole)."""
        if self.idx_disk:
            fd = os.open(self.path(".idx"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                pos = 0
                while pos < self.idx_disk:
                    chunk = os.pread(fd, min(READ_CHUNK, self.idx_disk - pos), pos)
                    if not chunk:
                        break
                    pos += len(chunk)
                    yield from IDX.iter_unpack(chunk[:len(chunk) - len(chunk) % IDX_SIZE])
            finally:
                os.close(fd)
        if self._writing is not None and self._writing.idx:
            yield from IDX.iter_unpack(self._writing.idx)
        if self._idx_buf:
            yield from IDX.iter_unpack(bytes(self._idx_buf))

    def index_chunks(self, pos: int) -> Generator[bytes, None, None]:
        """The raw index from byte ``pos`` on (whole entries, the unwritten buffer included), a chunk at a
        time."""
        if pos < self.idx_disk:
            fd = os.open(self.path(".idx"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                while pos < self.idx_disk:
                    chunk = os.pread(fd, min(READ_CHUNK, self.idx_disk - pos), pos)
                    chunk = chunk[:len(chunk) - len(chunk) % IDX_SIZE]
                    if not chunk:
                        raise CorruptRecord(f"short read at {pos} in {self.path('.idx')}")
                    pos += len(chunk)
                    yield chunk
            finally:
                os.close(fd)
        w = self._writing
        if w is not None and pos < self._idx_at:
            b = pos - w.idx_at
            while b < len(w.idx):
                chunk = w.idx[b:b + READ_CHUNK]
                b += len(chunk)
                yield chunk
            pos = self._idx_at
        b = pos - self._idx_at
        while b < len(self._idx_buf):
            chunk = bytes(self._idx_buf[b:b + READ_CHUNK])
            b += len(chunk)
            yield chunk

    # -- slices (window loads) ------------------------------------------------------------------------------
    def slice_path(self, k: int) -> str:
        return self.path(f".s{k:02d}")

    def slice_of(self, due_ms: int) -> int:
        """The slice holding due time ``due_ms`` (a time outside the bucket: the nearest slice)."""
        return min(SLICES - 1, max(0, (due_ms - self.start) // self.slice_ms))

    def split(self, bucket_ms: int, limit: int | None = None) -> int:
        """Bring the slices up to date with the index: made from the whole index the first time (files
        left by an earlier process are overwritten), then extended with the entries appended since; with
        ``limit``, stop after about that many (a chunk's worth more at most) and go on at the next call.
        Returns how many entries were added to them."""
        if self.split_len < 0:
            self.slice_ms = max(1, -(-bucket_ms // SLICES))
            self._delete_slices()
            self.slice_len = [0] * SLICES
            self.split_len = 0
            os.close(os.open(self.slice_path(0), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644))
        if self.split_len >= self.idx_len:
            return 0
        try:
            return self._extend_slices(limit)
        except BaseException:
            self.split_len = -1  # the slices are now in an unknown state: remade from scratch next time
            raise

    def _extend_slices(self, limit: int | None) -> int:
        start, width, last = self.start, self.slice_ms, SLICES - 1
        bufs = [bytearray() for _ in range(SLICES)]
        added = 0
        chunks = self.index_chunks(self.split_len)
        for chunk in chunks:
            if _NATIVE_LE:
                dues = memoryview(chunk).cast("q")[::4].tolist()
            else:
                dues = [e[0] for e in IDX.iter_unpack(chunk)]
            for i, due in enumerate(dues):
                k = (due - start) // width
                o = i * IDX_SIZE
                bufs[k if 0 <= k <= last else (0 if k < 0 else last)] += chunk[o:o + IDX_SIZE]
            added += len(dues)
            self.split_len += len(chunk)
            for k, buf in enumerate(bufs):
                if len(buf) >= SLICE_WRITE_AT:
                    self._write_slice(k, buf)
                    bufs[k] = bytearray()
            if limit is not None and added >= limit:
                break
        chunks.close()
        for k, buf in enumerate(bufs):
            if buf:
                self._write_slice(k, buf)
        return added

    def _write_slice(self, k: int, buf: bytearray) -> None:
        fd = os.open(self.slice_path(k), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(buf)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], self.slice_len[k] + done)
            view.release()
        finally:
            os.close(fd)
        self.slice_len[k] += len(buf)

    def slice_chunks(self, k: int) -> Iterator[bytes]:
        """Slice ``k``'s entries (raw, whole entries), a chunk at a time."""
        size = self.slice_len[k]
        if not size:
            return
        fd = os.open(self.slice_path(k), os.O_RDONLY | os.O_CLOEXEC)
        try:
            pos = 0
            while pos < size:
                chunk = os.pread(fd, min(READ_CHUNK, size - pos), pos)
                chunk = chunk[:len(chunk) - len(chunk) % IDX_SIZE]
                if not chunk:
                    raise CorruptRecord(f"short read at {pos} in {self.slice_path(k)}")
                pos += len(chunk)
                yield chunk
        finally:
            os.close(fd)

    def _delete_slices(self) -> None:
        """Remove the slice files (this process's, or an earlier one's: slice 0 always exists then)."""
        if self.split_len < 0 and not os.path.exists(self.slice_path(0)):
            return
        for k in range(SLICES):
            try:
                os.unlink(self.slice_path(k))
            except FileNotFoundError:
                pass

    def close_reader(self) -> None:
        if self._reader >= 0:
            os.close(self._reader)
            self._reader = -1

    # -- the dispatch log -----------------------------------------------------------------------------------
    def open_disp(self, syncer: Syncer | None) -> AppendFile:
        """The ``.disp`` file, opened (its torn tail cut) or created on first use."""
        if self.disp is None:
            path = self.path(".disp")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    _, good_end, _ = scan(f.read(), path)
                self.disp = AppendFile.open_existing(path, syncer, good_end)
            else:
                self.disp = AppendFile.create(path, syncer)
        return self.disp

    def log_disp(self, syncer: Syncer | None, kind: int, entries: list[tuple[int, int, int, int]]) -> None:
        self.changes += 1
        self.open_disp(syncer).append(pack_disp(kind, entries))

    def disp_records(self, syncer: Syncer | None, since: int = 0) -> Iterator[tuple[int, list[tuple[int, int, int, int]]]]:
        """Every dispatch-log record ``(kind, [(due_ms, seq, xref, size)])`` from byte ``since`` on."""
        if self.disp is None and not os.path.exists(self.path(".disp")):
            return
        data = self.open_disp(syncer).read_all()
        if since:
            data = data[since:]
        records, _, _ = scan(data, self.path(".disp"))
        view = memoryview(data)
        for _, start, n in records:
            yield unpack_disp(view[start:start + n])

    def disp_since(self, pos: int) -> tuple[list[tuple[int, list[tuple[int, int, int, int]]]], int]:
        """The dispatch-log records from byte ``pos`` (a record boundary) on, buffered ones included, and
        where the last whole one ends; reads only what follows ``pos``."""
        if self.disp is not None:
            data = self.disp.pread(pos, self.disp.size - pos)
        else:
            try:
                fd = os.open(self.path(".disp"), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return [], pos
            try:
                parts = []
                at = pos
                while chunk := os.pread(fd, 1 << 20, at):
                    parts.append(chunk)
                    at += len(chunk)
                data = b"".join(parts)
            finally:
                os.close(fd)
        if not data:
            return [], pos
        records, good_end, _ = scan(data, self.path(".disp"))
        view = memoryview(data)
        return [unpack_disp(view[start:start + n]) for _, start, n in records], pos + good_end

    def close(self, abandon: bool = False) -> None:
        self.close_reader()
        if self.disp is not None:
            if abandon:
                self.disp.abandon()
            else:
                self.disp.close()
            self.disp = None

    def delete(self) -> None:
        self.close(abandon=True)
        for suffix in (".data", ".idx", ".disp"):
            try:
                os.unlink(self.path(suffix))
            except FileNotFoundError:
                pass
        self._delete_slices()
        self.split_len = -1
