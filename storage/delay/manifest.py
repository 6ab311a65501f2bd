"""The delay store's checkpoint: one framed JSON object, replaced atomically (storage.segment.replace_file).

It says how far the buckets are trustworthy, so recovery is bounded by the checkpoint interval and not by
the number pending::

    {"wal": n,                    first WAL segment not yet applied (replay starts there)
     "next_seq": s,               seqs below it were handed out
     "bucket_ms": b,              the bucket length the buckets were made with (kept over configuration)
     "dead": [xref, ...],         dropped exchanges whose entries are still on disk
     "buckets": {start: [data_len, idx_len, disp_len, {xref: [count, bytes, resolved, resolved_bytes]}]}}
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
            "buckets": {str(s): [b.data_len, b.idx_len, b.disp_len, {str(x): c.to_list() for x, c in b.counts.items()}]
                        for s, b in self.buckets.items()},
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        o = json.loads(data)
        buckets = {int(s): BucketState(v[0], v[1], v[2], {int(x): XrefCount(*c) for x, c in v[3].items()})
                   for s, v in o["buckets"].items()}
        return cls(o["wal"], o["next_seq"], o["bucket_ms"], set(o["dead"]), buckets)

    def save(self, path: str) -> None:
        write_file_atomically(path, self.encode())

    @classmethod
    def load(cls, path: str) -> Manifest | None:
        data = read_framed_file(path)
        return None if data is None else cls.decode(data)
