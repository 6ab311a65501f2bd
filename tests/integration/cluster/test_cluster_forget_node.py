"""``leveret ctl forget_cluster_node`` (rabbitmqctl's verb; issue 15): a member that will not come back is
removed from the cluster with its node-local queues and the messages forwarded to them, so that its queue
names can be declared elsewhere and nothing waits for it for ever. A running member is refused.
"""

from __future__ import annotations

import pika
import pytest

from tests.integration.cluster.test_cluster_definitions import member
from tests.integration.cluster.test_cluster_forwarding import channel, known_on
from tests.integration.management.test_ctl_operator_verbs import _cli
from tests.integration.management.test_management_api import Http, wait_for

pytestmark = [pytest.mark.leveret_only]
pytest_plugins = ["pg_fixtures"]


def forget(on, name: str):
    return _cli("ctl", f"http://127.0.0.1:{on.management_port}", "forget_cluster_node", name)


def test_a_stopped_member_is_forgotten_with_its_queues_and_what_waited_for_them(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    conn, ch = channel(b)
    ch.queue_declare("kept-for-b", durable=True)
    conn.close()
    assert known_on(a, "kept-for-b")

    running = forget(a, "b@test")
    assert running.returncode == 1 and "running" in running.stderr, running
    itself = forget(a, "a@test")
    assert itself.returncode == 1 and "itself" in itself.stderr, itself
    unknown = forget(a, "nobody@test")
    assert unknown.returncode == 1 and "404" in unknown.stderr, unknown

    b.stop()  # a clean stop: b is still a member, its durable queue waits for it
    conn, ch = channel(a)
    ch.confirm_delivery()
    for i in range(3):  # forwarded and kept for b
        ch.basic_publish("", "kept-for-b", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
    conn.close()

    out = forget(a, "b@test")
    assert out.returncode == 0, out.stderr
    assert "Removing node b@test from the cluster" in out.stdout
    assert "1 of its queue(s) removed, 3 message(s) forwarded to it dropped" in out.stdout

    api = Http(a.management_port)
    assert [n["name"] for n in api("GET", "/api/nodes")[1]] == ["a@test"]
    assert wait_for(lambda: not known_on(a, "kept-for-b", timeout=0.2), 30), "a still sees b's queue"
    # The name is free: declared on a, it is a's own queue, empty, and takes messages.
    conn, ch = channel(a)
    assert ch.queue_declare("kept-for-b", durable=True).method.message_count == 0
    ch.confirm_delivery()
    ch.basic_publish("", "kept-for-b", b"here", mandatory=True)
    assert ch.queue_declare("kept-for-b", passive=True).method.message_count == 1
    conn.close()
    assert api("GET", "/api/queues/%2F/kept-for-b")[1]["node"] == "a@test"
    assert forget(a, "b@test").returncode == 1  # forgotten already: no longer a member

    # b back after all: a member again; its own queue of that name is recovered, the name stays a's
    # (other members route there) and b says so.
    b.start()
    assert wait_for(lambda: "b@test" in [n["name"] for n in api("GET", "/api/nodes")[1]], 30)
    assert wait_for(lambda: "another cluster member's queue holds" in b.log_text(), 30)
    assert api("GET", "/api/queues/%2F/kept-for-b")[1]["node"] == "a@test"
