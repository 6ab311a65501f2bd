"""The variable queue beyond the shared contracts: paging in bounded memory, recovery after clean and
dirty stops, disk use after acks, confirms released by the fsync thread onto the event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from storage.node_storage import NodeStorage, queue_dir_name


def msg(i: int, size: int = 100) -> bytes:
    return (b"%d:" % i).ljust(size, b"-")


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            if not f.endswith((".sqlite", ".sqlite-wal", ".sqlite-shm")):
                total += os.path.getsize(os.path.join(root, f))
    return total


def test_paging_50k_messages_with_a_small_budget(harness) -> None:
    h = harness(durable=False)
    vq = h.vq
    vq.set_ram_budget(64 * 1024)
    n = 50_000
    for i in range(n):
        vq.publish(msg(i), 100, False)
        if i % 1000 == 0:
            assert vq.ram_bytes() < 2 << 20
    parts = vq.parts()
    assert len(parts["delta"]) > 0.8 * n
    assert len(parts["q1"]) + len(parts["q4"]) <= 200
    assert vq.ram_bytes() < 2 << 20
    vq.check_invariants()
    got = []
    while True:
        f = vq.fetch(False)
        if f is None:
            break
        got.append(f[1])
        if len(got) % 5000 == 0:
            vq.check_invariants()
    assert got == [msg(i) for i in range(n)]
    assert vq.parts() == {"q4": [], "q3": [], "delta": [], "q2": [], "q1": []}


def test_big_persistent_messages_page_too_and_disk_falls_back_after_acks(harness) -> None:
    h = harness(durable=True, file_size_limit=1 << 20)
    vq = h.vq
    vq.beta_floor = 64
    vq.set_ram_budget(200_000)
    n = 3000
    for i in range(n):
        size = 6000 if i % 2 else 300  # half in the store, half embedded in the index
        vq.publish(msg(i, size), size, True)
    h.settle()
    assert len(vq.parts()["delta"]) > n // 2
    full = dir_bytes(h.root)
    assert full > n * 3000
    got = []
    for _ in range(n):
        seq, m, _ = vq.fetch(True)
        got.append(m)
        vq.ack([seq])
    h.settle()
    assert got == [msg(i, 6000 if i % 2 else 300) for i in range(n)]
    # Acked: index segments deleted, store files deleted or compacted.
    assert dir_bytes(h.root) < 2 << 20
    assert dir_bytes(h.root) < full / 5
    assert len(h.ns.persistent) == 0


def test_clean_restart_keeps_order_and_delivered_flags(harness) -> None:
    h = harness(durable=True)
    vq = h.vq
    for i in range(10):
        vq.publish(msg(i, 5000 if i == 3 else 100), 5000 if i == 3 else 100, True)
    vq.publish(b"transient", 9, False)
    f0 = vq.fetch(True)
    f1 = vq.fetch(True)
    vq.ack([f1[0]])
    vq.fetch(False)  # message 2 gone for good
    vq = h.restart(clean=True)
    assert vq.recovered_clean is True
    assert vq.len() == 8 and vq.pending_ack_count() == 0
    got = [vq.fetch(False) for _ in range(8)]
    assert [m for _, m, _ in got] == [msg(0)] + [msg(i, 5000 if i == 3 else 100) for i in range(3, 10)]
    assert [d for _, _, d in got] == [True] + [False] * 7  # only the unacked one was delivered
    assert got[0][0] == f0[0]
    assert vq.fetch(False) is None  # the transient message is gone


def test_a_queue_has_a_directory_only_once_it_writes_a_file(harness) -> None:
    """A declare makes no directory (a definitions import declares thousands of queues, and each mkdir waits on
    the file system's journal); the first index entry does. A queue that never wrote one restarts empty and
    clean, clean or not; one that did recovers its messages."""
    h = harness(durable=True)
    qdir = Path(h.root) / "queues" / queue_dir_name("/", "q")
    assert not qdir.exists()
    vq = h.restart(clean=True)
    assert not qdir.exists() and vq.recovered_clean is True and vq.len() == 0
    vq = h.restart(clean=False)
    assert not qdir.exists() and vq.recovered_clean is True and vq.len() == 0
    vq.publish(msg(1), 100, True)
    h.settle()
    assert sorted(p.suffix for p in qdir.iterdir()) == [".idx"]
    vq = h.restart(clean=False)
    assert vq.recovered_clean is False and vq.len() == 1
    assert vq.fetch(False)[1] == msg(1)


def test_dirty_restart_marks_everything_delivered(harness) -> None:
    h = harness(durable=True)
    vq = h.vq
    for i in range(20):
        vq.publish(msg(i, 100 if i % 2 else 5000), 100 if i % 2 else 5000, True)
    vq.publish(b"transient", 9, False)
    f = vq.fetch(True)
    vq.ack([vq.fetch(True)[0]])
    vq = h.restart(clean=False)
    assert vq.recovered_clean is False
    assert vq.len() == 19
    got = [vq.fetch(True) for _ in range(19)]
    assert got[0][0] == f[0]
    assert [m for _, m, _ in got] == [msg(0, 5000)] + [msg(i, 100 if i % 2 else 5000) for i in range(2, 20)]
    assert all(d for _, _, d in got)
    assert vq.fetch(True) is None
    # The unacked ones survive another dirty restart, still delivered and in order.
    vq = h.restart(clean=False)
    assert [m for _, m, _ in (vq.fetch(False) for _ in range(19))] == [m for _, m, _ in got]


def test_restart_with_paged_out_transient_and_persistent_messages(harness) -> None:
    h = harness(durable=True)
    vq = h.vq
    vq.beta_floor = 1
    vq.set_ram_target(0)
    for i in range(300):
        vq.publish(msg(i), 100, i % 3 == 0)
    assert len(vq.parts()["delta"]) > 200
    vq = h.restart(clean=True)
    got = [m for _, m, _ in iter(lambda: vq.fetch(False), None)]
    assert got == [msg(i) for i in range(0, 300, 3)]
    # ... and new messages after the restart keep their order behind old ones.
    for i in range(300, 310):
        vq.publish(msg(i), 100, True)
    vq = h.restart(clean=False)
    assert [m for _, m, _ in iter(lambda: vq.fetch(False), None)] == [msg(i) for i in range(300, 310)]


def test_non_durable_queue_is_empty_after_restart(harness) -> None:
    h = harness(durable=False)
    for i in range(10):
        h.vq.publish(msg(i), 100, True)
    assert h.restart(clean=True).len() == 0


def test_deleted_queue_leaves_no_files_and_no_store_references(harness) -> None:
    h = harness(durable=True)
    vq = h.vq
    for i in range(50):
        vq.publish(msg(i, 5000), 5000, True)
    vq.fetch(True)
    assert vq.delete_and_terminate() == 50
    assert len(h.ns.persistent) == 0
    assert not os.path.exists(vq._index.directory)


def test_shared_message_stored_once_across_queues(harness) -> None:
    h = harness(durable=True)
    ns = h.ns
    qs = [ns.open_queue("/", f"fan{i}", True) for i in range(10)]
    from storage.backing_queue import new_msg_id
    mid = new_msg_id()
    for q in qs:
        q.publish(b"z" * 10_000, 10_000, True, msg_id=mid)
    assert len(ns.persistent) == 1 and ns.persistent.refcount(mid) == 10
    for q in qs[:9]:
        q.fetch(False)
    assert ns.persistent.refcount(mid) == 1
    assert qs[9].fetch(False)[1] == b"z" * 10_000
    assert len(ns.persistent) == 0


async def test_confirms_after_fsync_on_the_loop_thread(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    ns = NodeStorage(str(tmp_path / "n"), loop)
    calls: list[str] = []
    ready = asyncio.Event()

    def on_confirm() -> None:
        calls.append(threading.current_thread().name)
        ready.set()

    vq = ns.open_queue("/", "q", True, on_confirm=on_confirm)
    ns.finish_recovery()
    for i in range(100):
        vq.publish(msg(i, 5000 if i % 2 else 50), 5000 if i % 2 else 50, True, confirm=i)
    vq.publish(b"t", 1, False, confirm="transient")
    assert vq.drain_confirmed() == ["transient"]  # no fsync to wait for
    assert not calls
    await asyncio.wait_for(ready.wait(), 5)
    assert calls and all(name == threading.current_thread().name for name in calls)
    assert sorted(vq.drain_confirmed()) == list(range(100))
    assert ns.syncer.fsyncs >= 2 and ns.syncer.rounds <= 3  # one group commit, not one per message
    ns.close()


def test_paged_transient_entries_do_not_pin_index_segments_after_restart(harness) -> None:
    h = harness(durable=True)
    vq = h.vq
    vq.beta_floor = 1
    vq.set_ram_target(0)
    for i in range(200):
        vq.publish(msg(i), 100, i % 2 == 0)  # the odd, transient ones are paged into the index too
    vq = h.restart(clean=True)
    got = [m for _, m, _ in iter(lambda: vq.fetch(False), None)]
    assert got == [msg(i) for i in range(0, 200, 2)]
    h.settle()
    assert vq._index.segment_numbers() == []


def test_orphan_queue_releases_its_store_references_after_a_clean_start(harness) -> None:
    h = harness(durable=True)
    gone = h.ns.open_queue("/", "gone", True)
    for i in range(20):
        gone.publish(msg(i, 5000), 5000, True)
    h.vq.publish(msg(99, 5000), 5000, True)
    del gone
    h.ns.close()
    ns = NodeStorage(h.root)
    assert ns.was_clean and len(ns.persistent) == 21
    vq = ns.open_queue("/", "q", True)  # "gone" was deleted from the definitions meanwhile
    ns.finish_recovery()
    assert len(ns.persistent) == 1 and vq.len() == 1
    assert sorted(os.listdir(os.path.join(h.root, "queues"))) == [os.path.basename(vq._index.directory)]
    ns.close()
