"""RabbitMQ's default queue type (Leveret-only here: RabbitMQ 3.10, the reference, predates it): a queue
declared without ``x-queue-type`` takes its vhost's default type, or the node's ``default_queue_type``; the
type is written into its arguments (so it redeclares and shows as that type), and properties the type cannot
have fall back to classic."""

from __future__ import annotations

import urllib.error

import pika
import pytest

from tests.integration.cluster.test_cluster_quorum import got_one
from tests.integration.management.test_management_api import Http, wait_for

# quorum: `make test` runs these against a cluster too (LEVERET_TEST_CLUSTER: start_broker starts its members,
# and each new connection goes to the next member).
pytestmark = [pytest.mark.leveret_only, pytest.mark.quorum]


def http_up(api: Http) -> bool:
    """Whether the HTTP API answers yet (it starts just after the AMQP listener start_broker waits for)."""
    try:
        return api("GET", "/api/overview")[0] == 200
    except urllib.error.URLError:
        return False


def queue_type(api: Http, vhost: str, name: str) -> str | None:
    status, body, _ = api("GET", f"/api/queues/{vhost}/{name}")
    return body.get("type") if status == 200 else None


def test_the_nodes_default_type_applies_to_what_it_can(start_broker):
    b = start_broker("--set", "default_queue_type=quorum")
    api = Http(b.management_port)
    assert wait_for(lambda: http_up(api), 30)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("jobs", durable=True)
    ch.queue_declare("jobs", durable=True)  # the same declare again is equivalent
    ch.queue_declare("scratch", durable=False)
    ch.queue_declare("mine", exclusive=True)
    ch.queue_declare("fleeting", durable=True, auto_delete=True)
    ch.queue_declare("explicit", durable=True, arguments={"x-queue-type": "classic"})
    assert wait_for(lambda: queue_type(api, "%2F", "jobs"), 30) == "quorum"
    assert api("GET", "/api/queues/%2F/jobs")[1]["arguments"].get("x-queue-type") == "quorum"
    for name in ("scratch", "mine", "fleeting", "explicit"):
        assert queue_type(api, "%2F", name) == "classic", name
    # A quorum queue counts redeliveries: the redelivered message carries x-delivery-count. (Published, and
    # taken again after the nack, on connections of their own: on other members when b is a cluster.)
    publisher = pika.BlockingConnection(b.pika_params())
    publisher.channel().basic_publish("", "jobs", b"x")
    method, _props, _body = wait_for(lambda: got_one(ch, "jobs"), 30)
    ch.basic_nack(method.delivery_tag, requeue=True)
    ch2 = publisher.channel()
    method, props, _body = wait_for(lambda: got_one(ch2, "jobs"), 30)
    assert method.redelivered and props.headers.get("x-delivery-count") == 1
    publisher.close()
    conn.close()


def test_a_vhosts_default_type(start_broker):
    b = start_broker()
    api = Http(b.management_port)
    assert wait_for(lambda: http_up(api), 30)
    assert api("PUT", "/api/vhosts/shop", {"default_queue_type": "quorum"})[0] in (201, 204)
    assert api("PUT", "/api/permissions/shop/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port, "shop"))
    conn.channel().queue_declare("orders", durable=True)
    conn.close()
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare("orders", durable=True)  # in "/", still classic
    conn.close()
    assert queue_type(api, "shop", "orders") == "quorum"
    assert queue_type(api, "%2F", "orders") == "classic"
