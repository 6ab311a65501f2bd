"""``leveret ctl import_from_rabbitmq URL`` (issue 37's one-command migration, Leveret's own) run as a user runs
it, the console script in a subprocess, against a real RabbitMQ 3.10.8 (management and consistent-hash
exchange plugins) and a Leveret of the test's own: the definitions arrive, every message arrives once
(count and bodies), RabbitMQ's queues end empty, the report names what could not be carried over, and a
second run doubles nothing.

What Leveret cannot carry here is a plugin's object: an ``x-consistent-hash`` exchange (and so its binding),
and RabbitMQ's ``internal_cluster_id``. No queue argument was found that RabbitMQ 3.10.8 accepts and Leveret
refuses (tried on both: quorum queues with x-max-in-memory-length, x-quorum-initial-group-size,
x-delivery-limit with x-dead-letter-strategy, x-message-ttl; classic queues with x-queue-version,
x-queue-master-locator, x-queue-mode lazy, x-overflow reject-publish-dlx), so the queues here all carry.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.shovel.conftest import api, wait_for
from tests.integration.shovel.helpers import count, drain
from tests.integration.shovel.rabbit_node import RabbitNode

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(300),
              pytest.mark.xdist_group("tests/integration/shovel/test_import_from_rabbitmq.py")]

LEVERET = Path(sys.executable).parent / "leveret"
EX_USAGE, EX_UNAVAILABLE = 64, 69


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitNode]:
    """RabbitMQ with its management API and a plugin whose objects Leveret does not have."""
    node = RabbitNode(plugins=["rabbitmq_management", "rabbitmq_consistent_hash_exchange"])
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


def rabbit_api(node: RabbitNode, method: str, path: str, body: object | None = None) -> object:
    req = urllib.request.Request(f"http://127.0.0.1:{node.http_port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode(),
                                          "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
        return json.loads(text) if text else None


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    assert LEVERET.exists(), f"the leveret console script is not installed in {LEVERET.parent}"
    return subprocess.run([str(LEVERET), "ctl", *args], capture_output=True, text=True, timeout=240, check=False)


def conn_params(port: int, vhost: str, user: str = "guest", password: str = "guest") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=port, virtual_host=vhost, heartbeat=0,
                                     credentials=pika.PlainCredentials(user, password),
                                     blocked_connection_timeout=60)


def publish(p: pika.ConnectionParameters, queue: str, n: int) -> list[bytes]:
    """n persistent messages with distinct bodies, confirmed."""
    bodies = [f"{queue}:{i}".encode() for i in range(n)]
    with pika.BlockingConnection(p) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i, body in enumerate(bodies):
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, message_id=str(i)))
    return bodies


def test_import_from_rabbitmq_carries_definitions_and_moves_every_message_once(rabbit, start_broker, uid):
    b = start_broker()
    vh = f"{uid}-vh"
    # -- a RabbitMQ as a team has it: a vhost, a user, exchanges, queues, bindings, a policy, a backlog
    rabbit_api(rabbit, "PUT", f"/api/vhosts/{vh}", {})
    rabbit_api(rabbit, "PUT", f"/api/permissions/{vh}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    rabbit_api(rabbit, "PUT", f"/api/users/{uid}-app", {"password": "app-secret", "tags": "management"})
    rabbit_api(rabbit, "PUT", f"/api/permissions/{vh}/{uid}-app", {"configure": "", "write": ".*", "read": ".*"})
    rabbit_api(rabbit, "PUT", f"/api/exchanges/{vh}/orders", {"type": "topic", "durable": True})
    rabbit_api(rabbit, "PUT", f"/api/exchanges/{vh}/hashed", {"type": "x-consistent-hash", "durable": True})
    rabbit_api(rabbit, "PUT", f"/api/queues/{vh}/qq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    rabbit_api(rabbit, "PUT", f"/api/queues/{vh}/capped", {"durable": True, "arguments": {"x-max-length": 1000}})
    rabbit_api(rabbit, "PUT", f"/api/queues/{vh}/idle", {"durable": True})
    rabbit_api(rabbit, "POST", f"/api/bindings/{vh}/e/orders/q/qq", {"routing_key": "a.#"})
    rabbit_api(rabbit, "POST", f"/api/bindings/{vh}/e/orders/q/capped", {"routing_key": "b.#"})
    rabbit_api(rabbit, "POST", f"/api/bindings/{vh}/e/hashed/q/capped", {"routing_key": "1"})
    rabbit_api(rabbit, "PUT", f"/api/policies/{vh}/ttl", {"pattern": "^capped$", "apply-to": "queues",
                                                          "definition": {"message-ttl": 3_600_000}})
    rp = conn_params(rabbit.port, vh)
    sent = {"qq": publish(rp, "qq", 700), "capped": publish(rp, "capped", 400)}
    # RabbitMQ's API counts a queue's messages every 5 s: wait until it shows the backlog, as a user sees it.
    wait_for(lambda: {q["name"]: q.get("messages") for q in rabbit_api(rabbit, "GET", f"/api/queues/{vh}")}
             == {"qq": 700, "capped": 400, "idle": 0}, 30, "RabbitMQ's API shows the backlog")

    lev_url = f"http://127.0.0.1:{b.management_port}"
    src = f"http://guest:guest@127.0.0.1:{rabbit.http_port}"
    amqp = f"amqp://guest:guest@127.0.0.1:{rabbit.port}"
    done = ctl("--url", lev_url, "import_from_rabbitmq", src, "--amqp-uri", amqp, "--move-timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Imported from RabbitMQ 3.10.8" in out, out
    # progress as it went: each move followed until its shovel removed itself
    assert "Moving the messages of 2 queue(s) ..." in out, out
    assert f"  queue 'qq' in vhost '{vh}': done\n" in out and f"  queue 'capped' in vhost '{vh}': done\n" in out, out
    assert f"exchange 'hashed' of type 'x-consistent-hash' in vhost '{vh}': unknown exchange type" in out, out
    assert f"binding of exchange 'hashed' to queue 'capped' with routing key '1' in vhost '{vh}'" in out, out
    assert "global parameter 'internal_cluster_id'" in out, out
    assert f"queue 'qq' in vhost '{vh}' (700 message(s)): done" in out, out
    assert f"queue 'capped' in vhost '{vh}' (400 message(s)): done" in out, out
    assert "'idle'" not in out.split("Shovels")[1], out  # an empty queue gets no shovel

    # -- the definitions are on the Leveret
    _, defs = api(b, "GET", "/api/definitions")
    assert vh in {v["name"] for v in defs["vhosts"]}
    queues = {q["name"]: q["arguments"] for q in defs["queues"] if q["vhost"] == vh}
    assert queues == {"qq": {"x-queue-type": "quorum"}, "capped": {"x-max-length": 1000}, "idle": {}}
    assert {(x["name"], x["type"]) for x in defs["exchanges"] if x["vhost"] == vh} == {("orders", "topic")}
    assert {(x["source"], x["destination"], x["routing_key"]) for x in defs["bindings"] if x["vhost"] == vh} \
        == {("orders", "qq", "a.#"), ("orders", "capped", "b.#")}
    assert [(p["name"], p["definition"]) for p in defs["policies"] if p["vhost"] == vh] \
        == [("ttl", {"message-ttl": 3_600_000})]
    rabbit_user = next(u for u in rabbit_api(rabbit, "GET", "/api/definitions")["users"] if u["name"] == f"{uid}-app")
    user = next(u for u in defs["users"] if u["name"] == f"{uid}-app")
    assert (user["password_hash"], user["hashing_algorithm"]) == (rabbit_user["password_hash"],
                                                                  rabbit_user["hashing_algorithm"])
    with pika.BlockingConnection(conn_params(b.port, vh, f"{uid}-app", "app-secret")) as conn:
        assert conn.channel().queue_declare("qq", passive=True).method.message_count == 700  # logs in as before

    # -- every message once, RabbitMQ's queues empty, the shovels gone
    lp = conn_params(b.port, vh)
    assert {q: count(lp, q) for q in sent} == {"qq": 700, "capped": 400}
    assert {q: count(rp, q) for q in sent} == {"qq": 0, "capped": 0}
    assert api(b, "GET", "/api/parameters/shovel")[1] == []

    # -- a second run doubles nothing (RabbitMQ's API may still count the old backlog for a few seconds: a
    # shovel set then finds the queue empty and removes itself)
    again = ctl("--url", lev_url, "--formatter", "json", "import_from_rabbitmq", src, "--amqp-uri", amqp,
                "--move-timeout", "120")
    assert again.returncode == 0, again.stdout + again.stderr
    report = json.loads(again.stdout)
    assert {d["object"] for d in report["dropped"]} >= {
        f"exchange 'hashed' of type 'x-consistent-hash' in vhost '{vh}'",
        f"binding of exchange 'hashed' to queue 'capped' with routing key '1' in vhost '{vh}'"}
    assert report["imported"]["queues"]["offered"] == report["imported"]["queues"]["carried"]
    assert all(s["state"] == "done" for s in report["shovels"]), report["shovels"]
    _, defs_again = api(b, "GET", "/api/definitions")
    assert sorted(q["name"] for q in defs_again["queues"]) == sorted(q["name"] for q in defs["queues"])
    for queue, bodies in sent.items():
        got = drain(lp, queue)
        assert sorted(body for _props, body, _redelivered in got) == sorted(bodies), queue
    assert {q: count(rp, q) for q in sent} == {"qq": 0, "capped": 0}


def test_usage_and_an_unreachable_rabbitmq_exit_as_ctl_does():
    nowhere = "http://127.0.0.1:1"  # nothing listens on port 1: neither the RabbitMQ nor a Leveret
    done = ctl("--url", nowhere, "import_from_rabbitmq")
    assert done.returncode == EX_USAGE and "usage: leveret ctl import_from_rabbitmq URL" in done.stderr, done
    done = ctl("--url", nowhere, "import_from_rabbitmq", "amqp://guest:guest@127.0.0.1")
    assert done.returncode == EX_USAGE and "management API" in done.stderr, done
    done = ctl("--url", nowhere, "import_from_rabbitmq", nowhere, "--amqp-uri", "amqp://h:5672/vh")
    assert done.returncode == EX_USAGE and "without a vhost" in done.stderr, done
    done = ctl("--url", nowhere, "import_from_rabbitmq", "http://guest:secret@127.0.0.1:1")
    assert done.returncode == EX_UNAVAILABLE, done
    assert done.stderr.strip().startswith("Error: cannot reach http://127.0.0.1:1: "), done.stderr
    assert "secret" not in done.stderr
