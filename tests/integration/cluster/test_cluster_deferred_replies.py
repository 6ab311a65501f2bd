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
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions
import pytest
from rawamqp import Frame, RawAMQPClient, body_frame, commands, content_header_frame, method_frame, raw_frame

from broker.amqp.method_pipeline import HOLD_MAX
from tests.integration.cluster.test_cluster_forwarding import (
    bound_classic_queue,
    channel,
    drain,
    known_on,
    two,
)
from tests.integration.management.test_management_api import Http, wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

QUORUM = {"x-queue-type": "quorum"}
# A round trip on another connection of the waiting member must stay well under the wait (0.5 s for a declare's
# question, 2 s for an unbind's request); a frozen loop makes it as long as the wait.
ROUND_TRIP_MAX = 0.25
# The unbind's wait is 2 s: half of it tells a frozen loop apart as well, with room for a loaded machine (a
# round trip of 258 ms failed the 0.25 s bound beside three other workers and four helpers' runs, load 10).
UNBIND_ROUND_TRIP_MAX = 1.0


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
    bound_classic_queue(a, "slow-uq", "slow-ux", "k")  # classic: on a
    assert known_on(b, "slow-uq")

    def unbind() -> None:
        conn, ch = channel(b)
        ch.queue_unbind("slow-uq", "slow-ux", "k")
        conn.close()

    with stopped(a):
        unbound, took, trips = round_trips_during(b, unbind)
    assert unbound is None, unbound
    assert took >= 1.5, took  # it waited for a (up to 2 s)...
    assert len(trips) >= 3 and max(trips) < UNBIND_ROUND_TRIP_MAX, (took, max(trips), len(trips))  # ... b did not
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


def _publish(channel_id: int, routing_key: str, body: bytes, persistent: bool = True) -> bytes:
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    return (_frame(channel_id, commands.Basic.Publish(exchange="", routing_key=routing_key))
            + content_header_frame(channel_id, len(body), properties) + body_frame(channel_id, body))


def _close(channel_id: int) -> bytes:
    return _frame(channel_id, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))


# access.request (class 30, deprecated; pamqp 3 does not know it), realm "/data", and its request-ok's ids.
_ACCESS_REQUEST = struct.pack(">HHB", 30, 10, 5) + b"/data" + bytes([0b11100])
_ACCESS_REQUEST_OK = "30.11"


def _name(f: Frame) -> str:
    """A method frame's name; by its ids for one pamqp does not know (access.request-ok)."""
    name = getattr(f.value, "name", None)
    if isinstance(name, str):
        return name
    class_id, method_id = struct.unpack(">HH", f.payload[:4])
    return f"{class_id}.{method_id}"


def replies_until_close_ok(c: RawAMQPClient, channel_id: int, timeout: float = 10.0) -> list[Frame]:
    """The method frames on ``channel_id`` up to its channel.close-ok, then whatever else comes on it within a
    moment (nothing may: after close-ok the number belongs to no channel until it is reopened)."""
    out: list[Frame] = []
    deadline = time.monotonic() + timeout
    while not (out and out[-1].is_method(commands.Channel.CloseOk)):
        out.append(c.wait_for(lambda f: f.is_method(channel=channel_id), max(0.01, deadline - time.monotonic())))
    out.extend(f for f in c.drain(0.3) if isinstance(f, Frame) and f.is_method(channel=channel_id))
    return out


def acked(frames: list[Frame]) -> set[int]:
    """The delivery tags the basic.acks among ``frames`` confirm (a multiple one: every tag up to its own)."""
    tags: set[int] = set()
    for f in frames:
        if f.is_method(commands.Basic.Ack):
            m = f.value
            tags.update(range(1, m.delivery_tag + 1) if m.multiple else (m.delivery_tag,))
    return tags


def test_a_channel_close_pipelined_behind_a_deferred_reply_is_answered_after_it(start_broker, pg_dsn):
    """channel.close right behind a declare that waits for a stopped owner and the publishes after it: RabbitMQ's
    channel process takes a channel's methods in order, so declare-ok, the publishes routed (with the confirms
    they have by then), then close-ok, and the number is free again. It used to be close-ok at once, the
    declare-ok never, the publishes dropped."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("close-held-q", durable=True)  # classic: on a, so a declare on b asks a
    ch.queue_declare("close-held-q2", durable=True)
    ch.queue_declare("close-qq", durable=True, arguments=QUORUM)
    conn.close()
    conn, ch = channel(b)
    ch.queue_declare("close-cq", durable=True)  # classic: on b
    conn.close()
    assert known_on(b, "close-held-q") and known_on(b, "close-held-q2") and known_on(b, "close-qq")
    c = raw(b)
    try:
        c.open_channel(1)
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk, 1)
        with stopped(a):
            c.send_raw(b"".join([
                _frame(1, commands.Queue.Declare(queue="close-held-q", durable=True)),
                _publish(1, "close-cq", b"c0", persistent=False),
                _publish(1, "close-cq", b"c1", persistent=False),
                *(_publish(1, "close-qq", b"m%d" % i) for i in range(3)),
                _close(1),
            ]))
            got = replies_until_close_ok(c, 1)
        assert [_name(f) for f in got] == ["Queue.DeclareOk", *(["Basic.Ack"] * (len(got) - 2)),
                                           "Channel.CloseOk"], got
        assert got[0].value.queue == "close-held-q"
        # The classic queue's transient messages (tags 1, 2) are confirmed as soon as they are routed: their acks
        # come before close-ok. The quorum queue's (3 to 5) are confirmed once their insert in PostgreSQL
        # commits, after the close: a closing channel sends nothing (nor does RabbitMQ's), so close-ok does not
        # wait for them, as it does not without a deferred reply either (their acks could only come before it).
        assert {1, 2} <= acked(got), got
        # The number is free again: a new channel, without confirm mode. access.request, answered by the
        # connection itself as channel.close is, waits its turn too.
        c.open_channel(1)
        with stopped(a):
            c.send_raw(b"".join([
                _frame(1, commands.Queue.Declare(queue="close-held-q2", durable=True)),
                raw_frame(1, 1, _ACCESS_REQUEST),
                _frame(1, commands.Queue.Declare(queue="close-ex", exclusive=True)),
                _close(1),
            ]))
            got = replies_until_close_ok(c, 1)
        assert [_name(f) for f in got] == ["Queue.DeclareOk", _ACCESS_REQUEST_OK, "Queue.DeclareOk",
                                           "Channel.CloseOk"], got
        assert [got[0].value.queue, got[2].value.queue] == ["close-held-q2", "close-ex"]
    finally:
        c.close()
    # Every publish was routed before the close, in order.
    conn, ch = channel(b)
    assert drain(conn, ch, "close-cq", 2) == [b"c0", b"c1"]
    assert drain(conn, ch, "close-qq", 3) == [b"m0", b"m1", b"m2"]
    conn.close()


def test_a_channel_close_behind_more_than_hold_max_held_frames(start_broker, pg_dsn):
    """More than HOLD_MAX frames pipelined behind a deferred declare, then channel.close: the connection's socket
    is not read meanwhile (back-pressure), the frames are answered in order once the declare is, then close-ok,
    and the connection reads again (its other channel is answered, the number reopened)."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("many-held-q", durable=True)  # classic: on a
    conn.close()
    assert known_on(b, "many-held-q")
    n = HOLD_MAX + 2_000
    c = raw(b)
    try:
        c.open_channel(1)
        c.open_channel(2)
        qos = _frame(1, commands.Basic.Qos(prefetch_count=1))
        with stopped(a):
            c.send_raw(b"".join([_frame(1, commands.Queue.Declare(queue="many-held-q", durable=True)),
                                 qos * n, _close(1)]))
            got = replies_until_close_ok(c, 1, timeout=30.0)
        assert _name(got[0]) == "Queue.DeclareOk" and _name(got[-1]) == "Channel.CloseOk", (got[:2], got[-2:])
        assert len(got) == n + 2 and {_name(f) for f in got[1:-1]} == {"Basic.QosOk"}, len(got)
        c.send_method(2, commands.Queue.Declare(queue="many-ex", exclusive=True))
        assert c.expect_method(commands.Queue.DeclareOk, 2).queue == "many-ex"
        c.open_channel(1)
    finally:
        c.close()


def test_a_connection_closed_or_dropped_while_a_close_is_held_cleans_up(start_broker, pg_dsn):
    """connection.close pipelined behind a held channel.close, or the socket dropped meanwhile: the channel and
    its held frames go with the connection (close-ok for connection.close), nothing is left on the member and
    nothing is logged as an error when the owner's answer comes (for a channel that is gone)."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("gone-held-q", durable=True)  # classic: on a
    ch.queue_declare("gone-qq", durable=True, arguments=QUORUM)
    conn.close()
    assert known_on(b, "gone-held-q")
    held = b"".join([_frame(1, commands.Queue.Declare(queue="gone-held-q", durable=True)),
                     _publish(1, "gone-qq", b"x"), _close(1)])
    closing, dropping = raw(b), raw(b)
    try:
        for c in (closing, dropping):
            c.open_channel(1)
            c.send_method(1, commands.Confirm.Select())
            c.expect_method(commands.Confirm.SelectOk, 1)
        with stopped(a):
            closing.send_raw(held + _frame(0, commands.Connection.Close(reply_code=200, reply_text="bye",
                                                                         class_id=0, method_id=0)))
            closing.wait_for(lambda f: f.is_method(commands.Connection.CloseOk, 0))
            dropping.send_raw(held)
            time.sleep(0.1)
            dropping.close()
            time.sleep(0.2)
        time.sleep(1.0)  # a answers the questions left: for channels that are gone
    finally:
        closing.close()
        dropping.close()
    api = Http(b.management_port)
    assert wait_for(lambda: api("GET", "/api/connections")[1] == [], 30)
    assert api("GET", "/api/channels")[1] == []
    log = b.log_text()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    # b goes on serving.
    conn, ch = channel(b)
    assert ch.queue_declare("gone-held-q", passive=True).method.queue == "gone-held-q"
    conn.close()


def test_a_close_held_behind_a_deferred_reply_that_fails_is_answered_too(start_broker, pg_dsn):
    """The deferred reply is a channel error (a redeclare that the owner's answer shows inequivalent): the server
    closes the channel (406), the publish held behind the declare is dropped with it, and the client's
    channel.close held there too is answered with close-ok, as one that crosses the server's close is (a client
    that sent close waits for its close-ok); the number is free once the client answers the server's close."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("fail-held-q", durable=True, arguments={"x-max-length": 10})  # classic: on a
    conn.close()
    assert known_on(b, "fail-held-q")
    time.sleep(0.5)  # b's answer from a (to known_on's declare) no longer serves: the declare below asks a again
    c = raw(b)
    try:
        c.open_channel(1)
        c.send_raw(b"".join([
            _frame(1, commands.Queue.Declare(queue="fail-held-q", durable=True, arguments={"x-max-length": 20})),
            _publish(1, "fail-held-q", b"dropped"),
            _close(1),
        ]))
        got = replies_until_close_ok(c, 1)
        assert [_name(f) for f in got] == ["Channel.Close", "Channel.CloseOk"], got
        assert (got[0].value.reply_code, got[0].value.class_id, got[0].value.method_id) == (406, 50, 10)
        c.send_method(1, commands.Channel.CloseOk())
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue="fail-held-q", passive=True))
        assert c.expect_method(commands.Queue.DeclareOk, 1).message_count == 0
    finally:
        c.close()
