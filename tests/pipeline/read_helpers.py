"""Helpers of the Spark source's tests (tests/pipeline/test_reader_plan.py, test_spark_read.py): stream queues
on a real broker, filled with pika (publisher confirms), and the reader options that point at that broker."""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

import pika
import pyarrow as pa

STREAM = {"x-queue-type": "stream"}


def read_options(broker: Any, **extra: Any) -> dict[str, str]:
    """The options of format("leveret") for the test broker: AMQP URL and its HTTP API port."""
    opts = {"uri": broker.url, "managementUri": f"http://{broker.host}:{broker.management_port}"}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def declare_stream(broker: Any, name: str, **arguments: Any) -> str:
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        conn.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    finally:
        conn.close()
    return name


def stream_info(broker: Any, name: str) -> dict[str, Any]:
    """The queue object of ``GET /api/queues/{vhost}/{name}`` (first_offset, next_offset, ...)."""
    vhost = urllib.parse.quote(broker.vhost, safe="")
    req = urllib.request.Request(f"http://{broker.host}:{broker.management_port}/api/queues/{vhost}/"
                                 f"{urllib.parse.quote(name, safe='')}")
    token = base64.b64encode(f"{broker.user}:{broker.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def publish(broker: Any, queue: str, bodies: Iterable[bytes], properties: pika.BasicProperties | None = None,
            ) -> int:
    """Publish to ``queue`` through the default exchange and wait until the stream holds them all (its
    next_offset grew by the count: one confirm per message would make pika take seconds per thousand)."""
    before = stream_info(broker, queue)["next_offset"]
    conn = pika.BlockingConnection(broker.pika_params())
    n = 0
    try:
        ch = conn.channel()
        for body in bodies:
            ch.basic_publish("", queue, body, properties)
            n += 1
    finally:
        conn.close()
    deadline = time.monotonic() + 30
    while stream_info(broker, queue)["next_offset"] < before + n:
        assert time.monotonic() < deadline, f"{queue}: {n} messages published, not all appended in 30 s"
        time.sleep(0.02)
    return n


def fill(broker: Any, queue: str, n: int, start: int = 0, size: int = 0) -> int:
    """``n`` messages whose bodies say their index (``m<i>``, padded to ``size`` bytes)."""
    return publish(broker, queue, (f"m{i}".encode().ljust(size, b".") for i in range(start, start + n)))


def read_partitions(reader: Any, partitions: Iterable[Any]) -> pa.Table:
    """What Spark's tasks would get: every partition's batches, in partition order, as one table."""
    batches = [b for p in partitions for b in reader.read(p)]
    if not batches:
        return pa.table({"offset": pa.array([], pa.int64())})
    return pa.Table.from_batches(batches)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def instant_between() -> int:
    """A millisecond after everything appended so far and before anything appended next (the broker stamps
    appends with the same wall clock), never on a whole second (so it travels in milliseconds)."""
    at = now_ms() + 1
    at += 1 if at % 1000 == 0 else 0
    while now_ms() <= at + 2:
        time.sleep(0.002)
    return at
