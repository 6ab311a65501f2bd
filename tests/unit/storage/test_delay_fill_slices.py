"""Window loads of the delay store (``DelayStore._fill``) cost what the loaded range holds, not what its bucket
holds: a bucket's index is split once into per-minute slices and a load reads only the slices it covers and
the dispatch-log bytes it has not read yet (the store's counters say how many). And the answers stay the
same: entries appended after the split, cancels ahead of the window, restarts with slice files left behind
(cleanly or not), everything due at once with a small window, buckets deleted with their slices."""

from __future__ import annotations

import os
import random
from pathlib import Path

import delay_harness
import pytest
from delay_harness import Clock

import storage.delay.bucket as bucket_mod
import storage.delay.store as store_mod
from storage.delay.bucket import SLICES
from storage.delay.record import DueRecord

HOUR = 3_600_000
MINUTE = 60_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR  # a bucket's start: nothing here reads the wall clock


class Node(delay_harness.Node):
    def put(self, due: int, body: bytes = b"", xref: int = 1, delay: int = 0) -> int:
        """By default the body names the due time."""
        return super().put(due, body or b"%d" % due, xref, delay)

    def slice_files(self) -> list[str]:
        return sorted(n for n in os.listdir(self.path / "buckets") if ".s" in n)


def keys(batch: list[DueRecord]) -> list[tuple[int, int]]:
    return [(d.record.due_ms, d.record.seq) for d in batch]


@pytest.fixture
def always_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slice every bucket, however small (the store reads a small one's index whole by default)."""
    monkeypatch.setattr(store_mod, "SPLIT_MIN", 0)


def test_a_load_reads_the_minutes_it_covers_not_the_bucket(tmp_path: Path) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    rng = random.Random(1)
    n = 60_000  # one hour bucket, about 1,000 a minute, appended out of due order
    dues = [T0 + rng.randrange(HOUR) for _ in range(n)]
    seqs = [node.put(d) for d in dues]
    node.store.checkpoint()
    s = node.store
    out: list[DueRecord] = []
    per_fill: list[int] = []
    clock.t = T0 + MINUTE
    while clock.t <= T0 + HOUR + MINUTE:
        before = s.fill_scanned
        out.extend(node.drain())
        per_fill.append(s.fill_scanned - before)
        clock.t += MINUTE
    assert keys(out) == sorted(zip(dues, seqs))
    assert s.fill_split == n  # the index was split once
    # The first load reads the slices of its range, not the index; every load reads at most the slices
    # overlapping its range (lookahead 2 min: three slices of ~1,000) where the old one read all 60,000.
    assert max(per_fill) < 5_000, per_fill
    assert sum(per_fill) < 3 * n
    # Each dispatch-log byte is read once, by the first load after it was written.
    disp = s._buckets[T0].disp
    assert disp is not None
    assert 0 < s.fill_disp_read <= disp.size


def test_entries_appended_after_the_split_come_out_in_order(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    rng = random.Random(2)
    want: list[tuple[int, int]] = []
    for _ in range(2_000):
        d = T0 + rng.randrange(30 * MINUTE)
        want.append((d, node.put(d)))
    node.store.checkpoint()
    node.sync()
    clock.t = T0 + 2 * MINUTE
    out = node.drain()  # the first load: the bucket is split
    assert node.store.fill_split == 2_000
    for round_ in range(12):
        # Appended after the split: some checkpointed (in .idx), the rest only buffered; some due inside
        # the window (loaded at once), most ahead of it (found by a later load in the slices' tail), a few
        # already late.
        for _ in range(300):
            d = clock.t + rng.randrange(-MINUTE, 10 * MINUTE)
            want.append((d, node.put(d)))
        if round_ % 2:
            node.store.checkpoint()
        node.sync()
        batch = node.drain()
        assert keys(batch) == sorted(keys(batch))
        out.extend(batch)
        clock.t += MINUTE
    clock.t = T0 + 3 * HOUR
    out.extend(node.drain())
    got = keys(out)
    assert len(got) == len(set(got)) == len(want)
    assert sorted(got) == sorted(want)


def test_appended_after_the_split_exact_order(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    first = [(T0 + 10 * MINUTE + i, node.put(T0 + 10 * MINUTE + i)) for i in range(0, 600_000, 1000)]
    node.store.checkpoint()
    node.sync()
    clock.t = T0 + 30_000
    assert node.drain() == []  # split; nothing due yet
    assert node.store.fill_split == len(first)
    later = [(T0 + 10 * MINUTE + i, node.put(T0 + 10 * MINUTE + i)) for i in range(500, 600_000, 1000)]
    node.store.checkpoint()
    more = [(T0 + 20 * MINUTE + i, node.put(T0 + 20 * MINUTE + i)) for i in range(0, 60_000, 7)]  # buffered
    node.sync()
    out: list[DueRecord] = []
    while clock.t < T0 + 40 * MINUTE:
        clock.t += 20_000
        out.extend(node.drain(limit=50))
    assert keys(out) == sorted(first + later + more)


def test_cancel_ahead_of_the_window_and_inside_it(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    dues = [T0 + i * 1000 for i in range(1800)]  # one every second for half an hour
    seqs = [node.put(d) for d in dues]
    node.sync()
    s = node.store
    assert s.cancel(seqs[5], dues[5])  # before any load (so before the split)
    clock.t = T0 + MINUTE
    out = node.drain()
    assert s.cancel(seqs[100], dues[100])  # inside the window (due at +100 s, window to +180 s)
    assert s.cancel(seqs[1000], dues[1000])  # ahead of the window: only in the dispatch log
    assert s.cancel(seqs[1700], dues[1700])
    assert set(s._buckets[T0].ahead) <= {seqs[5]}  # the new ones are read by the next load
    clock.t += 2 * MINUTE  # the next load
    out.extend(node.drain())
    assert set(s._buckets[T0].ahead) == {seqs[1000], seqs[1700]}  # seqs[5] is behind the window now
    for _ in range(40):
        clock.t += MINUTE
        out.extend(node.drain())
    cancelled = {seqs[i] for i in (5, 100, 1000, 1700)}
    assert keys(out) == [(d, q) for d, q in zip(dues, seqs) if q not in cancelled]
    assert s._buckets[T0].ahead == {}  # dropped once the window passed them
    assert not s.cancel(seqs[1000], dues[1000])


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_slices_left_by_an_earlier_process(tmp_path: Path, always_split: None, how: str) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    rng = random.Random(3)
    want = []
    for _ in range(3_000):
        d = T0 + rng.randrange(HOUR)
        want.append((d, node.put(d)))
    node.store.checkpoint()
    node.sync()
    clock.t = T0 + 5 * MINUTE
    out = node.drain()
    # Appended after the split and the checkpoint: in the slices (split from the buffer) and the WAL.
    for _ in range(500):
        d = T0 + rng.randrange(HOUR)
        want.append((d, node.put(d)))
    node.sync()
    clock.t += MINUTE
    out.extend(node.drain())  # some of the 500 handed out
    node.sync()  # the dispatches too
    lost = []
    for _ in range(200):  # never synced
        d = T0 + rng.randrange(10 * MINUTE, HOUR)
        lost.append((d, node.put(d)))
    node.store._fill(clock.t)  # a load: the slices are extended with them (not durable: not handed out)
    assert node.store.fill_split == 3_700
    assert node.slice_files()
    if how == "crash":
        node.crash()  # the 200 never reached the disk: stale slices must not bring them back
    else:
        node.restart()  # a clean stop makes them durable: pending like the rest
        want.extend(lost)
    clock.t = T0 + 2 * HOUR
    out.extend(node.drain())
    got = keys(out)
    assert len(got) == len(set(got))
    assert sorted(got) == sorted(want)


def test_everything_due_at_once_with_a_small_window(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock, max_loaded=500)
    seqs = [node.put(T0 + 1234) for _ in range(5_000)]
    node.sync()
    clock.t = T0 + 5 * MINUTE
    out: list[DueRecord] = []
    while batch := node.store.due(300):
        assert node.store.loaded <= 500
        node.store.dispatched(batch)
        out.extend(batch)
    assert [d.record.seq for d in out] == seqs
    # The same once the index is split with entries after it in another slice and the split's tail.
    more = [node.put(T0 + 30 * MINUTE) for _ in range(3_000)]
    more += [node.put(T0 + 30 * MINUTE - 1) for _ in range(100)]
    node.store.checkpoint()
    node.sync()
    clock.t = T0 + 40 * MINUTE
    out = node.drain(limit=200)
    assert [d.record.seq for d in out] == more[3000:] + more[:3000]


def test_slices_go_with_their_bucket(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    for i in range(100):
        node.put(T0 + i * 1000)
        node.put(T0 + HOUR + i * 1000)
    node.sync()
    clock.t = T0 + HOUR + 5 * MINUTE
    assert len(node.drain()) == 200
    assert node.slice_files()
    node.store.checkpoint()  # both buckets drained: deleted, slices too
    assert node.slice_files() == []
    assert os.listdir(tmp_path / "d" / "buckets") == []


def test_stale_slices_are_overwritten_and_deleted_with_their_bucket(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    node.put(T0 + 1000)
    second = node.put(T0 + 30 * MINUTE)
    node.sync()
    node.store.checkpoint()  # the bucket is in the manifest (else recovery deletes its files and replays)
    clock.t = T0 + 2000
    assert len(node.drain()) == 1  # a load: split
    node.sync()
    node.crash()
    assert node.slice_files()
    for k in range(SLICES):  # whatever an earlier process left, even garbage
        (tmp_path / "d" / "buckets" / f"{T0:020d}.s{k:02d}").write_bytes(b"\xff" * 64)
    clock.t = T0 + HOUR
    assert [d.record.seq for d in node.drain()] == [second]  # the new process's split overwrote them
    node.sync()
    node.store.checkpoint()
    assert node.slice_files() == []


def test_stale_slices_of_a_bucket_never_loaded_go_with_it(tmp_path: Path, always_split: None) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    seq = node.put(T0 + 1000)
    node.sync()
    node.store.checkpoint()
    node.crash()
    for k in (0, 7):
        (tmp_path / "d" / "buckets" / f"{T0:020d}.s{k:02d}").write_bytes(b"\xff" * 64)
    assert node.store.cancel(seq, T0 + 1000)  # drained without a load
    node.store.checkpoint()
    assert os.listdir(tmp_path / "d" / "buckets") == []


def test_small_buckets_are_read_whole_without_slices(tmp_path: Path) -> None:
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    for i in range(100):
        node.put(T0 + i * 1000)
    node.sync()
    clock.t = T0 + HOUR
    assert len(node.drain()) == 100
    assert node.store.fill_split == 0
    assert node.slice_files() == []


def test_the_next_bucket_is_split_a_part_per_load_ahead_of_time(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "SPLIT_MIN", 1_000)
    monkeypatch.setattr(store_mod, "PRESPLIT_MIN", 100)
    monkeypatch.setattr(bucket_mod, "READ_CHUNK", 256 * 32)  # the split stops at a chunk's end
    clock = Clock(T0 - 10)
    node = Node(tmp_path / "d", clock)
    rng = random.Random(4)
    want = [(d, node.put(d)) for d in sorted(T0 + rng.randrange(HOUR) for _ in range(1_200))]
    nxt = [(d, node.put(d)) for d in (T0 + HOUR + rng.randrange(HOUR) for _ in range(6_000))]
    node.store.checkpoint()
    node.sync()
    s = node.store
    clock.t = T0
    out = node.drain()
    steps = []
    while clock.t < T0 + HOUR - 2 * MINUTE:
        before = s.fill_split
        clock.t += MINUTE
        out.extend(node.drain())
        steps.append(s.fill_split - before)
    b = s._buckets[T0 + HOUR]
    assert b.split_len == b.idx_len  # done before the window reached it
    assert max(steps) <= 256  # in parts: left / loads expected before it is reached, a chunk at least
    assert sum(1 for n in steps if n) >= 10
    before = s.fill_split
    clock.t = T0 + 3 * HOUR
    out.extend(node.drain())
    assert s.fill_split == before  # nothing left to split when it was reached
    assert keys(out) == sorted(want + nxt)
