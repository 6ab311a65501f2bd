"""pika helpers of the shovel tests: publish numbered persistent messages with confirms, count a queue,
drain it."""

from __future__ import annotations

import pika


def params(host: str, port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host=host, port=port, credentials=pika.PlainCredentials("guest", "guest"),
                                     heartbeat=0, blocked_connection_timeout=60)


def declare(p: pika.ConnectionParameters, queue: str) -> None:
    with pika.BlockingConnection(p) as conn:
        conn.channel().queue_declare(queue, durable=True)


def publish(p: pika.ConnectionParameters, queue: str, n: int, start: int = 0, size: int = 64) -> None:
    """n persistent messages to ``queue`` (declared durable), message_id = their number, confirmed."""
    with pika.BlockingConnection(p) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        body = b"x" * size
        for i in range(start, start + n):
            props = pika.BasicProperties(delivery_mode=2, message_id=str(i), content_type="text/plain",
                                         correlation_id=f"c{i}", headers={"n": i, "tag": "shovel-test"})
            ch.basic_publish("", queue, body, props)


def count(p: pika.ConnectionParameters, queue: str) -> int:
    with pika.BlockingConnection(p) as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


def drain(p: pika.ConnectionParameters, queue: str) -> list[tuple[pika.BasicProperties, bytes, bool]]:
    """Every message in the queue (consumed and acked), in order."""
    out = []
    with pika.BlockingConnection(p) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2000)
        for method, props, body in ch.consume(queue, inactivity_timeout=1.0):
            if method is None:
                break
            out.append((props, body, method.redelivered))
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
    return out
