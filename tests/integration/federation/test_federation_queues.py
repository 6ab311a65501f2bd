"""Queue federation (issue 37): a queue here with the ``federation-upstream`` policy key fetches from its upstream
namesake only while it has consumers and nothing ready: published upstream with no consumer here, the messages
stay upstream; a consumer here receives them all, acked upstream on confirm. Upstreams: a second Leveret and a
real RabbitMQ 3.10.8."""

from __future__ import annotations

import time
import urllib.request

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.federation.conftest import api, received, wait_for
from tests.integration.shovel.helpers import count, publish

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(300),
              pytest.mark.xdist_group("tests/integration/federation/test_federation_queues.py")]


def federate_queue(broker, upstream: str, uri: str, pattern: str, **keys) -> None:
    assert api(broker, "PUT", f"/api/parameters/federation-upstream/%2F/{upstream}",
               {"value": {"uri": uri, **keys}})[0] in (201, 204)
    assert api(broker, "PUT", f"/api/policies/%2F/fedq-{upstream}",
               {"pattern": pattern, "apply-to": "queues", "definition": {"federation-upstream": upstream}})[0] \
        in (201, 204)


def queue_link(broker, queue: str) -> dict:
    def find():
        _, links = api(broker, "GET", "/api/federation-links")
        return next((li for li in links if li.get("queue") == queue and li["status"] == "running"), None)
    return wait_for(find, 60, f"queue link of {queue} running")


def moves_to_consumers(up_p: pika.ConnectionParameters, down, uri: str, uid: str) -> None:
    q = f"fedq.{uid}"
    down_p = down.pika_params(heartbeat=0)
    publish(up_p, q, 300)  # declares it upstream, durable
    with pika.BlockingConnection(down_p) as conn:
        conn.channel().queue_declare(q, durable=True)
    federate_queue(down, "up", uri, "^fedq\\.", **{"prefetch-count": 50})
    link = queue_link(down, q)
    assert link["type"] == "queue" and link["upstream_queue"] == q and link["consuming"] is False
    time.sleep(1.5)  # no consumer here: nothing moves
    assert count(up_p, q) == 300 and count(down_p, q) == 0
    got = received(down_p, q, at_least=300, timeout=60, quiet=1.5)
    assert sorted(int(p.message_id) for p, _b in got) == list(range(300))
    assert got[0][0].headers["x-received-from"][0]["queue"] == q
    assert wait_for(lambda: count(up_p, q) == 0, 10, "upstream queue drained")


def federation_samples(broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The ``leveret_federation_*`` samples of the broker's /metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prometheus_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) if family.name.startswith("leveret_federation")
            for s in family.samples}


def test_a_federated_queue_fetches_from_a_leveret_upstream_only_for_its_consumers(start_broker, uid):
    up = start_broker("--set", f"leveret.nodename=up-{uid}@localhost")
    down = start_broker("--set", f"leveret.nodename=down-{uid}@localhost")
    moves_to_consumers(up.pika_params(heartbeat=0), down, up.url, uid)
    # The queue's link in Prometheus: what it moved (published here, acked upstream on confirm) and its status.
    link = (("queue", f"fedq.{uid}"), ("upstream", "up"), ("vhost", "/"))
    samples = wait_for(lambda: (got := federation_samples(down))
                       .get(("leveret_federation_queue_messages_acked_total", link)) == 300 and got, 10,
                       "300 acked upstream in the queue link's metrics")
    assert samples[("leveret_federation_queue_messages_published_total", link)] == 300
    assert samples[("leveret_federation_queue_link_status", (*link[:1], ("status", "running"), *link[1:]))] == 1
    assert samples[("leveret_federation_queue_link_status", (*link[:1], ("status", "error"), *link[1:]))] == 0
    assert samples[("leveret_federation_links", (("status", "running"),))] == 1


def test_a_federated_queue_fetches_from_rabbitmq(rabbit, start_broker, uid):
    down = start_broker("--set", f"leveret.nodename=down-{uid}@localhost")
    rp = pika.ConnectionParameters(host="127.0.0.1", port=rabbit.port, heartbeat=0,
                                   credentials=pika.PlainCredentials("guest", "guest"))
    moves_to_consumers(rp, down, rabbit.url, uid)
