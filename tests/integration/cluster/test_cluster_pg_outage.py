"""PostgreSQL restarted under load (issue 15: "PostgreSQL unavailable: publishes to PostgreSQL queues are
nacked or blocked with connection.blocked, never confirmed and lost; consumers resume when it is back").

Two cluster members on a PostgreSQL of the test's own, which it crashes (``pg_ctl stop -m immediate``) and
starts again on the same port and data directory, twice, while a confirming publisher on one member sends
persistent messages to a quorum queue and a consumer on the other takes them. Neither client reconnects:
while PostgreSQL is down the publisher's messages are nacked (basic.nack), after it is back they are
confirmed again and the consumer receives again; at the end every confirmed message has been consumed
(nacked ones may be missing, duplicates are allowed: at least once), and no broker process died. A
definitions change made during the outage is refused (connection.close 541) and leaves nothing half-made;
the definitions feed is followed again afterwards. Real broker processes, pika clients."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest

from tests.integration.cluster.test_cluster_definitions import member, passive_exists
from tests.integration.cluster.test_cluster_quorum import PERSISTENT, QUORUM, declare, got_one, queue_messages
from tests.integration.management.test_management_api import Http, wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # own_postgres: a PostgreSQL server of this test's own, which it restarts


def within(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Publisher(threading.Thread):
    """Publishes persistent messages numbered 0, 1, ... one at a time with confirms, on one connection kept
    open throughout; records which were confirmed and which nacked."""

    def __init__(self, b, queue: str) -> None:
        super().__init__(daemon=True)
        self.b, self.queue = b, queue
        self.next = 0
        self.confirmed: list[int] = []
        self.nacked: list[int] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(self.b.pika_params())
            ch = conn.channel()
            ch.confirm_delivery()
            while not self.stop.is_set():
                i = self.next
                try:
                    ch.basic_publish("", self.queue, str(i).encode(), PERSISTENT)
                    self.confirmed.append(i)
                except pika.exceptions.NackError:
                    self.nacked.append(i)
                    self.stop.wait(0.005)  # a publisher told "not stored" tries the next a moment later
                self.next = i + 1
            conn.close()
        except BaseException as e:  # noqa: BLE001  (the test reports it: the connection must not break)
            self.error = e


class Consumer(threading.Thread):
    """Consumes with manual acks (prefetch 50) on one connection kept open throughout; records every body."""

    def __init__(self, b, queue: str) -> None:
        super().__init__(daemon=True)
        self.b, self.queue = b, queue
        self.received: set[int] = set()
        self.deliveries = 0
        self.redelivered = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(self.b.pika_params())
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)

            def on_message(ch, method, _props, body: bytes) -> None:
                self.received.add(int(body))
                self.deliveries += 1
                self.redelivered += method.redelivered
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume(self.queue, on_message)
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.05)
            conn.close()
        except BaseException as e:  # noqa: BLE001
            self.error = e


def _restart_under_load(server, pub: Publisher, con: Consumer, round_: int) -> None:
    """Load flows; PostgreSQL crashes (publishes are nacked) and starts again (confirms and deliveries of
    messages published after it came back)."""
    confirmed, got = len(pub.confirmed), con.deliveries
    assert within(lambda: len(pub.confirmed) >= confirmed + 200 and con.deliveries >= got + 100, 20), \
        f"round {round_}: no load before the restart ({len(pub.confirmed)} confirmed, {con.deliveries} got)"
    server.halt("immediate")
    nacked = len(pub.nacked)
    assert within(lambda: len(pub.nacked) >= nacked + 20, 10), \
        f"round {round_}: publishes were not nacked while PostgreSQL was down"
    server.resume()
    mark = pub.next  # published after PostgreSQL came back
    assert within(lambda: any(i >= mark for i in pub.confirmed), 20), \
        f"round {round_}: nothing confirmed after PostgreSQL came back"
    assert within(lambda: any(i >= mark for i in con.received), 20), \
        f"round {round_}: the consumer received nothing published after PostgreSQL came back"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_postgresql_restarted_twice_under_load_loses_nothing_confirmed(start_broker, own_postgres):
    dsn = own_postgres.dsn()  # a server of the test's own: its default database
    a = member(start_broker, dsn, "a@test")
    b = member(start_broker, dsn, "b@test")
    declare(a, "load")
    assert wait_for(lambda: queue_messages(b, "load") is not None, 30)
    pub, con = Publisher(a, "load"), Consumer(b, "load")
    con.start()
    pub.start()
    try:
        for round_ in range(2):
            _restart_under_load(own_postgres, pub, con, round_)
        pub.stop.set()
        pub.join(10)
        within(lambda: not (set(pub.confirmed) - con.received), 30)
        lost = sorted(set(pub.confirmed) - con.received)
        assert lost == [], f"{len(lost)} confirmed messages never consumed, e.g. {lost[:10]}"
    finally:
        pub.stop.set()
        con.stop.set()
        pub.join(10)
        con.join(10)
    assert pub.error is None, f"the publisher's connection broke: {pub.error!r}"
    assert con.error is None, f"the consumer's connection broke: {con.error!r}"
    assert not set(pub.confirmed) & set(pub.nacked)
    assert a.process.poll() is None and b.process.poll() is None, "a broker process died"
    for node in (a, b):
        assert node.log_text().count("reconnected with epoch") == 2, node.log_text()[-3000:]
    print(f"confirmed {len(pub.confirmed)}, nacked {len(pub.nacked)}, deliveries {con.deliveries} "
          f"({con.redelivered} redelivered)")


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_definition_made_during_the_outage_is_refused_and_the_feed_resumes(start_broker, own_postgres):
    dsn = own_postgres.dsn()  # a server of the test's own: its default database
    a = member(start_broker, dsn, "a@test")
    b = member(start_broker, dsn, "b@test")
    declare(a, "before")
    assert wait_for(lambda: passive_exists(b, "queue", "before"), 30)
    own_postgres.halt("immediate")
    conn = pika.BlockingConnection(a.pika_params())
    started = time.monotonic()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        conn.channel().queue_declare("during", durable=True, arguments=QUORUM)
    assert refused.value.reply_code == 541 and time.monotonic() - started < 5
    # The node's HTTP API still answers: it lists this member alone while the cluster's table is out of
    # reach, and refuses a definition it cannot write.
    api = Http(a.management_port)
    status, nodes, _ = api("GET", "/api/nodes")
    assert status == 200 and "a@test" in [n["name"] for n in nodes]
    status, body, _ = api("PUT", "/api/vhosts/during", {})
    assert status == 500 and "PostgreSQL" in body["reason"], (status, body)  # (the reason, not "internal error")
    own_postgres.resume()
    # Nothing half-made: the refused queue exists nowhere; a declare now is made and reaches the other member.
    assert not passive_exists(a, "queue", "during")
    declare(a, "after")
    assert wait_for(lambda: passive_exists(b, "queue", "after"), 30)
    assert not passive_exists(b, "queue", "during")
    assert api("GET", "/api/vhosts/during")[0] == 404
    # And the quorum queues work across the members again, once each has reconnected (b may still be
    # backing off: a publisher told "nacked" publishes again, as a confirming publisher should).
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()

    def published() -> bool:
        try:
            ch.basic_publish("", "after", b"hello", PERSISTENT)
            return True
        except pika.exceptions.NackError:
            return False

    assert wait_for(published, 30), "still nacked 30 s after PostgreSQL came back"
    conn.close()
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    answer = wait_for(lambda: got_one(ch, "after"), 30)
    assert answer is not None and answer[2] == b"hello"
    conn.close()
    assert a.process.poll() is None and b.process.poll() is None
