"""A delay bucket's index is checked against the CRC its checkpoint records (storage/delay/bucket.py,
``Bucket.verify_index``): before, index entries had no check at all, and a flipped bit in one was blamed on
``.data`` (a bad offset or length) or never found (a due time moved later). Now the damage is reported against
``.idx``, at the entry, and the index is rebuilt from ``.data``: every record is still dispatched, on time. A data
directory whose checkpoint was written before the CRC existed (four items per bucket) starts as before and is
migrated by its first checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from delay_harness import Clock, Node

from storage import corruption
from storage.delay.manifest import MIRROR
from storage.segment import read_framed_file, write_file_atomically

T0 = 1_700_000_000_000


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


def _filled(tmp_path: Path, clock: Clock) -> Node:
    node = Node(tmp_path / "delay", clock)
    for i in range(20):
        node.put(T0 + 1000 + i, b"body-%d" % i)
    node.sync()
    node.store.checkpoint()
    node.restart()  # a clean stop: every bucket checkpointed
    node.store.close()
    return node


def _idx(node: Node) -> Path:
    [name] = [n for n in os.listdir(node.path / "buckets") if n.endswith(".idx")]
    return node.path / "buckets" / name


@pytest.mark.parametrize("field,at", [("due time", 0 + 3), ("data offset", 16 + 1), ("data length", 24 + 0)])
def test_a_flipped_bit_in_an_index_entry_is_reported_there_and_nothing_is_lost(tmp_path: Path, clock: Clock,
                                                                                field: str, at: int) -> None:
    node = _filled(tmp_path, clock)
    idx = _idx(node)
    entry = 7 * 32
    with open(idx, "r+b") as f:
        f.seek(entry + at)
        b = f.read(1)[0]
        f.seek(entry + at)
        f.write(bytes([b ^ 0x08]))
    seen = set(corruption._seen)
    node.start()
    new = corruption._seen - seen
    assert new == {(str(idx), entry)}, f"{field}: {new}"
    clock.t = T0 + 2000
    got = node.drain()
    assert sorted(d.record.body for d in got) == sorted(b"body-%d" % i for i in range(20)), field
    node.store.close()


def test_a_checkpoint_of_the_previous_format_starts_and_is_migrated(tmp_path: Path, clock: Clock) -> None:
    node = _filled(tmp_path, clock)
    cp = str(node.path / "checkpoint")
    o = json.loads(read_framed_file(cp) or b"")
    for v in o["buckets"].values():
        assert len(v) == 5
        del v[4]  # the format before the index CRC: [data_len, idx_len, disp_len, counts]
    old = json.dumps(o, separators=(",", ":")).encode()
    write_file_atomically(cp, old)
    write_file_atomically(cp + MIRROR, old)
    node.start()
    clock.t = T0 + 1010
    assert len(node.drain()) == 10 + 1
    node.store.checkpoint()
    o = json.loads(read_framed_file(cp) or b"")
    assert all(isinstance(v[4], int) for v in o["buckets"].values()), "the first checkpoint records the CRC"
    node.restart()
    clock.t = T0 + 2000
    assert len(node.drain()) == 9
    node.store.close()

