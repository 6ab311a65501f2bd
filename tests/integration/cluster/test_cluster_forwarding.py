"""Node-local queues across a Leveret cluster (issue 15): a message published on one member to a classic,
exclusive or server-named queue of another member, or to a direct reply-to channel there, reaches it
(forwarded through PostgreSQL: broker/clustering/cluster_forwarding.py). RPC with the client on one member and the server
on the other; fan-out and topic routing to queues on both members; mandatory; confirms; a queue deleted by its
member stops receiving. Real broker processes, a real PostgreSQL (tests/pg_server.py), pika clients."""

from __future__ import annotations

import threading
import time
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.cluster.test_cluster_definitions import member, passive_exists
from tests.integration.management.test_management_api import wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def two(start_broker, pg_dsn):
    return member(start_broker, pg_dsn, "a@test"), member(start_broker, pg_dsn, "b@test")


def channel(b):
    conn = pika.BlockingConnection(b.pika_params())
    return conn, conn.channel()


def bound_classic_queue(b, queue: str, exchange: str, *keys: str) -> None:
    """Declared on ``b``: a durable direct ``exchange`` and a durable classic ``queue`` (so it lives on ``b``),
    bound to it with each of ``keys``."""
    conn, ch = channel(b)
    ch.exchange_declare(exchange, "direct", durable=True)
    ch.queue_declare(queue, durable=True)
    for key in keys:
        ch.queue_bind(queue, exchange, key)
    conn.close()


def drain(conn, ch, queue: str, n: int, timeout: float = 10.0) -> list[bytes]:
    """Up to ``n`` bodies from ``queue`` by basic.get (auto-ack), polling until ``timeout``."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            conn.sleep(0.02)
        else:
            got.append(body)
    return got


def known_on(b, queue: str, timeout: float = 5.0) -> bool:
    """Whether a passive declare of ``queue`` succeeds on ``b`` (another member's queue included)."""
    def ok() -> bool:
        conn, ch = channel(b)
        try:
            ch.queue_declare(queue, passive=True)
            return True
        except pika.exceptions.ChannelClosedByBroker:
            return False
        finally:
            if conn.is_open:
                conn.close()
    return bool(wait_for(ok, timeout))


def rpc_server(b, request_queue: str, stop: threading.Event, ready: threading.Event, quorum: bool) -> None:
    """Answers each request on ``request_queue`` (on ``b``) with b"re:" + body, to its reply_to."""
    conn, ch = channel(b)
    args = {"x-queue-type": "quorum"} if quorum else None
    ch.queue_declare(request_queue, durable=True, arguments=args)

    def on_request(ch, method, props, body):
        ch.basic_publish("", props.reply_to, b"re:" + body,
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)

    ch.basic_consume(request_queue, on_request)
    ready.set()
    while not stop.is_set():
        conn.process_data_events(time_limit=0.05)
    conn.close()


def run_server(b, request_queue: str, quorum: bool = False):
    stop, ready = threading.Event(), threading.Event()
    t = threading.Thread(target=rpc_server, args=(b, request_queue, stop, ready, quorum), daemon=True)
    t.start()
    assert ready.wait(10)
    return stop, t


def call(conn, ch, request_queue: str, reply_to: str, body: bytes, replies: list, timeout: float = 10.0) -> bytes:
    cid = uuid.uuid4().hex
    ch.basic_publish("", request_queue, body, pika.BasicProperties(reply_to=reply_to, correlation_id=cid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for props, reply in list(replies):
            if props.correlation_id == cid:
                replies.remove((props, reply))
                return reply
        conn.process_data_events(time_limit=0.05)
    raise AssertionError(f"no reply to {body!r} within {timeout} s")


@pytest.mark.parametrize("quorum", [False, True], ids=["classic-requests", "quorum-requests"])
def test_rpc_with_a_server_named_exclusive_reply_queue_across_members(start_broker, pg_dsn, quorum):
    a, b = two(start_broker, pg_dsn)
    stop, t = run_server(a, "rpc-req", quorum)
    try:
        # The request queue is on a (or shared): b forwards to it / serves it.
        assert known_on(b, "rpc-req")
        conn, ch = channel(b)
        reply_q = ch.queue_declare("", exclusive=True).method.queue
        replies: list = []
        ch.basic_consume(reply_q, lambda c, m, p, body: replies.append((p, body)), auto_ack=True)
        for i in range(20):
            assert call(conn, ch, "rpc-req", reply_q, b"q%d" % i, replies) == b"re:q%d" % i
        conn.close()
    finally:
        stop.set()
        t.join(5)


def test_rpc_with_direct_reply_to_across_members(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    stop, t = run_server(a, "drt-req")
    try:
        assert known_on(b, "drt-req")
        conn, ch = channel(b)
        replies: list = []
        ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, body: replies.append((p, body)), auto_ack=True)
        for i in range(10):
            assert call(conn, ch, "drt-req", "amq.rabbitmq.reply-to", b"d%d" % i, replies) == b"re:d%d" % i
        conn.close()
    finally:
        stop.set()
        t.join(5)


def test_direct_reply_to_on_one_node_is_unchanged(start_broker):
    single = start_broker()
    stop, t = run_server(single, "solo-req")
    try:
        conn, ch = channel(single)
        replies: list = []
        ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, body: replies.append((p, body)), auto_ack=True)
        cid = uuid.uuid4().hex
        ch.basic_publish("", "solo-req", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to",
                                                                     correlation_id=cid))
        assert wait_for(lambda: conn.process_data_events(time_limit=0.05) or replies, 30)
        conn.close()
    finally:
        stop.set()
        t.join(5)


def test_fanout_to_exclusive_subscribers_on_both_members(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conns = {}
    for name, node in (("a", a), ("b", b)):
        conn, ch = channel(node)
        ch.exchange_declare("news", "fanout", durable=True)
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "news")
        conns[name] = (conn, ch, q)
    # Each member learns of the other's subscriber by the doorbell: probe until the other's queue gets one.
    for publisher, other in (("a", "b"), ("b", "a")):
        pconn, pch = channel(a if publisher == "a" else b)
        oconn, och, oq = conns[other]
        deadline = time.monotonic() + 5
        while not drain(oconn, och, oq, 1, timeout=0.1):
            assert time.monotonic() < deadline, f"{publisher} never routed to {other}'s subscriber"
            pch.basic_publish("news", "", b"probe")
        pconn.close()
    for conn, ch, q in conns.values():
        conn.sleep(0.3)
        while drain(conn, ch, q, 100, timeout=0.2):
            pass
    for publisher in ("a", "b"):
        pconn, pch = channel(a if publisher == "a" else b)
        pch.confirm_delivery()
        for i in range(5):
            pch.basic_publish("news", "", b"%s-%d" % (publisher.encode(), i), mandatory=True)
        pconn.close()
    for name in ("a", "b"):
        conn, ch, q = conns[name]
        got = drain(conn, ch, q, 10)
        # Each publisher's messages in its order (a forwarded one may come after a later local one).
        for publisher in (b"a", b"b"):
            assert [m for m in got if m.startswith(publisher)] == [b"%s-%d" % (publisher, i) for i in range(5)], \
                (name, got)
        conn.close()


def test_topic_routing_and_mandatory_to_a_remote_queue(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn_a, ch_a = channel(a)
    ch_a.exchange_declare("events", "topic", durable=True)
    ch_a.queue_declare("audit")  # a classic queue: its messages live on a
    ch_a.queue_bind("audit", "events", "order.*.created")
    assert wait_for(lambda: passive_exists(b, "exchange", "events"), 30)  # the shared definition reached b
    conn_b, ch_b = channel(b)
    returned: list[bytes] = []
    ch_b.add_on_return_callback(lambda c, m, p, body: returned.append(body))
    ch_b.confirm_delivery()
    # b sees the binding within the doorbell's time: poll until a mandatory publish is no longer returned.
    deadline = time.monotonic() + 5
    while True:
        try:
            ch_b.basic_publish("events", "order.eu.created", b"probe", mandatory=True)
            break
        except pika.exceptions.UnroutableError:
            assert time.monotonic() < deadline, "b never routed to a's queue"
            time.sleep(0.05)
    ch_b.basic_publish("events", "order.us.created", b"o1", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch_b.basic_publish("events", "order.us.deleted", b"nowhere", mandatory=True)
    assert drain(conn_a, ch_a, "audit", 2) == [b"probe", b"o1"]
    assert drain(conn_a, ch_a, "audit", 1, timeout=0.5) == []  # the unmatched one went nowhere
    conn_a.close()
    conn_b.close()


def test_confirms_and_order_of_forwarded_messages(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("inbox", durable=True)
    assert known_on(b, "inbox")
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    for i in range(300):  # each publish waits for its confirm: sent after the forward's commit
        ch_b.basic_publish("", "inbox", b"m%d" % i, PERSISTENT, mandatory=True)
    conn_b.close()
    assert drain(conn_a, ch_a, "inbox", 300) == [b"m%d" % i for i in range(300)]
    conn_a.close()


def test_consuming_or_deleting_another_members_queue_is_refused_with_its_name(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("mine", durable=True)
    assert known_on(b, "mine")
    for action in ("consume", "delete", "get"):
        conn_b, ch_b = channel(b)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            if action == "consume":
                ch_b.basic_consume("mine", lambda *args: None)
            elif action == "delete":
                ch_b.queue_delete("mine")
            else:
                ch_b.basic_get("mine")
        assert exc.value.reply_code == 405 and "a@test" in exc.value.reply_text, (action, exc.value)
        conn_b.close()
    # A declare of the same name on b is the same queue (no second one on b).
    conn_b, ch_b = channel(b)
    assert ch_b.queue_declare("mine", durable=True).method.queue == "mine"
    ch_b.basic_publish("", "mine", b"via-b")
    conn_b.close()
    assert drain(conn_a, ch_a, "mine", 1) == [b"via-b"]
    conn_a.close()


def test_a_queue_deleted_by_its_member_stops_receiving(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn_a, ch_a = channel(a)
    ch_a.exchange_declare("feed", "direct", durable=True)
    ch_a.queue_declare("gone-soon")
    ch_a.queue_bind("gone-soon", "feed", "k")
    assert wait_for(lambda: passive_exists(b, "exchange", "feed"), 30)
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    assert wait_for(lambda: _routed(ch_b, "feed", "k"), 30)
    ch_a.queue_delete("gone-soon")
    assert wait_for(lambda: not _routed(ch_b, "feed", "k"), 30)
    assert wait_for(lambda: not _routed(ch_b, "", "gone-soon"), 30)
    conn_a.close()
    conn_b.close()


def _routed(ch, exchange: str, key: str) -> bool:
    try:
        ch.basic_publish(exchange, key, b"probe", mandatory=True)
        return True
    except pika.exceptions.UnroutableError:
        return False


def test_celery_rpc_backend_with_the_worker_on_one_member_and_the_client_on_the_other(start_broker, pg_dsn,
                                                                                     tmp_path):
    """Celery's rpc:// results: the worker (on a) publishes each result to the client's reply queue, which
    lives on b; the client's declare and bind of the task queue on b find a's queue and binding."""
    import os
    import subprocess
    import sys

    import celery.exceptions

    from tests.integration.clients.test_clients import ROOT, _load_celery_app

    a, b = two(start_broker, pg_dsn)
    queue = "fwd-celery"
    env = dict(os.environ, LEVERET_CELERY_BROKER_URL=a.url, LEVERET_CELERY_QUEUE=queue, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    log_path = tmp_path / "celery-worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.integration.celery_app", "worker", "--pool=solo",
             "--concurrency=1", "-l", "warning", "-Q", queue, "-n", "fwd@%h"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    mod = _load_celery_app()
    app = mod.app
    app.conf.broker_url = b.url
    app.conf.task_default_queue = queue
    try:
        assert known_on(b, queue, 15), f"the worker's queue never appeared:\n{log_path.read_text(errors='replace')}"
        try:
            assert mod.add.delay(2, 3).get(timeout=15) == 5
            assert mod.add.delay(20, 22).get(timeout=10) == 42
        except celery.exceptions.TimeoutError:
            pytest.fail(f"no result in time; worker output:\n{log_path.read_text(errors='replace')}")
        assert worker.poll() is None, f"the worker died:\n{log_path.read_text(errors='replace')}"
    finally:
        worker.terminate()
        try:
            worker.wait(5)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        app.close()


def test_another_members_exclusive_queue_cannot_be_declared_here(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn_a, ch_a = channel(a)
    q = ch_a.queue_declare("excl-a", exclusive=True).method.queue
    conn_b, ch_b = channel(b)
    for passive in (True, False):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch_b.queue_declare(q, passive=passive)
        assert exc.value.reply_code == 405
        ch_b = conn_b.channel()
    ch_b.basic_publish("", q, b"to-a")  # but it can be published to
    assert drain(conn_a, ch_a, q, 1) == [b"to-a"]
    conn_a.close()
    conn_b.close()


def test_forwarded_to_a_durable_queue_of_a_stopped_member_arrive_when_it_is_back(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("keep", durable=True)
    ch_a.queue_declare("", exclusive=True)
    conn_a.close()
    assert known_on(b, "keep")
    a.stop()
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    for i in range(5):
        ch_b.basic_publish("", "keep", b"k%d" % i, PERSISTENT, mandatory=True)  # confirmed: in PostgreSQL
    conn_b.close()
    a.start()
    conn_a, ch_a = channel(a)
    assert drain(conn_a, ch_a, "keep", 5) == [b"k%d" % i for i in range(5)]
    conn_a.close()


def test_a_killed_members_exclusive_queue_goes_from_the_others_routing(start_broker, pg_dsn):
    import signal

    a, b = two(start_broker, pg_dsn)
    _conn_a, ch_a = channel(a)  # kept open: the queue is its connection's
    q = ch_a.queue_declare("", exclusive=True).method.queue
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    assert _routed(ch_b, "", q)
    a.stop(signal.SIGKILL)
    assert wait_for(lambda: not _routed(ch_b, "", q), 15)  # reaped, its rows dropped: returned now
    conn_b.close()
