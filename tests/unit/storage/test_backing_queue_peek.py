"""``peek_many`` (the HTTP API's peek, issue 18) on every in-process backing queue of the conformance
suite's ``VARIANTS``: it answers the ready messages in the order ``fetch`` takes them, requeued ones
first with their delivered flag, paged-out ones (betas, delta) read from disk, and changes nothing:
afterwards figures, RAM use and the fetch order are exactly what they were, and no message is marked
delivered."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.storage.test_backing_queue_conformance import VARIANTS, Subject, drain, msg


@pytest.fixture(params=list(VARIANTS))
def subject(request, tmp_path: Path) -> Subject:
    return VARIANTS[request.param](tmp_path)


def _state(bq) -> tuple:
    return bq.figures(), bq.len(), bq.ready_bytes(), bq.pending_ack_count(), bq.ram_bytes(), bq.head_expiry()


def test_peek_many_answers_fetch_order_and_changes_nothing(subject: Subject) -> None:
    bq = subject.bq
    seqs = [bq.publish(msg(i), 10, i % 3 == 0) for i in range(40)]
    subject.settle()
    before = _state(bq)
    peeked = bq.peek_many(15)
    assert [m for _, m, _ in peeked] == [msg(i) for i in range(15)]
    assert [s for s, _, _ in peeked] == seqs[:15]
    assert not any(d for _, _, d in peeked)
    assert _state(bq) == before
    assert bq.peek_many(15) == peeked  # twice the same: nothing moved
    got = drain(bq)
    assert [m for _, m, _ in got] == [msg(i) for i in range(40)]
    assert not any(d for _, _, d in got), "a peek must not mark messages delivered"


def test_peek_many_shows_requeued_messages_first_with_their_delivered_flag(subject: Subject) -> None:
    bq = subject.bq
    for i in range(10):
        bq.publish(msg(i), 10, True)
    taken = [bq.fetch(True) for _ in range(3)]
    bq.requeue([taken[1][0]])  # msg(1) goes back ahead of msg(3)
    subject.settle()
    peeked = bq.peek_many(4)
    assert [(m, d) for _, m, d in peeked] == [(msg(1), True), (msg(3), False), (msg(4), False), (msg(5), False)]
    assert bq.pending_ack_count() == 2 and bq.len() == 8
    assert [m for _, m, _ in drain(bq)] == [msg(i) for i in [1, *range(3, 10)]]


def test_peek_many_bounds(subject: Subject) -> None:
    bq = subject.bq
    assert bq.peek_many(5) == []
    for i in range(3):
        bq.publish(msg(i), 10, False)
    assert bq.peek_many(0) == []
    assert [m for _, m, _ in bq.peek_many(100)] == [msg(0), msg(1), msg(2)]


def test_peek_many_reads_through_every_part_of_a_paged_variable_queue(tmp_path: Path) -> None:
    # More than one index segment, so delta, q3 and q2 all hold messages once paged; then new
    # publishes land in q1 behind them.
    subject = VARIANTS["variable-durable-paging"](tmp_path)
    bq = subject.bq
    n = 2500
    for i in range(n):
        bq.publish(msg(i, 30), 30, i % 2 == 0)
    bq.set_ram_target(None)
    for i in range(n, n + 20):
        bq.publish(msg(i, 30), 30, True)
    subject.settle()
    assert bq.delta.count and bq.q3 and bq.q1, (bq.delta, len(bq.q3), len(bq.q1))
    parts = (len(bq.q4), len(bq.q3), bq.delta.count, len(bq.q2), len(bq.q1))
    before = _state(bq)
    peeked = bq.peek_many(n + 20)
    assert [m for _, m, _ in peeked] == [msg(i, 30) for i in range(n + 20)]
    assert (len(bq.q4), len(bq.q3), bq.delta.count, len(bq.q2), len(bq.q1)) == parts
    assert _state(bq) == before
    assert [m for _, m, _ in drain(bq)] == [msg(i, 30) for i in range(n + 20)]


def test_priority_queue_peeks_highest_priority_first(tmp_path: Path) -> None:
    bq = VARIANTS["priority-memory"](tmp_path).bq
    for body in (b"0:a", b"2:b", b"1:c", b"2:d", b"0:e"):
        bq.publish(body, 3, False)
    assert [m for _, m, _ in bq.peek_many(4)] == [b"2:b", b"2:d", b"1:c", b"0:a"]
    assert [s for s, _, _ in bq.peek_many(5)] == [s for s, _, _ in drain(bq)]
