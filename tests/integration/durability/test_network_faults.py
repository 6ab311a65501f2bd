"""Network faults between a client and the broker, made by a user-space proxy (tests/faultproxy.py): a
connection cut in the middle of a frame, a peer that stalls (stops reading and sending, socket left open), and
a slow reader. Each time the broker must free what the connection held (gone from /api/connections, its
consumers gone, its unacknowledged messages requeued) and lose nothing it confirmed.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.parse
import urllib.request

import pika
import pika.exceptions
import pytest
from faultproxy import FaultProxy

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]


def api(b, path: str):
    req = urllib.request.Request(f"http://127.0.0.1:{b.management_port}{path}", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def queue_info(b, name: str) -> dict:
    return api(b, f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}")


def wait_until(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def connections_through(b, proxy: FaultProxy) -> list[dict]:
    """The broker's connections whose peer is one of the proxy's upstream sockets."""
    ports = set()
    for link in proxy.links:
        sock = link.upstream[1].transport.get_extra_info("sockname")
        if sock:
            ports.add(sock[1])
    return [c for c in api(b, "/api/connections") if c.get("peer_port") in ports]


def settled(b, queue: str, ready: int):
    """The queue holds ``ready`` messages, none unacknowledged, no consumer (the API's stats are refreshed
    on their own timer, so this is waited for)."""
    def check():
        q = queue_info(b, queue)
        ok = (q.get("messages_ready") == ready and q.get("messages_unacknowledged") == 0
              and q.get("consumers") == 0)
        return q if ok else None
    return check


def fill(b, queue: str, count: int, size: int = 100) -> list[bytes]:
    """Publish ``count`` persistent messages with confirms on a direct connection; the bodies, in order."""
    bodies = [f"{i:06d}-".encode() + b"x" * (size - 7) for i in range(count)]
    conn = pika.BlockingConnection(b.pika_params(heartbeat=0))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))  # raises unless confirmed
    conn.close()
    return bodies


def drain(b, queue: str) -> list[bytes]:
    conn = pika.BlockingConnection(b.pika_params(heartbeat=0))
    ch = conn.channel()
    out = []
    while True:
        _m, _p, body = ch.basic_get(queue, auto_ack=True)
        if body is None:
            break
        out.append(body)
    conn.close()
    return out


@pytest.fixture
def setup(start_broker):
    b = start_broker()
    proxy = FaultProxy(b.host, b.port)
    yield b, proxy
    proxy.close()


def via(proxy: FaultProxy, b, **kw) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=proxy.port, credentials=pika.PlainCredentials("guest", "guest"), **kw))


def test_connection_cut_mid_frame(setup, uid):
    b, proxy = setup
    q = f"{uid}-q"
    bodies = fill(b, q, 20)
    conn = via(proxy, b, heartbeat=0)
    proxy.wait_links(1)
    pub = conn.channel()
    pub.confirm_delivery()
    cons = conn.channel()
    cons.basic_qos(prefetch_count=5)
    got: list[bytes] = []
    cons.basic_consume(q, lambda ch, m, p, body: got.append(body))
    wait_until("5 deliveries", lambda: conn.process_data_events(0.05) or len(got) >= 5)
    def consumer_holds_five() -> bool:
        info = queue_info(b, q)
        return info.get("messages_unacknowledged") == 5 and info.get("consumers") == 1

    wait_until("the consumer and 5 unacked", consumer_holds_five)
    proxy.cut_after(300)  # inside the 10 kB publish below: its header frame arrives, then half a body frame
    with pytest.raises(pika.exceptions.AMQPError):
        pub.basic_publish("", q, b"z" * 10_000, pika.BasicProperties(delivery_mode=2))
    wait_until("the connection to be gone", lambda: not connections_through(b, proxy))
    wait_until("the 5 unacked requeued, the consumer gone", settled(b, q, 20))
    assert sorted(drain(b, q)) == bodies  # all confirmed messages, the half-sent one not among them


def test_stalled_peer_is_dropped_after_missed_heartbeats(setup, uid):
    b, proxy = setup
    q = f"{uid}-q"
    bodies = fill(b, q, 300, size=10_000)  # 3 MB: more than the socket buffers hold
    fds_before = len(os.listdir(f"/proc/{b.pid}/fd"))
    conn = via(proxy, b, heartbeat=1)
    link = proxy.wait_links(1)
    ch = conn.channel()
    ch.basic_consume(q, lambda ch, m, p, body: None)  # prefetch 0: the broker sends all it can
    wait_until("deliveries to start", lambda: conn.process_data_events(0.05) or link.down_bytes > 100_000)
    proxy.stall()  # the client side goes silent and stops reading; every socket stays open
    started = time.monotonic()
    wait_until("the stalled connection to be dropped", lambda: not connections_through(b, proxy), timeout=30)
    dropped_after = time.monotonic() - started
    print(f"stalled connection dropped after {dropped_after:.1f} s")
    # Heartbeat 1 s: two missed heartbeats (RabbitMQ's rule) are 2 s; the write buffer must not hold it open.
    assert dropped_after < 10, dropped_after
    wait_until("every delivery requeued", settled(b, q, 300))
    # Its socket is closed too, not left waiting for a write buffer the peer will never read.
    wait_until("the broker's descriptors back to before", lambda: len(os.listdir(f"/proc/{b.pid}/fd")) <= fds_before)
    assert sorted(drain(b, q)) == bodies


def test_slow_reader_gets_everything_and_others_are_not_slowed(setup, uid):
    b, proxy = setup
    q = f"{uid}-q"
    bodies = fill(b, q, 100, size=10_000)  # 1 MB at 400 kB/s through the proxy
    conn = via(proxy, b, heartbeat=0)
    proxy.wait_links(1)
    proxy.rate(400_000)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    got: list[bytes] = []

    def on_message(channel, method, _props, body):
        got.append(body)
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    canary_slowest = [0.0]
    canary_errors: list[str] = []
    stop = threading.Event()

    def canary() -> None:
        try:
            c = pika.BlockingConnection(b.pika_params(heartbeat=0))
            cch = c.channel()
            cq = cch.queue_declare("", exclusive=True).method.queue
            while not stop.is_set():
                t0 = time.monotonic()
                cch.basic_publish("", cq, b"ping")
                while cch.basic_get(cq, auto_ack=True)[2] is None:
                    pass
                canary_slowest[0] = max(canary_slowest[0], time.monotonic() - t0)
                stop.wait(0.05)
            c.close()
        except Exception as exc:  # noqa: BLE001 - reported below
            canary_errors.append(repr(exc))

    t = threading.Thread(target=canary, daemon=True)
    t.start()
    started = time.monotonic()
    wait_until("every message", lambda: conn.process_data_events(0.1) or len(got) >= 100, timeout=60)
    elapsed = time.monotonic() - started
    stop.set()
    t.join(10)
    print(f"slow reader: {elapsed:.1f} s, canary slowest {canary_slowest[0] * 1000:.0f} ms")
    assert got == bodies  # each once, in order
    assert elapsed > 1.5, elapsed  # the proxy did slow it down
    assert not canary_errors and canary_slowest[0] < 1.0, (canary_errors, canary_slowest)
    conn.close()
    wait_until("the queue empty, nothing unacked", settled(b, q, 0))
