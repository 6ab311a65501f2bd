"""The delay store's checkpoint with its writes off the loop (storage/delay/store.py, storage/background.py): while
the write is held, the store goes on taking appends, handing out, marking and reading records (those the
checkpoint took included); a write that fails goes back for the next checkpoint; a bucket drained at the
snapshot is deleted only if nothing touched it since; and a crash at any of these points recovers every record
once, nothing dispatched twice.

``Held`` is the seam's test implementation: a submitted job runs (on a thread, as WorkerThread runs it) only when
the test says, so each interleaving is made on purpose instead of hoped for."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from delay_harness import Clock, Node

from storage.delay import bucket as bucket_module
from storage.delay import store as store_module
from storage.delay.record import DueRecord

HOUR = 3_600_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR  # an hour's start: buckets line up with the test's hours


class Held:
    """Jobs wait for :meth:`run`; ``wait`` (the store's synchronous checkpoint, a close) runs them first."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], None], Callable[[], None]]] = []

    def submit(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        self.jobs.append((job, then))

    def run(self) -> None:
        """The job on a thread of its own, then its ``then`` (here: the test's thread plays the loop)."""
        job, then = self.jobs.pop(0)
        t = threading.Thread(target=job)
        t.start()
        t.join()
        then()

    def finish_job_only(self) -> None:
        """The job ends and its ``then`` never comes (the process dies before the loop applies it)."""
        job, _ = self.jobs.pop(0)
        job()

    def wait(self) -> None:
        while self.jobs:
            self.finish_job_only()

    def close(self) -> None:
        self.wait()


def bodies(batch: list[DueRecord]) -> list[bytes]:
    return sorted(d.record.body for d in batch)


@pytest.fixture
def held() -> Held:
    return Held()


@pytest.fixture
def node(tmp_path: Path, held: Held) -> Node:
    return Node(tmp_path / "delay", Clock(T0), background=held)


def test_appends_reads_and_dispatch_go_on_while_the_write_is_held(node: Node, held: Held) -> None:
    for h in range(3):
        for i in range(20):
            node.put(T0 + h * HOUR + i, b"a%d/%d" % (h, i))
    node.sync()
    done: list[BaseException | None] = []
    node.store.checkpoint_soon(done.append)
    assert len(held.jobs) == 1 and done == []
    assert not any(n.endswith(".data") for n in os.listdir(node.path / "buckets"))  # nothing written yet
    for h in range(3):  # after the snapshot: into new buffers behind the ones the checkpoint took
        for i in range(20, 30):
            node.put(T0 + h * HOUR + i, b"a%d/%d" % (h, i))
    node.sync()
    node.clock.t = T0 + 25
    first = node.drain()  # read from the held write (0-19) and from the new buffer (20-25)
    assert bodies(first) == sorted(b"a0/%d" % i for i in range(26))
    pending = node.store.list_records(1, limit=1000)
    assert sorted(r.body for r in pending) == sorted([b"a0/%d" % i for i in range(26, 30)]
                                                   + [b"a%d/%d" % (h, i) for h in (1, 2) for i in range(30)])
    held.run()
    assert done == [None]
    node.clock.t = T0 + HOUR + 29
    assert bodies(node.drain()) == sorted([b"a0/%d" % i for i in range(26, 30)] + [b"a1/%d" % i for i in range(30)])
    node.sync()
    node.crash()  # the manifest of the held checkpoint, the WAL after it: every record once
    node.clock.t = T0 + 3 * HOUR
    assert bodies(node.drain()) == sorted(b"a2/%d" % i for i in range(30))
    node.sync()
    node.crash()
    assert node.drain() == []


def test_a_crash_while_the_write_is_held_or_just_after_it_loses_nothing(tmp_path: Path) -> None:
    for when in ("held", "written, not applied"):
        held = Held()
        node = Node(tmp_path / when.replace(" ", "-"), Clock(T0), background=held)
        want = set()
        for i in range(200):
            want.add(b"b%d" % i)
            node.put(T0 + (i % 5) * HOUR + i, b"b%d" % i)
        node.sync()
        node.store.checkpoint_soon()
        for i in range(200, 260):
            want.add(b"b%d" % i)
            node.put(T0 + (i % 5) * HOUR + i, b"b%d" % i)
        node.sync()
        if when == "held":
            held.jobs.clear()  # the process dies with the write not begun
        else:
            held.finish_job_only()  # files and manifest written, the loop never applied it
        node.crash()
        node.clock.t = T0 + 6 * HOUR
        got = node.drain()
        assert bodies(got) == sorted(want) and len(got) == len(want), when


def test_a_failed_write_goes_back_and_the_next_checkpoint_writes_it(node: Node, held: Held,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(30):
        node.put(T0 + (i % 3) * HOUR + i, b"c%d" % i)
    node.sync()
    real = bucket_module.BucketWrite.write
    calls = []

    def full_disk(self: bucket_module.BucketWrite, fsync: bool) -> bool:
        calls.append(self.start)
        if len(calls) == 2:  # the first bucket landed, the second did not
            raise OSError(28, "No space left on device")
        return real(self, fsync)

    monkeypatch.setattr(bucket_module.BucketWrite, "write", full_disk)
    done: list[BaseException | None] = []
    node.store.checkpoint_soon(done.append)
    for i in range(30, 40):
        node.put(T0 + (i % 3) * HOUR + i, b"c%d" % i)
    node.sync()
    held.run()
    assert len(done) == 1 and isinstance(done[0], OSError)
    node.clock.t = T0 + 12  # every record readable all along: put back in front of the new buffers
    assert bodies(node.drain()) == sorted(b"c%d" % i for i in range(0, 40, 3) if i <= 12)
    monkeypatch.setattr(bucket_module.BucketWrite, "write", real)
    node.store.checkpoint_soon(done.append)
    held.run()
    assert done[1] is None
    node.sync()
    node.crash()
    node.clock.t = T0 + 3 * HOUR
    assert bodies(node.drain()) == sorted(b"c%d" % i for i in range(40) if not (i % 3 == 0 and i <= 12))


def test_a_drained_bucket_goes_at_the_end_unless_touched_meanwhile(node: Node, held: Held) -> None:
    for i in range(10):
        node.put(T0 + i, b"d%d" % i)
        node.put(T0 + 2 * HOUR + i, b"e%d" % i)
    node.sync()
    node.clock.t = T0 + 100
    assert len(node.drain()) == 10  # hour 0 drained
    node.sync()
    node.store.checkpoint_soon()
    held.run()
    assert sorted(n for n in os.listdir(node.path / "buckets") if n.endswith(".data")) == [f"{T0 + 2 * HOUR:020d}.data"]
    # Drained again, then touched between the snapshot and its end: a record due in its hour, dispatched.
    for i in range(10, 13):
        node.put(T0 + HOUR + i, b"f%d" % i)
    node.sync()
    node.clock.t = T0 + HOUR + 100
    assert len(node.drain()) == 3
    node.sync()
    node.store.checkpoint_soon()  # hour 1 is drained at this snapshot
    node.put(T0 + HOUR + 200, b"late")  # ... and touched before the write ends: a record, dispatched at once
    node.sync()
    node.clock.t = T0 + HOUR + 300
    assert bodies(node.drain()) == [b"late"]
    node.sync()
    held.run()  # drained again, but its dispatch log is the only proof that "late" went: kept
    assert f"{T0 + HOUR:020d}.disp" in os.listdir(node.path / "buckets")
    node.crash()  # before another checkpoint: the manifest left hour 1 out; the WAL rebuilds it with "late"
    assert node.drain() == []  # ... which its dispatch log says went
    assert node.store.pending_count() == 10  # hour 2's e records, the old resolutions not counted against it
    node.clock.t = T0 + 3 * HOUR
    assert bodies(node.drain()) == sorted(b"e%d" % i for i in range(10))


def test_a_checkpoint_asked_for_while_one_runs_starts_when_it_ends(node: Node, held: Held) -> None:
    node.put(T0 + 5, b"g0")
    node.sync()
    done: list[tuple[str, BaseException | None]] = []
    node.store.checkpoint_soon(lambda e: done.append(("first", e)))
    node.put(T0 + HOUR, b"g1")
    node.sync()
    node.store.checkpoint_soon(lambda e: done.append(("second", e)))
    assert len(held.jobs) == 1
    held.run()
    assert done == [("first", None)] and len(held.jobs) == 1  # the second started at the first's end
    held.run()
    assert done == [("first", None), ("second", None)]
    node.crash()  # both on disk: the WAL holds nothing the buckets do not
    node.clock.t = T0 + HOUR
    assert bodies(node.drain()) == [b"g0", b"g1"]


def test_the_synchronous_checkpoint_waits_for_the_running_one_and_answers_those_queued(node: Node,
                                                                                        held: Held) -> None:
    node.put(T0 + 5, b"h0")
    node.sync()
    done: list[str] = []
    node.store.checkpoint_soon(lambda e: done.append(f"first {e}"))
    node.put(T0 + HOUR, b"h1")
    node.store.checkpoint_soon(lambda e: done.append(f"queued {e}"))
    node.sync()
    node.store.drop_exchange(2)  # a synchronous checkpoint: the running one is finished and applied first
    assert done == ["first None", "queued None"] and held.jobs == []
    node.restart()
    node.clock.t = T0 + HOUR
    assert bodies(node.drain()) == [b"h0", b"h1"]


def test_a_snapshot_that_fails_takes_nothing(node: Node, held: Held, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of descriptors for the dispatch log's copy: nothing is taken (the buffers stay where they were), the
    caller is told, and the next checkpoint writes everything."""
    for i in range(6):
        node.put(T0 + (i % 2) * HOUR + i, b"i%d" % i)
    node.sync()
    node.clock.t = T0 + 2
    assert bodies(node.drain()) == [b"i0", b"i2"]  # hour 0's dispatch log is open now
    node.sync()

    def no_descriptors(fd: int) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(store_module.os, "dup", no_descriptors)
    done: list[BaseException | None] = []
    node.store.checkpoint_soon(done.append)
    assert len(done) == 1 and isinstance(done[0], OSError) and held.jobs == []
    monkeypatch.undo()
    node.clock.t = T0 + 4
    assert bodies(node.drain()) == [b"i4"]  # still read from its buffer
    node.sync()
    node.store.checkpoint_soon(done.append)
    held.run()
    assert done[1] is None
    node.crash()
    node.clock.t = T0 + 2 * HOUR
    assert bodies(node.drain()) == [b"i1", b"i3", b"i5"]


@pytest.mark.parametrize("dispatch_log_open_at_the_snapshot", [False, True])
def test_a_cancel_while_the_write_is_held_is_counted_once_after_a_restart(
        node: Node, held: Held, dispatch_log_open_at_the_snapshot: bool) -> None:
    """A bucket far ahead (its dispatch log is closed at the adopt) gets a cancel between the snapshot and the
    adopt. The dispatch log's length the adopt sets is the snapshot's, which misses the cancel: closing the log
    then would leave the next manifest saving that old length with counts that include the cancel, and recovery
    would count it a second time — the bucket's last record taken for resolved and never delivered."""
    far = T0 + 10 * HOUR
    first = node.put(far + 1, b"r1")
    second = node.put(far + 2, b"r2")
    node.put(far + 3, b"r3")
    node.sync()
    node.store.checkpoint_soon()
    held.run()
    if dispatch_log_open_at_the_snapshot:
        assert node.store.cancel(first, far + 1)
        node.sync()
    node.store.checkpoint_soon()  # the snapshot
    assert node.store.cancel(second if dispatch_log_open_at_the_snapshot else first,
                             far + (2 if dispatch_log_open_at_the_snapshot else 1))
    node.sync()
    held.run()  # the adopt
    left = 1 if dispatch_log_open_at_the_snapshot else 2
    assert node.store.pending_count() == left
    node.restart()  # a clean stop: its last checkpoint saves the bucket's state
    assert node.store.pending_count() == left
    node.restart()
    node.clock.t = far + HOUR
    assert bodies(node.drain()) == ([b"r3"] if dispatch_log_open_at_the_snapshot else [b"r2", b"r3"])


def test_a_checkpoint_no_thread_could_take_keeps_its_buffers(node: Node, held: Held,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread cannot be started (a process at its thread limit): the checkpoint is refused to its caller,
    the buffers stay, and the next checkpoint writes them; nothing is adopted as written that was not."""
    for i in range(10):
        node.put(T0 + HOUR + i, b"x%d" % i)
    node.sync()

    def no_thread(job: Callable[[], None], then: Callable[[], None]) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(held, "submit", no_thread)
    done: list[BaseException | None] = []
    node.store.checkpoint_soon(done.append)
    assert len(done) == 1 and isinstance(done[0], RuntimeError)
    monkeypatch.undo()
    node.store.checkpoint()  # nothing running: its own snapshot takes the buffers back
    node.restart()
    node.clock.t = T0 + 2 * HOUR
    assert bodies(node.drain()) == sorted(b"x%d" % i for i in range(10))


def test_a_job_that_never_ran_is_not_adopted_as_written(node: Node, held: Held) -> None:
    """The job dies before its end (here: it never runs) and the store settles it: not taken as written."""
    for i in range(5):
        node.put(T0 + HOUR + i, b"y%d" % i)
    node.sync()
    done: list[BaseException | None] = []
    node.store.checkpoint_soon(done.append)
    held.jobs.pop(0)  # the job is gone without running
    node.store.checkpoint()  # settles the running one: an error, its buffers back, then its own snapshot
    assert len(done) == 1 and isinstance(done[0], OSError)
    node.restart()
    node.clock.t = T0 + 2 * HOUR
    assert bodies(node.drain()) == sorted(b"y%d" % i for i in range(5))


def test_abandoned_with_a_checkpoint_in_flight_answers_those_waiting(node: Node, held: Held) -> None:
    node.put(T0 + HOUR, b"z")
    node.sync()
    done: list[BaseException | None] = []
    node.store.checkpoint_soon(done.append)
    node.store.checkpoint_soon(done.append)  # queued behind the first
    node.store.abandon()
    assert len(done) == 2 and all(isinstance(e, OSError) for e in done)
