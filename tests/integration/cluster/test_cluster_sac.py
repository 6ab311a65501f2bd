"""Single active consumer of a quorum queue across the members of a cluster (issue 15): one consumer is active
cluster-wide, not one per member.

A consumer on member ``a`` subscribes first, then one on ``b``; messages published on both members all go to
``a``'s (before: each member's first consumer was active, and the two shared the messages, ~180 / ~120 of 300).
When ``a``'s consumer goes (its connection closed, then in a second test ``a`` killed with SIGKILL), ``b``'s
becomes the active one and gets what follows, with nothing lost: the lock is PostgreSQL's advisory lock on
``a``'s lease session (storage/pg/cluster.py ``SAC_KEY``), released with the consumer or with the session.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pika
import pytest

from tests.integration.cluster.test_cluster_forwarding import channel, two

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

SAC = {"x-queue-type": "quorum", "x-single-active-consumer": True}


class Consumer(threading.Thread):
    """A manual-ack consumer on ``b`` in its own thread; ``bodies`` what it received."""

    def __init__(self, b, queue: str) -> None:
        super().__init__(daemon=True)
        self.b, self.queue = b, queue
        self.bodies: list[bytes] = []
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        conn, ch = channel(self.b)
        ch.basic_qos(prefetch_count=5)

        def on_message(c, method, _props, body):
            self.bodies.append(body)
            c.basic_ack(method.delivery_tag)

        ch.basic_consume(self.queue, on_message)
        self.ready.set()
        try:
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.05)
            conn.close()
        except pika.exceptions.AMQPError:
            pass  # its member was killed


def publish(b, queue: str, bodies: list[bytes]) -> None:
    conn, ch = channel(b)
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("how", ["closed", "killed"])
def test_one_consumer_is_active_across_members(start_broker, pg_dsn, how):
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("sac", durable=True, arguments=SAC)
    conn.close()
    on_a, on_b = Consumer(a, "sac"), Consumer(b, "sac")
    on_a.start()
    assert on_a.ready.wait(10)
    time.sleep(1.0)  # a's member holds the lock before b's consumer comes
    on_b.start()
    assert on_b.ready.wait(10)

    first = [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)] + [b"c%d" % i for i in range(100)]
    publish(b, "sac", first[:100])
    publish(a, "sac", first[100:200])
    publish(b, "sac", first[200:])
    assert wait_until(lambda: len(on_a.bodies) + len(on_b.bodies) >= len(first), 20)
    time.sleep(0.5)
    assert sorted(on_a.bodies) == sorted(first) and on_b.bodies == [], (len(on_a.bodies), len(on_b.bodies))

    if how == "closed":
        on_a.stop.set()
        on_a.join(10)
    else:
        os.kill(a.pid, signal.SIGKILL)
        a.process.wait(10)
    then = [b"d%d" % i for i in range(50)]
    publish(b, "sac", then)
    assert wait_until(lambda: len(on_b.bodies) >= len(then), 20), len(on_b.bodies)
    assert sorted(on_b.bodies) == sorted(then)
    on_b.stop.set()
    on_b.join(10)
