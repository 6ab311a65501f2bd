"""A quorum queue's ``message_stats`` (publish, deliver_get, ack... and their ``*_details.rate``) are the same
whichever member of a Leveret cluster is asked (issue 15): each member's counters go to PostgreSQL once a
second and every member shows their sums, with rates from samples timed by PostgreSQL's clock
(storage/pg/queue_stats.py). Before, each member showed its own counters: the publishing member a publish
rate and no acks, the consuming member b acks and no publishes.

Messages are published on member a and consumed (manual acks) and fetched (basic.get) on member b; both
members' HTTP API and Prometheus are asked. Real broker processes, a real PostgreSQL (tests/pg_fixtures.py),
pika and HTTP clients."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pika
import pytest

from broker.clustering.cluster_forwarding import LIST_MAX_AGE
from tests.integration.cluster.test_cluster_definitions import http_status, member
from tests.integration.cluster.test_cluster_forwarding import channel, drain
from tests.integration.management.test_management_api import Http, wait_for

# These tests measure rates of a steady publisher (40 a second, confirmed, into PostgreSQL-backed queues) and
# bound them (30-50): beside the parallel pass's load the publisher falls behind (a fresh-clone run saw 43.3 of
# at least 45), so they run in the serial pass, with their bounds kept.
pytestmark = [pytest.mark.leveret_only, pytest.mark.serial]
pytest_plugins = ["pg_fixtures"]

QUORUM = {"x-queue-type": "quorum"}
QUEUE = "stats-q"
COUNTS = ("publish", "deliver_get", "deliver", "get", "redeliver", "ack")
RATES = ("publish", "deliver_get", "ack")


def message_stats(b) -> dict:
    status, q, _ = Http(b.management_port)("GET", f"/api/queues/%2F/{QUEUE}")
    assert status == 200, q
    return q["message_stats"]


def both(a, b) -> tuple[dict, dict]:
    """Both members' message_stats of the queue, asked at the same moment (one request each, in parallel)."""
    with ThreadPoolExecutor(2) as pool:
        fa, fb = pool.submit(message_stats, a), pool.submit(message_stats, b)
        return fa.result(), fb.result()


def counts(stats: dict) -> dict[str, int]:
    return {name: stats.get(name) for name in COUNTS}


def rates(stats: dict) -> dict[str, float]:
    return {name: stats.get(name + "_details", {}).get("rate") for name in COUNTS}


def prometheus_counters(b) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.prometheus_port}/metrics/per-object", timeout=10).read()
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("rabbitmq_queue_") and "_total{" in line and f'queue="{QUEUE}"' in line:
            out[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


class Acker(threading.Thread):
    """A manual-ack consumer of the queue on member ``b``, acking each message as it comes."""

    def __init__(self, b) -> None:
        super().__init__(daemon=True)
        self.b = b
        self.got = 0
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        conn, ch = channel(self.b)
        ch.basic_qos(prefetch_count=20)

        def on_message(c, method, _props, _body) -> None:
            self.got += 1
            c.basic_ack(method.delivery_tag)

        ch.basic_consume(QUEUE, on_message)
        self.ready.set()
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.05)
        conn.close()


class Publisher(threading.Thread):
    """Persistent, confirmed messages to ``queue`` on member ``m``, ``per_second`` of them a second, until
    :meth:`finish`: ``sent`` counts them (confirmed), ``began`` is the wall-clock time of the first's confirm."""

    def __init__(self, m, per_second: float, queue: str = QUEUE) -> None:
        super().__init__(daemon=True)
        self.m = m
        self.per_second = per_second
        self.queue = queue
        self.sent = 0
        self.began = 0.0
        self.first = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        conn, ch = channel(self.m)
        ch.confirm_delivery()
        start = time.monotonic()
        while not self._halt.is_set():
            ch.basic_publish("", self.queue, b"m%d" % self.sent, pika.BasicProperties(delivery_mode=2))
            self.sent += 1
            if self.sent == 1:
                self.began = time.time()
                self.first.set()
            self._halt.wait(start + self.sent / self.per_second - time.monotonic())
        conn.close()

    def finish(self) -> int:
        """Stop; the number of messages sent."""
        self._halt.set()
        self.join(30)
        assert not self.is_alive()
        return self.sent


def traffic_began(*publishers: Publisher) -> float:
    """When every publisher had its first message confirmed (wall clock)."""
    assert all(p.first.wait(10) for p in publishers)
    return max(p.began for p in publishers)


def rates_show(began: float, slot_ms: int) -> float:
    """The wall-clock time from which every rate PostgreSQL samples (storage/pg/queue_stats.py) is of traffic
    that ``began`` then, however the slots fall (PostgreSQL's clock, which cuts them, is this machine's). A
    rate shown during slot K is the growth between each member's samples of slots K-2 and K-1, each taken at
    the member's first flush of its slot: in the slot the traffic began in, a member's sample can be older
    than the traffic (a node's counters, sampled from its start: a partial rate) or missing (a queue's first
    sample, at its member's first flush after its first message, can fall in the next slot: no rate). From
    the third slot after it, both samples are of the traffic. (Before, the tests slept "two rate slots", 6.5 s
    of 3 s slots: begun late in a slot, they read a partial or no rate.)"""
    slot = slot_ms / 1000
    return (int(began // slot) + 3) * slot


def sleep_until(wall_clock: float) -> None:
    time.sleep(max(0.0, wall_clock - time.time()))


def answers_over(seconds: float, at_least: int, limit: float = 20.0) -> Iterator[int]:
    """Turns of a loop of questions 0.2 s apart, for ``seconds`` and at least ``at_least`` of them (a loaded
    machine answers slower; ``limit`` seconds at most)."""
    start = time.monotonic()
    n = 0
    while (time.monotonic() - start < seconds or n < at_least) and time.monotonic() - start < limit:
        yield n
        n += 1
        time.sleep(0.2)


def published_here_fetched_there(a, b, n: int) -> None:
    """``n`` persistent messages published (confirmed) on ``a``, then fetched on ``b`` by basic.get (auto-ack)."""
    conn, ch = channel(a)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", QUEUE, b"g%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()
    conn, ch = channel(b)
    assert len(drain(conn, ch, QUEUE, n)) == n
    conn.close()


def members_with_queue(start_broker, pg_dsn, slot_ms: int = 1000) -> tuple[Any, Any]:
    """Members a and b (rate slots of ``slot_ms``, the same on both: 1 s by default, so rates show within
    seconds), the quorum queue declared on a and known to b's HTTP API."""
    slots = ("--set", f"collect_statistics_interval={slot_ms}")
    a = member(start_broker, pg_dsn, "a@test", *slots)
    b = member(start_broker, pg_dsn, "b@test", *slots)
    conn, ch = channel(a)
    ch.queue_declare(QUEUE, durable=True, arguments=QUORUM)
    conn.close()
    assert wait_for(lambda: Http(b.management_port)("GET", f"/api/queues/%2F/{QUEUE}")[0] == 200, 30)
    return a, b


@contextmanager
def steady_traffic(publish_on, consume_on, per_second: float) -> Iterator[Publisher]:
    """Messages published on ``publish_on`` at ``per_second`` and acked by a consumer on ``consume_on``;
    yields the publisher, and at the end stops it and waits until every message it sent was acked."""
    acker = Acker(consume_on)
    acker.start()
    assert acker.ready.wait(10)
    publisher = Publisher(publish_on, per_second)
    publisher.start()
    try:
        yield publisher
    finally:
        n = publisher.finish()
        assert wait_for(lambda: acker.got >= n, 15), (acker.got, n)
        acker.stop.set()
        acker.join(10)


def test_message_stats_and_rates_are_the_same_on_every_member(start_broker, pg_dsn):
    a, b = members_with_queue(start_broker, pg_dsn)

    with steady_traffic(a, b, 40.0) as publisher:
        # While the traffic runs: both members answer the same rates (when asked within one rate slot: polled
        # until a pair of answers falls in one), and not zero on either (before, b showed no publish rate, a
        # no ack rate). The rate is the cluster's: the 40 a second a publishes and b acknowledges. (A queue's
        # rates are none until each member has two samples of its part, never partial: polled from the start,
        # then 2 s more of answers.)
        agreed: list[dict] = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            sa, sb = both(a, b)
            ra, rb = rates(sa), rates(sb)
            if ra == rb and all(ra[name] > 0 for name in RATES):
                if not agreed:
                    deadline = time.monotonic() + 2.0
                agreed.append(ra)
            time.sleep(0.1)
        assert agreed, (rates(sa), rates(sb))
        for r in agreed:
            assert 20 <= r["publish"] <= 60, r
            assert 20 <= r["ack"] <= 60 and 20 <= r["deliver_get"] <= 60, r
    n = publisher.sent

    # basic.get on b too: ten more published on a, fetched on b (auto-ack: no acks counted).
    published_here_fetched_there(a, b, 10)

    # At rest: the same totals on both, the real counts, and the rates back to zero on both.
    expected = {"publish": n + 10, "deliver_get": n + 10, "deliver": n, "get": 10, "redeliver": 0, "ack": n}

    def settled() -> bool:
        sa, sb = both(a, b)
        return counts(sa) == counts(sb) == expected and rates(sa) == rates(sb) == dict.fromkeys(COUNTS, 0.0)

    assert wait_for(settled, 30), both(a, b)
    sa, sb = both(a, b)
    assert sa == sb

    # Prometheus' per-queue counters: the cluster-wide figures, reported by the queue's leader alone (the
    # other member has none for it), so a sum over the members' scrapes counts them once.
    want = {"rabbitmq_queue_messages_published_total": n + 10, "rabbitmq_queue_messages_delivered_total": n,
            "rabbitmq_queue_messages_redelivered_total": 0, "rabbitmq_queue_messages_acked_total": n,
            "rabbitmq_queue_get_total": 10}
    assert sorted([prometheus_counters(a), prometheus_counters(b)], key=len) == [{}, want]

    # b dies: what it counted (every delivery and ack) stays in the totals a shows; once b is out of the live
    # members, a reports the queue whichever of them led it.
    os.kill(b.pid, signal.SIGKILL)
    b.process.wait(10)
    time.sleep(2.5)  # past a's cached reading and a flush of a's
    assert counts(message_stats(a)) == expected
    assert wait_for(lambda: prometheus_counters(a) == want, 20), prometheus_counters(a)


def test_a_queue_busy_on_one_member_is_not_idle_on_the_other(start_broker, pg_dsn):
    """``idle_since`` of a quorum queue follows the cluster's traffic: published and consumed on a, the queue is
    not shown idle on b, where nothing happens to it (before, b judged it by its own counters and showed it idle
    while a was busy); once the traffic stops, both show it idle."""
    a, b = members_with_queue(start_broker, pg_dsn)

    def idle_since(m) -> str | None:
        status, q, _ = Http(m.management_port)("GET", f"/api/queues/%2F/{QUEUE}")
        assert status == 200, q
        return q.get("idle_since")

    with steady_traffic(a, a, 30.0):  # 7 s, 30 a second
        time.sleep(3.0)  # the counters of the first seconds flushed and sampled on both
        looks = []
        while len(looks) < 8:  # 4 s: longer than a queue unchanged is shown idle after (SHARED_IDLE_AFTER)
            looks.append((idle_since(a), idle_since(b)))
            time.sleep(0.5)
        assert all(la is None and lb is None for la, lb in looks), looks
    assert wait_for(lambda: idle_since(a) is not None and idle_since(b) is not None, 30)


FIGURES = ("messages", "messages_ready", "messages_unacknowledged")


def figure_rates(m) -> dict[str, float]:
    status, q, _ = Http(m.management_port)("GET", f"/api/queues/%2F/{QUEUE}")
    assert status == 200, q
    return {name: q[name + "_details"]["rate"] for name in FIGURES}


def test_the_rates_of_a_queues_message_counts_are_the_same_on_every_member(start_broker, pg_dsn):
    """``messages_details`` (and ``messages_ready_details``, ``messages_unacknowledged_details``) of a quorum
    queue come from counts PostgreSQL samples once per rate slot, so every member whose reading (cached up to
    1 s, never past its slot) is of the same slot shows the same rates. Before, each member sampled the
    counts itself, at its own moments: the rates differed (here: 1 s slots, so a pair of answers taken at
    once differs only if a slot ended between them)."""
    a, b = members_with_queue(start_broker, pg_dsn)
    publisher = Publisher(a, 40.0)
    publisher.start()  # a backlog growing 40 a second, nobody consuming
    # The count's rate is none until the queue has two samples, both of the traffic (never partial: its first
    # sample is taken after its first message): from then on, on both.
    assert wait_for(lambda: all(figure_rates(m)["messages"] > 0 for m in (a, b)), 10)
    pairs: list[tuple[dict, dict]] = []
    for _ in answers_over(4.0, 15):
        with ThreadPoolExecutor(2) as pool:
            fa, fb = pool.submit(figure_rates, a), pool.submit(figure_rates, b)
            pairs.append((fa.result(), fb.result()))
    n = publisher.finish()
    assert len(pairs) >= 15, pairs
    same = [ra for ra, rb in pairs if ra == rb]
    assert len(same) * 3 >= len(pairs) * 2, pairs  # a pair differs only across a slot boundary
    for r in same:
        assert 30 <= r["messages"] <= 50 and r["messages"] == r["messages_ready"], r
        assert r["messages_unacknowledged"] == 0, r

    # Drained on b: back to zero on both.
    conn, ch = channel(b)
    assert len(drain(conn, ch, QUEUE, n)) == n
    conn.close()
    assert wait_for(lambda: figure_rates(a) == figure_rates(b) == dict.fromkeys(FIGURES, 0.0), 15), \
        (figure_rates(a), figure_rates(b))


def test_the_overview_shows_the_clusters_traffic_on_every_member(start_broker, pg_dsn):
    """The overview's ``message_stats`` (publish, deliver_get, ack, confirm...) are the cluster's, as RabbitMQ's
    overview shows a cluster's: each member writes its node-wide counters to PostgreSQL and every member adds
    the other live members' to its own. Before, a showed only the publishes and b only the deliveries."""
    a, b = members_with_queue(start_broker, pg_dsn)
    published_here_fetched_there(a, b, 30)

    def overview_stats(m) -> dict:
        stats = Http(m.management_port)("GET", "/api/overview")[1]["message_stats"]
        return {name: stats.get(name) for name in ("publish", "confirm", "deliver_get", "get_no_ack", "redeliver")}

    want = {"publish": 30, "confirm": 30, "deliver_get": 30, "get_no_ack": 30, "redeliver": 0}  # (auto-ack gets)
    assert wait_for(lambda: overview_stats(a) == overview_stats(b) == want, 30), (overview_stats(a),
                                                                                   overview_stats(b))
    # A member that stopped drops out, as a node that left a RabbitMQ cluster takes its statistics with it.
    b.stop()
    without_b = {**want, "deliver_get": 0, "get_no_ack": 0}
    assert wait_for(lambda: overview_stats(a) == without_b, 30), overview_stats(a)
    # Back, b counts from zero (its previous run's totals are not added again: they would show as a burst).
    b.start()
    assert wait_for(lambda: http_status(Http(b.management_port), "/api/overview") is not None, 30)  # (after AMQP)
    assert wait_for(lambda: overview_stats(b) == without_b, 30), overview_stats(b)
    time.sleep(2.5)  # past b's first flush and a's cached reading
    assert overview_stats(a) == without_b


# 20 s (3 s rate slots): among the first of the serial pass (tests/conftest.py _slow_first), not left running
# alone at its end.
@pytest.mark.slow
def test_another_members_classic_queue_and_the_totals_show_the_same_rates_on_every_member(start_broker, pg_dsn):
    """A classic queue lives on one member (its rates are sampled there); the others list it with the figures,
    message counters and rates its member answers, and the overview's and the vhost's totals add up the rates
    of every queue of the cluster as every member shows them. Before, member b showed a's classic queue with
    rate 0 and no message_stats, and b's totals' rates counted only the queues b itself had (here: 20 a second
    where a showed 60). The overview's message rates come from the members' counters sampled in PostgreSQL
    (schema version 7): before, each member sampled the cluster's sums at its own moments, and two members
    asked at once answered different rates."""
    slot_ms = 3000
    a, b = members_with_queue(start_broker, pg_dsn, slot_ms=slot_ms)
    conn, ch = channel(a)
    ch.queue_declare("classic-on-a", durable=True)
    conn.close()
    assert wait_for(lambda: Http(b.management_port)("GET", "/api/queues/%2F/classic-on-a")[0] == 200, 30)
    to_classic, to_quorum = Publisher(a, 40.0, "classic-on-a"), Publisher(b, 20.0)
    to_classic.start()
    to_quorum.start()  # backlogs growing 40 and 20 a second, nobody consuming

    def reading(m) -> tuple[dict, float, float, float]:
        api = Http(m.management_port)
        q = api("GET", "/api/queues/%2F/classic-on-a")[1]
        rates = {name: q[name + "_details"]["rate"] for name in FIGURES}
        rates["publish"] = q["message_stats"].get("publish_details", {}).get("rate", 0.0)
        overview = api("GET", "/api/overview")[1]
        totals = overview["queue_totals"]["messages_details"]["rate"]
        vhost = api("GET", "/api/vhosts/%2F")[1]["messages_details"]["rate"]
        # The overview's message rates: every member's counters, sampled by PostgreSQL's clock (version 7).
        publish = overview["message_stats"].get("publish_details", {}).get("rate", 0.0)
        return rates, totals, vhost, publish

    def view(m) -> tuple[dict, float, float, float]:
        """One member's answers, from one reading of the figures: asked again if a rate slot began (or the
        classic queue's member sampled it) between the requests (both members would then show the
        overview's totals of one slot beside the vhost's of the next)."""
        for _ in range(3):
            one = reading(m)
            if one == reading(m):
                break
        return one

    # Every rate of the traffic (the classic queue's sampled on a every slot_ms, and answered to b up to
    # LIST_MAX_AGE late; the quorum queue's and the overview's sampled in PostgreSQL, see rates_show).
    began = traffic_began(to_classic, to_quorum)
    sleep_until(max(rates_show(began, slot_ms), began + 2 * slot_ms / 1000 + LIST_MAX_AGE) + 0.1)
    pairs = []
    for _ in answers_over(4.0, 10):
        with ThreadPoolExecutor(2) as pool:
            fa, fb = pool.submit(view, a), pool.submit(view, b)
            pairs.append((fa.result(), fb.result()))
    n = to_classic.finish()
    to_quorum.finish()
    assert len(pairs) >= 10, pairs
    same = [va for va, vb in pairs if va == vb]
    assert len(same) * 2 >= len(pairs), pairs  # a pair differs only across a sample or slot boundary
    for rates, totals, vhost, publish in same:
        assert 30 <= rates["messages"] <= 50 and rates["messages"] == rates["messages_ready"], rates
        assert 30 <= rates["publish"] <= 50, rates
        assert 45 <= totals <= 75 and totals == vhost, (totals, vhost)
        assert 45 <= publish <= 75, publish

    # Every queue of the cluster counted once in the overview's object totals, on both (b has the classic
    # queue only as a's answer).
    assert [Http(m.management_port)("GET", "/api/overview")[1]["object_totals"]["queues"] for m in (a, b)] == [2, 2]

    # At rest: the classic queue's counters as its member counts them, on both; every rate back to zero.
    def settled() -> bool:
        (ra, ta, va, pa), (rb, tb, vb, pb) = view(a), view(b)
        stats = [Http(m.management_port)("GET", "/api/queues/%2F/classic-on-a")[1]["message_stats"] for m in (a, b)]
        return (stats[0]["publish"] == stats[1]["publish"] == n and ra == rb == dict.fromkeys(ra, 0.0)
                and ta == tb == va == vb == pa == pb == 0.0)

    assert wait_for(settled, 15), (view(a), view(b))
