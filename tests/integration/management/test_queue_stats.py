"""Per-queue statistics kept live (seed 004): ready, unacked, published, delivered, acked, consumers and
publishers, as the HTTP API shows them after known traffic from real clients. Leveret-only: the reference
RabbitMQ node runs without its management plugin (and RabbitMQ has no per-queue publisher count)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pika
import pytest

from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only


def test_queue_stats_follow_the_traffic(uid):
    tmp = Path(tempfile.mkdtemp(prefix="leveret-stats-"))
    b, mport, _ = start_mgmt_broker(tmp)
    api = Http(mport)
    try:
        conn = pika.BlockingConnection(b.pika_params())
        pub = conn.channel()
        q = pub.queue_declare(f"{uid}-q").method.queue
        for i in range(5):
            pub.basic_publish("", q, str(i).encode())
        cons = conn.channel()
        cons.basic_qos(prefetch_count=2)
        seen: list = []
        cons.basic_consume(q, lambda ch, m, p, body: seen.append(m.delivery_tag))
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        cons.basic_ack(seen[0])
        conn.process_data_events(time_limit=0.2)

        info = api("GET", f"/api/queues/%2F/{q}")[1]
        assert info["publishers"] == 1 and info["consumers"] == 1
        assert (info["messages_ready"], info["messages_unacknowledged"]) == (2, 2)
        stats = info["message_stats"]
        assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (5, 3, 1)

        pub.close()  # a closed channel no longer counts as a publisher
        conn.process_data_events(time_limit=0.1)
        assert api("GET", f"/api/queues/%2F/{q}")[1]["publishers"] == 0
        conn.close()
        info = api("GET", f"/api/queues/%2F/{q}")[1]
        assert info["consumers"] == 0 and info["messages_ready"] == 4  # unacked ones went back
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)
