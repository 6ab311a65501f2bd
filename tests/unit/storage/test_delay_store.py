"""The delay store (storage/delay/): ordering, far horizons on a fake clock, buckets made and deleted,
restarts clean and crashed, the dispatch contract across a crash, cancel, exchange drop, paging, a clock
running backwards, and memory bounded with many pending."""

from __future__ import annotations

import os
import random
import resource
from pathlib import Path

import pytest
from delay_harness import Clock, Node

from storage.delay.record import DueRecord

HOUR = 3_600_000
DAY = 24 * HOUR
YEAR = 365 * DAY
T0 = 1_700_000_000_000  # a fixed epoch ms: nothing here reads the wall clock


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def node(tmp_path: Path, clock: Clock) -> Node:
    return Node(tmp_path / "delay", clock)


def bodies(batch: list[DueRecord]) -> list[bytes]:
    return [d.record.body for d in batch]


def files(node: Node, suffix: str) -> list[str]:
    return sorted(n for n in os.listdir(node.path / "buckets") if n.endswith(suffix))


def test_due_in_due_then_seq_order_and_never_early(node: Node, clock: Clock) -> None:
    delays = [500, 100, 300, 200, 100, 400]
    for i, d in enumerate(delays):
        node.put(T0 + d, b"%d" % i, delay=d)
    node.sync()
    assert node.store.due() == []  # nothing is due at T0
    clock.t = T0 + 99
    assert node.store.due() == []
    clock.t = T0 + 100
    first = node.drain()
    assert bodies(first) == [b"1", b"4"]  # equal due times keep publish order
    clock.t = T0 + 1000
    assert bodies(node.drain()) == [b"3", b"2", b"5", b"0"]
    r = first[0].record
    assert (r.routing_key, r.properties, r.delay_ms, r.xref) == (b"rk", b"\x00\x01", 100, 1)


def test_not_handed_out_before_durable(node: Node, clock: Clock) -> None:
    seq = node.put(T0 - 5)
    assert node.durable == 0
    assert node.store.due() == []  # its WAL record is not fsynced yet
    node.sync()
    assert node.durable == seq + 1
    assert [d.record.seq for d in node.drain()] == [seq]


def test_a_year_ahead_on_a_fake_clock(node: Node, clock: Clock) -> None:
    for d in (YEAR - 1, YEAR, YEAR + 1, DAY, 30 * DAY):
        node.put(T0 + d, b"%d" % d)
    node.sync()
    assert len(node.store.bucket_starts()) == 3  # the year -1/0/+1 ms share an hour
    clock.t = T0 + YEAR - 2
    assert bodies(node.drain()) == [b"%d" % DAY, b"%d" % (30 * DAY)]
    clock.t = T0 + YEAR - 1
    assert bodies(node.drain()) == [b"%d" % (YEAR - 1)]
    clock.t = T0 + YEAR + 1
    assert bodies(node.drain()) == [b"%d" % YEAR, b"%d" % (YEAR + 1)]
    assert node.store.next_due_ms() is None


def test_buckets_roll_over_and_drained_ones_are_deleted(node: Node, clock: Clock) -> None:
    start = T0 - T0 % HOUR
    for h in range(3):
        for i in range(10):
            node.put(start + h * HOUR + i * 1000, b"%d/%d" % (h, i))
    node.sync()
    node.store.checkpoint()
    assert len(files(node, ".data")) == 3 and len(files(node, ".idx")) == 3
    wal = node.path / "wal"
    assert len(os.listdir(wal)) == 1  # segments below the checkpoint are gone
    clock.t = start + HOUR + 9000
    got = node.drain()
    assert len(got) == 20
    node.store.checkpoint()
    assert files(node, ".data") == [f"{start + 2 * HOUR:020d}.data"]
    assert files(node, ".disp") == []
    clock.t = start + 3 * HOUR
    assert len(node.drain()) == 10
    node.restart()
    assert files(node, ".data") == [] and files(node, ".idx") == []
    assert node.store.due() == [] and node.store.next_due_ms() is None


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_restart_replays_without_duplicates_or_loss(tmp_path: Path, clock: Clock, how: str) -> None:
    node = Node(tmp_path / "d", clock, checkpoint_bytes=3000)  # several checkpoints along the way
    rng = random.Random(7)
    want = {}
    for i in range(400):
        due = T0 + rng.randrange(0, 10 * HOUR)
        want[node.put(due, b"m%d" % i)] = due
    node.sync()
    assert node.durable == max(want) + 1
    getattr(node, how)()
    later = node.put(T0 + 5, b"after")
    node.sync()
    clock.t = T0 + 11 * HOUR
    got = node.drain()
    seqs = [d.record.seq for d in got]
    assert sorted(seqs) == sorted([*want, later])  # nothing lost, nothing twice, no seq reused
    assert [(d.record.due_ms, d.record.seq) for d in got] == sorted((d.record.due_ms, d.record.seq) for d in got)
    node.sync()  # the dispatch log on disk (without it, a crash gives the batch back: at-least-once)
    getattr(node, how)()
    assert node.drain() == []


def test_crash_drops_what_was_not_durable_and_keeps_what_was(tmp_path: Path, clock: Clock) -> None:
    node = Node(tmp_path / "d", clock)
    kept = [node.put(T0 + 10, b"a"), node.put(T0 + 20, b"b")]
    node.sync()
    node.put(T0 + 30, b"lost")  # buffered only: the crash takes it
    node.crash()
    clock.t = T0 + 100
    assert [d.record.seq for d in node.drain()] == kept


def test_crash_after_checkpoint_cuts_buckets_and_replays_once(tmp_path: Path, clock: Clock) -> None:
    """Buckets written past their checkpointed length (the WAL not yet cut) must not get records twice."""
    node = Node(tmp_path / "d", clock)
    for i in range(50):
        node.put(T0 + i, b"x%d" % i)
    node.store.checkpoint()
    for i in range(50, 80):
        node.put(T0 + i, b"x%d" % i)
    node.sync()
    # Write the bucket buffers out as a crash half-way through a checkpoint would, without the manifest.
    for b in node.store._buckets.values():
        b.flush()
    node.crash()
    clock.t = T0 + 1000
    got = node.drain()
    assert bodies(got) == [b"x%d" % i for i in range(80)]


def test_dispatch_contract_across_a_crash(node: Node, clock: Clock) -> None:
    for i in range(10):
        node.put(T0 + i, b"%d" % i)
    node.sync()
    clock.t = T0 + 100
    batch = node.store.due(4)
    assert bodies(batch) == [b"0", b"1", b"2", b"3"]
    node.store.dispatched(batch[:2])
    node.sync()  # the dispatch log's record is on disk
    out = node.store.due(3)  # handed out, never marked
    assert bodies(out) == [b"4", b"5", b"6"]
    node.store.dispatched(batch[2:])  # marked, but the crash comes before the .disp fsync
    node.crash()
    again = node.drain()
    assert bodies(again) == [b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9"]
    node.sync()
    node.crash()
    assert node.drain() == []


def test_release_gives_a_batch_back(node: Node, clock: Clock) -> None:
    for i in range(3):
        node.put(T0 + i, b"%d" % i)
    node.sync()
    clock.t = T0 + 10
    batch = node.store.due()
    assert node.store.due() == []
    node.store.release(batch)
    assert bodies(node.drain()) == [b"0", b"1", b"2"]


def test_cancel(node: Node, clock: Clock) -> None:
    near = node.put(T0 + 10, b"near")
    far = node.put(T0 + 30 * DAY, b"far")
    keep = node.put(T0 + 20, b"keep")
    node.sync()
    assert node.store.due() == []  # loads the window: "near" is in it
    assert node.store.cancel(near, T0 + 10)
    assert node.store.cancel(far, T0 + 30 * DAY)
    assert not node.store.cancel(far, T0 + 30 * DAY)  # already cancelled
    assert not node.store.cancel(keep, T0 + 21)  # wrong id
    assert node.store.exchange_stats(1).count == 1
    clock.t = T0 + 100
    batch = node.store.due()
    assert bodies(batch) == [b"keep"]
    assert not node.store.cancel(keep, T0 + 20)  # being dispatched
    node.store.dispatched(batch)
    node.sync()
    node.crash()
    clock.t = T0 + 31 * DAY
    assert node.drain() == []
    assert node.store.exchange_stats(1).count == 0


def test_cancel_of_a_record_not_yet_durable_makes_it_durable_first(node: Node, clock: Clock) -> None:
    seq = node.put(T0 + 10, b"x")
    assert node.store.cancel(seq, T0 + 10)
    node.sync()
    node.crash()
    clock.t = T0 + 100
    assert node.drain() == []


def test_drop_exchange(node: Node, clock: Clock) -> None:
    for i in range(20):
        node.put(T0 + i * DAY, b"a%d" % i, xref=1)
        node.put(T0 + i * DAY + 1, b"b%d" % i, xref=2)
    node.put(T0 + 100 * DAY, b"only-a", xref=1)
    node.sync()
    node.store.drop_exchange(1)
    assert node.store.exchange_stats(1).count == 0
    assert node.store.list_pending(1) == []
    assert f"{T0 + 100 * DAY - (T0 + 100 * DAY) % HOUR:020d}.data" not in files(node, ".data")  # a's only bucket
    with pytest.raises(ValueError):
        node.put(T0, xref=1)
    node.crash()
    assert node.store.exchange_stats(2).count == 20
    clock.t = T0 + 101 * DAY
    assert bodies(node.drain()) == [b"b%d" % i for i in range(20)]
    node.store.checkpoint()
    assert files(node, ".data") == []


def test_list_pending_paged_by_due_time_and_stats(node: Node, clock: Clock) -> None:
    rng = random.Random(3)
    dues = {}
    for i in range(250):
        due = T0 + rng.randrange(0, 5 * DAY)
        dues[node.put(due, b"p" * 10, xref=7)] = due
        node.put(due, xref=8)
    node.sync()
    want = sorted((d, s) for s, d in dues.items())
    pages = []
    after = None
    while True:
        page = node.store.list_pending(7, after, 40)
        if not page:
            break
        assert len(page) <= 40
        pages.extend((p.due_ms, p.seq) for p in page)
        after = (page[-1].due_ms, page[-1].seq)
    assert pages == want
    st = node.store.exchange_stats(7)
    assert st.count == 250 and st.next_due_ms == want[0][0] and st.nbytes > 250 * 10
    rec = node.store.get(want[3][1], want[3][0])
    assert rec is not None and rec.body == b"p" * 10
    node.store.cancel(want[0][1], want[0][0])
    assert node.store.exchange_stats(7).next_due_ms == want[1][0]
    assert node.store.get(want[0][1], want[0][0]) is None


def test_clock_running_backwards_never_delivers_early_or_twice(node: Node, clock: Clock) -> None:
    for i in range(10):
        node.put(T0 + i * 1000, b"%d" % i)
    node.sync()
    clock.t = T0 + 4500
    assert bodies(node.drain()) == [b"0", b"1", b"2", b"3", b"4"]
    clock.t = T0 - HOUR  # jumps back an hour
    assert node.drain() == []
    clock.t = T0 + 5000  # the ratchet: still "T0 + 4500" until the wall clock passes it
    assert bodies(node.drain()) == [b"5"]
    clock.t = T0 + 3000
    node.restart()  # after a restart the ratchet starts again: the dispatch log prevents duplicates
    assert node.drain() == []
    clock.t = T0 + 20_000
    assert bodies(node.drain()) == [b"6", b"7", b"8", b"9"]


def test_window_is_bounded_when_everything_is_due_at_once(tmp_path: Path, clock: Clock) -> None:
    node = Node(tmp_path / "d", clock, max_loaded=100)
    for i in range(1000):
        node.put(T0 + 50, b"%d" % i)
    node.sync()
    clock.t = T0 + 50
    seen = []
    while True:
        batch = node.store.due(30)
        if not batch:
            break
        assert node.store.loaded <= 100
        node.store.dispatched(batch)
        seen.extend(d.record.seq for d in batch)
    assert seen == sorted(seen) and len(seen) == 1000


def test_short_delays_arriving_inside_the_window_come_out_in_order(node: Node, clock: Clock) -> None:
    node.put(T0 + 60_000, b"late")
    node.sync()
    assert node.store.due() == []  # the window now covers the next two minutes
    node.put(T0 + 1000, b"early")
    node.sync()
    clock.t = T0 + 60_000
    assert bodies(node.drain()) == [b"early", b"late"]


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.slow
def test_memory_bounded_with_a_million_pending_over_a_year(tmp_path: Path, clock: Clock) -> None:
    node = Node(tmp_path / "d", clock, checkpoint_bytes=8 << 20)
    rng = random.Random(1)
    before = _rss_kb()
    body = b"b" * 20
    n = 1_000_000
    for i in range(n):
        node.put(T0 + 1000 + rng.randrange(YEAR), body, xref=1 + i % 4)
        if i % 10_000 == 0:
            node.sync()
    node.sync()
    node.store.checkpoint()
    assert node.store.pending_count() == n
    grown = (_rss_kb() - before) / 1024
    assert grown < 60, f"RSS grew {grown:.1f} MB"
    node.restart()
    assert node.store.pending_count() == n
    clock.t = T0 + DAY
    got = node.drain()
    assert 0 < len(got) < n // 300  # about a day's worth (1/365), no more
    assert node.store.loaded < 10_000
    grown = (_rss_kb() - before) / 1024
    assert grown < 60, f"RSS grew {grown:.1f} MB"
