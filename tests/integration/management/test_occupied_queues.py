"""Message figures over many queues read only the queues that may hold messages (issue 38: the operator
surface at 100,000 queues). The vhost keeps the set (broker/queues/amqqueue.py ``QueueRegistry.occupied``): a
queue is in it from its creation, joins it on every publish, and the rate sampler drops the queues it finds
empty. These tests let the sampler (every 300 ms here) drop every queue first, then check that a publish shows
at once, not a sample later, in a page sorted by messages, in /api/overview's totals and in the aggregated
Prometheus figures; that unacked messages keep a queue counted; and that a restart recovers the figures.
Leveret-only: RabbitMQ's management figures are up to ``collect_statistics_interval`` late by design."""

from __future__ import annotations

import time
import urllib.request

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.management.test_management_api import Http, wait_for

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]

QUEUES = 40
SAMPLES = 1.5  # seconds: several passes of a 300 ms sampler


@pytest.fixture
def node(start_broker):
    b = start_broker("--set", "collect_statistics_interval=300")
    api = Http(b.management_port)
    assert wait_for(lambda: api("GET", "/api/overview")[0] == 200), "the HTTP API did not come up"
    return b, api


def totals(api: Http) -> int:
    return api("GET", "/api/overview")[1]["queue_totals"]["messages"]


def prometheus_messages(b) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.prometheus_port}/metrics", timeout=10).read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "rabbitmq_queue_messages")


def busiest(api: Http, uid: str, n: int = 3) -> list[tuple[str, int]]:
    status, page, _h = api("GET", f"/api/queues?page=1&page_size={n}&sort=messages&sort_reverse=true&name={uid}")
    assert status == 200, page
    return [(item["name"], item["messages"]) for item in page["items"]]


def test_a_publish_to_a_queue_found_empty_shows_at_once(node, uid):
    b, api = node
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        names = [f"{uid}-q{i:02d}" for i in range(QUEUES)]
        for name in names:
            ch.queue_declare(name, durable=True)
        time.sleep(SAMPLES)  # the sampler has found every queue empty and dropped it
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", names[17], b"m", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", names[5], b"m", pika.BasicProperties(delivery_mode=2))
        # Asked at once: no sampler pass is needed for these figures.
        assert busiest(api, uid) == [(names[17], 3), (names[5], 1), (names[39], 0)]
        assert totals(api) == 4
        assert prometheus_messages(b) == 4

        method, _props, _body = ch.basic_get(names[5], auto_ack=False)  # ready 0, unacked 1
        assert method is not None
        time.sleep(SAMPLES)
        assert busiest(api, uid, 2) == [(names[17], 3), (names[5], 1)]
        assert totals(api) == 4
        ch.basic_ack(method.delivery_tag)
        assert wait_for(lambda: totals(api) == 3)
        assert busiest(api, uid, 2) == [(names[17], 3), (names[39], 0)]
    finally:
        conn.close()

    b.restart()  # recovered queues are counted before any sampler pass
    assert wait_for(lambda: api("GET", "/api/overview")[0] == 200)
    assert totals(api) == 3
    assert busiest(api, uid, 1) == [(names[17], 3)]
