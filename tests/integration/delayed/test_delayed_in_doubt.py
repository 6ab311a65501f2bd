"""A kill -9 at the one moment a delayed message's dispatch is in doubt (issue 14: nothing delivered twice).

The window: the target queue has the dispatched message on disk, the delay store's DISPATCHED record is not
yet. Before exactly-once dispatch, the restart handed the message out again (a duplicate); now the queue's copy
carries the dispatch's origin id and the restart sends nothing again (broker/delayed/delayed_dispatch.py). When the
queue's consumer had already acked it, the segment that proves it was pinned on disk until the dispatch
settled (storage/dispatch_evidence.py), so the restart does not send it again either. That test makes the
dispatched message the last of the queue index's first segment (4,095 messages published and acked before it)
and publishes one more right after it, so the segment is no longer the one being written and, fully acked,
would be deleted at once without the pin.

To hit the window without luck, the broker runs with the test hook ``LEVERET_TEST_FSYNC_DELAY_MS``
(storage/syncer.py: each fsync round waits that long): dispatch begins (fsync), the message is enqueued,
written to the queue's files and seen at once by a transient observer queue (t0); the queue confirms it to the
dispatcher after its fsync, about ``FSYNC_DELAY`` later, and only then is the DISPATCHED record written. A
kill -9 keeps whatever was written to the kernel, so the window is ``t0 .. t0 + FSYNC_DELAY``; the kill falls
in its middle. The dispatcher's checkpoint (every 5 s from the exchange's declaration, which would log the
record itself) is kept out of the window by choosing the due time. Each test checks, from the broker's log after the restart,
that the window was hit (one dispatch in doubt), so it cannot pass by missing it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pika
import pytest

pytestmark = [pytest.mark.leveret_only]

FSYNC_DELAY_MS = 800
SEGMENT_ENTRIES = 4096  # storage/queue_index.py
EXCHANGE, QUEUE, KEY = "doubt-dx", "doubt-dq", "k"


def _declare(ch) -> None:
    ch.exchange_declare(EXCHANGE, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_bind(QUEUE, EXCHANGE, KEY)


def _resolution(log_text: str) -> dict:
    """The broker's "in doubt resolved" log event (JSON lines)."""
    for line in log_text.splitlines():
        if "in doubt resolved" in line:
            return json.loads(line)
    return {}


def _kill_in_the_window(start_broker, monkeypatch, consume_durable: bool):
    """Start a broker, publish one persistent delayed message, kill -9 inside its in-doubt window; returns the
    data dir and what a manual-ack consumer of the durable queue acked (when ``consume_durable``)."""
    monkeypatch.setenv("LEVERET_TEST_FSYNC_DELAY_MS", str(FSYNC_DELAY_MS))
    b = start_broker()
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    _declare(ch)
    declared = time.time()  # the dispatcher's checkpoint timer starts here: every 5 s from now
    seen = threading.Event()
    acked: list[bytes] = []
    filler = SEGMENT_ENTRIES - 1 if consume_durable else 0
    for i in range(filler):
        ch.basic_publish("", QUEUE, b"filler", pika.BasicProperties(delivery_mode=2))

    def observe() -> None:
        c = pika.BlockingConnection(b.pika_params())
        och = c.channel()
        q = och.queue_declare("", exclusive=True).method.queue
        och.queue_bind(q, EXCHANGE, KEY)
        if consume_durable:
            def on_durable(ch_, method, _props, body):
                ch_.basic_ack(method.delivery_tag)
                acked.append(body)
            och.basic_qos(prefetch_count=10)
            och.basic_consume(QUEUE, on_durable)
        och.basic_consume(q, lambda *_: seen.set(), auto_ack=True)
        with contextlib.suppress(Exception):  # the broker is killed under it
            while not seen.is_set() or (consume_durable and b"once" not in acked):
                c.process_data_events(0.01)

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    deadline = time.monotonic() + 30
    while len(acked) < filler and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acked) == filler
    # Due 0.4 s after one of the dispatcher's checkpoints (every 5 s from the declaration), so the next one
    # comes after the kill.
    tick = declared + 5
    while tick + 0.4 < time.time() + 0.3:
        tick += 5
    delay_ms = int((tick + 0.4 - time.time()) * 1000)
    plain = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(EXCHANGE, KEY, b"once", pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay_ms}))
    assert seen.wait(15), "the delayed message was never dispatched"
    if consume_durable:  # the queue index moves on to its next segment (no confirm awaited: no fsync in the way)
        plain.basic_publish("", QUEUE, b"after", pika.BasicProperties(delivery_mode=2))
    time.sleep(0.5 * FSYNC_DELAY_MS / 1000)
    b.kill9()
    watcher.join(5)
    assert time.time() < tick + 4.5, "too slow to stay clear of the dispatcher's next checkpoint"
    monkeypatch.delenv("LEVERET_TEST_FSYNC_DELAY_MS")
    return b.data_dir, acked


def _restart_and_drain(start_broker, data_dir) -> tuple[list[bytes], dict]:
    b = start_broker(data_dir=data_dir)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    _declare(ch)
    time.sleep(1.0)  # anything sent again would be in the queue by now
    bodies = []
    while True:
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    conn.close()
    return bodies, _resolution(b.log_text())


@pytest.mark.timeout(60)
def test_a_dispatch_in_doubt_whose_queue_has_it_is_not_sent_again(start_broker, monkeypatch):
    data_dir, _ = _kill_in_the_window(start_broker, monkeypatch, consume_durable=False)
    bodies, resolution = _restart_and_drain(start_broker, data_dir)
    assert resolution, "the kill missed the in-doubt window (no dispatch in doubt at the restart)"
    assert (resolution.get("already_delivered"), resolution.get("sent_again")) == (1, 0), resolution
    assert bodies == [b"once"]


@pytest.mark.timeout(60)
def test_a_dispatch_in_doubt_already_consumed_and_acked_is_not_sent_again(start_broker, monkeypatch):
    data_dir, acked = _kill_in_the_window(start_broker, monkeypatch, consume_durable=True)
    assert acked.count(b"once") == 1 and acked.count(b"filler") == SEGMENT_ENTRIES - 1
    bodies, resolution = _restart_and_drain(start_broker, data_dir)
    assert resolution, "the kill missed the in-doubt window (no dispatch in doubt at the restart)"
    assert (resolution.get("already_delivered"), resolution.get("sent_again")) == (1, 0), resolution
    assert b"once" not in bodies, "the consumer acked it before the crash: it must not come back"
