"""Exchange federation from a real RabbitMQ 3.10.8 upstream (issue 37): a Leveret downstream federates an exchange
of RabbitMQ (which runs no federation plugin: the link's plain fanout exchange and queue are declared there);
bound keys cross, unbound ones do not, a binding made downstream later starts matching, and the link comes back
after RabbitMQ restarts without losing an on-confirm message."""

from __future__ import annotations

import json
import threading

import pika
import pytest

from tests.integration.federation.conftest import federate, federation_status, leveret_node, link_of, received
from tests.integration.federation.test_federation_leveret import declare, publish
from tests.integration.shovel.conftest import wait_for

# One worker for the module: one RabbitMQ node (tests/integration/shovel/test_shovel.py says why the marker is
# written here).
pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(400),
              pytest.mark.xdist_group("tests/integration/federation/test_federation_rabbitmq.py")]


def rabbit_params(rabbit) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=rabbit.port, heartbeat=0,
                                     credentials=pika.PlainCredentials("guest", "guest"))


def rabbit_bindings(rabbit, exchange: str) -> set[str]:
    out = rabbit.ctl("list_bindings", "source_name", "destination_name", "routing_key", "--formatter", "json")
    assert out.returncode == 0, out.stderr
    return {b["routing_key"] for b in json.loads(out.stdout) if b["source_name"] == exchange}


def test_leveret_federates_an_exchange_of_rabbitmq(rabbit, start_broker, uid):
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex, q = f"fed.{uid}", f"{uid}-q"
    rp, dp = rabbit_params(rabbit), down.pika_params(heartbeat=0)
    declare(rp, ex)
    declare(dp, ex, bindings={q: ["a.*"]})
    federate(down, "rabbit", rabbit.url, "^fed\\.", **{"reconnect-delay": 1})
    link = link_of(down, ex)
    assert link["uri"] == f"amqp://127.0.0.1:{rabbit.port}/%2F"
    wait_for(lambda: rabbit_bindings(rabbit, ex) == {"a.*"}, 15, "binding a.* on RabbitMQ")
    queues = rabbit.ctl("list_queues", "name", "durable", "--formatter", "json")
    internal = f"federation: {ex} -> down-{uid}@localhost"
    assert {"name": internal, "durable": True} in json.loads(queues.stdout)

    publish(rp, ex, ["a.1", "b.1", "a.2"])
    got = received(dp, q, at_least=2)
    assert sorted(b for _p, b in got) == [b"m0", b"m2"]
    hop = got[0][0].headers["x-received-from"][0]
    assert hop["cluster-name"].startswith(f"leveret-shovel-{rabbit.port}@") and hop["uri"] == f"amqp://127.0.0.1:{rabbit.port}/%2F"

    with pika.BlockingConnection(dp) as conn:
        conn.channel().queue_bind(q, ex, "b.#")
    wait_for(lambda: rabbit_bindings(rabbit, ex) == {"a.*", "b.#"}, 15, "binding b.# on RabbitMQ")
    publish(rp, ex, ["b.x.y"], start=10)
    assert [b for _p, b in received(dp, q, at_least=1)] == [b"m10"]

    rows = federation_status(down)
    assert [(r["exchange"], r["upstream"], r["status"], r["type"]) for r in rows] == \
        [(ex, "rabbit", "running", "exchange")]


def test_link_survives_a_rabbitmq_restart_without_losing_on_confirm_messages(rabbit, start_broker, uid):
    down = leveret_node(start_broker, f"down-{uid}@localhost")
    ex, q = f"fed.{uid}", f"{uid}-q"
    rp, dp = rabbit_params(rabbit), down.pika_params(heartbeat=0)
    declare(rp, ex)
    declare(dp, ex, bindings={q: ["#"]})
    federate(down, "rabbit", rabbit.url, "^fed\\.", **{"reconnect-delay": 1, "prefetch-count": 50})
    link_of(down, ex)
    wait_for(lambda: rabbit_bindings(rabbit, ex) == {"#"}, 15, "binding # on RabbitMQ")
    n = 3000
    publisher = threading.Thread(target=publish, args=(rp, ex, ["k"] * n))
    publisher.start()
    publisher.join(120)
    rabbit.stop()
    link_of(down, ex, status="error", timeout=30)
    rabbit.start()
    link_of(down, ex, timeout=90)
    publish(rp, ex, ["k"] * 100, start=n)
    got = received(dp, q, at_least=n + 100, timeout=90, quiet=2)
    assert {int(p.message_id) for p, _b in got} == set(range(n + 100))
