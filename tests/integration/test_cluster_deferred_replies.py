"""Replies a cluster member cannot give at once (issue 15): a queue.declare of another member's queue waits for
that member's answer (the equivalence check, the counts), a queue.unbind of a binding of another member's queue
waits for the owner to carry it out, and a quorum queue's basic.get / declare-ok wait for a round in
PostgreSQL. While such a reply is pending the member's event loop must go on serving every other connection
(and the other channels of the same connection), and the channel's later methods must not overtake it: AMQP
0-9-1 answers a channel's methods in order, and a client that pipelines (sends the next method without waiting
for the -ok) relies on it.

The owner is made slow for real: SIGSTOP of its process (its node row stays live, so the member asks it and
waits). Real broker processes, a real PostgreSQL (tests/pg_fixtures.py), pika clients, and a raw client
(tests/rawamqp.py) for the pipelining."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions
import pytest
from rawamqp import Frame, RawAMQPClient, body_frame, commands, content_header_frame, method_frame
from test_cluster_forwarding import channel, known_on, two

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

QUORUM = {"x-queue-type": "quorum"}
# A round trip on another connection of the waiting member must stay well under the wait (0.5 s for a declare's
# question, 2 s for an unbind's request); a frozen loop makes it as long as the wait.
ROUND_TRIP_MAX = 0.25


@contextmanager
def stopped(b) -> Iterator[None]:
    """``b``'s process stopped (SIGSTOP) meanwhile: alive for the cluster, answering nothing."""
    os.kill(b.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(b.pid, signal.SIGCONT)


def round_trips_during(b, slow: Callable[[], Any]) -> tuple[Any, float, list[float]]:
    """Run ``slow()`` (a blocking client call to ``b``) in a thread while another connection to ``b`` publishes
    (confirmed) and gets a message back, again and again: (what ``slow`` returned or raised, how long it took,
    every round trip's duration)."""
    conn, ch = channel(b)
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    result: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            result["value"] = slow()
        except Exception as exc:  # noqa: BLE001 (reported to the test)
            result["value"] = exc
        result["took"] = time.monotonic() - t0

    thread = threading.Thread(target=run)
    thread.start()
    trips: list[float] = []
    while thread.is_alive() or not trips:
        t0 = time.monotonic()
        ch.basic_publish("", q, b"ping")
        method, _props, body = ch.basic_get(q, auto_ack=True)
        trips.append(time.monotonic() - t0)
        assert method is not None and body == b"ping"
    thread.join()
    conn.close()
    return result["value"], result["took"], trips


def declare_on(b, name: str, **kw: Any) -> Callable[[], Any]:
    def run() -> Any:
        conn, ch = channel(b)
        try:
            return ch.queue_declare(name, **kw).method
        finally:
            if conn.is_open:
                conn.close()
    return run


def test_a_declare_waiting_for_the_owners_answer_does_not_freeze_the_member(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("slow-decl", durable=True, arguments={"x-max-length": 10})
    conn.close()
    assert known_on(b, "slow-decl")
    with stopped(a):
        declared, took, trips = round_trips_during(b, declare_on(b, "slow-decl", durable=True,
                                                                 arguments={"x-max-length": 10}))
    # The declare did wait for a (which never answered: declare-ok unchecked, with 0 and 0)...
    assert isinstance(declared, pika.spec.Queue.DeclareOk), declared
    assert took >= 0.4, took
    # ... while b's other connection went on.
    assert len(trips) >= 3 and max(trips) < ROUND_TRIP_MAX, (took, max(trips), len(trips))
    # Once a answers, a mismatching redeclare on b is still 406 (the check made when the answer comes).
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        declare_on(b, "slow-decl", durable=True, arguments={"x-max-length": 20})()
    assert err.value.reply_code == 406


def test_an_unbind_waiting_for_the_owner_does_not_freeze_the_member(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.exchange_declare("slow-ux", "direct", durable=True)
    ch.queue_declare("slow-uq", durable=True)  # classic: on a
    ch.queue_bind("slow-uq", "slow-ux", "k")
    conn.close()
    assert known_on(b, "slow-uq")

    def unbind() -> None:
        conn, ch = channel(b)
        ch.queue_unbind("slow-uq", "slow-ux", "k")
        conn.close()

    with stopped(a):
        unbound, took, trips = round_trips_during(b, unbind)
    assert unbound is None, unbound
    assert took >= 1.5, took  # it waited for a (up to 2 s)...
    assert len(trips) >= 3 and max(trips) < ROUND_TRIP_MAX, (took, max(trips), len(trips))  # ... b did not
    # a carries the request out once it runs again: nothing published on a to k reaches the queue.
    time.sleep(1.0)
    conn, ch = channel(a)
    ch.confirm_delivery()
    ch.queue_purge("slow-uq")
    ch.basic_publish("slow-ux", "k", b"x")
    assert ch.queue_declare("slow-uq", passive=True).method.message_count == 0
    conn.close()


# -- the order of a channel's replies ---------------------------------------------------------------------------

def raw(b) -> RawAMQPClient:
    c = RawAMQPClient(b.host, b.port, user=b.user, password=b.password, vhost=b.vhost, timeout=10.0)
    c.handshake(heartbeat=0)
    return c


def replies(c: RawAMQPClient, n: int, timeout: float = 10.0) -> list[Frame]:
    """The next ``n`` method frames (content frames and heartbeats skipped)."""
    out: list[Frame] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        f = c.wait_for(lambda f: f.type == 1, max(0.01, deadline - time.monotonic()))
        out.append(f)
    return out


def names(frames: list[Frame]) -> list[tuple[int, str]]:
    return [(f.channel, f.value.name) for f in frames]


def test_a_pipelining_client_gets_a_quorum_queues_deferred_replies_in_order(start_broker, pg_dsn):
    a, _b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("order-qq", durable=True, arguments=QUORUM)
    ch.confirm_delivery()
    ch.basic_publish("", "order-qq", b"first", pika.BasicProperties(delivery_mode=2))
    conn.close()
    c = raw(a)
    try:
        c.open_channel(1)
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk, 1)
        # All at once, none waited for: the quorum queue's declare-ok waits for a recount and its get for a
        # reservation round; the exclusive queue's declare-ok, the publish's ack and the second get could be
        # answered at once, but must come after what was asked before them on the channel.
        c.send_raw(b"".join([
            _frame(1, commands.Queue.Declare(queue="order-qq", durable=True, arguments=QUORUM)),
            _frame(1, commands.Queue.Declare(queue="order-ex", exclusive=True)),
            _frame(1, commands.Basic.Get(queue="order-qq", no_ack=True)),
            _frame(1, commands.Queue.Declare(queue="order-ex", exclusive=True, passive=True)),
        ]))
        got = replies(c, 4)
        assert names(got) == [(1, "Queue.DeclareOk"), (1, "Queue.DeclareOk"), (1, "Basic.GetOk"),
                              (1, "Queue.DeclareOk")], names(got)
        assert [got[0].value.queue, got[1].value.queue, got[3].value.queue] == ["order-qq", "order-ex", "order-ex"]
        assert got[0].value.message_count == 1
        # A publish pipelined behind a deferred declare goes to the queue after it: the declare-ok counts
        # what was there before, the get that follows finds it.
        c.send_raw(b"".join([
            _frame(1, commands.Queue.Declare(queue="order-qq", durable=True, arguments=QUORUM)),
            _publish(1, "order-qq", b"second"),
            _frame(1, commands.Basic.Get(queue="order-qq", no_ack=True)),
            _frame(1, commands.Queue.Declare(queue="order-ex", exclusive=True, passive=True)),
        ]))
        got = replies(c, 4)
        assert names(got) == [(1, "Queue.DeclareOk"), (1, "Basic.Ack"), (1, "Basic.GetOk"),
                              (1, "Queue.DeclareOk")], names(got)
        assert got[0].value.message_count == 0
    finally:
        c.close()


def test_a_held_channel_holds_only_itself(start_broker, pg_dsn):
    """A declare waiting for a stopped owner: its channel's later methods wait behind it, the connection's
    other channel is answered at once."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("held-q", durable=True)
    conn.close()
    assert known_on(b, "held-q")
    c = raw(b)
    try:
        c.open_channel(1)
        c.open_channel(2)
        with stopped(a):
            t0 = time.monotonic()
            c.send_raw(b"".join([
                _frame(1, commands.Queue.Declare(queue="held-q", durable=True)),
                _frame(1, commands.Queue.Declare(queue="held-1", exclusive=True)),
                _frame(2, commands.Queue.Declare(queue="held-2", exclusive=True)),
            ]))
            first = replies(c, 1)[0]
            first_at = time.monotonic() - t0
            got = [first, *replies(c, 2)]
        assert [(f.channel, f.value.queue) for f in got] == [(2, "held-2"), (1, "held-q"), (1, "held-1")], got
        assert first_at < ROUND_TRIP_MAX, first_at
    finally:
        c.close()


def _frame(channel_id: int, method: Any) -> bytes:
    return method_frame(channel_id, method)


def _publish(channel_id: int, routing_key: str, body: bytes) -> bytes:
    return (_frame(channel_id, commands.Basic.Publish(exchange="", routing_key=routing_key))
            + content_header_frame(channel_id, len(body), commands.Basic.Properties(delivery_mode=2))
            + body_frame(channel_id, body))
