"""Quorum-queue semantics across the members of a cluster (issue 15: "the integration suite's quorum-queue tests
pass against a two-node cluster"): the returns that make ``x-delivery-count`` and the delivery limit are counted
in PostgreSQL, so a message returned on one member and delivered by the other carries the count of every return
so far, and the limit dead-letters it whichever member saw the last return. (The suite's own quorum tests run
against a cluster with ``LEVERET_TEST_CLUSTER=2 pytest -m quorum tests/integration``, which ``make test`` does;
these put every return on alternating members, which a single-consumer test cannot.) Real broker processes,
a real PostgreSQL (tests/pg_server.py), pika clients."""

from __future__ import annotations

import pika
import pytest

from tests.integration.cluster.test_cluster_definitions import member
from tests.integration.cluster.test_cluster_quorum import got_one
from tests.integration.management.test_management_api import wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

QUORUM = {"x-queue-type": "quorum"}


def channel(b) -> pika.adapters.blocking_connection.BlockingChannel:
    return pika.BlockingConnection(b.pika_params()).channel()


def test_x_delivery_count_counts_returns_made_on_either_member(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    ch_a, ch_b = channel(a), channel(b)
    ch_a.queue_declare("work", durable=True, arguments=QUORUM)
    assert wait_for(lambda: _declared(ch_b, "work"), 30)
    ch_a.confirm_delivery()
    ch_a.basic_publish("", "work", b"m", pika.BasicProperties(headers={"app": 1}))
    seen = []
    for i in range(5):  # got on b, a, b, a, b; each one but the last returned with a nack
        ch = ch_b if i % 2 == 0 else ch_a
        method, props, body = wait_for(lambda ch=ch: got_one(ch, "work"), 30)
        assert body == b"m" and props.headers["app"] == 1
        seen.append((method.redelivered, props.headers.get("x-delivery-count", 0)))
        if i < 4:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
    assert seen == [(False, 0), (True, 1), (True, 2), (True, 3), (True, 4)]


def test_a_priority_quorum_queue_counts_and_serves_as_the_cluster_does(start_broker, pg_dsn):
    """``x-max-priority`` on a quorum queue: one store per priority level, wrapped (storage/priority_queue.py
    SharedPriorityBackingQueue). Before the wrapper passed the shared store's calls on, each member counted
    returns itself (x-delivery-count 1, 1, 1, 1 where it is 1, 2, 3, 4), and a basic.get or declare-ok on the
    member that did not publish answered before PostgreSQL's rows were read (get-empty, message_count 0)."""
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    ch_a, ch_b = channel(a), channel(b)
    ch_a.queue_declare("prio", durable=True, arguments={**QUORUM, "x-max-priority": 5})
    assert wait_for(lambda: _declared(ch_b, "prio"), 30)
    ch_a.confirm_delivery()
    ch_a.basic_publish("", "prio", b"low", pika.BasicProperties(priority=1))
    ch_a.basic_publish("", "prio", b"high", pika.BasicProperties(priority=4))
    # At once on b (no polling): the declare-ok counts a's confirmed messages, the get finds the highest.
    assert ch_b.queue_declare("prio", passive=True).method.message_count == 2
    for want in (b"high", b"low"):
        method, _props, body = ch_b.basic_get("prio")
        assert body == want, body
        ch_b.basic_ack(method.delivery_tag)
    # Returns (nack with requeue) on alternating members: each counted, whichever member saw it. (One message
    # at a time: the priority order of messages returned on another member is each member's own reading.)
    ch_a.basic_publish("", "prio", b"m", pika.BasicProperties(priority=3))
    seen = []
    for i in range(5):  # on b, a, b, a, b
        ch = ch_a if i % 2 else ch_b
        method, props, body = wait_for(lambda ch=ch: got_one(ch, "prio"), 30)
        assert body == b"m"
        seen.append((method.redelivered, (props.headers or {}).get("x-delivery-count", 0)))
        if i < 4:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
    assert seen == [(False, 0), (True, 1), (True, 2), (True, 3), (True, 4)]


def test_the_delivery_limit_holds_across_members(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    ch_a, ch_b = channel(a), channel(b)
    ch_a.exchange_declare("dlx", "fanout", durable=True)
    ch_a.queue_declare("dead", durable=True, arguments=QUORUM)
    ch_a.queue_bind("dead", "dlx")
    ch_a.queue_declare("work", durable=True,
                       arguments={**QUORUM, "x-delivery-limit": 2, "x-dead-letter-exchange": "dlx"})
    assert wait_for(lambda: _declared(ch_b, "work") and _declared(ch_b, "dead"), 30)
    ch_a.confirm_delivery()
    ch_a.basic_publish("", "work", b"poison")
    counts = []
    for i in range(3):  # delivered on b, a, b: the third return is one too many
        ch = ch_b if i % 2 == 0 else ch_a
        method, props, body = wait_for(lambda ch=ch: got_one(ch, "work"), 30)
        assert body == b"poison"
        counts.append((props.headers or {}).get("x-delivery-count", 0))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [0, 1, 2]
    _method, props, body = wait_for(lambda: got_one(ch_a, "dead"), 30)  # dead-lettered by b, read on a
    assert body == b"poison"
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == ("work", "delivery_limit", 1)
    assert got_one(ch_a, "work") is None and got_one(ch_b, "work") is None


def _declared(ch, name: str) -> bool:
    """Whether a passive declare of ``name`` succeeds (on a channel of ``ch``'s connection)."""
    probe = ch.connection.channel()
    try:
        probe.queue_declare(name, passive=True)
        probe.close()
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
