"""More of what clients on two members of a Leveret cluster (issue 15) see of one quorum queue, judged by what
RabbitMQ 3.10 does with a quorum queue on one node: unacked deliveries of a consumer on one member that cancels
and closes, or recovers, reach a consumer on the other at once and in order; a purge or a delete made on one
member while the other holds deliveries (purge-ok and delete-ok counts, what a get on the other member sees
right after a purge-ok); queue.delete(if_unused) beside another member's consumer; consumer priorities across
members; a byte limit with reject-publish; a multiple nack with requeue. (Two probes of this session found
differences left as they are, written down in README.md: consumers with room on two members do not share a
stream of publishes made on one of them, and a TTL queue whose consumer on the publishing member is full may
deliver a message or two out of order on the other member; both since addressed by issue 35:
test_cluster_fair_delivery.py, test_cluster_ttl_order.py.) Real broker processes, a real PostgreSQL (tests/pg_server.py), pika clients."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from tests.integration.cluster.test_cluster_cross_member import QUORUM, ready, two
from tests.integration.cluster.test_cluster_forwarding import channel, known_on
from tests.integration.cluster.test_cluster_overflow import publish_confirmed
from tests.integration.cluster.test_cluster_quorum import got_one
from tests.integration.management.test_management_api import wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

# Seconds within which messages returned to the queue (a consumer gone, basic.recover, a nack with requeue) must
# be delivered again "at once": under 1 s on a quiet machine, but a CI machine (2 cores, load 6-10, brokers and
# PostgreSQL starting beside) can hold a delivery back for seconds. What the bound rules out is a return that
# waits for the holder's lease (15 s) to lapse, or never comes.
AT_ONCE = 5.0


class Consumer:
    """A manual-ack consumer on its own connection to ``m``, recording (body, redelivered, x-delivery-count,
    delivery tag, monotonic time) without acking."""

    def __init__(self, m, queue: str, prefetch: int, **arguments):
        self.conn, self.ch = channel(m)
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[bytes, bool, int, int, float]] = []
        self.cancelled_by_broker = False
        self.ch.add_on_cancel_callback(lambda _frame: setattr(self, "cancelled_by_broker", True))
        self.tag = self.ch.basic_consume(queue, self._on, arguments=arguments or None)

    def _on(self, _ch, method, props, body) -> None:
        count = (props.headers or {}).get("x-delivery-count", 0)
        self.got.append((body, method.redelivered, count, method.delivery_tag, time.monotonic()))

    def bodies(self) -> list[bytes]:
        return [g[0] for g in self.got]


def pump(consumers, until=lambda: False, seconds: float = 5.0) -> bool:
    """Process every consumer's connection until ``until()`` or ``seconds``; whether ``until()`` held."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for c in consumers:
            c.conn.process_data_events(time_limit=0.02)
        if until():
            return True
    return until()


def declared(a, b, queue: str, **arguments) -> None:
    conn, ch = channel(a)
    ch.queue_declare(queue, durable=True, arguments={**QUORUM, **arguments})
    conn.close()
    assert known_on(b, queue)
    assert ready(b, queue) == 0  # b has the queue open


@pytest.mark.parametrize("how", ["cancel-then-close", "connection-close"])
def test_unacked_of_a_consumer_that_goes_away_reach_the_other_member_at_once_in_order(start_broker, pg_dsn, how):
    """a's consumer holds 5 unacked. RabbitMQ: basic.cancel leaves them with the channel (a may still ack
    one), and the channel's close returns the rest; a consumer on b gets them redelivered, in order, at once."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q1")
    on_a = Consumer(a, "q1", 10)
    publish_confirmed(a, "q1", [b"m%d" % i for i in range(5)])
    assert pump([on_a], lambda: len(on_a.got) == 5, 30), on_a.bodies()
    on_b = Consumer(b, "q1", 10)
    pump([on_b], seconds=0.3)
    assert on_b.got == [], "b got messages a's consumer holds unacked"
    expected = [b"m%d" % i for i in range(5)]
    if how == "cancel-then-close":
        on_a.ch.basic_cancel(on_a.tag)
        pump([on_a, on_b], seconds=0.7)
        assert on_b.bodies() == [], f"after a's basic.cancel only (its channel open), b got {on_b.bodies()}"
        on_a.ch.basic_ack(on_a.got[0][3])  # still a's to ack (RabbitMQ)
        pump([on_a], seconds=0.2)
        assert on_a.ch.is_open, "a's ack after basic.cancel closed its channel"
        expected = expected[1:]
    closed = time.monotonic()
    on_a.conn.close()
    pump([on_b], lambda: len(on_b.got) >= len(expected), 30)
    late = [round(g[4] - closed, 2) for g in on_b.got if g[4] - closed > AT_ONCE]
    print(f"\n{how}: b's x-delivery-count {[g[2] for g in on_b.got]} (RabbitMQ 3.10: 1, a return counted), "
          f"last after {max((g[4] - closed for g in on_b.got), default=0):.2f} s")
    assert [(g[0], g[1]) for g in on_b.got] == [(x, True) for x in expected] and not late, (
        f"b got {[(g[0], g[1]) for g in on_b.got]}, expected {expected} redelivered; late (s): {late}")
    on_b.conn.close()


def test_basic_recover_requeue_on_one_member_redelivers_at_once(start_broker, pg_dsn):
    """basic.recover(requeue=true) on a's channel holding 5 unacked: RabbitMQ requeues them; each is
    delivered again, redelivered, once, to a's or b's consumer, at once (AT_ONCE)."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q2")
    on_a = Consumer(a, "q2", 5)
    publish_confirmed(a, "q2", [b"m%d" % i for i in range(5)])
    assert pump([on_a], lambda: len(on_a.got) == 5, 30), on_a.bodies()
    on_b = Consumer(b, "q2", 10)
    pump([on_b], seconds=0.3)
    assert on_b.got == []
    on_a.got.clear()
    t0 = time.monotonic()
    on_a.ch.basic_recover(requeue=True)
    pump([on_a, on_b], lambda: len(on_a.got) + len(on_b.got) >= 5, 30)
    pump([on_a, on_b], seconds=0.3)  # nothing more
    again = sorted(on_a.got + on_b.got, key=lambda g: g[4])
    late = [round(g[4] - t0, 2) for g in again if g[4] - t0 > AT_ONCE]
    print(f"\nafter recover: a {on_a.bodies()}, b {on_b.bodies()}")
    assert sorted(g[0] for g in again) == [b"m%d" % i for i in range(5)] and all(g[1] for g in again) \
        and not late, (f"again: {[(g[0], g[1]) for g in again]}; late (s): {late}")
    on_a.conn.close()
    on_b.conn.close()


@pytest.mark.parametrize("ttl", [None, 60_000])
def test_purge_on_one_member_while_the_other_holds_unacked_and_reserved(start_broker, pg_dsn, ttl):
    """a's consumer (prefetch 5) holds m0..m4 unacked; 20 more are ready. A purge on b answers 20 (RabbitMQ
    counts the ready ones) and none of them is delivered afterwards, on a or b; a's 5, nacked with requeue,
    come back (redelivered, to a's consumer or b's) and are all that is left. With a queue TTL (60 s, nothing expires), a judges
    the head it has no room to deliver: the rows it reserves for that must be purged as well."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q3", **({"x-message-ttl": ttl} if ttl else {}))
    on_a = Consumer(a, "q3", 5)
    publish_confirmed(a, "q3", [b"m%d" % i for i in range(5)])
    assert pump([on_a], lambda: len(on_a.got) == 5, 30), on_a.bodies()
    publish_confirmed(a, "q3", [b"r%d" % i for i in range(20)])
    pump([on_a], seconds=0.5)
    conn_b, ch_b = channel(b)
    purged = ch_b.queue_purge("q3").method.message_count
    on_b = Consumer(b, "q3", 50)
    pump([on_a, on_b], seconds=0.5)
    tags = [g[3] for g in on_a.got]
    on_a.ch.basic_nack(tags[-1], multiple=True, requeue=True)
    pump([on_a, on_b], seconds=3.0)  # past RELEASE_IDLE_AFTER (2 s) too
    after = [(g[0], g[1]) for g in on_a.got[5:]] + [(g[0], g[1], "b") for g in on_b.got]
    left = {"a": ready(a, "q3"), "b": ready(b, "q3")}
    for c in (on_a, on_b):
        c.conn.close()
    conn_b.close()
    # Either consumer may take the requeued five (RabbitMQ hands a requeued message to any consumer with
    # credit; since delivery is dealt across members by free credit, b's often gets some): what counts is
    # that they all come back, redelivered, and nothing purged does.
    got_back = sorted((g[0], g[1]) for g in on_a.got[5:] + on_b.got)
    assert purged == 20 and got_back == sorted((b"m%d" % i, True) for i in range(5)), (
        f"purge-ok {purged} (expected 20); delivered after the purge and the nack: {after} (expected m0..m4 "
        f"redelivered, nothing purged)")
    print(f"\nready after: {left}")


def test_delete_on_one_member_cancels_the_consumer_on_the_other(start_broker, pg_dsn):
    """queue.delete on b while a's consumer is attached (holding one unacked of 3): RabbitMQ sends the consumer
    basic.cancel (consumer_cancel_notify, which pika advertises), answers delete-ok with the ready count
    (rabbit_quorum_queue:delete/4: 2 here), and the queue is gone: a passive declare on either member is 404."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q4")
    on_a = Consumer(a, "q4", 1)
    publish_confirmed(a, "q4", [b"m0", b"m1", b"m2"])
    assert pump([on_a], lambda: len(on_a.got) == 1), on_a.bodies()
    conn_b, ch_b = channel(b)
    t0 = time.monotonic()
    deleted = ch_b.queue_delete("q4").method.message_count
    conn_b.close()
    cancelled = pump([on_a], lambda: on_a.cancelled_by_broker, 30)
    took = time.monotonic() - t0
    print(f"\ndelete-ok count {deleted}; a's consumer cancelled: {cancelled} after {took:.2f} s")
    # The follower replays b's delete within its 0.5 s poll (ms with the doorbell); what must not happen is a's
    # consumer left attached (never cancelled). 10 s: far below the 30 s wait, room for a loaded 2-core machine.
    assert cancelled and took < 10.0, f"a's consumer cancelled by the broker: {cancelled} ({took:.2f} s)"
    assert on_a.bodies() == [b"m0"], on_a.bodies()
    on_a.conn.close()
    assert deleted == 2, f"b's delete-ok message_count {deleted}; RabbitMQ's is the ready messages (m1, m2): 2"
    for m in (a, b):
        conn, ch = channel(m)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.queue_declare("q4", passive=True)
        assert exc.value.reply_code == 404
        conn.close()


def test_consumer_priorities_across_members_deliver_each_message_once(start_broker, pg_dsn):
    """x-priority 10 on a's consumer, 0 on b's, both prefetch 50, 30 published on b: RabbitMQ gives every
    one to the higher-priority consumer (it has room); in a Leveret cluster a consumer's priority counts among
    its own member's consumers only (README.md). Asserted: all 30 arrive, once."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q5")
    high = Consumer(a, "q5", 50, **{"x-priority": 10})
    low = Consumer(b, "q5", 50, **{"x-priority": 0})
    pump([high, low], seconds=0.3)
    publish_confirmed(b, "q5", [b"m%d" % i for i in range(30)])
    pump([high, low], lambda: len(high.got) + len(low.got) >= 30, 30)
    pump([high, low], seconds=0.2)
    print(f"\nx-priority 10 on a got {len(high.got)}, x-priority 0 on b (the publisher's member) got "
          f"{len(low.got)} (RabbitMQ: 30 / 0)")
    assert sorted(high.bodies() + low.bodies()) == sorted(b"m%d" % i for i in range(30))
    for c in (high, low):
        c.conn.close()


def test_max_length_bytes_reject_publish_across_members(start_broker, pg_dsn):
    """x-max-length-bytes 100, reject-publish; 20-byte bodies. a's publishes fill it (some confirmed, then
    nacked); afterwards b's publishes are nacked too, and what is in the queue is a's, at most 100 bytes
    (RabbitMQ's quorum queue may take one past the limit: only ``<= 120`` is asserted)."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q6", **{"x-max-length-bytes": 100, "x-overflow": "reject-publish"})
    from_a = publish_confirmed(a, "q6", [b"a%019d" % i for i in range(8)])
    assert wait_for(lambda: ready(b, "q6") == from_a.count(True), 30), (from_a, ready(b, "q6"))
    from_b = publish_confirmed(b, "q6", [b"b%019d" % i for i in range(3)])
    print(f"\na: {from_a}; b: {from_b}")
    assert 5 <= from_a.count(True) <= 6 and from_a[-1] is False, from_a
    assert from_b == [False] * 3, f"b's publishes into a full queue: {from_b} (expected all nacked)"
    conn, ch = channel(b)
    bodies = []
    while (answer := got_one(ch, "q6")) is not None:
        bodies.append(answer[2])
        ch.basic_ack(answer[0].delivery_tag)
    conn.close()
    assert all(x.startswith(b"a") for x in bodies) and len(bodies) == from_a.count(True), bodies


def test_nack_multiple_requeue_on_one_member_returns_all_in_order(start_broker, pg_dsn):
    """5 published on a, delivered to b's consumer; basic.nack(multiple, requeue) of the last tag: all five
    come back to b, in order, redelivered, x-delivery-count 1 (RabbitMQ 3.10's quorum queue)."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q7")
    on_b = Consumer(b, "q7", 10)
    publish_confirmed(a, "q7", [b"m%d" % i for i in range(5)])
    assert pump([on_b], lambda: len(on_b.got) == 5), on_b.bodies()
    first = [(g[0], g[1], g[2]) for g in on_b.got]
    last_tag = on_b.got[-1][3]
    on_b.got.clear()
    t0 = time.monotonic()
    on_b.ch.basic_nack(last_tag, multiple=True, requeue=True)
    pump([on_b], lambda: len(on_b.got) >= 5, 30)
    pump([on_b], seconds=0.2)
    took = max((g[4] - t0 for g in on_b.got), default=0.0)
    on_b.conn.close()
    assert first == [(b"m%d" % i, False, 0) for i in range(5)], first
    assert [(g[0], g[1], g[2]) for g in on_b.got] == [(b"m%d" % i, True, 1) for i in range(5)] and took < AT_ONCE, (
        f"after the nack: {[(g[0], g[1], g[2]) for g in on_b.got]} in {took:.2f} s")


def refused(m, op) -> int | None:
    """``op(channel)`` on a new connection to ``m``: the reply code that closed the channel or connection,
    None if it was answered."""
    conn, ch = channel(m)
    try:
        op(ch)
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as exc:
        return exc.reply_code
    finally:
        if conn.is_open:
            conn.close()
    return None


def test_delete_if_unused_on_one_member_is_refused_while_the_other_has_a_consumer(start_broker, pg_dsn):
    """A consumer on a holding the queue's one message; on b, queue.delete(if_unused=true). RabbitMQ 3.10
    refuses if-unused on any quorum queue (540 NOT_IMPLEMENTED, rabbit_quorum_queue:delete/4), and so does
    Leveret; before, b judged by its own consumers and deleted the queue under a's. The queue, its consumer and
    its message stay. (b's passive declare's consumer_count is reported: RabbitMQ counts a's consumer.)"""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q10")
    publish_confirmed(a, "q10", [b"kept"])
    on_a = Consumer(a, "q10", 1)
    assert pump([on_a], lambda: len(on_a.got) == 1), on_a.bodies()
    conn, ch = channel(b)
    consumer_count = ch.queue_declare("q10", passive=True).method.consumer_count
    conn.close()
    outcome = refused(b, lambda ch: ch.queue_delete("q10", if_unused=True))
    pump([on_a], seconds=0.5)
    cancelled = on_a.cancelled_by_broker
    on_a.conn.close()
    assert outcome == 540 and not cancelled and known_on(a, "q10", 1), (
        f"b's queue.delete(if_unused) with a consumer on a: {outcome} (expected 540), a's consumer cancelled by "
        f"the broker: {cancelled}, queue still there: {known_on(a, 'q10', 1)}; b's declare-ok consumer_count "
        f"{consumer_count} (expected 1)")


def test_purge_ok_right_after_another_members_confirmed_publishes_counts_them(start_broker, pg_dsn):
    """3 publishes confirmed on a, then at once queue.purge on b (which has the queue open). RabbitMQ's
    purge-ok counts the 3 ready messages (a declare-ok on b would: storage/pg/SCHEMA.md, when_counted), and once it is
    answered they are gone for everyone: a basic.get on a right after answers get-empty and a's declare-ok
    counts 0."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "q12")
    conn_a, ch_a = channel(a)
    assert publish_confirmed(a, "q12", [b"m0", b"m1", b"m2"]) == [True] * 3
    conn, ch = channel(b)
    purged = ch.queue_purge("q12").method.message_count
    got_on_a = got_one(ch_a, "q12")
    left = ready(a, "q12")
    conn.close()
    conn_a.close()
    assert (purged, got_on_a, left) == (3, None, 0), (
        f"b's purge-ok message_count {purged} (expected 3); a's basic.get right after it: "
        f"{got_on_a and got_on_a[2]} (expected get-empty); a's declare-ok count then {left} (expected 0)")
