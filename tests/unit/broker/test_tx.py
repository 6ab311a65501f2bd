"""Transactions (broker/amqp/tx.py): work held until commit and handed back in order, rollback returning the
held acks, commit-ok only once the committed persistent publishes are on disk (several commits answered
together), and a failed store turning into a commit failure."""

from __future__ import annotations

from broker.amqp.tx import COMMIT_FAILED, Transaction


def test_work_is_held_in_order_and_handed_back_at_commit():
    tx = Transaction()
    tx.add_publish("m1")
    tx.add_settle("ack", [(1, "d1"), (2, "d2")])
    tx.add_publish("m2")
    tx.add_settle("discard", [(3, "d3")])
    assert len(tx) == 4
    assert tx.commit() == [("publish", "m1"), ("ack", [(1, "d1"), (2, "d2")]), ("publish", "m2"),
                           ("discard", [(3, "d3")])]
    assert len(tx) == 0
    assert tx.commit() == []


def test_a_commit_of_transient_work_is_answered_at_once():
    tx = Transaction()
    tx.add_publish("m")
    tx.commit()
    tx.routed(0)
    assert tx.applied() == 1
    assert tx.applied() == 1  # an empty commit too


def test_commit_ok_waits_for_every_committed_persistent_publish():
    tx = Transaction()
    tx.commit()
    tx.routed(2)  # one publish in two durable queues
    tx.routed(1)
    assert tx.applied() == 0
    assert tx.synced() == 0
    assert tx.synced() == 0
    assert tx.synced() == 1


def test_commits_pipelined_behind_a_sync_are_answered_together():
    tx = Transaction()
    tx.commit()
    tx.routed(1)
    assert tx.applied() == 0
    tx.commit()  # a second commit with nothing to sync still waits behind the first
    assert tx.applied() == 0
    assert tx.synced() == 2
    assert tx.synced(0) == 0  # nothing left to answer


def test_a_failed_store_fails_the_commit_once_every_publish_answered():
    tx = Transaction()
    tx.commit()
    tx.routed(2)
    assert tx.applied() == 0
    assert tx.synced(stored=False) == 0  # still waiting for the other queue
    assert tx.synced() == COMMIT_FAILED


def test_tokens_are_negative_and_distinct():
    tx = Transaction()
    tokens = [tx.next_token() for _ in range(3)]
    assert tokens == [-1, -2, -3]


def test_rollback_returns_the_held_acks_and_drops_the_publishes():
    tx = Transaction()
    tx.add_publish("m")
    tx.add_settle("ack", [(1, "d1")])
    tx.add_settle("requeue", [(2, "d2"), (3, "d3")])
    assert tx.held_acks() == [(1, "d1"), (2, "d2"), (3, "d3")]
    assert tx.rollback() == [(1, "d1"), (2, "d2"), (3, "d3")]
    assert len(tx) == 0
    assert tx.rollback() == []
