"""A check of SQLite's write-ahead log (``<db>-wal``) before the database is opened, because SQLite's own
recovery is silent about damage in it.

SQLite replays the WAL's frames from the start and stops at the first one that fails its checks (salts
equal to the header's, a non-zero page number, the cumulative checksum), keeping the frames up to the last
commit frame before it. That is right for a write cut short by a crash, which can only be the last frames,
but a flipped bit in an early frame silently drops every transaction committed after it: one round of the
bit-flip lane (issue 31) lost a queue and its binding that way after a kill -9. This module tells the two
apart, from the format SQLite documents (https://www.sqlite.org/fileformat2.html#walformat):

* a 32-byte header, big-endian: magic ``0x377f0682``/``0x377f0683`` (the low bit: the byte order of the
  checksum's words, 1 for big-endian), format version, page size, checkpoint sequence, salt-1, salt-2,
  checksum-1, checksum-2 (over the first 24 bytes);
* frames of a 24-byte header (page number, database size after commit, non-zero only in a commit frame,
  salt-1, salt-2, checksum-1, checksum-2) and one page; each frame's checksum continues the previous one's
  (the header's for the first frame) over the frame header's first 8 bytes and the page.

Because every frame stores its cumulative checksum, a frame can be checked on its own by seeding it with
its predecessor's *stored* checksum: damage to one frame then fails that frame (and, if the damage hit its
checksum fields, the next), while the frames after it still check. :func:`find_damage` returns the offset of
the first frame SQLite would stop at when a *commit* frame with the header's salts checks after it: those
transactions were committed (fsynced, with ``synchronous=FULL``) and SQLite would drop them without a word.
When nothing valid with the header's salts follows, the bad frames are a crash's torn tail (or frames left
over from an older generation of the log, which carry other salts) and SQLite's handling is right.

What it cannot see: damage to the very last commit frame of the log (nothing follows it to tell it from a
torn write), which SQLite drops with the transaction it ends, and damage in a page that was checkpointed
into the main file already (the main file's pages carry no checksum; storage/metadata_store.py checks the
rows instead).
"""

from __future__ import annotations

import struct

MAGICS = (0x377F0682, 0x377F0683)
WAL_HEADER = struct.Struct(">IIIIIIII")
FRAME_HEADER = struct.Struct(">IIIIII")
HEADER_SIZE = 32
FRAME_HEADER_SIZE = 24
_MASK = 0xFFFFFFFF


def checksum(data: bytes | memoryview, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing from ``(s0, s1)``."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    it = iter(words)
    for x0, x1 in zip(it, it, strict=True):
        s0 = (s0 + x0 + s1) & _MASK
        s1 = (s1 + x1 + s0) & _MASK
    return s0, s1


def find_damage(data: bytes) -> int | None:
    """The byte offset of damage in a WAL file's bytes that SQLite would silently drop committed frames
    after (the header's offset, 0, or the first frame that fails), or None when the log is whole or ends in
    a torn tail only."""
    if len(data) < HEADER_SIZE:
        return None
    magic, version, page_size, _seq, salt1, salt2, c1, c2 = WAL_HEADER.unpack_from(data, 0)
    # Orders to try: the magic's, or both when the magic itself is damaged.
    orders = [bool(magic & 1)] if magic in MAGICS else [True, False]
    for big in orders:
        header_ok = magic in MAGICS and checksum(data[:24], 0, 0, big) == (c1, c2)
        sizes = [page_size] if _page_size_ok(page_size) else [1 << k for k in range(9, 17)]
        for size in sizes:
            found = _scan_frames(data, size, salt1, salt2, (c1, c2), big, header_ok)
            if found is not None:
                return found
        if not header_ok:
            # The header's salts may be the damaged field: the first frame's are the log's too.
            for size in sizes:
                if len(data) >= HEADER_SIZE + FRAME_HEADER_SIZE:
                    fs1, fs2 = FRAME_HEADER.unpack_from(data, HEADER_SIZE)[2:4]
                    found = _scan_frames(data, size, fs1, fs2, (c1, c2), big, False)
                    if found is not None:
                        return found
    del version
    return None


def _page_size_ok(n: int) -> bool:
    return 512 <= n <= 65536 and n & (n - 1) == 0


def _scan_frames(data: bytes, page_size: int, salt1: int, salt2: int, seed: tuple[int, int], big: bool,
                 header_ok: bool) -> int | None:
    """Walk the frames; return where SQLite stops if a valid commit frame with these salts follows."""
    frame = FRAME_HEADER_SIZE + page_size
    view = memoryview(data)
    first_bad: int | None = None if header_ok else 0
    prev = seed
    pos = HEADER_SIZE
    while pos + frame <= len(data):
        pgno, commit, s1, s2, c1, c2 = FRAME_HEADER.unpack_from(data, pos)
        ok = (s1, s2) == (salt1, salt2) and pgno != 0
        if ok:
            got = checksum(view[pos:pos + 8], prev[0], prev[1], big)
            got = checksum(view[pos + FRAME_HEADER_SIZE:pos + frame], got[0], got[1], big)
            ok = got == (c1, c2)
        if not ok and first_bad is None:
            first_bad = pos
        elif ok and commit and first_bad is not None:
            return first_bad
        prev = (c1, c2)  # the stored checksum seeds the next frame: one bad frame does not hide the rest
        pos += frame
    return None
