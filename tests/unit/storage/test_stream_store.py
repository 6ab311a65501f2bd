"""The file stream store's own properties (storage/stream_store.py), beyond the conformance suite: torn
tails of each log cut at open, consume entries never pointing past the message log, kill -9 of a writing
process, flat memory and O(log n) index lookups on a million records, message-log collection."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import corruption
from storage.node_storage import NodeStorage, message_data
from storage.stream_store import CLOG, ENTRY_SIZE, MLOG, PLOG, TAIL_BUDGET_BYTES, FileStreamLog, StreamStore
from storage.syncer import Syncer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
from stream_kill9_writer import payload as writer_payload


class Node:
    """A vhost stream store on a loop-less syncer; ``restart`` closes cleanly or ``crash`` abandons."""

    def __init__(self, path: Path, message_segment_size: int = 4096) -> None:
        self.path = path
        self.mss = message_segment_size
        self.start()

    def start(self) -> None:
        self.syncer = Syncer(None)
        self.store = StreamStore(str(self.path), self.syncer, message_segment_size=self.mss)

    def open(self, name: str = "s", segment: int = 1000) -> FileStreamLog:
        return self.store.open_stream(name, max_segment_size_bytes=segment)

    def stop(self) -> None:
        self.store.close()
        self.syncer.close()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "v")
    yield n
    if not n.store.closed:
        n.store.close()


def files(d: Path, suffix: str) -> list[Path]:
    return sorted(p for p in d.rglob("*" + suffix))


def fill(s: FileStreamLog, n: int, size: int = 50) -> None:
    for _ in range(n):
        o = s.next_offset
        s.append(b"%d:" % o + b"p" * size, 1000 + o)


def check(s: FileStreamLog, upto: int, size: int = 50) -> None:
    recs = s.read(0, upto + 10)
    assert [r.offset for r in recs] == list(range(s.first_offset, upto))
    assert all(r.payload == b"%d:" % r.offset + b"p" * size for r in recs)


def test_message_log_torn_tail_is_cut(node: Node) -> None:
    s = node.open()
    fill(s, 100)
    node.stop()
    last = files(node.path / "messages", MLOG)[-1]
    size = last.stat().st_size
    with open(last, "ab") as f:
        f.write(b"LVET\x40\x00\x00\x00garbage")  # a record header and part of its payload
    node.start()
    s = node.open()
    assert last.stat().st_size == size
    assert s.next_offset == 100
    check(s, 100)
    fill(s, 5)
    node.restart()
    check(node.open(), 105)


def test_consume_log_torn_entry_is_cut_and_a_damaged_whole_one_is_kept(node: Node) -> None:
    """Part of an entry is a write cut short: cut, not reported. A whole entry that fails its CRC is damage (a
    kill -9 keeps every byte written, so no crash leaves one): reported, and kept so that its offset is never
    given to another message; reads skip it."""
    s = node.open(segment=10**6)
    fill(s, 30)
    node.restart()
    clog = files(node.path / "s", CLOG)[-1]
    with open(clog, "ab") as f:
        f.write(b"\x01" * 17)  # part of an entry
    before = sum(corruption.counts().values())
    s = node.open()
    assert s.next_offset == 30
    assert clog.stat().st_size == 30 * ENTRY_SIZE
    assert sum(corruption.counts().values()) == before, "a torn write is not corruption"
    with open(clog, "ab") as f:
        f.write(b"\x02" * ENTRY_SIZE)  # a whole entry whose CRC fails
    node.restart()
    s = node.open()
    assert sum(corruption.counts().values()) == before + 1
    assert s.next_offset == 31, "the damaged entry keeps its offset"
    check(s, 30)
    assert s.append(b"31:" + b"p" * 50, 5) == 31


def test_damage_inside_the_recovery_window_keeps_the_entries_after_it(node: Node) -> None:
    """nats-server #7549: a bad record inside the window that recovery checks must not cut the confirmed, intact
    records after it. One flipped bit in an early payload, one in a later entry: both reported (the file that
    holds the damage, at the record's offset), both offsets skipped, every other record served, and new
    appends take new offsets (none reused)."""
    s = node.open(segment=10**6)
    fill(s, 20)
    node.stop()
    mlog = files(node.path / "messages", MLOG)[-1]
    rec = 12 + len(b"10:") + 50
    at = 12 + len(b"0:") + 50  # record 0
    at += sum(12 + len(b"%d:" % o) + 50 for o in range(1, 5))  # records 1-4: record 5 starts here
    with open(mlog, "r+b") as f:
        f.seek(at + rec // 2)
        byte = f.read(1)[0]
        f.seek(at + rec // 2)
        f.write(bytes([byte ^ 0x10]))
    clog = files(node.path / "s", CLOG)[-1]
    with open(clog, "r+b") as f:
        f.seek(12 * ENTRY_SIZE + 9)
        byte = f.read(1)[0]
        f.seek(12 * ENTRY_SIZE + 9)
        f.write(bytes([byte ^ 0x01]))
    seen = set(corruption._seen)
    node.start()
    s = node.open()
    new = sorted(k for k in corruption._seen - seen)
    assert new == sorted([(str(mlog), at), (str(clog), 12 * ENTRY_SIZE)]), new
    assert s.next_offset == 20
    recs = s.read(0, 100)
    assert [r.offset for r in recs] == [o for o in range(20) if o not in (5, 12)]
    assert all(r.payload == b"%d:" % r.offset + b"p" * 50 for r in recs)
    assert s.append(b"20:" + b"p" * 50, 5) == 20
    node.restart()
    assert [r.offset for r in node.open().read(0, 100)] == [o for o in range(21) if o not in (5, 12)]


def test_consume_entries_past_the_message_log_are_dropped(node: Node) -> None:
    """A crash after the consume log reached the disk but before the message log did: those entries go."""
    s = node.open(segment=10**6)
    fill(s, 20)
    node.stop()
    last = files(node.path / "messages", MLOG)[-1]
    rec = 12 + len(b"19:") + 50
    os.truncate(last, last.stat().st_size - rec - 5)  # record 19 gone, record 18 torn
    node.start()
    s = node.open()
    assert s.next_offset == 18
    check(s, 18)
    assert s.append(b"18:" + b"p" * 50, 5) == 18  # an offset never confirmed may be given again
    node.restart()
    check(node.open(), 19)


def test_consume_entry_with_bad_payload_crc_is_skipped_and_reported(node: Node) -> None:
    """Damage to the newest payload (a whole record failing its CRC, not a write cut short) is reported and
    skipped; the offset stays taken."""
    s = node.open(segment=10**6)
    fill(s, 10)
    node.stop()
    last = files(node.path / "messages", MLOG)[-1]
    with open(last, "r+b") as f:  # flip a byte of the payload of the newest record
        f.seek(last.stat().st_size - 2)
        f.write(b"Z")
    before = sum(corruption.counts().values())
    node.start()
    s = node.open()
    assert sum(corruption.counts().values()) == before + 1
    assert s.next_offset == 10
    check(s, 9)
    assert s.append(b"10:" + b"p" * 50, 5) == 10


def test_pull_log_torn_tail_and_compaction(node: Node) -> None:
    s = node.open()
    fill(s, 10)
    g = s.group("g", 0)
    g.pulled([0, 1, 2])
    g.acked([0])
    node.restart()
    plog = files(node.path / "s", PLOG)[0]
    with open(plog, "ab") as f:
        f.write(b"LVET\x30\x00\x00\x00{\"k\":\"a\"")  # a torn record
    s = node.open()
    g = s.groups()["g"]
    assert (g.cursor, g.committed, g.outstanding()) == (3, 1, [1, 2])
    for i in range(3, 20000):  # many records: the file is compacted into checkpoints
        g.pulled([i])
        g.acked([i - 2])
    assert plog.stat().st_size < 300 << 10
    node.restart()
    g = node.open().groups()["g"]
    assert (g.cursor, g.committed, g.outstanding()) == (20000, 19998, [19998, 19999])


def test_message_log_segments_go_when_no_stream_references_them(node: Node) -> None:
    a = node.open("a", segment=1000)
    b = node.open("b", segment=1000)
    fill(a, 200)  # ~ 65 bytes per record in the message log, 4 KiB segments
    fill(b, 10)
    fill(a, 200)
    segs = len(files(node.path / "messages", MLOG))
    assert segs > 5
    a.retain(0, None, 0)
    after = len(files(node.path / "messages", MLOG))
    assert after == segs - 3  # b's records (in the 4th segment) keep it and everything after
    b.retain(0, None, 0)  # b has one segment: nothing goes
    b.delete()
    assert len(files(node.path / "messages", MLOG)) < after
    node.restart()
    a = node.open("a", segment=1000)
    check(a, 400)
    assert a.first_offset > 0


def test_not_collected_while_recovering(tmp_path: Path) -> None:
    """Until every stream was opened, a message-log segment may belong to one not opened yet."""
    n = Node(tmp_path / "v")
    a, b = n.open("a"), n.open("b")
    fill(b, 5)
    fill(a, 300)
    n.store.close()
    n.syncer.close()
    syncer = Syncer(None)
    store = StreamStore(str(tmp_path / "v"), syncer, message_segment_size=4096, recovering=True)
    a = store.open_stream("a", max_segment_size_bytes=1000)
    a.retain(0, None, 0)
    before = len(files(tmp_path / "v" / "messages", MLOG))
    b = store.open_stream("b", max_segment_size_bytes=1000)
    assert store.finish_recovery() == []
    assert [r.offset for r in b.read(0, 10)] == [0, 1, 2, 3, 4]
    assert len(files(tmp_path / "v" / "messages", MLOG)) == before
    store.close()


def test_retention_by_age_with_injected_clock(node: Node) -> None:
    s = node.open(segment=500)
    for i in range(100):
        s.append(b"x" * 50, 10_000 + i * 1000)  # 10 per segment
    assert s.segment_count == 10
    assert s.retain(None, 60_000, now_ms=10_000 + 99_000) == 3  # segments ending at 19 s, 29 s, 39 s
    assert s.first_offset == 30
    node.restart()
    s = node.open(segment=500)
    assert s.first_offset == 30 and s.segment_count == 7
    assert s.retain(None, 60_000, now_ms=10_000 + 99_000) == 0


def test_node_storage_opens_streams_and_reports_their_data(tmp_path: Path) -> None:
    d = str(tmp_path / "node")
    ns = NodeStorage(d)
    s = ns.open_stream("v1", "s", max_segment_size_bytes=10_000)
    gone = ns.open_stream("v2", "gone", max_segment_size_bytes=10_000)
    ns.finish_recovery()
    s.append(b"hello", 1)
    gone.append(b"bye", 1)
    ns.syncer.flush()
    ns.close()
    assert sum(1 for f in message_data(d) if f.startswith("streams")) == 2
    ns = NodeStorage(d)
    s = ns.open_stream("v1", "s", max_segment_size_bytes=10_000)
    ns.finish_recovery()  # v2's stream was not opened: it no longer exists
    assert [r.payload for r in s.read(0, 10)] == [b"hello"]
    assert sum(1 for f in message_data(d) if f.startswith("streams")) == 1
    ns.close()


# -- kill -9 --------------------------------------------------------------------------------------------------


def run_round(data_dir: Path, durable_before_kill: int) -> tuple[int, int]:
    """One writer process killed with SIGKILL: (offset it recovered to, highest N it reported durable)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(HERE / "stream_kill9_writer.py"), str(data_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    durable = 0
    deadline = time.monotonic() + 20
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("recovered"), line + (proc.stderr.read() if proc.stderr else "")
        recovered = int(line.split()[1])
        while durable < recovered + durable_before_kill and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            durable = max(durable, int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate()
    durable = max([durable] + [int(x) for x in rest.split()])
    assert durable > recovered, err
    return recovered, durable


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_durable_offsets_survive_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    rnd = random.Random(11)
    best = 0
    for _ in range(20):
        recovered, durable = run_round(data_dir, rnd.randint(1, 3000))
        assert recovered >= best  # never below what was reported durable: no confirmed offset is reused
        best = max(best, durable)
    ns = NodeStorage(str(data_dir))
    s = ns.open_stream("/", "s", max_segment_size_bytes=20_000)
    ns.open_stream("/", "other", max_segment_size_bytes=20_000)
    ns.finish_recovery()
    assert s.next_offset >= best
    got = 0
    o = 0
    while o < s.next_offset:
        recs = s.read(o, 1000)
        assert recs
        for r in recs:
            assert r.offset == o and r.payload == writer_payload(o) and r.timestamp_ms == 1000 + o
            o += 1
            got += 1
    assert got == s.next_offset >= best
    ns.close()


# -- a million records ----------------------------------------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def million(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileStreamLog]:
    syncer = Syncer(None)
    store = StreamStore(str(tmp_path_factory.mktemp("big")), syncer, message_segment_size=8 << 20)
    s = store.open_stream("big", max_segment_size_bytes=1 << 20)
    for i in range(1_000_000):
        s.append(b"m%07d" % i, 1_000_000 + i)
        if i % 50_000 == 0:
            syncer.flush()
    syncer.flush()
    yield s
    store.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_memory_stays_flat_reading_a_million_records(million: FileStreamLog) -> None:
    before = peak = _rss()
    o, n = 0, 0
    while True:
        recs = million.read(o, 2000)
        if not recs:
            break
        n += len(recs)
        assert recs[0].payload == b"m%07d" % o
        o = recs[-1].offset + 1
        peak = max(peak, _rss())
    assert n == 1_000_000
    assert peak - before < 50 << 20, f"RSS grew by {(peak - before) >> 20} MiB"


@pytest.mark.slow
def test_offset_at_is_a_binary_search(million: FileStreamLog) -> None:
    for ts, want in [(1_000_000, 0), (1_000_000 + 777_777, 777_777), (1_999_999, 999_999), (3_000_000, 1_000_000)]:
        reads = million.index_reads
        assert million.offset_at(ts) == want
        assert million.index_reads - reads <= 25  # log2(entries per segment) + 1, not a scan


@pytest.mark.slow
def test_read_anywhere_is_one_lookup(million: FileStreamLog) -> None:
    reads = million.index_reads
    recs = million.read(154_321, 3)
    assert [r.payload for r in recs] == [b"m0154321", b"m0154322", b"m0154323"]
    assert million.index_reads - reads == 1


@pytest.mark.slow
def test_the_newest_records_are_read_from_memory_within_the_budget(million: FileStreamLog) -> None:
    reads = million.index_reads
    recs = million.read(999_990, 100)
    assert [r.offset for r in recs] == list(range(999_990, 1_000_000))
    assert recs[0].payload == b"m0999990"
    assert million.index_reads == reads  # the tail: no index read
    kept = million._tail_bytes
    assert kept <= TAIL_BUDGET_BYTES, "the tail stays within the store's budget"


def test_a_filtered_read_skips_segments_without_the_wanted_values(node: Node) -> None:
    """Each consume-log segment knows the filter values of its entries (RabbitMQ 3.13's chunk filter, kept
    exactly): a filtered read does not read the entries of a segment that holds none of them, before a
    restart (summaries built at append) and after (built once, on the first filtered read)."""
    s = node.open(segment=2000)  # 50 records of ~50 bytes per segment
    for o in range(400):
        s.append(b"%d:" % o + b"p" * 50, 1000 + o, "blue" if o >= 350 else "red")
    node.syncer.flush()
    assert s.segment_count >= 8
    reads = s.index_reads
    blue = s.read(0, 1000, frozenset({"blue"}))
    assert [r.offset for r in blue] == list(range(350, 400))
    assert s.index_reads - reads <= 2, "only the segments that hold 'blue' are read"
    node.restart()
    s = node.open(segment=2000)
    reads = s.index_reads
    assert [r.offset for r in s.read(0, 1000, frozenset({"blue"}))] == list(range(350, 400))
    first_pass = s.index_reads - reads
    reads = s.index_reads
    assert [r.offset for r in s.read(0, 1000, frozenset({"blue"}))] == list(range(350, 400))
    assert s.index_reads - reads <= 2 < first_pass, "recovered segments are summarised once"
    assert [r.offset for r in s.read(0, 1000, frozenset({"green"}))] == []
    assert len(s.read(0, 1000, frozenset({"red", "blue"}))) == 400


def test_the_tail_budget_is_shared_by_the_open_streams(node: Node) -> None:
    from storage.stream_store import TAIL_MIN_BYTES

    streams = [node.open(f"s{i}") for i in range(4)]
    assert {s.tail_cap for s in streams} == {TAIL_BUDGET_BYTES // 4}
    many = [node.open(f"m{i}") for i in range(TAIL_BUDGET_BYTES // TAIL_MIN_BYTES + 4)]
    assert {s.tail_cap for s in streams + many} == {TAIL_MIN_BYTES}, "never below the minimum"
    for s in many:
        s.close()
    assert {s.tail_cap for s in streams} == {TAIL_BUDGET_BYTES // 4}, "a closed stream gives its share back"
    fill(streams[0], 20_000, size=100)  # ~2 MiB > its share of 2 MiB: the older half goes
    assert streams[0]._tail_bytes <= TAIL_BUDGET_BYTES // 4
    check(streams[0], 20_000, size=100)
