"""A dynamic shovel runs on one member of a Leveret cluster, and on another once that member is gone (issue 37:
"shovels ... run on one member in a cluster"; broker/shovel/placement.py, storage/pg/claims.py).

A shovel's parameter is a shared definition, so every member knows it. Before, every member ran it: a shovel
from an exchange declared a queue on each member and moved every message once per member (two members: each
message twice). RabbitMQ runs it on one node. Here: one member lists it running and the other does not, a
message published into the source exchange reaches the destination once, and after a kill -9 of the member
running it the other member starts it (within seconds) and moves what is published next; a member that hangs
(SIGSTOP) loses it once its lease has run out and does not take it back when woken. Real broker processes,
a real PostgreSQL (tests/pg_server.py), pika clients, the HTTP API."""

from __future__ import annotations

import os
import signal
import time
import urllib.parse
from collections import Counter

import pika
import pytest

from tests.integration.cluster.test_cluster_cross_member import QUORUM, two
from tests.integration.cluster.test_cluster_forwarding import channel
from tests.integration.cluster.test_cluster_overflow import wait_count
from tests.integration.management.test_management_api import Http

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

SHOVEL = "one-member"
TAKEOVER = 15.0  # the killed member's session ends at once; the survivor claims every second (CLAIM_EVERY)


def node_name(m) -> str:
    status, overview, _ = Http(m.management_port)("GET", "/api/overview")
    assert status == 200, overview
    return str(overview["node"])


def listed(m) -> list[dict]:
    """The shovel's entries in ``m``'s GET /api/shovels (every member's shovels, as RabbitMQ lists them)."""
    status, shovels, _ = Http(m.management_port)("GET", "/api/shovels")
    assert status == 200, shovels
    return [s for s in shovels if s["name"] == SHOVEL]


def running_here(m) -> list[str]:
    """``m``'s own node name if ``m`` runs the shovel."""
    me = node_name(m)
    return [s["node"] for s in listed(m) if s["state"] == "running" and s["node"] == me]


def wait_running(members, timeout: float) -> list:
    """The members that list the shovel running, once at least one does (and the others had time to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holders = [m for m in members if running_here(m)]
        if holders:
            time.sleep(2.5)  # two more claim rounds: a second member would have started it by now
            return [m for m in members if running_here(m)]
        time.sleep(0.1)
    return []


def publish(m, exchange: str, bodies: list[bytes]) -> None:
    conn, ch = channel(m)
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, "", body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def drain(m, queue: str) -> list[bytes]:
    """Every message of ``queue`` (taken with basic.get, acked)."""
    conn, ch = channel(m)
    out = []
    try:
        while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
            out.append(got[2])
    finally:
        conn.close()
    return out


def count(m, queue: str) -> int:
    conn, ch = channel(m)
    try:
        return int(ch.queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def shovel_on(a, b) -> tuple:
    """The shovel (fanout exchange ``shovel-src`` to quorum queue ``shovel-dst``) declared through ``a``: returns
    (the member that runs it, the other), once exactly one runs it."""
    conn, ch = channel(a)
    ch.exchange_declare("shovel-src", "fanout", durable=True)
    ch.queue_declare("shovel-dst", durable=True, arguments=QUORUM)
    conn.close()
    value = {"src-uri": "amqp://", "src-exchange": "shovel-src", "dest-uri": "amqp://", "dest-queue": "shovel-dst"}
    status, body, _ = Http(a.management_port)("PUT", f"/api/parameters/shovel/%2F/{urllib.parse.quote(SHOVEL)}",
                                              {"value": value})
    assert status in (201, 204), body
    holders = wait_running([a, b], 15)
    assert len(holders) == 1, [running_here(m) for m in (a, b)]
    return holders[0], (b if holders[0] is a else a)


def test_a_shovel_runs_on_one_member_moves_each_message_once_and_moves_on_a_kill(start_broker, pg_dsn):
    a, b = two(start_broker, pg_dsn)
    holder, other = shovel_on(a, b)
    # Every member lists it, once, with the member that runs it (the other from the holder's report).
    assert [(s["node"], s["state"]) for s in listed(holder)] == [(node_name(holder), "running")]
    deadline = time.monotonic() + 10
    while [(s["node"], s["state"]) for s in listed(other)] != [(node_name(holder), "running")]:
        assert time.monotonic() < deadline, listed(other)
        time.sleep(0.2)
    assert listed(other)[0]["dest_queue"] == "shovel-dst"

    publish(a, "shovel-src", [f"m{i}".encode() for i in range(300)])
    assert wait_count(a, "shovel-dst", 300, timeout=20), count(a, "shovel-dst")
    time.sleep(1.5)  # a second copy would come from a second member's shovel by now
    assert count(a, "shovel-dst") == 300

    os.kill(holder.pid, signal.SIGKILL)
    holder.process.wait(timeout=10)
    killed_at = time.monotonic()
    taken = wait_running([other], TAKEOVER)
    assert taken == [other], f"no member ran the shovel within {TAKEOVER} s of the kill"
    took = time.monotonic() - killed_at
    publish(other, "shovel-src", [f"n{i}".encode() for i in range(200)])
    assert wait_count(other, "shovel-dst", 500, timeout=20), count(other, "shovel-dst")
    assert took < TAKEOVER, took


HUNG_TAKEOVER = 20.0  # a 3 s lease, the survivor's reap round (0.5 s) and claim round (1 s), under the suite's load


def test_a_hung_member_gives_its_shovel_up_and_does_not_take_it_back(start_broker, pg_dsn):
    """A member that hangs (SIGSTOP) keeps its connections open; once its lease (3 s here) has run out, the
    other member ends its sessions, the claims session among them (it holds the member's epoch key), and runs
    the shovel. Woken up, the hung member finds its claims lost and does not run the shovel again; what was
    published during the hang may arrive twice (at least once), nothing is lost."""
    a, b = two(start_broker, pg_dsn, "--set", "cluster.postgres.lease_seconds=3")
    holder, other = shovel_on(a, b)

    os.kill(holder.pid, signal.SIGSTOP)
    try:
        hung_at = time.monotonic()
        taken = wait_running([other], HUNG_TAKEOVER)  # only the other is asked: the hung one answers nothing
        assert taken == [other], f"no member ran the shovel within {HUNG_TAKEOVER} s of the hang"
        took = time.monotonic() - hung_at
        publish(other, "shovel-src", [f"h{i}".encode() for i in range(200)])
        assert wait_count(other, "shovel-dst", 200, timeout=20), count(other, "shovel-dst")
    finally:
        os.kill(holder.pid, signal.SIGCONT)

    deadline = time.monotonic() + 15
    while running_here(holder):  # woken: it finds its sessions ended and stops what it ran under them
        assert time.monotonic() < deadline, "the member that hung still runs the shovel"
        time.sleep(0.2)
    time.sleep(2.5)  # two more claim rounds: it would have taken the shovel back by now
    assert [m for m in (a, b) if running_here(m)] == [other]
    publish(holder, "shovel-src", [f"w{i}".encode() for i in range(100)])  # routed on the member that ran it
    deadline = time.monotonic() + 20
    while count(other, "shovel-dst") < 300:
        assert time.monotonic() < deadline, count(other, "shovel-dst")
        time.sleep(0.2)
    time.sleep(1.5)
    got = Counter(drain(other, "shovel-dst"))
    hung = {f"h{i}".encode() for i in range(200)}
    assert set(got) == hung | {f"w{i}".encode() for i in range(100)}  # nothing lost
    # At least once: the hung member's own source queue (bound to the fanout exchange like the new holder's) got
    # the messages published during the hang too, and when woken it may move them before it sees its claims lost
    # (both events wait on its loop; 2 of 4 runs here). Only those can come twice; after that, each once.
    assert all(n == 1 for body, n in got.items() if body not in hung), got
    assert all(n <= 2 for n in got.values()), got
    assert took < HUNG_TAKEOVER, took
