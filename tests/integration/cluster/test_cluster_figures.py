"""The queue figures of a Leveret cluster are the same whichever member is asked (issue 15): the HTTP API
(/api/queues, /api/queues/{vhost}/{name}), ``leveret ctl list_queues`` and Prometheus show every shared
(quorum) queue of the cluster with its ready / unacknowledged / total counted in PostgreSQL, and the other
members' node-local queues with their member as ``node``. Real broker processes, a real PostgreSQL
(tests/pg_fixtures.py), pika and HTTP clients."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pika
import pytest

from tests.integration.cluster.test_cluster_definitions import member
from tests.integration.management.test_management_api import Http, wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

ROOT = Path(__file__).resolve().parents[3]
QUORUM = {"x-queue-type": "quorum"}
FIELDS = ("messages_ready", "messages_unacknowledged", "messages")


def publish(b, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()


def figures(b, vhost_path: str = "") -> dict[str, tuple]:
    """{queue name: (ready, unacked, messages, node, type)} from ``b``'s /api/queues."""
    status, body, _ = Http(b.management_port)("GET", "/api/queues" + vhost_path)
    assert status == 200, body
    return {q["name"]: (*(q.get(f) for f in FIELDS), q["node"], q["type"]) for q in body}


def ctl_rows(b) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{b.management_port}",
                          "--formatter", "json", "list_queues", "name", *FIELDS, "node"],
                         capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return sorted(json.loads(out.stdout), key=lambda r: r["name"])


def prometheus(b, queue: str, prefix: str = "rabbitmq_queue_messages") -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.prometheus_port}/metrics/per-object", timeout=10).read()
    out = {}
    for line in text.decode().splitlines():
        if line.startswith(prefix) and f'queue="{queue}"' in line:
            name = line.split("{", 1)[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def aggregated(b, name: str) -> float:
    """One family of ``b``'s /metrics (no labels: the member's sum over its queues)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.prometheus_port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


class HoldingConsumer:
    """A consumer on ``b`` that takes ``prefetch`` messages of ``queue`` and holds them unacknowledged."""

    def __init__(self, b, queue: str, prefetch: int) -> None:
        self.got = 0
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(b, queue, prefetch), daemon=True)
        self.thread.start()

    def run(self, b, queue: str, prefetch: int) -> None:
        conn = pika.BlockingConnection(b.pika_params())
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)

        def on_message(_ch, _method, _props, _body) -> None:
            self.got += 1

        ch.basic_consume(queue, on_message)
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.05)
            if self.got >= prefetch:
                self.ready.set()
        conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_every_member_shows_the_same_figures(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    ch.queue_declare("fig-q", durable=True, arguments=QUORUM)
    ch.queue_declare("only-a", durable=True, arguments=QUORUM)  # b never touches it
    ch.queue_declare("local-a", durable=True)  # a classic queue: it lives on a
    conn.close()
    publish(a, "fig-q", 30)
    publish(a, "only-a", 3)
    publish(a, "local-a", 4)

    consumer = HoldingConsumer(b, "fig-q", prefetch=7)
    try:
        assert consumer.ready.wait(10)
        # The same on both at once, while b still holds rows reserved ahead of its consumer (its own estimate
        # counts them ready, a's as another member's: only one count read the same way agrees).
        # (Each member's count is up to a second old: both may still show the count from before the publishes,
        # the same on both but not what this checks.)
        assert wait_for(lambda: figures(a)["fig-q"][:3] == figures(b)["fig-q"][:3] and figures(b)["fig-q"][2] == 30,
                        2.5), (figures(a)["fig-q"], figures(b)["fig-q"])
        expected = {"fig-q": (23, 7, 30, "quorum"), "only-a": (3, 0, 3, "quorum"),
                    "local-a": (4, 0, 4, "classic")}

        def settled() -> bool:
            fa, fb = figures(a), figures(b)
            for name, (ready, unacked, total, qtype) in expected.items():
                if name not in fa or name not in fb:
                    return False
                if fa[name][:3] != fb[name][:3] or fa[name][:3] != (ready, unacked, total):
                    return False
            return True

        # Equal on both at once, except for the prefix b reserved ahead of its consumer (handed back after 2 s).
        assert wait_for(settled, 30), (figures(a), figures(b))
        fa, fb = figures(a), figures(b)
        for name, (ready, unacked, total, qtype) in expected.items():
            assert fa[name][:3] == fb[name][:3] == (ready, unacked, total), name
            assert fa[name][4] == fb[name][4] == qtype
        # Fresh on both: a publish on a shows on b within the count's second of caching (not at some recount).
        publish(a, "fig-q", 5)
        assert wait_for(lambda: figures(a)["fig-q"][:3] == figures(b)["fig-q"][:3] == (28, 7, 35), 1.5), \
            (figures(a)["fig-q"], figures(b)["fig-q"])
        expected["fig-q"] = (28, 7, 35, "quorum")
        fa, fb = figures(a), figures(b)
        # node: the member holding a node-local queue, whoever is asked.
        assert fa["local-a"][3] == fb["local-a"][3] == "a@test"
        # The same from the one-queue endpoint, and the quorum queue's members.
        api_a, api_b = Http(a.management_port), Http(b.management_port)
        for api in (api_a, api_b):
            status, q, _ = api("GET", "/api/queues/%2F/fig-q")
            assert status == 200
            assert (q["messages_ready"], q["messages_unacknowledged"], q["messages"]) == (28, 7, 35)
            assert q["members"] == q["online"] == ["a@test", "b@test"]
            status, q, _ = api("GET", "/api/queues/%2F/local-a")
            assert status == 200, q
            assert (q["node"], q["messages"], q["type"]) == ("a@test", 4, "classic")
            assert api("GET", "/api/queues/%2F/nowhere")[0] == 404
        # The vhost's list too.
        assert {k: v[:3] for k, v in figures(b, "/%2F").items()} == {k: v[:3] for k, v in figures(a, "/%2F").items()}
        # leveret ctl list_queues, on either member.
        rows_a, rows_b = ctl_rows(a), ctl_rows(b)
        # (A shared queue's node is the member answering: every member serves it.)
        assert [{**r, "node": None} for r in rows_a] == [{**r, "node": None} for r in rows_b]
        for rows, me in ((rows_a, "a@test"), (rows_b, "b@test")):
            assert {"name": "fig-q", "messages_ready": 28, "messages_unacknowledged": 7, "messages": 35,
                    "node": me} in rows
            assert {"name": "only-a", "messages_ready": 3, "messages_unacknowledged": 0, "messages": 3,
                    "node": me} in rows
            assert {"name": "local-a", "messages_ready": 4, "messages_unacknowledged": 0, "messages": 4,
                    "node": "a@test"} in rows
        # The totals (overview, vhost) too: every queue of the cluster, once.
        for api in (api_a, api_b):
            totals = api("GET", "/api/overview")[1]["queue_totals"]
            assert (totals["messages"], totals["messages_ready"], totals["messages_unacknowledged"]) == (42, 35, 7)
            vhost = api("GET", "/api/vhosts/%2F")[1]
            assert (vhost["messages"], vhost["messages_ready"], vhost["messages_unacknowledged"]) == (42, 35, 7)
        # Prometheus, per queue: the shared queue's leader (the same on both members' API) reports its figures,
        # the other member none (RabbitMQ reports a quorum queue on its leader's node), so that a sum over the
        # members' scrapes counts it once; both report their own consumers of it (b's one, a's none).
        leaders = {api("GET", "/api/queues/%2F/fig-q")[1]["leader"] for api in (api_a, api_b)}
        assert len(leaders) == 1 and leaders <= {"a@test", "b@test"}, leaders
        by_member = {"a@test": a, "b@test": b}
        leader = by_member[leaders.pop()]
        follower = b if leader is a else a
        pl, pf = prometheus(leader, "fig-q"), prometheus(follower, "fig-q")
        assert (pl["rabbitmq_queue_messages_ready"], pl["rabbitmq_queue_messages_unacked"],
                pl["rabbitmq_queue_messages"]) == (28, 7, 35)
        assert not {k for k in pf if k.startswith("rabbitmq_queue_messages")}, pf
        assert prometheus(b, "fig-q", "rabbitmq_queue_consumers") == {"rabbitmq_queue_consumers": 1}
        assert prometheus(a, "fig-q", "rabbitmq_queue_consumers") == {"rabbitmq_queue_consumers": 0}
        # /metrics (one figure per member): summed over the members, every queue of the cluster once, as the
        # overview's totals.
        assert sum(aggregated(m, "rabbitmq_queue_messages") for m in (a, b)) == 42
        assert sum(aggregated(m, "rabbitmq_queue_messages_unacked") for m in (a, b)) == 7
    finally:
        consumer.close()
    # The consumer's connection closed: its 7 come back, on both.
    assert wait_for(lambda: figures(a)["fig-q"][:3] == figures(b)["fig-q"][:3] == (35, 0, 35), 30)


def test_figures_follow_acks_on_the_other_member(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    ch.queue_declare("ack-q", durable=True, arguments=QUORUM)
    conn.close()
    publish(a, "ack-q", 12)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    got, deadline = 0, time.monotonic() + 10
    while got < 5 and time.monotonic() < deadline:  # (b reserves rows at its first get: polled)
        method, _props, _body = ch.basic_get("ack-q", auto_ack=True)
        if method is None:
            conn.sleep(0.02)
        else:
            got += 1
    assert got == 5
    conn.close()
    assert wait_for(lambda: figures(a)["ack-q"][:3] == figures(b)["ack-q"][:3] == (7, 0, 7), 30), \
        (figures(a)["ack-q"], figures(b)["ack-q"])
    time.sleep(1.2)  # and stays so (nothing counted twice once the counts are cached anew)
    assert figures(a)["ack-q"][:3] == figures(b)["ack-q"][:3] == (7, 0, 7)


def test_aliveness_test_on_every_member(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    for _ in range(2):
        for m in (a, b):
            status, body, _ = Http(m.management_port)("GET", "/api/aliveness-test/%2F")
            assert (status, body) == (200, {"status": "ok"}), m
