"""The queue shell's shared parts (broker/queues/credit_flow.py, broker/queues/confirm_book.py,
broker/queues/queue_shell.py): pausing publishers once per owner, settling owed confirms once, and what
deleting a queue of either type does with both."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.message import Message
from broker.observability.counters import GlobalCounters
from broker.queues.confirm_book import ConfirmBook, OffsetConfirmBook
from broker.queues.credit_flow import FLOW_HIGH, FLOW_LOW, PublisherFlow
from broker.queues.queue_process import QueueProcess
from broker.queues.queue_shell import CONFIRM_LATER, QueueShell
from broker.vhost import VHost
from protocol.fastcodec import build_content_header, shortstr


class Reader:
    """A publisher's reader: the reasons it is paused for, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def pause_for(self, reason: object) -> None:
        self.events.append(("pause", reason))

    def resume_for(self, reason: object) -> None:
        self.events.append(("resume", reason))


class Publisher:
    """A publisher's channel: the confirms it was given, (tag, stored)."""

    def __init__(self) -> None:
        self.confirmed: list[tuple[int, bool]] = []

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        self.confirmed.append((seq, stored))


def test_a_reader_is_paused_once_per_owner_and_every_paused_reader_resumes_once():
    owner = object()
    flow = PublisherFlow(owner)
    a, b = Reader(), Reader()
    flow.pause(a)
    flow.pause(a)
    flow.pause(b)
    assert flow and len(flow) == 2
    assert a.events == [("pause", owner)]
    flow.release()
    assert not flow
    assert a.events == [("pause", owner), ("resume", owner)]
    assert b.events == [("pause", owner), ("resume", owner)]
    flow.release()  # nobody paused: nothing resumed twice
    assert len(a.events) == 2


def test_the_confirm_book_settles_only_what_it_still_owes():
    p = Publisher()
    book = ConfirmBook()
    for tag in (1, 2, 3):
        book.add((p, tag))
    book.settle([(p, 2), (p, 9)], True)  # 9 was never owed (or settled already)
    book.settle([(p, 3), (p, 2)], False)
    assert p.confirmed == [(2, True), (3, False)]
    assert len(book) == 1
    book.settle_all()
    assert p.confirmed[-1] == (1, True) and not book


def test_the_offset_book_settles_a_durable_prefix_in_offset_order():
    p = Publisher()
    book = OffsetConfirmBook()
    for offset in (10, 11, 12, 13):
        book.append((offset, (p, offset + 100)))
    book.settle_below(12, True)
    assert p.confirmed == [(110, True), (111, True)]
    book.settle_below(13, False)  # a failed fsync below 13: that publish is nacked
    assert p.confirmed[-1] == (112, False)
    book.settle_below(13, True)
    assert len(book) == 1
    book.settle_all()
    assert p.confirmed[-1] == (113, True) and not book


def test_the_marks_leave_room_between_pausing_and_letting_go():
    assert 0 < FLOW_LOW < FLOW_HIGH


def message(key: str, body: bytes) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(delivery_mode=2).marshal())
    return Message("", key, shortstr("") + shortstr(key), header, body)


@pytest.mark.parametrize("arguments", [{}, {"x-queue-type": "stream"}], ids=["classic", "stream"])
async def test_deleting_a_queue_confirms_what_it_owes_once_and_lets_its_publishers_go(arguments):
    vh = VHost("/", counters=GlobalCounters(), clock=ManualClock(1_700_000_000_000.0))
    q, _ = vh.queues.declare("q", False, True, False, False, arguments, None)  # type: ignore[arg-type]
    assert isinstance(q, QueueShell)
    p, reader = Publisher(), Reader()
    assert q.deliver_or_enqueue(message("q", b"a"), True, (p, 1)) == CONFIRM_LATER
    q.throttle(reader)
    q.throttle(reader)
    assert q.awaiting_confirm() == 1 and p.confirmed == []
    vh.queues.delete(q)
    assert p.confirmed == [(1, True)]
    assert reader.events == [("pause", q), ("resume", q)]
    assert q.deleted and q.awaiting_confirm() == 0
    await asyncio.sleep(0)  # the stream's log would report the fsync now: it is gone, and nothing is owed
    if isinstance(q, QueueProcess):
        q.on_confirmed()  # as the store's fsync would, late
    assert p.confirmed == [(1, True)]
