"""Prometheus endpoint: scraped and parsed with prometheus-client's parser; values checked after known
traffic, under RabbitMQ's metric names."""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.management.test_management_api import start_mgmt_broker

pytestmark = pytest.mark.leveret_only


@pytest.fixture(scope="module")
def scraped():
    """A broker that saw known traffic: 5 messages published to 'mq', 2 fetched (1 acked, 1 unacked),
    one consumer on 'idle'; the connection stays open while scraping."""
    tmp = Path(tempfile.mkdtemp(prefix="leveret-metrics-"))
    b, _mport, pport = start_mgmt_broker(tmp)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("mq")
    ch.queue_declare("idle")
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "mq", f"m{i}".encode())
    ch.basic_publish("", "nowhere", b"dropped")
    method, _, _ = ch.basic_get("mq")
    ch.basic_ack(method.delivery_tag)
    ch.basic_get("mq")
    ch.basic_get("idle")
    ch.basic_consume("idle", lambda *a: None)
    time.sleep(0.2)

    def scrape(path: str) -> dict[tuple[str, tuple], float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{pport}{path}", timeout=5).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    try:
        yield scrape
    finally:
        conn.close()
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_aggregated_queue_and_object_gauges(scraped):
    m = scraped("/metrics")
    assert m[("rabbitmq_queue_messages_ready", ())] == 3
    assert m[("rabbitmq_queue_messages_unacked", ())] == 1
    assert m[("rabbitmq_queue_messages", ())] == 4
    assert m[("rabbitmq_queue_consumers", ())] == 1
    assert m[("rabbitmq_queues", ())] == 2
    assert m[("rabbitmq_connections", ())] == 1
    assert m[("rabbitmq_channels", ())] == 1
    assert m[("rabbitmq_consumers", ())] == 1
    assert m[("rabbitmq_queue_messages_published_total", ())] == 5
    assert m[("rabbitmq_queue_get_total", ())] == 2


def test_per_object_series_have_vhost_and_queue_labels(scraped):
    m = scraped("/metrics/per-object")
    labels = (("queue", "mq"), ("vhost", "/"))
    assert m[("rabbitmq_queue_messages_ready", labels)] == 3
    assert m[("rabbitmq_queue_messages_unacked", labels)] == 1
    assert m[("rabbitmq_queue_messages", labels)] == 4
    assert m[("rabbitmq_queue_consumers", (("queue", "idle"), ("vhost", "/")))] == 1
    assert m[("rabbitmq_queue_messages_published_total", labels)] == 5
    assert m[("rabbitmq_queue_messages_ready_bytes", labels)] == 6


def test_identity_build_and_node_metrics(scraped):
    m = scraped("/metrics")
    identity = [k for k in m if k[0] == "rabbitmq_identity_info"]
    assert len(identity) == 1 and dict(identity[0][1])["rabbitmq_node"].startswith("leveret@")
    build = [k for k in m if k[0] == "rabbitmq_build_info"]
    assert len(build) == 1 and dict(build[0][1])["product"] == "Leveret"
    assert m[("rabbitmq_process_resident_memory_bytes", ())] > 1_000_000
    assert m[("rabbitmq_resident_memory_limit_bytes", ())] > 0
    assert m[("rabbitmq_disk_space_available_bytes", ())] > 0
    assert m[("rabbitmq_alarms_memory_used_watermark", ())] == 0
    assert m[("leveret_uptime_seconds", ())] > 0
    for name in ("rabbitmq_global_messages_received_total", "rabbitmq_global_messages_delivered_total",
                 "rabbitmq_global_messages_acknowledged_total", "rabbitmq_global_messages_confirmed_total",
                 "rabbitmq_global_messages_routed_total", "rabbitmq_global_messages_unroutable_dropped_total"):
        assert (name, (("protocol", "amqp091"),)) in m, name


def test_global_counters_after_traffic(scraped):
    m = scraped("/metrics")
    p = (("protocol", "amqp091"),)
    assert m[("rabbitmq_global_messages_received_total", p)] == 6
    assert m[("rabbitmq_global_messages_received_confirm_total", p)] == 6
    assert m[("rabbitmq_global_messages_confirmed_total", p)] == 6
    assert m[("rabbitmq_global_messages_routed_total", p)] == 5
    assert m[("rabbitmq_global_messages_unroutable_dropped_total", p)] == 1
    assert m[("rabbitmq_global_messages_delivered_get_manual_ack_total", p)] == 2
    assert m[("rabbitmq_global_messages_get_empty_total", p)] == 1
    assert m[("rabbitmq_global_messages_acknowledged_total", p)] == 1
    assert m[("rabbitmq_connections_opened_total", ())] == 1
    assert m[("rabbitmq_channels_opened_total", ())] == 1
    assert m[("rabbitmq_queues_declared_total", ())] == 2
