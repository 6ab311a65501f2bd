"""Byte layouts of the delay store, little-endian, each ``struct`` asserting its size.

A *record* (the payload of one framed WAL record and of one framed ``.data`` record; framing as in
:mod:`storage.segment`: magic, length, CRC32)::

    offset 0   u64  seq        node-monotonic; (due_ms, seq) orders dispatch and is a pending record's id
    offset 8   i64  due_ms     absolute, ms since the epoch (UTC)
    offset 16  i64  delay_ms   the delay asked for (the broker echoes it in the delivered message)
    offset 24  u32  xref       exchange reference, assigned by the broker and never reused
    offset 28  u16  flags      opaque to the store (e.g. persistent)
    offset 30  u16  rk_len     routing key length
    offset 32  u32  props_len  raw content-header properties length
    offset 36  rk_len bytes routing key, props_len bytes properties, then the body (the rest)

An *index entry* (``.idx``; fixed size and unframed, so a file is read as an array; no CRC of its own: after a
crash the file is cut to its checkpointed length and rebuilt from the WAL, and the checkpoint records the CRC of
each bucket's whole index, checked at recovery, which rebuilds a damaged index from ``.data``:
storage/delay/manifest.py, ``Bucket.verify_index``)::

    i64 due_ms | u64 seq | u64 data offset (of the payload) | u32 data length | u32 xref      (32 bytes)

A *dispatch-log record* (``.disp``, framed): ``u8 kind`` (1 dispatched, 2 cancelled, 3 begun: about to be
enqueued, so in doubt after a crash until a dispatched or cancelled record follows) followed by entries
``i64 due_ms | u64 seq | u32 xref | u32 data length`` (24 bytes each); the due time is kept so that a
window load reads only the entries of its time range, and xref and length so that the counters can be
brought up to date at recovery without reading the index.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from storage.checksum import crc32
from storage.segment import HEADER, MAGIC

RECORD_HEAD = struct.Struct("<QqqIHHI")
assert RECORD_HEAD.size == 36
IDX = struct.Struct("<qQQII")
IDX_SIZE = IDX.size
assert IDX_SIZE == 32
DISP = struct.Struct("<qQII")
DISP_SIZE = DISP.size
assert DISP_SIZE == 24
DISPATCHED = 1
CANCELLED = 2
BEGUN = 3
RESOLVING = (DISPATCHED, CANCELLED)  # the kinds that settle an entry for good
MAX_SEQ = (1 << 64) - 1


@dataclass(slots=True, frozen=True)
class DelayRecord:
    """One delayed message as the store keeps it. ``seq`` is 0 until :meth:`DelayStore.append` assigns it."""

    due_ms: int
    xref: int
    routing_key: bytes
    properties: bytes
    body: bytes
    delay_ms: int = 0
    flags: int = 0
    seq: int = 0

    def encode(self, seq: int | None = None) -> bytes:
        """The record's bytes, with ``seq`` in place of its own when given (the store assigns seqs)."""
        return b"".join((RECORD_HEAD.pack(self.seq if seq is None else seq, self.due_ms, self.delay_ms, self.xref, self.flags,
                                          len(self.routing_key), len(self.properties)),
                         self.routing_key, self.properties, self.body))

    def frame(self, seq: int) -> bytes:
        """``encode(seq)`` framed as :mod:`storage.segment` frames a record (magic, length, CRC32, payload):
        what the store appends, as it is, both to the WAL and to the bucket's ``.data`` (one CRC, not two)."""
        payload = b"".join((RECORD_HEAD.pack(seq, self.due_ms, self.delay_ms, self.xref, self.flags,
                                             len(self.routing_key), len(self.properties)),
                            self.routing_key, self.properties, self.body))
        return HEADER.pack(MAGIC, len(payload), crc32(payload)) + payload

    @classmethod
    def decode(cls, data: bytes | memoryview) -> DelayRecord:
        seq, due, delay, xref, flags, rk_len, props_len = RECORD_HEAD.unpack_from(data, 0)
        a = RECORD_HEAD.size
        b = a + rk_len
        c = b + props_len
        return cls(due, xref, bytes(data[a:b]), bytes(data[b:c]), bytes(data[c:]), delay, flags, seq)


_SETTERS: tuple[Callable[[DelayRecord, Any], None], ...] = tuple(
    DelayRecord.__dict__[field.name].__set__ for field in fields(DelayRecord))


def _fast_init(self: DelayRecord, due_ms: int, xref: int, routing_key: bytes, properties: bytes, body: bytes,
               delay_ms: int = 0, flags: int = 0, seq: int = 0,
               _set: tuple[Callable[[DelayRecord, Any], None], ...] = _SETTERS) -> None:
    """The frozen dataclass's ``__init__``, without its ``object.__setattr__`` lookup per field (a record is
    made per delayed publish: this took 2.5 us of it, now 1.5): the slots' descriptors set directly."""
    _set[0](self, due_ms)
    _set[1](self, xref)
    _set[2](self, routing_key)
    _set[3](self, properties)
    _set[4](self, body)
    _set[5](self, delay_ms)
    _set[6](self, flags)
    _set[7](self, seq)


assert [f.name for f in fields(DelayRecord)] == ["due_ms", "xref", "routing_key", "properties", "body", "delay_ms",
                                                 "flags", "seq"]
_fast_init.__name__ = "__init__"
_fast_init.__qualname__ = "DelayRecord.__init__"
setattr(DelayRecord, "__init__", _fast_init)  # noqa: B010 - mypy keeps the dataclass's signature


@dataclass(slots=True, frozen=True)
class DueRecord:
    """A record handed out by :meth:`DelayStore.due`; give it back through ``dispatched`` or ``release``."""

    record: DelayRecord
    bucket: int  # the bucket's start (ms): where its dispatch is logged
    size: int  # stored payload length (the byte counters count this)


@dataclass(slots=True, frozen=True)
class PendingEntry:
    """One pending record as listed (no body read): enough for an operator's page and for ``cancel``."""

    due_ms: int
    seq: int
    xref: int
    size: int


def pack_disp(kind: int, entries: list[tuple[int, int, int, int]]) -> bytes:
    """A dispatch-log payload from ``(due_ms, seq, xref, size)`` tuples."""
    return bytes([kind]) + b"".join(DISP.pack(*e) for e in entries)


def unpack_disp(payload: bytes | memoryview) -> tuple[int, list[tuple[int, int, int, int]]]:
    return payload[0], list(DISP.iter_unpack(payload[1:]))
