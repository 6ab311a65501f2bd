"""The conformance suite of storage/stream_log.py: every StreamLog implementation behaves the same.

Parametrized over the implementations (``kind``): ``memory`` (storage/stream_memory.py) and ``file``
(storage/stream_store.py, on a syncer without a loop so that a flush is an inline fsync). Tests that need a
restart (state across close/reopen) run only where the store survives one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage.stream_log import GroupLog, StreamLog
from storage.stream_memory import MemoryStreamLog
from storage.stream_store import StreamStore
from storage.syncer import Syncer

KINDS = ["memory", "file"]


def _typed(log: MemoryStreamLog) -> StreamLog:
    """Type check: the memory log satisfies the StreamLog protocol (mypy verifies this line)."""
    return log


class Maker:
    """Opens streams of one implementation; ``reopen`` simulates a clean restart (file store only)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.restartable = kind == "file"
        self._store: Any = None
        self._syncer: Any = None
        self._open: dict[str, int] = {}
        self._start()

    def _start(self) -> None:
        if self.kind == "file":
            self._syncer = Syncer(None)
            self._store = StreamStore(str(self.path / "vhost"), self._syncer)

    def open(self, name: str = "s", segment_size: int = 1000) -> StreamLog:
        self._open[name] = segment_size
        if self.kind == "memory":
            return MemoryStreamLog(name, max_segment_size_bytes=segment_size)
        return self._store.open_stream(name, max_segment_size_bytes=segment_size)

    def flush(self) -> None:
        if self._syncer is not None:
            self._syncer.flush()

    def reopen(self, name: str = "s") -> StreamLog:
        assert self.restartable
        self._store.close()
        self._syncer.close()
        self._start()
        return self.open(name, self._open[name])

    def close(self) -> None:
        if self._store is not None and not self._store.closed:
            self._store.close()
            self._syncer.close()


@pytest.fixture(params=KINDS)
def maker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Maker]:
    m = Maker(request.param, tmp_path)
    yield m
    m.close()


@pytest.fixture(params=[kind for kind in KINDS if kind == "file"])
def restartable_maker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Maker]:
    """Only the stores whose contents survive a close and reopen (not the memory store)."""
    m = Maker(request.param, tmp_path)
    yield m
    m.close()


def payload(i: int, size: int = 10) -> bytes:
    return (b"%d:" % i).ljust(size, b"x")


def fill(log: StreamLog, n: int, size: int = 10, ts0: int = 1000, step: int = 10) -> None:
    for i in range(n):
        assert log.append(payload(i, size), ts0 + i * step) == log.next_offset - 1


# -- offsets and reads ------------------------------------------------------------------------------------


def test_offsets_start_at_zero_and_count_up(maker: Maker) -> None:
    log = maker.open()
    assert (log.first_offset, log.next_offset, log.bytes) == (0, 0, 0)
    assert [log.append(b"a", 1), log.append(b"bb", 2), log.append(b"", 3)] == [0, 1, 2]
    assert (log.first_offset, log.next_offset, log.bytes) == (0, 3, 3)


def test_read_from_anywhere(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    fill(log, 50)
    assert log.segment_count > 1
    recs = log.read(0, 1000)
    assert [r.offset for r in recs] == list(range(50))
    assert [r.payload for r in recs] == [payload(i) for i in range(50)]
    assert [r.timestamp_ms for r in recs] == [1000 + 10 * i for i in range(50)]
    assert [r.offset for r in log.read(17, 5)] == [17, 18, 19, 20, 21]
    assert [r.offset for r in log.read(9, 30)] == list(range(9, 39))  # across segment boundaries
    assert [r.offset for r in log.read(45, 100)] == list(range(45, 50))
    assert log.read(50, 10) == []
    assert log.read(1000, 10) == []
    assert log.read(0, 0) == []


def test_a_run_appended_in_one_call_is_what_its_appends_one_by_one_would_be(maker: Maker) -> None:
    """append_run (a run of publishes, broker/amqp/publish_run.py) against append, record by record: same
    offsets, timestamps, payloads, segments (runs that cross segment boundaries), filters and durable end,
    and the same after a restart."""
    one, run = maker.open("one", segment_size=100), maker.open("run", segment_size=100)
    seen: list[int] = []
    run.on_durable = seen.append
    chunks = [(0, 1), (1, 7), (8, 23), (31, 2)]  # (first, count): runs of 1 to 23 records
    for first, count in chunks:
        ts = 1000 + first
        value = "red" if first % 2 else None
        for i in range(first, first + count):
            assert one.append(payload(i), ts, value) == i
        assert run.append_run([payload(i) for i in range(first, first + count)], ts, value) == first
    maker.flush()
    assert seen and seen[-1] == 33

    def contents(log: StreamLog) -> tuple[object, ...]:
        recs = log.read(0, 1000)
        red = log.read(0, 1000, frozenset({"red"}))
        return ([(r.offset, r.timestamp_ms, r.payload) for r in recs], [r.offset for r in red],
                log.segment_count, log.bytes, log.next_offset)

    assert contents(run) == contents(one)
    assert run.segment_count > 2
    if maker.restartable:
        expected = contents(one)
        assert contents(maker.reopen("run")) == expected


def test_read_below_first_starts_at_first(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    fill(log, 50)
    log.retain(200, None, 0)
    first = log.first_offset
    assert first > 0
    assert log.read(0, 3)[0].offset == first


def test_offset_at_by_timestamp(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    fill(log, 60, ts0=1000, step=10)  # offset i at 1000 + 10 i
    assert log.offset_at(0) == 0
    assert log.offset_at(1000) == 0
    assert log.offset_at(1001) == 1
    assert log.offset_at(1250) == 25
    assert log.offset_at(1255) == 26
    assert log.offset_at(1590) == 59
    assert log.offset_at(1591) == 60 == log.next_offset
    log.retain(200, None, 0)
    assert log.offset_at(0) == log.first_offset


def test_offset_at_with_equal_timestamps(maker: Maker) -> None:
    log = maker.open(segment_size=30)
    for i in range(20):
        log.append(payload(i), 5000 + (i // 4))
    assert log.offset_at(5002) == 8
    assert log.offset_at(5004) == 16
    assert log.offset_at(5005) == 20


def test_empty_stream(maker: Maker) -> None:
    log = maker.open()
    assert log.read(0, 10) == []
    assert log.offset_at(0) == 0
    assert log.retain(0, 0, 10**15) == 0
    assert log.segment_count == 1


# -- retention --------------------------------------------------------------------------------------------


def test_retention_by_bytes_keeps_active_segment_and_never_reuses_offsets(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    fill(log, 55)  # 10 bytes each: 10 per segment, 6 segments
    assert log.segment_count == 6
    assert log.bytes == 550
    removed = log.retain(300, None, 0)
    assert removed == 3 and log.segment_count == 3
    assert log.bytes == 250 and log.first_offset == 30
    assert [r.offset for r in log.read(0, 2)] == [30, 31]
    assert log.retain(0, None, 0) == 2  # never the active segment
    assert log.segment_count == 1 and log.first_offset == 50
    assert log.read(0, 100)[0].payload == payload(50)
    assert log.append(b"new", 9999) == 55  # offsets are never reused
    assert log.next_offset == 56


def test_retention_by_age(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    fill(log, 35, ts0=0, step=100)  # segments end at 900, 1900, 2900; the active one at 3400
    assert log.retain(None, 1000, now_ms=2500) == 1  # 900 < 1500; 1900 is not
    assert log.first_offset == 10
    assert log.retain(None, 1000, now_ms=2500) == 0
    assert log.retain(None, 1, now_ms=10**9) == 2  # everything old, but the active segment stays
    assert log.segment_count == 1 and log.first_offset == 30


def test_retention_unlimited_removes_nothing(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    fill(log, 30)
    assert log.retain(None, None, 10**15) == 0
    assert log.first_offset == 0


# -- filters ----------------------------------------------------------------------------------------------


def test_filtered_read_skips_chunks_that_cannot_match(maker: Maker) -> None:
    log = maker.open(segment_size=100)
    for i in range(30):  # segment k holds only the value "v<k>"
        log.append(payload(i), i, f"v{i // 10}")
    log.append(payload(30), 30, None)
    got = log.read(0, 100, frozenset({"v1"}))
    offsets = [r.offset for r in got]
    assert list(range(10, 20)) == [o for o in offsets if 10 <= o < 20]  # every match, in order
    assert not any(o < 10 for o in offsets)  # the first segment cannot match: skipped
    assert offsets == sorted(offsets)
    unfiltered = log.read(0, 100)
    assert len(unfiltered) == 31


def test_filtered_read_may_return_other_values(maker: Maker) -> None:
    log = maker.open(segment_size=1000)
    for i in range(10):
        log.append(payload(i), i, "a" if i % 2 else "b")
    got = log.read(0, 100, frozenset({"a"}))
    assert {r.offset for r in got} >= {1, 3, 5, 7, 9}


# -- groups -----------------------------------------------------------------------------------------------


def test_group_cursor_committed_outstanding(maker: Maker) -> None:
    log = maker.open()
    fill(log, 10)
    g = log.group("g", 0)
    assert (g.name, g.cursor, g.committed, g.outstanding()) == ("g", 0, 0, [])
    g.pulled([0, 1, 2, 3])
    assert (g.cursor, g.committed, g.outstanding()) == (4, 0, [0, 1, 2, 3])
    g.acked([1, 2])
    assert (g.committed, g.outstanding()) == (0, [0, 3])
    g.acked([0])  # contiguous now: committed moves past 0, 1, 2
    assert (g.committed, g.outstanding()) == (3, [3])
    g.pulled([4, 5])
    g.acked([3, 4, 5])
    assert (g.cursor, g.committed, g.outstanding()) == (6, 6, [])
    g.acked([2])  # an old ack changes nothing
    assert g.committed == 6


def test_group_start_offset_and_existing_group(maker: Maker) -> None:
    log = maker.open()
    fill(log, 10)
    g = log.group("late", 7)
    assert (g.cursor, g.committed) == (7, 7)
    g.pulled([7])
    again = log.group("late", 0)  # an existing group keeps its state
    assert (again.cursor, again.committed, again.outstanding()) == (8, 7, [7])
    assert set(log.groups()) == {"late"}
    log.group("other", 3)
    assert set(log.groups()) == {"late", "other"}


def test_group_state_survives_reopen(restartable_maker: Maker) -> None:
    maker = restartable_maker
    log = maker.open()
    fill(log, 20)
    g = log.group("g", 0)
    g.pulled(range(10))
    g.acked([0, 1, 2, 5, 6])
    h = log.group("h", 15)
    h.pulled([15, 16])
    maker.flush()
    log = maker.reopen()
    assert set(log.groups()) == {"g", "h"}
    g2 = log.groups()["g"]
    assert (g2.cursor, g2.committed, g2.outstanding()) == (10, 3, [3, 4, 7, 8, 9])
    g2.acked([3, 4])
    assert g2.committed == 7
    h2 = log.group("h", 0)
    assert (h2.cursor, h2.committed, h2.outstanding()) == (17, 15, [15, 16])


def test_stream_survives_reopen(restartable_maker: Maker) -> None:
    maker = restartable_maker
    log = maker.open(segment_size=100)
    fill(log, 45)
    log.retain(300, None, 0)
    first = log.first_offset
    maker.flush()
    log = maker.reopen()
    assert (log.first_offset, log.next_offset) == (first, 45)
    assert [r.payload for r in log.read(0, 100)] == [payload(i) for i in range(first, 45)]
    assert log.offset_at(1000 + 10 * 40) == 40
    assert log.append(b"after", 5) == 45


# -- durability -------------------------------------------------------------------------------------------


def test_on_durable_without_a_loop(maker: Maker) -> None:
    log = maker.open()
    seen: list[int] = []
    log.on_durable = seen.append
    log.append(b"a", 1)
    log.append(b"b", 2)
    maker.flush()
    assert seen and seen[-1] == 2


async def test_on_durable_with_a_loop(maker: Maker) -> None:
    log = maker.open()
    seen: list[int] = []
    log.on_durable = seen.append
    for i in range(5):
        log.append(b"x", i)
    for _ in range(200):
        if seen and seen[-1] == 5:
            break
        await asyncio.sleep(0.005)
        maker.flush()  # the file store's syncer has no loop here: flush as the node would
    assert seen[-1] == 5
    assert seen == sorted(seen)


def test_delete(maker: Maker) -> None:
    log = maker.open()
    fill(log, 5)
    log.group("g", 0)
    log.delete()
    assert log.groups() == {}


def test_group_is_a_grouplog(maker: Maker) -> None:
    log = maker.open()
    g: GroupLog = log.group("g", 0)
    assert g.name == "g"


def test_empty_filter_value_matches_unfiltered_messages(maker: Maker) -> None:
    """``""`` among the wanted values stands for messages appended without one (osiris's match_unfiltered)."""
    log = maker.open(segment_size=100)
    for i in range(10):
        log.append(payload(i), i, "a")
    for i in range(10, 20):
        log.append(payload(i), i, None)
    assert not any(r.offset >= 10 for r in log.read(0, 100, frozenset({"a"})))  # unfiltered ones skipped
    unfiltered = [r.offset for r in log.read(0, 100, frozenset({""}))]
    assert list(range(10, 20)) == [o for o in unfiltered if o >= 10]
    assert not any(o < 10 for o in unfiltered)  # the "a" segment is skipped
    both = [r.offset for r in log.read(0, 100, frozenset({"", "a"}))]
    assert both == list(range(20))
