"""One cluster, one identity (issue 35): a second member with a running member's name is refused at start (one
line naming the name and ``leveret.nodename``), a member killed -9 and started again under its name rejoins at
once, and members on one machine left to their default names get distinct ones; the cluster name is one, stored
in PostgreSQL, the same on every member (HTTP API, Prometheus, AMQP server properties). Real broker processes on
one real PostgreSQL (tests/pg_server.py)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pika
import pytest

from tests.conftest import ROOT
from tests.integration.cluster.test_cluster_definitions import http_status, member
from tests.integration.management.test_management_api import Http, wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

QQ = {"x-queue-type": "quorum"}


def fill(b, queue: str, n: int) -> None:
    """Declare the quorum queue ``queue`` on ``b`` and publish ``n`` messages with confirms."""
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True, arguments=QQ)
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


def get_all(b, queue: str) -> list[bytes]:
    """Every message of ``queue`` taken with basic.get on ``b`` (acked)."""
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    out: list[bytes] = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append(body)
    conn.close()
    return out


def test_a_second_member_with_a_running_members_name_is_refused(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "same@test")
    fill(a, "qq-named", 5)
    with pytest.raises(RuntimeError) as refused:
        start_broker("--set", f"cluster.postgres.dsn={pg_dsn}", "--set", "leveret.nodename=same@test")
    text = str(refused.value)
    assert "exited with 1" in text
    line = next(x for x in text.splitlines() if x.startswith("leveret: "))
    assert "same@test" in line and "leveret.nodename" in line, line
    # The running member is untouched by the refused start.
    assert get_all(a, "qq-named") == [b"0", b"1", b"2", b"3", b"4"]


def test_a_member_killed_and_started_again_under_its_name_rejoins_at_once(start_broker, pg_dsn):
    """kill -9 ends the member's PostgreSQL sessions with its process: its epoch's key is free, which proves
    that run is gone, so the restart does not wait for the lease to pass. The lease is 60 s here, so that a
    start slowed by a loaded machine (a few seconds) cannot be mistaken for a wait on it."""
    a = member(start_broker, pg_dsn, "again@test", "--set", "cluster.postgres.lease_seconds=60")
    fill(a, "qq-again", 10)
    a.kill9()
    t0 = time.monotonic()
    a.start()
    assert wait_for(lambda: http_status(Http(a.management_port), "/api/overview") is not None, 30)
    took = time.monotonic() - t0
    assert took < 30, f"restart took {took:.1f} s: it waited for (half) the lease of the killed run"
    assert sorted(get_all(a, "qq-again"), key=int) == [str(i).encode() for i in range(10)]


def test_members_on_one_machine_left_to_their_default_names_both_serve_the_cluster(start_broker, pg_dsn):
    """Without leveret.nodename, members on other ports than 5672 are leveret-<port>@<host>: two on one
    machine differ, and a quorum queue filled on one is served by the other (before: both leveret@<host>, and
    the second answered 404 NOT_FOUND)."""
    a = start_broker("--set", f"cluster.postgres.dsn={pg_dsn}")
    b = start_broker("--set", f"cluster.postgres.dsn={pg_dsn}")
    names = []
    for x in (a, b):
        overview = wait_for(lambda x=x: Http(x.management_port)("GET", "/api/overview")[1], 10)
        names.append(overview["node"])
    assert names[0] != names[1], names
    assert names[0].startswith(f"leveret-{a.port}@"), names
    fill(a, "qq-default-names", 20)
    assert sorted(get_all(b, "qq-default-names"), key=int) == [str(i).encode() for i in range(20)]


def prometheus_identity(b) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{b.prometheus_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return next(x for x in text.splitlines() if x.startswith("rabbitmq_identity_info"))


def server_cluster_name(b) -> str:
    """The cluster_name of the server properties in b's Connection.Start."""
    conn = pika.BlockingConnection(b.pika_params())
    try:
        name = conn._impl.server_properties["cluster_name"]
        return name.decode() if isinstance(name, bytes) else name
    finally:
        conn.close()


def names_everywhere(b) -> tuple[str, str, str, str]:
    """b's cluster name as /api/cluster-name, /api/overview, Prometheus and AMQP report it."""
    api = Http(b.management_port)
    return (api("GET", "/api/cluster-name")[1]["name"], api("GET", "/api/overview")[1]["cluster_name"],
            prometheus_identity(b).split('rabbitmq_cluster="', 1)[1].split('"', 1)[0], server_cluster_name(b))


def test_the_cluster_has_one_name_on_every_member_set_through_any(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "first@test")
    b = member(start_broker, pg_dsn, "second@test")
    # A new cluster is named after its first member (RabbitMQ's default), and the second takes that name.
    assert names_everywhere(a) == ("first@test",) * 4
    assert names_everywhere(b) == ("first@test",) * 4
    # PUT on one member renames the cluster: the other reports it within a moment, everywhere.
    assert Http(b.management_port)("PUT", "/api/cluster-name", {"name": "orders-prod"})[0] == 204
    assert wait_for(lambda: names_everywhere(a) == ("orders-prod",) * 4, 5), names_everywhere(a)
    assert names_everywhere(b) == ("orders-prod",) * 4
    # It is the cluster's, kept in PostgreSQL: a member started again (without cluster_name) still has it.
    a.stop()
    a.start()
    assert wait_for(lambda: http_status(Http(a.management_port), "/api/overview") is not None, 10)
    assert names_everywhere(a) == ("orders-prod",) * 4
    # The cluster_name key of a member's configuration names the cluster at its start, as RabbitMQ's does.
    c = member(start_broker, pg_dsn, "third@test", "--set", "cluster_name=from-config")
    assert names_everywhere(c) == ("from-config",) * 4
    assert wait_for(lambda: names_everywhere(a) == ("from-config",) * 4, 5), names_everywhere(a)
    assert wait_for(lambda: names_everywhere(b) == ("from-config",) * 4, 5), names_everywhere(b)
    # And as an operator does it, `leveret ctl set_cluster_name` (rabbitmqctl's verb) on one member names it on all.
    out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{a.management_port}",
                          "set_cluster_name", "orders-eu"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "Setting cluster name to orders-eu ...", out
    for m in (a, b, c):
        assert wait_for(lambda m=m: names_everywhere(m) == ("orders-eu",) * 4, 5), names_everywhere(m)
