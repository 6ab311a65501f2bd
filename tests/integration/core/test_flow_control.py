"""Resource alarms and the consumer acknowledgement timeout, with real clients against a broker process.

These start a Leveret of their own with a configuration that raises an alarm at once (a disk limit larger
than any disk), so they are Leveret-only: a shared RabbitMQ cannot be put into an alarm from a test.
"""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

pytestmark = pytest.mark.leveret_only


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "leveret.conf"
    path.write_text(text)
    return str(path)


def _pump(conn: pika.BlockingConnection, until, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def test_disk_alarm_blocks_publishers_and_lets_consumers_go_on(start_broker, tmp_path, uid):
    b = start_broker("--config", _config(tmp_path, "disk_free_limit.absolute = 1000000TB\n"))
    consumer_conn = pika.BlockingConnection(b.pika_params())
    cch = consumer_conn.channel()
    q = cch.queue_declare(f"{uid}-q").method.queue
    got: list[bytes] = []
    cch.basic_consume(q, lambda ch, m, p, body: got.append(body), auto_ack=True)

    publisher = pika.BlockingConnection(b.pika_params())
    blocked: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda conn, frame: blocked.append(frame.method.reason))
    pch = publisher.channel()
    # The first publish makes the connection a publisher: it is blocked from then on (as in RabbitMQ, the
    # frames already read are still handled).
    pch.basic_publish("", q, b"first")
    _pump(publisher, lambda: bool(blocked))
    assert blocked and "disk" in blocked[0]
    pch.basic_publish("", q, b"held back")
    publisher.process_data_events(time_limit=0.2)

    # What is sent while blocked is not read: it never reaches the queue; the consumer connection,
    # which never published, is still served.
    _pump(consumer_conn, lambda: b"held back" in got, timeout=1.0)
    assert b"held back" not in got
    assert cch.queue_declare(q, passive=True).method.message_count == 0
    consumer_conn.close()


def test_consumer_timeout_closes_the_channel_and_requeues(start_broker, uid):
    b = start_broker()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    q = ch.queue_declare(f"{uid}-q", arguments={"x-consumer-timeout": 300}).method.queue
    ch.basic_publish("", q, b"slow")
    closed: list[Exception] = []
    ch._impl.add_on_close_callback(lambda c, reason: closed.append(reason))
    ch.basic_consume(q, lambda c, m, p, body: None)  # never acks
    _pump(conn, lambda: bool(closed))
    assert isinstance(closed[0], pika.exceptions.ChannelClosedByBroker)
    assert closed[0].reply_code == 406
    assert "delivery acknowledgement on channel" in closed[0].reply_text
    ch2 = conn.channel()
    method, _props, body = ch2.basic_get(q, auto_ack=True)
    assert body == b"slow" and method.redelivered
    conn.close()


def test_publisher_is_unblocked_when_the_alarm_clears(tmp_path, uid):
    """A disk alarm blocks the publisher; lowering the limit with `leveret ctl set_disk_free_limit` clears
    it: the client gets connection.unblocked and what it sent while blocked is then read and routed."""
    import subprocess
    import sys

    from tests.integration.management.test_management_api import start_mgmt_broker

    b, mport, _ = start_mgmt_broker(tmp_path, "--config", _config(tmp_path, "disk_free_limit.absolute = 1000000TB\n"))
    try:
        publisher = pika.BlockingConnection(b.pika_params())
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda c, f: events.append("blocked"))
        publisher.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
        ch = publisher.channel()
        q = ch.queue_declare(f"{uid}-q").method.queue
        ch.basic_publish("", q, b"one")
        _pump(publisher, lambda: "blocked" in events)
        ch.basic_publish("", q, b"two")
        publisher.process_data_events(time_limit=0.2)

        ctl = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{mport}",
                              "set_disk_free_limit", "1000"], capture_output=True, text=True, timeout=30, check=False)
        assert ctl.returncode == 0, ctl.stderr
        _pump(publisher, lambda: "unblocked" in events)
        assert events == ["blocked", "unblocked"]
        other = pika.BlockingConnection(b.pika_params()).channel()
        deadline = time.monotonic() + 5
        while other.queue_declare(q, passive=True).method.message_count < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.queue_declare(q, passive=True).method.message_count == 2
    finally:
        b.stop()
