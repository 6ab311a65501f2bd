"""The firehose (broker/observability/trace.py): ``amq.rabbitmq.trace``, ``leveret ctl trace_on / trace_off``
and the vhost object's ``tracing`` in the HTTP API.

RabbitMQ turns tracing on only with ``rabbitmqctl trace_on`` (or its management plugin), so the tests that
trace are ``leveret_only``. What they check of RabbitMQ's behaviour was verified by hand against RabbitMQ
3.10.8 (``rabbitmqctl trace_on -p /``, a queue bound to amq.rabbitmq.trace with ``#``, pika publishing and
consuming): routing keys ``publish.`` (default exchange), ``publish.<exchange>``, ``deliver.<queue>`` (basic.get
too); headers ``exchange_name``, ``routing_keys`` (the routing key then CC, and BCC keys though BCC is removed
from the properties), ``properties`` (the message's properties; ``type`` for the type property), ``node``,
``vhost``, ``connection``, ``channel``, ``user``, ``routed_queues`` (publish), ``redelivered`` (deliver, 0/1);
the copy's body is the message's, its only property the headers; trace copies are not traced themselves;
``trace_on`` / ``trace_off`` print "Starting tracing for vhost "/" ...", "Trace enabled for vhost /" and
"Stopping tracing ...", "Trace disabled for vhost /"; the state is not kept across a restart (RabbitMQ's
firehose guide). The exchange test runs against RabbitMQ as well.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from amqp_helpers import conn, connect  # noqa: F401 - fixtures
from pika.exceptions import ChannelClosedByBroker

from tests.conftest import ROOT
from tests.integration.management.test_management_api import Http, start_mgmt_broker

TRACE = "amq.rabbitmq.trace"


class Node:
    def __init__(self, broker: Any, http: Http, mport: int) -> None:
        self.broker = broker
        self.http = http
        self.mport = mport

    def ctl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{self.mport}",
                              *args], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        if ok:
            assert out.returncode == 0, out.stderr
        return out

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.broker.pika_params())

    def tracing(self, vhost: str = "%2F") -> bool:
        status, body, _ = self.http("GET", f"/api/vhosts/{vhost}")
        assert status == 200
        return body["tracing"]


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    tmp = Path(tempfile.mkdtemp(prefix="leveret-trace-"))
    b, mport, _ = start_mgmt_broker(tmp)
    try:
        yield Node(b, Http(mport), mport)
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def traced(node: Node) -> Iterator[Node]:
    node.ctl("trace_on")
    try:
        yield node
    finally:
        node.ctl("trace_off")


@contextlib.contextmanager
def sink(ch: Any) -> Iterator[str]:
    name = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(name, TRACE, "#")
    yield name


def events(ch: Any, queue: str, settle: float = 0.3) -> list[tuple[str, dict[str, Any], bytes]]:
    time.sleep(settle)
    out = []
    while True:
        m, p, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append((m.routing_key, p.headers or {}, body))


def test_the_trace_exchange_exists_and_is_internal(conn):  # noqa: F811 - fixture
    ch = conn.channel()
    ch.exchange_declare(TRACE, "topic", durable=True, internal=True, passive=True)
    ch.exchange_declare(TRACE, "topic", durable=True, internal=True)  # equivalent: ok
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.confirm_delivery()
        ch.basic_publish(TRACE, "publish.x", b"forged")
    assert err.value.reply_code == 403
    assert err.value.reply_text == f"ACCESS_REFUSED - cannot publish to internal exchange '{TRACE}' in vhost '/'"
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.exchange_delete(TRACE)
    assert err.value.reply_code == 403
    assert err.value.reply_text == f"ACCESS_REFUSED - deletion of system exchange '{TRACE}' in vhost '/' not allowed"


@pytest.mark.leveret_only
def test_publish_and_deliver_events_have_rabbitmqs_keys_and_headers(traced: Node):
    c = traced.connect()
    try:
        ch = c.channel()
        with sink(ch) as s:
            ch.queue_declare("tr.q")
            ch.queue_purge("tr.q")
            ch.exchange_declare("tr.x", "direct")
            ch.queue_bind("tr.q", "tr.x", "k")
            ch.basic_publish("", "tr.q", b"hello", pika.BasicProperties(
                message_id="m1", content_type="text/plain", delivery_mode=2, priority=3, timestamp=123,
                headers={"CC": ["tr.nowhere"], "h": 1}))
            ch.basic_publish("tr.x", "k", b"via-x", pika.BasicProperties(headers={"BCC": ["zz"]}))
            m, _p, _b = ch.basic_get("tr.q")
            ch.basic_nack(m.delivery_tag, requeue=True)
            got = []
            ch.basic_consume("tr.q", lambda chx, mm, _pp, bb: (got.append(bb), chx.basic_ack(mm.delivery_tag)))
            deadline = time.monotonic() + 5
            while len(got) < 2 and time.monotonic() < deadline:
                c.process_data_events(0.1)
            assert got == [b"hello", b"via-x"]
            evs = events(ch, s)
    finally:
        c.close()
    by_key: dict[str, list[tuple[dict[str, Any], bytes]]] = {}
    for key, headers, body in evs:
        by_key.setdefault(key, []).append((headers, body))
    assert sorted(by_key) == ["ack.tr.q", "deliver.tr.q", "publish.", "publish.tr.x"]
    (pub, body), = by_key["publish."]
    assert body == b"hello"
    assert pub["exchange_name"] == ""
    assert pub["routing_keys"] == ["tr.q", "tr.nowhere"]
    props = pub["properties"]
    assert {k: props[k] for k in ("content_type", "delivery_mode", "priority", "message_id", "timestamp")} == \
        {"content_type": "text/plain", "delivery_mode": 2, "priority": 3, "message_id": "m1", "timestamp": 123}
    assert props["headers"] == {"CC": ["tr.nowhere"], "h": 1}
    assert pub["node"].startswith("leveret@")
    assert pub["vhost"] == "/" and pub["user"] == "guest" and pub["channel"] == 1
    assert " -> " in pub["connection"]
    assert pub["routed_queues"] == ["tr.q"]
    (pubx, bodyx), = by_key["publish.tr.x"]
    assert bodyx == b"via-x"
    assert pubx["exchange_name"] == "tr.x" and pubx["routing_keys"] == ["k", "zz"]
    assert "BCC" not in (pubx["properties"].get("headers") or {})
    delivers = by_key["deliver.tr.q"]
    assert [(h["redelivered"], b) for h, b in delivers] == [(0, b"hello"), (1, b"hello"), (0, b"via-x")]
    for h, _b in delivers:
        assert h["user"] == "guest" and h["channel"] == 1 and h["vhost"] == "/"
        assert "routed_queues" not in h
    assert delivers[0][0]["routing_keys"] == ["tr.q", "tr.nowhere"]
    assert delivers[2][0]["routing_keys"] == ["k", "zz"]


@pytest.mark.leveret_only
def test_every_event_has_a_time_and_one_identity_per_message(traced: Node):
    c = traced.connect()
    try:
        ch = c.channel()
        with sink(ch) as s:
            ch.queue_declare("tr.id", auto_delete=True)
            ch.basic_publish("", "tr.id", b"with-id", pika.BasicProperties(message_id="mine"))
            ch.basic_publish("", "tr.id", b"without-id")
            seen = []
            for _ in range(2):
                m, p, body = ch.basic_get("tr.id")
                seen.append((body, (p.headers or {}).get("x-leveret-trace-id")))
                ch.basic_ack(m.delivery_tag)
            evs = events(ch, s)
    finally:
        c.close()
    assert seen[0] == (b"with-id", None)  # a message_id is the identity: the message is left alone
    stamped = seen[1][1]
    assert seen[1][0] == b"without-id" and isinstance(stamped, str) and stamped
    ids: dict[str, list[tuple[str, int]]] = {}
    for key, headers, _body in evs:
        ids.setdefault(headers["x-leveret-message-id"], []).append((key.split(".")[0], headers["x-leveret-event-time"]))
    assert set(ids) == {"mine", stamped}
    for timeline in ids.values():
        assert [kind for kind, _t in timeline] == ["publish", "deliver", "ack"]
        times = [t for _k, t in timeline]
        assert times == sorted(times) and abs(times[0] - time.time() * 1000) < 60_000


@pytest.mark.leveret_only
def test_deadletter_events_say_why(traced: Node):
    c = traced.connect()
    try:
        ch = c.channel()
        with sink(ch) as s:
            ch.exchange_declare("tr.dlx", "fanout", auto_delete=True)
            ch.queue_declare("tr.dlq", auto_delete=True)
            ch.queue_bind("tr.dlq", "tr.dlx")
            ch.queue_declare("tr.dl", auto_delete=True, arguments={"x-dead-letter-exchange": "tr.dlx"})
            ch.basic_publish("", "tr.dl", b"rejected", pika.BasicProperties(message_id="r"))
            ch.basic_publish("", "tr.dl", b"expired", pika.BasicProperties(message_id="e", expiration="1"))
            m, _p, _b = ch.basic_get("tr.dl")
            ch.basic_reject(m.delivery_tag, requeue=False)
            time.sleep(0.2)
            m2 = ch.basic_get("tr.dl")[0]
            assert m2 is None  # expired by now
            evs = events(ch, s)
    finally:
        c.close()
    dead = {h["x-leveret-message-id"]: (h["reason"], h["dead_letter_exchange"], b)
            for k, h, b in evs if k == "deadletter.tr.dl"}
    assert dead == {"r": ("rejected", "tr.dlx", b"rejected"), "e": ("expired", "tr.dlx", b"expired")}
    # a dead letter is not a client's publish (as in RabbitMQ): no publish.tr.dlx event
    assert not [k for k, _h, _b in evs if k == "publish.tr.dlx"]


@pytest.mark.leveret_only
def test_tracing_off_publishes_nothing(node: Node):
    assert node.tracing() is False
    c = node.connect()
    try:
        ch = c.channel()
        with sink(ch) as s:
            ch.queue_declare("tr.off", auto_delete=True)
            ch.basic_publish("", "tr.off", b"x", pika.BasicProperties(message_id="off"))
            m, p, _b = ch.basic_get("tr.off")
            ch.basic_ack(m.delivery_tag)
            assert "x-leveret-trace-id" not in (p.headers or {})
            assert events(ch, s) == []
    finally:
        c.close()


@pytest.mark.leveret_only
def test_ctl_trace_on_off_and_the_http_api(node: Node):
    on = node.ctl("trace_on").stdout
    assert on.splitlines() == ['Starting tracing for vhost "/" ...', "Trace enabled for vhost /"]
    assert node.tracing() is True
    assert "true" in node.ctl("list_vhosts", "name", "tracing").stdout.split()
    off = node.ctl("trace_off").stdout
    assert off.splitlines() == ['Stopping tracing for vhost "/" ...', "Trace disabled for vhost /"]
    assert node.tracing() is False
    # the HTTP API as RabbitMQ's: PUT /api/vhosts/{name} {"tracing": true}; a PUT without it leaves it alone
    node.ctl("add_vhost", "tr.v")
    try:
        assert node.http("PUT", "/api/vhosts/tr.v", {"tracing": True})[0] == 204
        assert node.tracing("tr.v") is True and node.tracing() is False  # per vhost
        assert node.http("PUT", "/api/vhosts/tr.v", {"description": "d"})[0] == 204
        assert node.tracing("tr.v") is True
        assert node.http("PUT", "/api/vhosts/tr.v", {"tracing": "yes"})[0] == 400
        node.ctl("-p", "tr.v", "trace_off")
        assert node.tracing("tr.v") is False
    finally:
        node.ctl("delete_vhost", "tr.v")
    missing = node.ctl("-p", "tr.nope", "trace_on", ok=False)
    assert missing.returncode == 1 and "tr.nope" in missing.stderr
    assert node.http("GET", "/api/vhosts/tr.nope")[0] == 404  # not created by trace_on


@pytest.mark.leveret_only
def test_tracing_is_off_after_a_restart(node: Node):
    node.ctl("trace_on")
    assert node.tracing() is True
    node.broker.restart()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert node.tracing() is False
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.leveret_only
def test_an_expiry_without_a_dead_letter_exchange_is_still_an_event(traced: Node):
    """A message that expires in a queue without a dead-letter exchange leaves it: the deadletter event says so
    (reason expired, no dead_letter_exchange), as for one that is dead-lettered."""
    c = traced.connect()
    try:
        ch = c.channel()
        with sink(ch) as s:
            ch.queue_declare("tr.ttl", auto_delete=True, arguments={"x-message-ttl": 100})
            ch.basic_publish("", "tr.ttl", b"gone", pika.BasicProperties(message_id="ttl-1"))
            time.sleep(0.5)  # the queue's TTL timer drops it
            evs = events(ch, s)
    finally:
        c.close()
    dead = [(h["x-leveret-message-id"], h["reason"], "dead_letter_exchange" in h, b)
            for k, h, b in evs if k == "deadletter.tr.ttl"]
    assert dead == [("ttl-1", "expired", False, b"gone")]


def test_a_message_handed_to_a_waiting_consumer_is_traced_publish_first(traced: Node):
    """The trace shows a message's publish before its delivery even when a consumer is waiting and the
    delivery happens within the publish (RabbitMQ traces on the way in, then out)."""
    c = traced.connect()
    try:
        ch = c.channel()
        got: list[bytes] = []
        with sink(ch) as s:
            ch.queue_declare("tr.wait", auto_delete=True)
            ch.basic_consume("tr.wait", lambda _c, _m, _p, body: got.append(body), auto_ack=True)
            for i in range(5):
                ch.basic_publish("", "tr.wait", b"w%d" % i, pika.BasicProperties(message_id=f"w{i}"))
            deadline = time.monotonic() + 5
            while len(got) < 5 and time.monotonic() < deadline:
                c.process_data_events(time_limit=0.1)
            evs = events(ch, s)
    finally:
        c.close()
    order = [(k.split(".")[0], h["x-leveret-message-id"]) for k, h, _b in evs
             if k in ("publish.", "deliver.tr.wait")]
    for i in range(5):
        assert order.index(("publish", f"w{i}")) < order.index(("deliver", f"w{i}")), order
