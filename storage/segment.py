"""Append-only files of framed records: the on-disk unit of the message store and of the queue index.

Every record, little-endian::

    offset 0   u32  MAGIC (0x5445564C, b"LVET")  lets a scan find the next record after damage
    offset 4   u32  n, the payload length
    offset 8   u32  CRC32 of the payload
    offset 12  n    payload

A record is valid when its magic, a length that fits the file and its CRC all check. Scanning a file
(``scan``) yields the valid records in order. After an invalid one it searches for the next magic whose
record validates: if there is one, the bytes between were corruption in the middle of the file, which
is reported and skipped; if there is none, the file ends in a torn write or a damaged last record,
which the caller cuts off (``AppendFile.open_existing`` truncates it) so that new records follow the last
good one. The two are told apart by their shape (:func:`torn_at`): a write cut short leaves a record cut
short (never confirmed: a warning), damage leaves a whole record that fails its check (reported). Reports go through
:func:`storage.corruption.report`: one line naming the file and the offset, and the store's corruption
counter; what the stores then do is the policy stated there (the record is dropped, the others are kept).

``AppendFile`` buffers appends in memory (one write per burst or per ``FLUSH_AT`` bytes, not per
record); a :class:`storage.syncer.Syncer`, when given, learns that the file is dirty and fsyncs it with
the rest of the burst in its own thread.

A write that fails (ENOSPC, EIO) never shifts a record: data goes out with ``os.pwrite`` at the offset the
file's bytes so far end at (``written``, which counts exactly the bytes the kernel took), so the bytes a
short write did land stay counted and the retry continues after them, and whatever a failed call may have
left past ``written`` is cut off (ZODB's truncate-on-failed-append) and is overwritten by the retry anyway.
The unwritten rest stays in the buffer, is served to readers from there, and is retried by the syncer;
the error is kept in ``error`` until a write succeeds. Every offset handed out by ``append`` stays valid.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Protocol

from storage import corruption
from storage.checksum import crc32

log = logging.getLogger("leveret.storage")

MAGIC = 0x5445564C
MAGIC_BYTES = struct.pack("<I", MAGIC)
HEADER = struct.Struct("<III")
assert HEADER.size == 12
HEADER_SIZE = HEADER.size
# Appends are written to the kernel once this much is buffered, even inside a burst (bounds memory).
FLUSH_AT = 1 << 20


class Syncer(Protocol):
    """What an append file needs of its syncer (storage.syncer.Syncer): to be told it has new appends.
    Declared here so that segment does not depend on the syncer that depends on it."""

    def mark(self, f: AppendFile) -> None: ...


class CorruptRecord(Exception):
    """A record read by position failed its checks (a bad disk, or a file changed under us)."""


def _bad(path: str, offset: int, what: str) -> CorruptRecord:
    """Report a record read by position that fails its check, and the exception its reader raises."""
    corruption.report(path, offset, what, "not served; dropped")
    return CorruptRecord(f"{what} at {offset} in {path}")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until all of ``data`` is written: a short write (a full disk) is not silently a success."""
    view = memoryview(data)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        view.release()


def frame(payload: bytes) -> bytes:
    """One record as bytes (tests and small files; appends avoid the copy)."""
    return HEADER.pack(MAGIC, len(payload), crc32(payload)) + payload


def _valid_at(data: bytes | memoryview, pos: int, end: int) -> int:
    """The payload length of a valid record at ``pos``, or -1."""
    if pos + HEADER_SIZE > end:
        return -1
    magic, n, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or pos + HEADER_SIZE + n > end:
        return -1
    start = pos + HEADER_SIZE
    if crc32(data[start:start + n]) != crc:
        return -1
    length: int = n
    return length


def torn_at(data: bytes | memoryview, pos: int, end: int) -> bool:
    """Whether the invalid bytes from ``pos`` to the end of a file are a write cut short rather than damage.

    A write that did not land whole leaves a record cut short: fewer bytes than a header, a header whose
    length runs past the end (and whose CRC the bytes that are there do not match), or zeros (a file system
    that extended the file before a power cut wrote its data). A whole record that fails its check is damage:
    a kill -9 keeps every byte written, and a confirmed record was fsynced whole. One case looks like a cut
    write and is not: a flipped bit that makes the last record's length run past the end; the bytes that are
    there then match the header's CRC, which a cut write's cannot."""
    if end - pos < HEADER_SIZE or not any(data[pos:end]):
        return True
    magic, n, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or pos + HEADER_SIZE + n <= end:
        return False
    return bool(crc32(data[pos + HEADER_SIZE:end]) != crc)


def scan(data: bytes, name: str = "", keep_damaged_tail: bool = False) -> tuple[list[tuple[int, int, int]], int, int]:
    """Validate every record of a file's bytes.

    Returns ``(records, good_end, skipped)``: ``records`` lists ``(record offset, payload offset,
    payload length)`` of each valid record in order; ``good_end`` is where the last valid record ends
    (anything after it is a torn tail, to cut); ``skipped`` counts bytes of corruption skipped in the middle.
    A torn write at the end (:func:`torn_at`) is logged as a warning, not reported as corruption: it was never
    confirmed. Damage to the last record is reported and, by default, cut with the tail; with
    ``keep_damaged_tail`` it is skipped and kept in place like damage in the middle (``good_end`` is then the
    file's end), for a log whose positions must not be reused (the stream message log: storage/stream_store.py).
    """
    found = Scan(data, name, keep_damaged_tail)
    records = list(found)
    return records, found.good_end, found.skipped


class Scan:
    """:func:`scan` one record at a time, for files too large to list every record of (a deduplication log of
    millions of entries): iterating yields ``(record offset, payload offset, payload length)``; once it is
    exhausted, ``good_end`` and ``skipped`` are :func:`scan`'s. ``data`` may be a memory map."""

    def __init__(self, data: bytes | mmap.mmap, name: str = "", keep_damaged_tail: bool = False) -> None:
        self.data = data
        self.name = name
        self.keep_damaged_tail = keep_damaged_tail
        self.good_end = 0
        self.skipped = 0

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        data, name, keep_damaged_tail = self.data, self.name, self.keep_damaged_tail
        view = memoryview(data)
        end = len(data)
        pos = 0
        try:
            while pos < end:
                n = _valid_at(view, pos, end)
                if n >= 0:
                    yield pos, pos + HEADER_SIZE, n
                    pos += HEADER_SIZE + n
                    self.good_end = pos
                    continue
                # Damage at pos: find the next record that validates, if any.
                probe = pos + 1
                while True:
                    probe = data.find(MAGIC_BYTES, probe)
                    if probe < 0 or _valid_at(view, probe, end) >= 0:
                        break
                    probe += 1
                if probe < 0:
                    # Nothing valid follows: a write cut short (never confirmed), or damage to the last record.
                    if torn_at(view, pos, end):
                        log.warning("storage: cut a torn write of %d bytes at offset %d of %s (a record cut short: "
                                    "never confirmed)", end - pos, pos, name or "a file")
                        break
                    if keep_damaged_tail:
                        corruption.report(name or "a file", pos, f"the last {end - pos} bytes are a whole record "
                                          "that fails its check (damage, not a torn write)", "skipped; kept in place")
                        self.skipped += end - pos
                        self.good_end = end
                        break
                    corruption.report(name or "a file", pos, f"the last {end - pos} bytes are a whole record that "
                                      "fails its check (damage, not a torn write)", "cut off")
                    break
                corruption.report(name or "a file", pos, f"{probe - pos} bytes fail their check (magic, length or "
                                  "CRC)", "skipped; the valid records after them are kept")
                self.skipped += probe - pos
                pos = probe
        finally:
            view.release()


class AppendFile:
    """One segment file open for appending and for positional reads.

    ``written`` is how much of it the kernel has, ``synced`` how much is known to be on disk (fsynced;
    kept by the syncer), ``size`` what it will hold once the buffer is written. ``error`` is the last write
    error while some of the buffer could not be written (None once everything is out).
    """

    __slots__ = ("buf", "dirty", "error", "fd", "new", "path", "synced", "syncer", "write_behind", "written")

    def __init__(self, path: str, syncer: Syncer | None, fd: int, size: int, new: bool) -> None:
        self.path = path
        self.fd = fd
        self.buf = bytearray()
        self.written = size
        self.synced = size if not new else 0
        self.syncer = syncer
        self.dirty = False
        self.new = new  # the directory entry still needs an fsync
        self.error: OSError | None = None
        # Whether its writes may wait for the syncer's round in progress (storage.syncer.Syncer.flush): set by
        # an owner whose waiters count in throughput, not in the latency of each round (a stream's logs).
        self.write_behind = False

    @classmethod
    def create(cls, path: str, syncer: Syncer | None) -> AppendFile:
        # Not O_APPEND: writes go to explicit offsets (pwrite), so a failed one can be retried in place.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        return cls(path, syncer, fd, 0, True)

    @classmethod
    def open_existing(cls, path: str, syncer: Syncer | None, good_end: int) -> AppendFile:
        """Reopen a scanned file for appending, first cutting any torn tail after ``good_end``."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        size = os.fstat(fd).st_size
        if size > good_end:
            log.warning("storage: cut %d bytes at offset %d from %s (the scan logged why)", size - good_end,
                        good_end, path)
            os.ftruncate(fd, good_end)
            size = good_end
        return cls(path, syncer, fd, size, False)

    @property
    def size(self) -> int:
        return self.written + len(self.buf)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def append(self, payload: bytes) -> int:
        """Buffer one record; returns the offset of its payload in the file."""
        buf = self.buf
        off = self.written + len(buf) + HEADER_SIZE
        buf += HEADER.pack(MAGIC, len(payload), crc32(payload))
        buf += payload
        if not self.dirty and self.syncer is not None:
            self.dirty = True
            self.syncer.mark(self)
        if len(buf) >= FLUSH_AT:
            self.write_out()
        return off

    def append2(self, head: bytes, body: bytes) -> int:
        """Buffer one record whose payload is ``head + body``, without joining them."""
        buf = self.buf
        off = self.written + len(buf) + HEADER_SIZE
        buf += HEADER.pack(MAGIC, len(head) + len(body), crc32(body, crc32(head)))
        buf += head
        buf += body
        if not self.dirty and self.syncer is not None:
            self.dirty = True
            self.syncer.mark(self)
        if len(buf) >= FLUSH_AT:
            self.write_out()
        return off

    def write_out(self) -> bool:
        """Hand the buffer to the kernel (page cache); durability is the syncer's business.

        Returns False when not all of it could be written: the bytes that did land stay counted in
        ``written``, the rest stays buffered for a retry, and ``error`` says why. Never raises."""
        buf = self.buf
        if not buf or self.fd < 0:
            return True
        view = memoryview(buf)
        done = 0
        try:
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], self.written + done)
        except OSError as e:
            self.error = e
            return self._keep_unwritten(done)
        finally:
            view.release()
        self.written += done
        # A new buffer rather than resizing this one: the old may still be exported (a view kept by a
        # traceback), and a bytearray with exports cannot be resized.
        self.buf = bytearray()
        self.error = None
        return True

    def _keep_unwritten(self, done: int) -> bool:
        """After a failed write: count what landed, drop it from the buffer, cut anything past it."""
        self.written += done
        self.buf = self.buf[done:]
        try:
            os.ftruncate(self.fd, self.written)
        except OSError:
            pass  # the retry's pwrite overwrites those bytes at the same offsets anyway
        log.error("storage: writing %s failed after %d bytes, %d bytes kept for a retry: %s",
                  self.path, done, len(self.buf), self.error)
        return False

    def pread(self, offset: int, n: int) -> bytes:
        """Bytes at ``offset``, from the file or, where not yet written, from the buffer."""
        written = self.written
        if offset + n <= written:
            return os.pread(self.fd, n, offset)
        if offset >= written:
            start = offset - written
            return bytes(self.buf[start:start + n])
        return os.pread(self.fd, written - offset, offset) + bytes(self.buf[:offset + n - written])

    def read_payload(self, offset: int, n: int) -> bytes:
        """The payload of ``n`` bytes at ``offset``, checked against its record header."""
        data = self.pread(offset - HEADER_SIZE, n + HEADER_SIZE)
        if len(data) != n + HEADER_SIZE:
            raise _bad(self.path, offset - HEADER_SIZE, "short read")
        magic, length, crc = HEADER.unpack_from(data, 0)
        if magic != MAGIC or length != n or crc32(memoryview(data)[HEADER_SIZE:]) != crc:
            raise _bad(self.path, offset - HEADER_SIZE, "bad record (magic, length or CRC)")
        return data[HEADER_SIZE:]

    def read_payload_hint(self, offset: int, hint: int) -> bytes:
        """The payload at ``offset`` whose length is only guessed (``hint``): one pread when the guess
        is big enough, two otherwise. Checked like :meth:`read_payload`."""
        data = self.pread(offset - HEADER_SIZE, HEADER_SIZE + hint)
        if len(data) < HEADER_SIZE:
            raise _bad(self.path, offset - HEADER_SIZE, "short read")
        magic, n, crc = HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            raise _bad(self.path, offset - HEADER_SIZE, "bad record (magic)")
        if n > hint:
            data = self.pread(offset - HEADER_SIZE, HEADER_SIZE + n)
        payload = data[HEADER_SIZE:HEADER_SIZE + n]
        if len(payload) != n or crc32(payload) != crc:
            raise _bad(self.path, offset - HEADER_SIZE, "bad record (length or CRC)")
        return payload

    def read_all(self) -> bytes:
        return (os.pread(self.fd, self.written, 0) if self.written else b"") + bytes(self.buf)

    def close(self) -> None:
        """Write out the buffer and close. Raises the write error, keeping the file open and its buffer,
        when the buffer cannot be written (the caller decides: retry later, or give up on a clean stop)."""
        if self.fd >= 0:
            if not self.write_out():
                assert self.error is not None
                raise self.error
            os.close(self.fd)
            self.fd = -1

    def abandon(self) -> None:
        """Release the descriptor without writing the buffer (what a crash does; tests)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.abandon()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes | bytearray, durable: bool = True) -> None:
    """Put ``data`` at ``path`` whole or not at all: written to ``path.tmp`` (every byte, fsynced when
    ``durable``), renamed over ``path``, directory fsynced. On a failed write (a full disk) the partial
    temporary file is removed, so it neither takes the space that ran out nor replaces anything."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    except OSError:
        os.close(fd)
        fd = -1
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def write_file_atomically(path: str, payload: bytes) -> None:
    """Write one framed record to ``path`` durably and atomically (see :func:`replace_file`)."""
    replace_file(path, frame(payload))


def read_framed_file(path: str, outcome: str = "ignored (the store scans its files instead)") -> bytes | None:
    """The payload of a file written by ``write_file_atomically``, or None if missing or invalid (reported,
    with ``outcome``: what the caller does instead)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if _valid_at(data, 0, len(data)) != len(data) - HEADER_SIZE:
        corruption.report(path, 0, "the file fails its check", outcome)
        return None
    return data[HEADER_SIZE:]


def iter_payloads(data: bytes, records: list[tuple[int, int, int]]) -> Iterator[memoryview]:
    view = memoryview(data)
    for _, start, n in records:
        yield view[start:start + n]
