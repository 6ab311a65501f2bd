"""The queue index: embedding under queue_index_embed_msgs_below, segment files and their deletion,
delivered flags, torn tails."""

from __future__ import annotations

import os
from pathlib import Path

from storage.queue_index import SEGMENT_ENTRIES, QueueIndex
from storage.syncer import Syncer


def test_small_messages_are_embedded_large_ones_go_to_the_store(harness) -> None:
    h = harness(durable=True)
    vq = h.vq
    vq.publish(b"a" * 4095, 4095, True)
    assert len(h.ns.persistent) == 0
    vq.publish(b"b" * 4096, 4096, True)
    assert len(h.ns.persistent) == 1
    vq.publish(b"c" * 10, 10, False)  # transient: not written at all until paged out
    assert len(h.ns.persistent) == 1 and len(h.ns.transient) == 0
    assert [m for _, m, _ in (vq.fetch(False) for _ in range(3))] == [b"a" * 4095, b"b" * 4096, b"c" * 10]
    assert len(h.ns.persistent) == 0


def test_the_threshold_is_configurable(harness) -> None:
    h = harness(durable=True, queue_index_embed_msgs_below=100)
    h.vq.publish(b"x" * 100, 100, True)
    h.vq.publish(b"x" * 99, 99, True)
    assert len(h.ns.persistent) == 1


def test_segments_are_deleted_once_all_acked(tmp_path: Path) -> None:
    syncer = Syncer()
    qi = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    n = SEGMENT_ENTRIES * 2 + 10
    for s in range(n):
        qi.publish(s, None, True, False, 3, None, b"abc")
    syncer.flush()
    assert qi.segment_numbers() == [0, 1, 2]
    for s in range(SEGMENT_ENTRIES):
        qi.deliver(s)
    entries = qi.read_segment(0, 0, SEGMENT_ENTRIES)
    assert len(entries) == SEGMENT_ENTRIES and all(e.delivered for e in entries)
    assert qi.read_body(5, entries[5].body_pos, 3) == b"abc"
    for s in range(SEGMENT_ENTRIES + 5):
        qi.ack(s)
    assert qi.segment_numbers() == [1, 2]
    assert [e.seq_id for e in qi.read_segment(1, 0, n)][:2] == [SEGMENT_ENTRIES + 5, SEGMENT_ENTRIES + 6]
    for s in range(SEGMENT_ENTRIES + 5, n):
        qi.ack(s)
    syncer.flush()
    assert qi.segment_numbers() == [2], "the segment being written stays while publishes go on in it"
    qi.publish(SEGMENT_ENTRIES * 3, None, True, False, 3, None, b"abc")  # publishes move on to segment 3
    assert qi.segment_numbers() == [3]
    qi.ack(SEGMENT_ENTRIES * 3)
    qi.close({"any": 1})
    reopened = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    reopened.recover_terms()
    assert reopened.segment_numbers() == [], "a clean start drops a written segment with nothing unacked"


def test_a_consumer_that_keeps_up_does_not_make_a_file_per_message(tmp_path: Path) -> None:
    """Publish, ack, publish, ack... in one segment: its file is created once and kept (it used to be unlinked
    by each ack that emptied it and created again by the next publish)."""
    syncer = Syncer()
    qi = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    qi.publish(0, None, True, False, 3, None, b"abc")
    syncer.flush()
    one = os.path.getsize(qi._path(0))  # the file holding one publish
    for s in range(1, 200):
        qi.ack(s - 1)
        qi.publish(s, None, True, False, 3, None, b"abc")
    syncer.flush()
    # Kept: it holds every publish and ack (a file made again by the last publish would hold one publish).
    assert os.path.getsize(qi._path(0)) > 199 * one
    live = qi.read_segment(0, 0, SEGMENT_ENTRIES)
    assert [e.seq_id for e in live] == [199], "only the last message is unacked"


def test_torn_index_tail_is_cut_on_dirty_recovery(tmp_path: Path) -> None:
    syncer = Syncer()
    qi = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    for s in range(10):
        qi.publish(s, None, True, False, 3, None, b"abc")
    syncer.sync()
    path = tmp_path / "q" / "00000000.idx"
    os.truncate(path, path.stat().st_size - 5)
    qi2 = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    assert qi2.recover_terms() is None
    found = list(qi2.scan_all())
    assert [e.seq_id for e in found[0][2]] == list(range(9))
    assert found[0][1] == 8  # the highest seq_id left


def test_transient_queue_index_starts_empty(tmp_path: Path) -> None:
    qi = QueueIndex(str(tmp_path / "q"), None, durable=False)
    qi.publish(0, None, False, False, 1, None, b"x")
    qi.close(None)
    qi2 = QueueIndex(str(tmp_path / "q"), None, durable=False)
    assert qi2.segment_numbers() == []


def test_acks_in_one_call_are_one_record_per_segment_and_recover(tmp_path: Path) -> None:
    """ack_many (a consumer's multiple ack): one record per segment for the run; a dirty recovery replays it
    as the single acks it replaces, and a segment whose every entry the batch acks goes as with single acks."""
    syncer = Syncer()
    qi = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    n = SEGMENT_ENTRIES + 20
    for s in range(n):
        qi.publish(s, None, s % 2 == 0, False, 3, None, b"abc")
    syncer.flush()
    before = os.path.getsize(qi._path(1))
    qi.ack_many([(s, s % 2 == 0) for s in range(SEGMENT_ENTRIES + 10, SEGMENT_ENTRIES + 15)])
    syncer.flush()
    assert os.path.getsize(qi._path(1)) - before == 12 + 1 + 5 * 8, "one record: header, kind, five seq_ids"
    qi.ack_many([(s, s % 2 == 0) for s in range(SEGMENT_ENTRIES)] + [(SEGMENT_ENTRIES + 1, False)])
    assert qi.segment_numbers() == [1], "segment 0 fully acked: deleted without writing its acks"
    syncer.sync()
    qi2 = QueueIndex(str(tmp_path / "q"), syncer, durable=True)
    assert qi2.recover_terms() is None
    ((seg, top, live),) = list(qi2.scan_all())
    assert (seg, top) == (1, n - 1)
    acked = {SEGMENT_ENTRIES + 1, *range(SEGMENT_ENTRIES + 10, SEGMENT_ENTRIES + 15)}
    assert [e.seq_id for e in live] == [s for s in range(SEGMENT_ENTRIES, n) if s % 2 == 0 and s not in acked]
