"""The storage half of exactly-once delayed dispatch (storage/dispatch_evidence.py, storage/delay/store.py):
origin ids kept by queue indexes, segments pinned until a dispatch settles, dispatches in doubt after a crash.
The broker half and a real kill -9 are tested in tests/integration/delayed/test_delayed_in_doubt.py."""

from __future__ import annotations

import os
from pathlib import Path

from storage.delay import DelayRecord, DelayStore
from storage.dispatch_evidence import PIN, origin_epoch, origin_msg_id
from storage.queue_index import SEGMENT_ENTRIES, QueueIndex

T0 = 1_800_000_000_000


def _fill_segment(qi: QueueIndex, seg: int, origin: int | None = None) -> None:
    """Publish a whole segment of plain messages (the last one ``origin`` when given), then ack them all."""
    first = seg * SEGMENT_ENTRIES
    for s in range(first, first + SEGMENT_ENTRIES):
        mid = origin if origin is not None and s == first + SEGMENT_ENTRIES - 1 else s + 1
        qi.publish(s, mid, True, False, 10, None, b"x")
    qi.publish(first + SEGMENT_ENTRIES, 99, True, False, 10, None, b"x")  # moves on: seg is not written to now
    for s in range(first, first + SEGMENT_ENTRIES):
        qi.ack(s)


def test_an_origin_id_is_recognisable_and_never_made_by_new_msg_id() -> None:
    from storage.backing_queue import new_msg_id

    mid = origin_msg_id(12345, 77)
    assert mid >> 127 == 1 and mid & ((1 << 64) - 1) == 77 and origin_epoch(mid >> 64) == 12345
    assert all(new_msg_id() >> 127 == 0 for _ in range(1000))


def test_a_fully_acked_segment_holding_an_unsettled_dispatch_stays_until_it_settles(tmp_path: Path) -> None:
    qi = QueueIndex(str(tmp_path / "q"), None, durable=True)
    epoch = PIN.begin()
    _fill_segment(qi, 0, origin=origin_msg_id(epoch, 4242))
    assert os.path.exists(tmp_path / "q" / "00000000.idx"), "deleted before its dispatch settled"
    assert qi.origins_held({4242, 4243}) == {4242}
    PIN.settle([epoch])
    assert not os.path.exists(tmp_path / "q" / "00000000.idx")
    assert qi.origins_held({4242}) == set()


def test_a_segment_without_dispatches_is_deleted_at_once(tmp_path: Path) -> None:
    qi = QueueIndex(str(tmp_path / "q"), None, durable=True)
    open_epoch = PIN.begin()  # an unsettled dispatch elsewhere pins nothing here
    _fill_segment(qi, 0)
    assert not os.path.exists(tmp_path / "q" / "00000000.idx")
    PIN.settle([open_epoch])


def test_recovery_keeps_the_dispatches_a_pinned_segment_proves_before_deleting_it(tmp_path: Path) -> None:
    qi = QueueIndex(str(tmp_path / "q"), None, durable=True)
    epoch = PIN.begin()
    _fill_segment(qi, 0, origin=origin_msg_id(epoch, 4242))
    qi.close(None)  # a crash: no clean terms
    again = QueueIndex(str(tmp_path / "q"), None, durable=True)
    segments = list(again.scan_all())
    assert [seg for seg, _, live in segments if live] == [1]
    assert not os.path.exists(tmp_path / "q" / "00000000.idx")  # fully acked: gone at recovery ...
    assert again.origins_held({4242}) == {4242}  # ... after giving up its proof
    PIN.settle([epoch])


def test_a_dispatch_begun_and_not_marked_is_in_doubt_after_a_crash_and_not_handed_out(tmp_path: Path) -> None:
    now = [T0]
    store = DelayStore(str(tmp_path / "d"), None, lambda: now[0])
    seqs = [store.append(DelayRecord(T0 + 10 * i, 1, b"k", b"", b"m%d" % i)) for i in range(3)]
    store.checkpoint()  # durable (no syncer in this test)
    now[0] = T0 + 100
    batch = store.due(10)
    assert [d.record.seq for d in batch] == seqs
    store.begin(batch[:2])
    durable = []
    store.when_durable(durable.append)
    assert durable == [True]
    store.dispatched(batch[:1])
    store.when_durable(durable.append)
    store.abandon()  # kill -9: seq 1 begun and not marked, seq 2 handed out and not begun

    again = DelayStore(str(tmp_path / "d"), None, lambda: now[0])
    assert [d.record.seq for d in again.due(10)] == [seqs[2]]  # in doubt: not handed out
    doubt = again.take_in_doubt()
    assert [(d.record.seq, d.record.body) for d in doubt] == [(seqs[1], b"m1")]
    assert again.take_in_doubt() == []  # once
    again.dispatched(doubt)
    again.close()
    third = DelayStore(str(tmp_path / "d"), None, lambda: now[0])
    assert third.take_in_doubt() == [] and [d.record.seq for d in third.due(10)] == [seqs[2]]
    third.close()


def test_an_in_doubt_record_given_back_comes_out_once(tmp_path: Path) -> None:
    now = [T0]
    store = DelayStore(str(tmp_path / "d"), None, lambda: now[0])
    seq = store.append(DelayRecord(T0 + 10, 1, b"k", b"", b"m"))
    store.checkpoint()
    now[0] = T0 + 100
    batch = store.due(10)
    store.begin(batch)
    store.when_durable(lambda ok: None)
    store.abandon()
    again = DelayStore(str(tmp_path / "d"), None, lambda: now[0])
    doubt = again.take_in_doubt()
    again.release(doubt)  # e.g. its publish failed: it is handed out again, once
    out = again.due(10) + again.due(10)
    assert [d.record.seq for d in out] == [seq]
    again.close()
