"""The message store: reference counts, file deletion and compaction, durability, and recovery after
clean and dirty stops, torn tails and corruption in the middle of a file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from storage.backing_queue import new_msg_id
from storage.msg_store import MsgStore
from storage.segment import HEADER_SIZE, frame, scan
from storage.syncer import Syncer


def body(i: int, size: int = 1000) -> bytes:
    return (b"body-%d-" % i).ljust(size, b"x")


def open_store(path: Path, **kw) -> tuple[MsgStore, Syncer]:
    syncer = Syncer()
    return MsgStore(str(path), syncer=syncer, **kw), syncer


def test_write_read_and_refcounts(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path / "s")
    a, b = new_msg_id(), new_msg_id()
    assert a != b
    assert not store.incref(a)
    store.write(a, body(1))
    for _ in range(9):  # routed to ten queues: stored once
        assert store.incref(a)
    size_after = store.disk_bytes()
    assert store.refcount(a) == 10 and len(store) == 1
    assert size_after == len(body(1)) + 16 + HEADER_SIZE
    store.write(b, body(2))
    assert store.read(a) == body(1) and store.read(b) == body(2)
    for _ in range(9):
        store.remove(a)
    assert store.read(a) == body(1) and store.refcount(a) == 1
    store.remove(a)
    assert store.read(a) is None and not store.contains(a) and store.refcount(a) == 0
    store.remove(a)  # unknown: ignored


def test_is_durable_after_the_groups_fsync(tmp_path: Path) -> None:
    store, syncer = open_store(tmp_path / "s")
    m = new_msg_id()
    store.write(m, body(1))
    assert not store.is_durable(m)
    syncer.flush()
    assert store.is_durable(m)
    transient = MsgStore(str(tmp_path / "t"), durable=False)
    transient.write(m, body(1))
    assert transient.read(m) == body(1) and not transient.is_durable(m)


def test_dead_files_are_deleted_and_sparse_ones_compacted(tmp_path: Path) -> None:
    store, syncer = open_store(tmp_path / "s", file_size_limit=64 * 1024)
    ids = [new_msg_id() for _ in range(400)]
    for i, m in enumerate(ids):
        store.write(m, body(i))
    syncer.flush()
    assert len(store.file_numbers()) >= 6
    before = store.disk_bytes()
    # Every message of the first files dies: those files go. Later files keep one message in five.
    for i, m in enumerate(ids):
        if i < 120 or i % 5:
            store.remove(m)
    syncer.flush()
    assert store.deleted_files >= 1 and store.compactions >= 1
    assert store.disk_bytes() < before / 3
    for i, m in enumerate(ids):
        assert store.read(m) == (None if (i < 120 or i % 5) else body(i))
    # All acked: disk falls back to (nearly) nothing.
    for i, m in enumerate(ids):
        if not (i < 120 or i % 5):
            store.remove(m)
    syncer.flush()
    assert store.disk_bytes() < 64 * 1024 + 2000
    assert len(store.file_numbers()) == 1


async def test_compaction_runs_in_a_thread(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    syncer = Syncer(loop)
    store = MsgStore(str(tmp_path / "s"), syncer=syncer, loop=loop, file_size_limit=32 * 1024)
    ids = [new_msg_id() for _ in range(200)]
    for i, m in enumerate(ids):
        store.write(m, body(i))
    syncer.flush()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if syncer.synced >= 1:
            break
    for i, m in enumerate(ids):
        if i % 4:
            store.remove(m)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if store.compactions >= 3:
            break
    assert store.compactions >= 3
    for i, m in enumerate(ids):
        assert store.read(m) == (None if i % 4 else body(i))
    store.close()
    syncer.close()


def test_clean_restart_uses_the_snapshot(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path / "s", file_size_limit=16 * 1024)
    ids = [new_msg_id() for _ in range(50)]
    for i, m in enumerate(ids):
        store.write(m, body(i))
        if i % 3 == 0:
            store.incref(m)
    for m in ids[:10]:
        store.remove(m)
    store.close()
    store2, _ = open_store(tmp_path / "s", file_size_limit=16 * 1024)
    assert store2.was_clean and not store2.recovering
    assert not os.path.exists(tmp_path / "s" / "clean.snapshot")  # a crash from now on is dirty
    for i, m in enumerate(ids):
        expected = 2 if i % 3 == 0 else 1
        if i < 10:
            expected -= 1
        assert store2.refcount(m) == expected
        assert store2.read(m) == (body(i) if expected else None)


def test_dirty_restart_takes_references_from_the_queues(tmp_path: Path) -> None:
    store, syncer = open_store(tmp_path / "s")
    ids = [new_msg_id() for _ in range(20)]
    for i, m in enumerate(ids):
        store.write(m, body(i))
    syncer.sync()  # then "crash": no close
    store2, _ = open_store(tmp_path / "s")
    assert not store2.was_clean and store2.recovering
    for m in ids[:5]:
        assert store2.add_recovered_ref(m)
    assert store2.add_recovered_ref(ids[0])
    assert not store2.add_recovered_ref(new_msg_id())
    store2.finish_recovery()
    assert len(store2) == 5 and store2.refcount(ids[0]) == 2
    assert [store2.read(m) for m in ids[:6]] == [body(i) for i in range(5)] + [None]


def _segment_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.suffix == ".msgs")


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    store, syncer = open_store(tmp_path / "s")
    ids = [new_msg_id() for _ in range(10)]
    for i, m in enumerate(ids):
        store.write(m, body(i))
    syncer.sync()
    seg = _segment_files(tmp_path / "s")[0]
    size = seg.stat().st_size
    os.truncate(seg, size - 300)  # the last record half written
    store2, syncer2 = open_store(tmp_path / "s")
    for m in ids:
        store2.add_recovered_ref(m)
    store2.finish_recovery()
    assert [store2.read(m) for m in ids] == [body(i) for i in range(9)] + [None]
    assert seg.stat().st_size == size - (1000 + 16 + HEADER_SIZE)  # cut back to the last whole record
    m = new_msg_id()
    store2.write(m, b"after")
    syncer2.sync()
    assert store2.read(m) == b"after"


def test_corrupt_record_in_the_middle_is_skipped(tmp_path: Path, caplog) -> None:
    store, syncer = open_store(tmp_path / "s")
    ids = [new_msg_id() for _ in range(10)]
    for i, m in enumerate(ids):
        store.write(m, body(i))
    syncer.sync()
    seg = _segment_files(tmp_path / "s")[0]
    data = bytearray(seg.read_bytes())
    rec = 1000 + 16 + HEADER_SIZE
    data[4 * rec + 500] ^= 0xFF  # a flipped bit in message 4's body
    data[6 * rec + 5] ^= 0xFF  # and message 6's length field
    seg.write_bytes(bytes(data))
    store2, _ = open_store(tmp_path / "s")
    for m in ids:
        store2.add_recovered_ref(m)
    store2.finish_recovery()
    assert [store2.read(m) is not None for m in ids] == [i not in (4, 6) for i in range(10)]
    assert "corrupt" in caplog.text


def test_corruption_after_recovery_is_reported_not_raised(tmp_path: Path) -> None:
    store, syncer = open_store(tmp_path / "s")
    m = new_msg_id()
    store.write(m, body(1))
    syncer.sync()
    seg = _segment_files(tmp_path / "s")[0]
    with open(seg, "r+b") as f:
        f.seek(100)
        f.write(b"\0\0\0")
    assert store.read(m) is None


def test_scan_finds_records_after_garbage() -> None:
    data = frame(b"one") + b"garbage\x00\x01" + frame(b"two") + frame(b"three")[:-1]
    records, good_end, skipped = scan(data)
    assert [bytes(data[s:s + n]) for _, s, n in records] == [b"one", b"two"]
    assert skipped == 9 and good_end == len(frame(b"one")) + 9 + len(frame(b"two"))
