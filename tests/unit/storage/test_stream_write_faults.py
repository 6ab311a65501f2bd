"""Fault injection for the stream store (storage/stream_store.py), as test_write_faults.py does for the classic
queue: every write and fsync a stream's life makes on its files (message log, consume log, pull log, the name
and checkpoint files written whole) is made to fail once, at each position in turn, and the invariants a stream
queue relies on are checked after a restart:

- every offset reported durable (``on_durable``) is readable, with its payload and timestamp;
- offsets are contiguous from 0 and never given to other content (each record read back is the one appended
  at its offset, before the restart or after it);
- no offset is both confirmed and failed (the reports only ever move forward);
- the consumer group never claims more than happened: every offset below its committed offset was acked,
  every outstanding offset was pulled; after a clean stop that went through, its progress is exact;
- the fault is a one-off, so it never stalls the stream: an append made after it is confirmed (and every
  append is settled one way or the other), and after the restart new appends are confirmed at new offsets.

The faults are those of a full or failing disk: ENOSPC (nothing lands, or half lands first), EIO, and EIO
after garbage landed past the end. The life ends with a clean stop (which may itself meet the fault: it then
leaves the files as a crash would, as NodeStorage.close does), or with kill -9 at the end of the burst in which
the fault fired, with work in flight: the files are abandoned, what was handed to the kernel stays, the
buffers go.

Found by its first version: a consume-log segment whose write failed while the next segment's went through
left, after the crash, a hole in the offsets (see the last test).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from fault_injection import FaultInjector

from storage import stream_store
from storage.stream_log import StreamRecord
from storage.stream_store import FileStreamLog, StreamStore
from storage.syncer import Syncer

MESSAGE_SEGMENT = 4096  # the message log rolls every few records
CONSUME_SEGMENT = 3000  # payload bytes per consume-log segment: several segments
SIZES = (40, 700, 2500)
APPENDS = 36
T = TypeVar("T")
COMPACT_AT = 150  # the pull log is rewritten as a checkpoint every few records


def payload(offset: int, life: int = 0) -> bytes:
    """Says which offset and which life (before or after a restart) it was appended at, so a record read back
    at another offset, or an offset reused for other content, shows."""
    size = SIZES[offset % len(SIZES)]
    return (f"{life}:{offset:05d}:".encode() * (size // 8 + 1))[:size]


def timestamp(offset: int, life: int = 0) -> int:
    return 1_000_000 * (life + 1) + offset


class Life:
    """One run of the store, recording what it told its stream queue and what the group did."""

    def __init__(self, root: Path, life: int = 0, crash_after: FaultInjector | None = None) -> None:
        self.root = root
        self.life = life
        self.crash_after = crash_after
        self.syncer = Syncer(None)  # no loop: ``settle`` writes and fsyncs inline, as the loop's flush would
        self.store = StreamStore(str(root), self.syncer, message_segment_size=MESSAGE_SEGMENT)
        self.stream: FileStreamLog | None = None
        self.appended: dict[int, bytes] = {}
        self.reports: list[tuple[bool, int]] = []  # (durable?, N) in the order they came
        self.pulled: set[int] = set()  # handed to a member (attempted: the record may have failed to persist)
        self.acked: set[int] = set()
        self.group_errors = 0

    # -- what the stream queue sees -------------------------------------------------------------------------
    def open(self) -> FileStreamLog:
        s = retry_once(lambda: self.store.open_stream("s", max_segment_size_bytes=CONSUME_SEGMENT))
        s.on_durable = lambda n: self.reports.append((True, n))
        s.on_durable_failed = lambda n: self.reports.append((False, n))
        self.stream = s
        return s

    def append(self) -> int:
        assert self.stream is not None
        o = self.stream.next_offset
        data = payload(o, self.life)
        assert self.stream.append(data, timestamp(o, self.life)) == o
        self.appended[o] = data
        return o

    def settle(self) -> None:
        """The end of a burst: the scheduled flush (a failed write stays buffered and is retried by the next)."""
        self.syncer.flush()
        if self.crash_after is not None and self.crash_after.fired:
            raise Crash

    def fates(self) -> tuple[set[int], set[int], int]:
        """(confirmed, failed, settled below): each report settles the offsets from the previous one's end."""
        confirmed: set[int] = set()
        failed: set[int] = set()
        below = 0
        for durable, n in self.reports:
            assert n > below, f"a report went backwards or repeated itself: {self.reports}"
            (confirmed if durable else failed).update(range(below, n))
            below = n
        return confirmed, failed, below

    # -- the consumer group ---------------------------------------------------------------------------------
    def group_op(self, op: str, offsets: list[int]) -> None:
        """Pull or ack; a failed write of the pull log's checkpoint surfaces here as OSError (the member's
        view has changed already: the offsets count as pulled / acked, they may or may not be on disk)."""
        assert self.stream is not None
        g = self.stream.groups()["g"]
        (self.pulled if op == "pulled" else self.acked).update(offsets)
        try:
            getattr(g, op)(offsets)
        except OSError:
            self.group_errors += 1

    def consume(self, n: int, ack_now: int) -> list[int]:
        """A member pulls up to ``n`` confirmed records from the cursor (checking them) and acks the first
        ``ack_now`` of them; returns the rest (acked later, so the committed offset lags behind gaps)."""
        assert self.stream is not None
        g = self.stream.groups()["g"]
        durable_below = max((end for ok, end in self.reports if ok), default=0)
        recs = [r for r in self.stream.read(g.cursor, n) if r.offset < durable_below]
        for r in recs:
            assert r.payload == self.appended[r.offset] and r.timestamp_ms == timestamp(r.offset, self.life)
        offsets = [r.offset for r in recs]
        if offsets:
            self.group_op("pulled", offsets)
            if ack_now:
                self.group_op("acked", offsets[:ack_now])
        return offsets[ack_now:]

    # -- stopping -------------------------------------------------------------------------------------------
    def stop(self, clean: bool) -> bool:
        """A clean stop as NodeStorage.close does it (a failure there leaves the files as a crash would), or
        kill -9. Returns whether the clean stop went through."""
        if not clean:
            self.abandon()
            return False
        try:
            self.store.close()
            self.syncer.sync()
            ok = True
        except OSError:
            self.abandon()
            ok = False
        self.syncer.stop()
        return ok

    def abandon(self) -> None:
        """Release every descriptor without writing the buffers: what kill -9 leaves (the kernel keeps what
        it was handed, fsynced or not)."""
        store = self.store
        for f in store.mlog._files.values():
            f.abandon()
        for s in list(store.streams.values()):
            for seg in s._segs:
                seg.file.abandon()
            for g in s._groups.values():
                if g._file is not None:
                    g._file.abandon()
        store.closed = True
        self.syncer.stop()


def retry_once(fn: Callable[[], T]) -> T:
    """Call ``fn``; if a (one-off) fault fails it, call it again, as an operator restarting the queue would."""
    try:
        return fn()
    except OSError:
        return fn()


class Crash(Exception):
    """Raised at the end of the burst in which the fault fired, when the run is to be killed right there."""


def run_life(root: Path, clean: bool, inj: FaultInjector | None = None) -> tuple[Life, bool]:
    """Appends of three sizes over several segments of each log in bursts, a group pulling and acking, the
    retries of the next bursts, a canary that must be confirmed, then a clean stop. Or, when not ``clean``,
    kill -9 at the end of the burst in which ``inj`` fired (at the end if it never does), with work in flight.
    Returns the life and whether its clean stop went through."""
    life = Life(root, crash_after=None if clean else inj)
    try:
        live(life)
    except Crash:
        pass
    if clean:
        return life, life.stop(clean=True)
    life.append()  # work in flight at the kill: never settled
    life.consume(2, ack_now=1)
    life.stop(clean=False)
    return life, False


def live(life: Life) -> None:
    s = life.open()
    retry_once(lambda: s.group("g", 0))
    later: list[int] = []
    for i in range(APPENDS):
        life.append()
        if i % 4 == 3:
            life.settle()
        if i % 6 == 5:
            if later:
                life.group_op("acked", later)
            later = life.consume(3, ack_now=1 + i % 2)
    for _ in range(3):
        life.settle()
    # After the one-off fault, the stream goes on: a fresh append is confirmed (at most one more try, in case
    # the fault hits this very burst).
    for _ in range(2):
        canary = life.append()
        life.settle()
        life.settle()
        if canary in life.fates()[0]:
            break
    else:
        raise AssertionError(f"no append is confirmed any more (a silent stall): {life.reports}")
    assert life.fates()[2] == s.next_offset, f"appends left neither confirmed nor failed: {life.reports}"


def read_all(s: FileStreamLog) -> list[StreamRecord]:
    out: list[StreamRecord] = []
    o = s.first_offset
    while recs := s.read(o, 7):
        out += recs
        o = recs[-1].offset + 1
    return out


def check_reopened(root: Path, life: Life, clean_ok: bool, fault: str) -> None:
    """Restart and check the invariants, then live on: new appends are confirmed and take new offsets."""
    confirmed, failed, _ = life.fates()
    assert not confirmed & failed
    again = Life(root, life=1)
    s = again.open()
    again.store.finish_recovery()
    recs = read_all(s)
    assert [r.offset for r in recs] == list(range(s.next_offset)), f"{fault}: offsets not contiguous"
    for r in recs:
        assert r.offset in life.appended, f"{fault}: offset {r.offset} was never appended"
        assert r.payload == life.appended[r.offset], f"{fault}: offset {r.offset} holds another record"
        assert r.timestamp_ms == timestamp(r.offset)
    lost = sorted(o for o in confirmed if o >= s.next_offset)
    assert not lost, f"{fault}: confirmed offsets lost: {lost} (reports {life.reports})"
    if clean_ok:
        assert s.next_offset == len(life.appended), f"{fault}: a clean stop lost appends"
    g = s.groups().get("g")
    assert g is not None, f"{fault}: the group is gone"
    unacked = sorted(set(range(g.committed)) - life.acked)
    assert not unacked, f"{fault}: committed {g.committed} passes offsets never acked: {unacked}"
    assert set(g.outstanding()) <= life.pulled, f"{fault}: outstanding {g.outstanding()} never pulled"
    assert g.cursor <= max(life.pulled, default=-1) + 1
    if clean_ok:  # a clean stop that went through kept the group's progress exactly
        want_committed = 0
        while want_committed in life.acked:
            want_committed += 1
        assert g.committed == want_committed, f"{fault}: a clean stop lost acks"
        assert g.outstanding() == sorted(life.pulled - life.acked), f"{fault}: a clean stop lost pulls"
    # The restarted stream goes on at a fresh offset and confirms it.
    start = s.next_offset
    new = [again.append() for _ in range(3)]
    again.settle()
    assert new == [start, start + 1, start + 2]
    assert set(new) <= again.fates()[0], f"{fault}: appends after the restart not confirmed: {again.reports}"
    assert again.stop(clean=True)
    third = Life(root, life=2)
    s = third.open()
    got = read_all(s)
    assert [r.payload for r in got] == [r.payload for r in recs] + [payload(o, 1) for o in new]
    third.stop(clean=True)


def count_calls(root: Path, clean: bool) -> int:
    inj = FaultInjector(str(root))
    with inj.installed():
        life, clean_ok = run_life(root, clean, inj)
    _, failed, _ = life.fates()
    # The fault-free run is the control: nothing fails, and the checks below are exact.
    assert not failed and not life.group_errors and clean_ok == clean
    assert len(life.stream._segs) >= 3 and len(life.store.mlog.starts) >= 3  # type: ignore[union-attr]
    check_reopened(root, life, clean_ok, "no fault")
    return inj.calls


@pytest.fixture(autouse=True)
def small_pull_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite the pull log as a checkpoint often, so that its replace-whole-file writes meet faults too."""
    monkeypatch.setattr(stream_store, "COMPACT_AT", COMPACT_AT)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: a run makes a few hundred real fsyncs, and what is tested is
    what the store does when they fail, not how long a disk takes (no power is cut: tmpfs keeps everything a
    kill -9 would keep)."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="leveret-stream-faults-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("clean", [True, False], ids=["clean-stop", "crash-after-fault"])
@pytest.mark.parametrize("err,mode", [(errno.ENOSPC, "fail"), (errno.ENOSPC, "short"), (errno.EIO, "fail"),
                                      (errno.EIO, "garbage")], ids=["enospc", "enospc-short", "eio", "eio-garbage"])
def test_durable_offsets_are_readable_after_a_failed_write_or_fsync_at_every_position(
        scratch: Path, err: int, mode: str, clean: bool) -> None:
    total = count_calls(scratch / "count", clean)
    assert total > 50, "the life should make many writes and fsyncs"
    fired = failed_reports = 0
    for k in range(1, total + 1):
        root = scratch / f"run{k}"
        root.mkdir()
        inj = FaultInjector(str(root), fail_at=k, err=err, mode=mode)
        with inj.installed():
            life, clean_ok = run_life(root, clean, inj)
        fired += inj.fired
        failed_reports += bool(life.fates()[1])
        check_reopened(root, life, clean_ok, f"fault at call {k} ({os.strerror(err)}, {mode})")
        shutil.rmtree(root)  # kept when a check fails
    assert fired == total
    assert failed_reports > 0, "some fault should have hit an fsync covering appends"


class FsyncFaults(FaultInjector):
    """Counts and fails fsyncs only: writes go through, uncounted."""

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return self._pwrite(fd, data, offset)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return self._write(fd, data)


def test_a_failed_fsync_reports_failed_offsets_and_later_appends_are_durable(tmp_path: Path) -> None:
    life = Life(tmp_path)
    life.open()
    for _ in range(3):
        life.append()
    inj = FsyncFaults(str(tmp_path), fail_at=1, err=errno.EIO)
    with inj.installed():
        life.settle()
    assert inj.fired
    assert life.reports == [(False, 3)], "offsets 0-2 are reported failed, not durable"
    for _ in range(2):
        life.append()
    life.settle()
    assert life.reports == [(False, 3), (True, 5)], "a failed fsync stalls the stream for good"
    assert life.fates()[:2] == ({3, 4}, {0, 1, 2})
    life.stop(clean=True)
    again = Life(tmp_path, life=1)
    assert [r.payload for r in read_all(again.open())] == [payload(o) for o in range(5)]
    again.stop(clean=True)


def test_a_failed_write_holds_the_report_until_the_retry_writes_it(tmp_path: Path) -> None:
    """A write that fails is neither confirmed nor failed: it stays buffered, readable, and the next burst
    writes and confirms it with what came after."""
    life = Life(tmp_path)
    s = life.open()
    for _ in range(3):
        life.append()
    inj = FaultInjector(str(tmp_path), fail_at=1, err=errno.ENOSPC, mode="short")
    with inj.installed():
        life.settle()
    assert inj.fired and life.syncer.write_failing
    assert life.reports == []
    assert [r.payload for r in s.read(0, 10)] == [payload(o) for o in range(3)]
    life.append()
    life.settle()
    assert life.reports == [(True, 4)]
    life.stop(clean=False)
    again = Life(tmp_path, life=1)
    assert [r.payload for r in read_all(again.open())] == [payload(o) for o in range(4)]
    again.stop(clean=True)


def test_a_consume_segment_whose_write_failed_leaves_no_gap_after_a_crash(tmp_path: Path) -> None:
    """Found by the test above: the first consume-log segment's write fails, the later segments' go through,
    then kill -9. Recovery kept the later segments' entries behind the empty first segment: offsets 0-1
    were missing while 2-5 were there (none confirmed, but the stream had a hole and ``first_offset`` named
    an offset that could not be read). Now everything after the gap is cut: offsets stay contiguous."""
    life = Life(tmp_path)
    s = life.open()
    for _ in range(6):  # payloads of 40, 700, 2500, ... bytes: consume segments start at 0, 2, 4, 5
        life.append()
    assert [seg.first for seg in s._segs] == [0, 2, 4, 5]
    inj = FaultInjector(s._segs[0].file.path, fail_at=1, err=errno.ENOSPC)  # only this file's calls count
    with inj.installed():
        life.settle()
    assert inj.fired and life.reports == []
    life.stop(clean=False)
    again = Life(tmp_path, life=1)
    s = again.open()
    assert (s.first_offset, s.next_offset) == (0, 0)
    assert read_all(s) == []
    assert again.append() == 0
    again.settle()
    assert again.reports == [(True, 1)]
    again.stop(clean=True)
    third = Life(tmp_path, life=2)
    assert [r.payload for r in read_all(third.open())] == [payload(0, 1)]
    third.stop(clean=True)
