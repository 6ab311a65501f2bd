"""Publisher-confirm bookkeeping (broker/amqp/confirms.py): publishes settled at once or after their queues'
fsync, the acks of one tick folded into one multiple=true ack up to the oldest publish still waiting, gaps
and nacks, one flush request per tick, and messages_unconfirmed."""

from __future__ import annotations

from broker.amqp.confirms import Confirms, fold_acks


def numbered(c: Confirms) -> int:
    c.seq += 1
    return c.seq


def test_fold_acks_consecutive_and_after_the_oldest_waiting():
    assert fold_acks([], None) == []
    assert fold_acks([1], None) == [(1, False)]
    assert fold_acks([1, 2, 3], None) == [(3, True)]
    # 4 still waits for a queue: acks below it fold, later ones go one by one.
    assert fold_acks([1, 2, 3, 5, 6], 4) == [(3, True), (5, False), (6, False)]
    assert fold_acks([2, 5], 4) == [(2, False), (5, False)]
    assert fold_acks([5, 6], 1) == [(5, False), (6, False)]


def test_consecutive_confirms_of_a_tick_fold_into_one_multiple_ack():
    c = Confirms()
    firsts = [c.published(numbered(c), 0, False) for _ in range(5)]
    assert firsts == [True, False, False, False, False]  # one flush request per tick, not per message
    assert c.messages_unconfirmed == 5
    assert c.take() == ([], [(5, True)], 5)
    assert c.messages_unconfirmed == 0
    assert c.take() == ([], [], 0)
    # The next tick asks for a flush again.
    assert c.published(numbered(c), 0, False) is True
    assert c.take() == ([], [(6, False)], 1)


def test_a_gap_waiting_for_a_queue_stops_the_fold():
    c = Confirms()
    c.published(numbered(c), 0, False)  # 1 settled now
    c.published(numbered(c), 1, False)  # 2 waits for one queue's fsync
    c.published(numbered(c), 0, False)  # 3
    c.published(numbered(c), 0, False)  # 4
    assert c.messages_unconfirmed == 4
    assert c.take() == ([], [(1, False), (3, False), (4, False)], 3)
    assert c.messages_unconfirmed == 1
    assert c.queue_answered(2, True) is True
    assert c.take() == ([], [(2, False)], 1)
    assert c.messages_unconfirmed == 0


def test_a_publish_waits_for_every_queue_and_a_failed_store_nacks_it():
    c = Confirms()
    c.published(numbered(c), 2, False)  # 1: two queues
    c.published(numbered(c), 3, False)  # 2: three queues
    assert c.queue_answered(1, True) is False
    assert c.queue_answered(2, False) is False  # one queue failed its fsync
    assert c.queue_answered(1, True) is True
    assert c.queue_answered(2, True) is False
    assert c.take() == ([], [(1, False)], 1)
    assert c.queue_answered(2, True) is True
    assert c.take() == ([2], [], 0)  # nacked, although two of its queues stored it
    assert c.queue_answered(2, True) is False  # an answer for a settled publish is ignored
    assert c.messages_unconfirmed == 0


def test_a_nack_in_the_middle_goes_first_and_the_acks_around_it_still_fold():
    c = Confirms()
    c.published(numbered(c), 0, False)  # 1
    c.published(numbered(c), 0, False)  # 2
    c.published(numbered(c), 0, True)  # 3 refused by a queue (e.g. overflow reject-publish)
    c.published(numbered(c), 0, False)  # 4
    c.published(numbered(c), 0, False)  # 5
    assert c.messages_unconfirmed == 5
    assert c.take() == ([3], [(5, True)], 4)


def test_a_refused_publish_waiting_for_other_queues_is_nacked_once_they_answer():
    c = Confirms()
    c.published(numbered(c), 1, True)
    assert not c.settled
    c.queue_answered(1, True)
    assert c.settled
    assert c.take() == ([1], [], 0)


def test_confirms_settled_out_of_order_are_sorted_before_folding():
    c = Confirms()
    for _ in range(4):
        c.published(numbered(c), 1, False)
    for seq in (3, 1, 4, 2):
        c.queue_answered(seq, True)
    assert c.take() == ([], [(4, True)], 4)


def test_clear_forgets_everything():
    c = Confirms()
    c.published(numbered(c), 1, False)
    c.published(numbered(c), 0, False)
    c.clear()
    assert c.messages_unconfirmed == 0
    assert not c.settled
    assert c.queue_answered(1, True) is False
