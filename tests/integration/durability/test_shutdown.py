"""Graceful shutdown (issue 5): SIGTERM with clients attached closes them with 320 CONNECTION_FORCED,
syncs the stores, exits 0, and loses nothing that was confirmed; the next start is a clean one."""

from __future__ import annotations

import signal
import threading
import time

import pika
import pytest
from amqp_helpers import get_all

pytestmark = pytest.mark.leveret_only


def test_sigterm_with_clients_attached_loses_nothing_confirmed(start_broker, uid):
    b = start_broker()
    q = f"{uid}-q"
    setup = pika.BlockingConnection(b.pika_params())
    setup.channel().queue_declare(q, durable=True)
    setup.close()

    confirmed: list[int] = []
    closed_with: list[int] = []

    def publish() -> None:
        conn = pika.BlockingConnection(b.pika_params())
        ch = conn.channel()
        ch.confirm_delivery()
        try:
            for i in range(100_000):
                ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
                confirmed.append(i)  # basic_publish returned: the broker confirmed it
        except pika.exceptions.ConnectionClosedByBroker as exc:
            closed_with.append(exc.reply_code)
        except pika.exceptions.AMQPError:
            closed_with.append(-1)

    consumer = pika.BlockingConnection(b.pika_params())
    consumer.channel().queue_declare(f"{uid}-other")  # a second client, idle
    t = threading.Thread(target=publish, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while len(confirmed) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(confirmed) >= 300
    assert b.stop(signal.SIGTERM) == 0
    t.join(10)
    assert closed_with == [320]
    assert '"storage closed cleanly"' in b.log_text()

    b.start()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    got = [int(body) for _method, _props, body in get_all(ch, q, limit=1_000_000)]
    assert got[: len(confirmed)] == confirmed  # every confirmed message, in order
    assert got == list(range(len(got)))  # nothing else, nothing twice
    conn.close()
