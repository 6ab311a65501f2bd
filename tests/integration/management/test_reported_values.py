"""Values the HTTP API and the Prometheus exporter report, each checked against a broker put in the state it
describes (architecture issue, "wrong values behind getattr defaults"): a connection blocked by an alarm or
held back by credit flow, publishes awaiting their confirms, paged-out messages, unacknowledged bytes,
publishing channels, the resource limits after ``leveret ctl set_*``, and ``disk_free_limit.relative``.

Before the presenters read declared fields, every one of these showed a default: "running", 0, the
configured limit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rawamqp import RawAMQPClient, body_frame, commands, content_header_frame, method_frame

from tests.conftest import ROOT, BrokerProcess
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]

PER_OBJECT = "/metrics/per-object"


class Node:
    """A Leveret process of its own: AMQP, its HTTP API (``api``), its metrics (``scrape``), ``ctl``."""

    def __init__(self, broker: BrokerProcess, mport: int, pport: int) -> None:
        self.broker = broker
        self.mport = mport
        self.pport = pport
        self.api = Http(mport)

    def get(self, path: str):
        status, body, _ = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body

    def scrape(self, path: str = "/metrics") -> dict[tuple[str, tuple], float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.pport}{path}", timeout=5).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def ctl(self, *args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{self.mport}",
                              *args], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def connect(self, name: str) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.broker.pika_params(client_properties={"connection_name": name}))

    def connection(self, name: str) -> dict:
        """The /api/connections entry of the pika connection named ``name``."""
        for c in self.get("/api/connections"):
            if c["client_properties"].get("connection_name") == name:
                return c
        raise AssertionError(f"no connection named {name!r}")


@contextlib.contextmanager
def own_node(*extra: str, env: dict[str, str] | None = None) -> Iterator[Node]:
    tmp = Path(tempfile.mkdtemp(prefix="leveret-values-"))
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        b, mport, pport = start_mgmt_broker(tmp, *extra)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield Node(b, mport, pport)
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """A broker with the default settings, shared by the tests that do not change node-wide state."""
    with own_node() as n:
        yield n


def eventually(probe: Callable[[], object], timeout: float = 10.0, interval: float = 0.05):
    """``probe()`` once it is truthy; the last value seen if it never is within ``timeout``."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = probe()
    return value


def pump(conn: pika.BlockingConnection, until: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


# -- connections: blocked by an alarm, held back by credit flow -------------------------------------------------

def test_connection_blocked_by_an_alarm_shows_state_blocked(tmp_path, uid):
    """A disk alarm at start (a limit larger than any disk): the connection that publishes is blocked,
    ``state`` "blocked" and ``blocked`` true; one that has not published is "blocking" (it would be blocked
    at its first publish), as RabbitMQ shows them. Once the alarm clears both are "running" again."""
    conf = tmp_path / "alarm.conf"
    conf.write_text("disk_free_limit.absolute = 1000000TB\n")
    with own_node("--config", str(conf)) as n:
        publisher, idle = n.connect(f"{uid}-pub"), n.connect(f"{uid}-idle")
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda c, f: events.append("blocked"))
        publisher.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
        ch = publisher.channel()
        queue = ch.queue_declare(f"{uid}-q").method.queue
        ch.basic_publish("", queue, b"m")
        pump(publisher, lambda: "blocked" in events)
        assert events == ["blocked"]
        pub = n.connection(f"{uid}-pub")
        assert (pub["state"], pub["blocked"]) == ("blocked", True)
        other = n.connection(f"{uid}-idle")
        assert (other["state"], other["blocked"]) == ("blocking", False)

        n.ctl("set_disk_free_limit", "1000")
        pump(publisher, lambda: "unblocked" in events)
        pub = n.connection(f"{uid}-pub")
        assert (pub["state"], pub["blocked"]) == ("running", False)
        assert n.connection(f"{uid}-idle")["state"] == "running"
        publisher.close()
        idle.close()


# The fsync of this broker's disk writer waits this long: persistent publishes wait that long for their
# confirms (LEVERET_TEST_FSYNC_DELAY_MS, storage/syncer.py).
FSYNC_DELAY_MS = 1500
# broker/queues/queue_process.py FLOW_HIGH: publishes a queue lets wait for their fsync before credit flow
# stops reading its publishers.
FLOW_HIGH = 4000


# The flow test's broker: an fsync long enough that more than FLOW_HIGH publishes are read while the first
# one runs even on a loaded 2-core CI machine (≥ 700 publishes/s). With 1.5 s, a broker starved to ~1,300
# publishes/s confirmed each round before FLOW_HIGH were owed and never held the publisher back (seen in two of
# seven full runs).
FLOW_FSYNC_DELAY_MS = 6000


@pytest.fixture(scope="module")
def slow_disk() -> Iterator[Node]:
    with own_node(env={"LEVERET_TEST_FSYNC_DELAY_MS": str(FSYNC_DELAY_MS)}) as n:
        yield n


@pytest.fixture(scope="module")
def very_slow_disk() -> Iterator[Node]:
    with own_node(env={"LEVERET_TEST_FSYNC_DELAY_MS": str(FLOW_FSYNC_DELAY_MS)}) as n:
        yield n


def _confirming_client(n: Node, queue: str) -> RawAMQPClient:
    c = RawAMQPClient.for_broker(n.broker, timeout=10)
    c.handshake(heartbeat=0)
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue=queue, durable=True))
    c.expect_method(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk, 1)
    return c


def _persistent_publishes(queue: str, n: int) -> bytes:
    one = (method_frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
           + content_header_frame(1, 100, commands.Basic.Properties(delivery_mode=2)) + body_frame(1, b"x" * 100))
    return one * n


def _channel_of(n: Node, client: RawAMQPClient) -> dict:
    port = client.sock.getsockname()[1]
    found = [c for c in n.get("/api/channels") if c["connection_details"]["peer_port"] == port]
    assert len(found) == 1, found
    return found[0]


def test_channel_messages_unconfirmed_counts_publishes_awaiting_their_confirm(slow_disk, uid):
    """Ten persistent publishes into a durable queue wait for the (slowed) fsync: the channel shows
    ``messages_unconfirmed`` 10 meanwhile, and 0 once they are confirmed."""
    n = slow_disk
    client = _confirming_client(n, f"{uid}-q")
    try:
        client.send_raw(_persistent_publishes(f"{uid}-q", 10))
        seen = eventually(lambda: _channel_of(n, client)["messages_unconfirmed"] == 10 or None,
                          timeout=FSYNC_DELAY_MS / 1000 * 0.8)
        assert seen, _channel_of(n, client)
        confirmed = 0
        while confirmed < 10:
            ack = client.expect_method(commands.Basic.Ack, 1)
            confirmed = ack.delivery_tag
        assert eventually(lambda: _channel_of(n, client)["messages_unconfirmed"] == 0, timeout=2)
    finally:
        client.close()


def test_connection_held_back_by_credit_flow_shows_state_flow(very_slow_disk, uid):
    """More persistent publishes than a queue's credit (FLOW_HIGH awaiting their fsync): the queue stops
    reading the publisher's socket, and /api/connections shows the connection as "flow"."""
    n = very_slow_disk
    client = _confirming_client(n, f"{uid}-q")
    port = client.sock.getsockname()[1]

    def state() -> str:
        return next(c["state"] for c in n.get("/api/connections") if c["peer_port"] == port)

    assert state() == "running"
    sender = threading.Thread(target=client.send_raw, args=(_persistent_publishes(f"{uid}-q", FLOW_HIGH + 2000),),
                              daemon=True)
    sender.start()
    try:
        # Shown as "flow" from the pause on, for 5 seconds at least (RabbitMQ's rule).
        assert eventually(lambda: state() == "flow", timeout=FLOW_FSYNC_DELAY_MS / 1000 + 6.0), state()
    finally:
        sender.join(30)
        client.close()


# -- queues: paged-out messages, unacknowledged bytes -------------------------------------------------------------

# A queue nobody consumes keeps at most 16 MiB of its ready messages in RAM (broker/resources/memory_budget.py
# DEFAULT_QUEUE_BUDGET): 24 MiB page out about a third of them.
PAGE_MSG = 64 * 1024
PAGE_COUNT = 384


@pytest.fixture(scope="module")
def paged_queue(node: Node) -> Iterator[str]:
    name = "values-paged"
    conn = node.connect("paged")
    ch = conn.channel()
    ch.queue_declare(name)
    body = b"p" * PAGE_MSG
    for _ in range(PAGE_COUNT):
        ch.basic_publish("", name, body)
    assert eventually(lambda: node.get(f"/api/queues/%2F/{name}")["messages"] == PAGE_COUNT)
    yield name
    ch.queue_delete(name)
    conn.close()


def test_queue_messages_paged_out_in_the_api(node: Node, paged_queue: str):
    info = eventually(lambda: (i := node.get(f"/api/queues/%2F/{paged_queue}"))["messages_paged_out"] and i)
    assert info, node.get(f"/api/queues/%2F/{paged_queue}")
    assert 0 < info["messages_paged_out"] <= info["messages_ready"] == PAGE_COUNT
    # At most the 16 MiB head is in RAM.
    assert info["messages_paged_out"] >= PAGE_COUNT - 16 * 1024 * 1024 // PAGE_MSG


def test_leveret_queue_messages_paged_out_metric(node: Node, paged_queue: str):
    api = eventually(lambda: node.get(f"/api/queues/%2F/{paged_queue}")["messages_paged_out"])
    assert api
    labels = (("queue", paged_queue), ("vhost", "/"))
    assert node.scrape(PER_OBJECT)[("leveret_queue_messages_paged_out", labels)] == api
    assert node.scrape()[("leveret_queue_messages_paged_out", ())] >= api


def test_queue_message_bytes_unacknowledged(node: Node, uid):
    conn = node.connect(uid)
    ch = conn.channel()
    name = ch.queue_declare(f"{uid}-q").method.queue
    for size in (100, 200, 300):
        ch.basic_publish("", name, b"u" * size)
    ch.basic_get(name)
    second, _, _ = ch.basic_get(name)
    info = eventually(lambda: (i := node.get(f"/api/queues/%2F/{q(name)}"))["messages_unacknowledged"] == 2 and i)
    assert info
    assert info["message_bytes_unacknowledged"] == 300
    assert info["message_bytes_ready"] == 300
    assert info["message_bytes"] == 600
    m = node.scrape(PER_OBJECT)
    labels = (("queue", name), ("vhost", "/"))
    assert m[("rabbitmq_queue_messages_unacked_bytes", labels)] == 300
    assert m[("rabbitmq_queue_messages_bytes", labels)] == 600
    ch.basic_ack(second.delivery_tag, multiple=True)
    info = eventually(lambda: (i := node.get(f"/api/queues/%2F/{q(name)}"))["messages_unacknowledged"] == 0 and i)
    assert info and (info["message_bytes_unacknowledged"], info["message_bytes"]) == (0, 300)
    ch.queue_delete(name)
    conn.close()


# -- node: publishers, limits -------------------------------------------------------------------------------------

def _publishers(n: Node) -> float:
    return n.scrape()[("rabbitmq_global_publishers", (("protocol", "amqp091"),))]


def test_global_publishers_counts_every_publishing_channel(node: Node, uid):
    """Channels that have published and are open, confirm mode or not; consuming or idle ones are not."""
    base = _publishers(node)
    conn = node.connect(uid)
    plain, confirming, consuming = conn.channel(), conn.channel(), conn.channel()
    name = plain.queue_declare(f"{uid}-q").method.queue
    consuming.basic_consume(name, lambda *a: None, auto_ack=True)
    assert _publishers(node) == base
    plain.basic_publish("", name, b"plain")
    plain.basic_publish("", "no-such-queue", b"unroutable")
    assert eventually(lambda: _publishers(node) == base + 1), _publishers(node)
    confirming.confirm_delivery()
    confirming.basic_publish("", name, b"confirmed")
    assert _publishers(node) == base + 2
    plain.close()
    assert eventually(lambda: _publishers(node) == base + 1), _publishers(node)
    consuming.queue_delete(name)
    conn.close()
    assert eventually(lambda: _publishers(node) == base), _publishers(node)


@pytest.fixture(scope="module")
def limits_node() -> Iterator[Node]:
    with own_node() as n:
        yield n


def test_memory_limit_after_ctl_set_vm_memory_high_watermark(limits_node: Node):
    n = limits_node
    before = n.get("/api/nodes")[0]["mem_limit"]
    limit = 3 * before + 12345  # far from the configured one, and no alarm
    n.ctl("set_vm_memory_high_watermark", "absolute", str(limit))
    assert n.get("/api/nodes")[0]["mem_limit"] == limit
    assert n.scrape()[("rabbitmq_resident_memory_limit_bytes", ())] == limit
    assert n.get("/api/nodes")[0]["mem_alarm"] is False


def test_disk_free_limit_after_ctl_set_disk_free_limit(limits_node: Node):
    n = limits_node
    assert n.get("/api/nodes")[0]["disk_free_limit"] == 50 * 1000 * 1000  # the default
    n.ctl("set_disk_free_limit", "12345678")
    assert n.get("/api/nodes")[0]["disk_free_limit"] == 12345678
    assert n.scrape()[("rabbitmq_disk_space_available_limit_bytes", ())] == 12345678


def test_disk_free_limit_relative_is_applied(uid):
    """``disk_free_limit.relative`` is a multiple of the machine's RAM (RabbitMQ's ``{mem_relative, R}``): a
    huge one is reported as that many bytes and raises the disk alarm, which blocks a publisher."""
    relative = 100000.0
    expected = int(relative * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    with own_node("--set", f"disk_free_limit.relative={relative}") as n:
        info = n.get("/api/nodes")[0]
        assert info["disk_free_limit"] == expected
        assert info["disk_free_alarm"] is True
        m = n.scrape()
        assert m[("rabbitmq_disk_space_available_limit_bytes", ())] == expected
        assert m[("rabbitmq_alarms_free_disk_space_watermark", ())] == 1
        conn = n.connect(uid)
        blocked: list[str] = []
        conn.add_on_connection_blocked_callback(lambda c, f: blocked.append(f.method.reason))
        ch = conn.channel()
        ch.basic_publish("", ch.queue_declare(f"{uid}-q").method.queue, b"m")
        pump(conn, lambda: bool(blocked))
        assert blocked and "disk" in blocked[0]
        assert n.connection(uid)["state"] == "blocked"
        # Not closed: a blocked connection's close is not read until the alarm clears; the broker's shutdown
        # closes it.
