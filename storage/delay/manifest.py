"""The delay store's checkpoint: one framed JSON object, replaced atomically (storage.segment.replace_file).

It says how far the buckets are trustworthy, so recovery is bounded by the checkpoint interval and not by
the number pending::

    {"wal": n,                    first WAL segment not yet applied (replay starts there)
     "next_seq": s,               seqs below it were handed out
     "bucket_ms": b,              the bucket length the buckets were made with (kept over configuration)
     "dead": [xref, ...],         dropped exchanges whose entries are still on disk
     "buckets": {start: [data_len, idx_len, disp_len, {xref: [count, bytes, resolved, resolved_bytes]}, idx_crc]}}

``idx_crc`` is the CRC-32 of the bucket's ``.idx`` up to ``idx_len``: index entries carry no checksum of their
own (they are read as an array), so recovery checks each bucket's index against it and, when it fails, rebuilds
the index from ``.data``, whose framed records hold everything an entry says (storage/delay/bucket.py,
``Bucket.verify_index``). A checkpoint written before it existed has four items per bucket: the bucket's index
is then taken as it is, and the next checkpoint records its CRC (a data directory of the previous format starts
as before and is migrated by its first checkpoint).

It is the one file the store cannot rebuild from the others (the buckets' checkpointed lengths and the dead
exchanges are nowhere else), so it is written twice: ``checkpoint`` then ``checkpoint.mirror``, each whole or
not at all. A ``checkpoint`` that fails its CRC (a flipped bit: reported, storage/corruption.py) is read from
the mirror instead; before, every pending delayed message was lost with it. The mirror is at worst one
checkpoint older (a crash between the two writes), which recovery handles as after any crash: the WAL
segments after it are deleted only once both copies are written, so cutting the buckets back to its lengths
and replaying from its WAL position loses nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from storage.delay.bucket import XrefCount
from storage.segment import read_framed_file, write_file_atomically


@dataclass(slots=True)
class BucketState:
    data_len: int
    idx_len: int
    disp_len: int
    counts: dict[int, XrefCount]
    idx_crc: int | None = None  # None: a checkpoint of the previous format (not recorded)


@dataclass(slots=True)
class Manifest:
    wal: int = 0
    next_seq: int = 1
    bucket_ms: int = 0
    dead: set[int] = field(default_factory=set)
    buckets: dict[int, BucketState] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({
            "wal": self.wal, "next_seq": self.next_seq, "bucket_ms": self.bucket_ms, "dead": sorted(self.dead),
            "buckets": {str(s): [b.data_len, b.idx_len, b.disp_len, {str(x): c.to_list() for x, c in b.counts.items()},
                                 b.idx_crc]
                        for s, b in self.buckets.items()},
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        o = json.loads(data)
        buckets = {int(s): BucketState(v[0], v[1], v[2], {int(x): XrefCount(*c) for x, c in v[3].items()},
                                       v[4] if len(v) > 4 else None)
                   for s, v in o["buckets"].items()}
        return cls(o["wal"], o["next_seq"], o["bucket_ms"], set(o["dead"]), buckets)

    def save(self, path: str) -> None:
        data = self.encode()
        write_file_atomically(path, data)
        write_file_atomically(path + MIRROR, data)

    @classmethod
    def load(cls, path: str) -> Manifest | None:
        """The checkpoint, from its mirror when the file fails its check; None when neither exists."""
        data = read_framed_file(path, "read from its mirror copy")
        # The mirror is checked even when the checkpoint is good, so that its damage is reported now rather
        # than found on the day it is needed (the next checkpoint rewrites it).
        mirror = read_framed_file(path + MIRROR, "the store starts from its WAL alone" if data is None
                                  else "not needed (the checkpoint is good); rewritten at the next checkpoint")
        data = data if data is not None else mirror
        return None if data is None else cls.decode(data)


MIRROR = ".mirror"
