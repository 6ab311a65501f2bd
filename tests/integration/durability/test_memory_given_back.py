"""Memory given back after a backlog goes (issue 19): a queue being consumed keeps its messages in RAM, so
a backlog grows the broker's resident size; once the messages are gone (here the queue is deleted with
them) the resident size must come back near where it was, not stay at the peak as glibc's heap keeps it
without a trim (measured before broker/resources/memory_budget.py's ``give_back``: 611 MB left of an 836 MB peak).

Leveret only: it reads the broker process's /proc and its log."""

from __future__ import annotations

import time

import pika
import pytest

pytestmark = pytest.mark.leveret_only

MiB = 1024 * 1024
MESSAGES = 150_000
BODY = b"m" * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_resident_memory_comes_back_after_a_backlog_is_deleted(start_broker, uid) -> None:
    broker = start_broker()
    idle = rss(broker.pid)
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    queue = f"{uid}-backlog"
    ch.queue_declare(queue)
    # A consumer that takes one message and never acks: the queue counts as consumed, so it keeps its
    # backlog in RAM (a queue nobody consumes pages all but 16 MiB to disk).
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(queue, lambda *a: None)
    for i in range(MESSAGES):
        ch.basic_publish("", queue, BODY)
        if i % 10_000 == 0:
            conn.process_data_events(0)
    ch.queue_declare(queue, passive=True)  # a round trip: every publish is in
    peak = rss(broker.pid)
    assert peak - idle > 100 * MiB, f"the backlog did not grow the broker ({idle} → {peak} bytes)"
    ch.queue_delete(queue)
    deadline = time.monotonic() + 10
    now = peak
    while time.monotonic() < deadline:
        now = rss(broker.pid)
        if now - idle < (peak - idle) / 4:
            break
        time.sleep(0.2)
    conn.close()
    assert now - idle < (peak - idle) / 4, (
        f"resident {now // MiB} MiB after the backlog went (idle {idle // MiB}, peak {peak // MiB})")
    assert "memory given back" in broker.log_text()
