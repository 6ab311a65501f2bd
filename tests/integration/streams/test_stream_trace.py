"""The firehose on a stream (issue 12, "The trace stream"): acks of a stream's consumers, plain or in a group,
are traced as ``ack.<stream>`` events (Leveret-only, as for classic queues: broker/observability/trace.py), so that publish →
deliver → ack can be followed per message on a stream too. The ack event carries the message's identity and,
like its deliver event, the ``x-stream-offset`` header among its properties.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration.management.test_trace import TRACE, Node, events, node, sink, traced  # noqa: F401 - fixtures

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(60)]

STREAM = {"x-queue-type": "stream"}


def consume(c: pika.BlockingConnection, queue: str, count: int, ack: Any, **arguments: Any) -> list[int]:
    """Consume ``count`` deliveries; ``ack(offset)`` says whether to ack each. Returns the offsets delivered."""
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[int] = []

    def on_message(chx, method, props, _body) -> None:
        offset = props.headers["x-stream-offset"]
        got.append(offset)
        if ack(offset):
            chx.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message, arguments=arguments)
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        c.process_data_events(0.05)
    ch.basic_cancel(tag)
    ch.queue_declare(queue, passive=True, durable=True, arguments=STREAM)  # a round-trip: the acks are in
    return got


@contextlib.contextmanager
def traced_stream(n: Node, name: str) -> Iterator[tuple[pika.BlockingConnection, Any, str]]:
    """A stream ``name`` and a queue bound to every trace event: yields (connection, channel in confirm mode,
    the trace queue); the stream is deleted on exit."""
    c = n.connect()
    try:
        ch = c.channel()
        ch.queue_declare(name, durable=True, arguments=STREAM)
        with sink(ch) as s:
            ch.confirm_delivery()
            yield c, ch, s
        ch.queue_delete(name)
    finally:
        c.close()


def test_stream_acks_are_traced(traced: Node):  # noqa: F811 - fixture
    name = "tr.stream"
    with traced_stream(traced, name) as (c, ch, s):
        for i in range(4):
            ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(message_id=f"id-{i}"))
        plain = consume(c, name, 4, lambda o: o % 2 == 0, **{"x-stream-offset": "first"})
        grouped = consume(c, name, 4, lambda o: o != 3, **{"x-stream-offset": "first", "x-stream-group": "g"})
        evs = events(ch, s)
    assert plain == [0, 1, 2, 3] and grouped == [0, 1, 2, 3]
    acks = [(h["x-leveret-message-id"], h["properties"]["headers"]["x-stream-offset"], h, body)
            for key, h, body in evs if key == f"ack.{name}"]
    # plain consumer acked 0 and 2, the group 0, 1 and 2; in the order the acks arrived
    assert [(mid, off) for mid, off, _h, _b in acks] == [("id-0", 0), ("id-2", 2), ("id-0", 0), ("id-1", 1),
                                                         ("id-2", 2)]
    for _mid, _off, h, body in acks:
        assert body == b"" and h["vhost"] == "/" and h["exchange_name"] == "" and h["routing_keys"] == [name]
    times: dict[str, dict[str, int]] = {}
    for key, h, _body in evs:
        times.setdefault(h["x-leveret-message-id"], {}).setdefault(key.split(".")[0], h["x-leveret-event-time"])
    for mid in ("id-0", "id-1", "id-2"):
        t = times[mid]
        assert t["publish"] <= t["deliver"] <= t["ack"]
    assert "ack" not in times["id-3"]  # never acked: no ack event


def consume_then_ack_all(c: pika.BlockingConnection, queue: str, count: int) -> list[int]:
    """Consume ``count`` deliveries from ``first``, then ack them all with one multiple ack (as the Spark
    connector does). Returns the offsets delivered."""
    ch = c.channel()
    ch.basic_qos(prefetch_count=count)
    got: list[tuple[int, int]] = []
    tag = ch.basic_consume(queue, lambda _c, m, p, _b: got.append((p.headers["x-stream-offset"], m.delivery_tag)),
                           arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        c.process_data_events(0.05)
    ch.basic_ack(got[-1][1], multiple=True)
    ch.basic_cancel(tag)
    ch.queue_declare(queue, passive=True, durable=True, arguments=STREAM)  # a round-trip: the ack is in
    return [offset for offset, _ in got]


def test_a_multiple_ack_traces_each_message_and_a_trace_stream_read_traces_nothing(traced: Node):  # noqa: F811
    name, firehose = "tr.stream.multiple", "tr.firehose"
    with traced_stream(traced, name) as (c, ch, s):
        ch.queue_declare(firehose, durable=True, arguments=STREAM)
        ch.queue_bind(firehose, TRACE, f"*.{name}")  # this stream's deliver and ack events, kept in a stream
        for i in range(5):
            ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(message_id=f"id-{i}"))
        assert consume_then_ack_all(c, name, 5) == [0, 1, 2, 3, 4]
        time.sleep(0.3)  # the ack events are traced a moment after the ack
        held = ch.queue_declare(firehose, passive=True, durable=True, arguments=STREAM)
        assert consume_then_ack_all(c, firehose, 10) == list(range(10))  # read and acked at once
        evs = events(ch, s)
        ch.queue_delete(firehose)
    assert held.method.message_count == 10  # 5 deliver and 5 ack events
    acks = [h["x-leveret-message-id"] for key, h, _body in evs if key == f"ack.{name}"]
    assert acks == [f"id-{i}" for i in range(5)]  # one event per message of the multiple ack, in order
    assert [key for key, _h, _body in evs if key.endswith(f".{firehose}")] == []  # the firehose is never traced


def test_no_stream_ack_events_when_tracing_is_off(node: Node):  # noqa: F811 - fixture
    name = "tr.stream.off"
    with traced_stream(node, name) as (c, ch, s):
        ch.basic_publish("", name, b"quiet")
        assert consume(c, name, 1, lambda _o: True, **{"x-stream-offset": "first"}) == [0]
        assert events(ch, s) == []
