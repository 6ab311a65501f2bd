"""Consumer priorities (``x-priority``) rank a quorum queue's consumers across the members of a Leveret cluster,
as RabbitMQ's quorum queue ranks them queue-wide (issue 35): while consumers of a higher priority have room,
wherever they are connected, those of a lower priority on another member get nothing; once the higher ones are
blocked (their prefetch full), the lower ones get the rest. Before, a priority ranked consumers within their own
member only: the publishing member kept its consumers' share whatever their priority. Real broker processes, a
real PostgreSQL (tests/pg_server.py), pika clients."""

from __future__ import annotations

import threading
import time

import pika
import pytest

from tests.integration.cluster.test_cluster_cross_member import QUORUM, two
from tests.integration.cluster.test_cluster_forwarding import channel, known_on

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

N = 1_000
PREFETCH = 20
HIGH, LOW = 10, 0
# The share the higher-priority consumer must get while it keeps room (acking at once): all of it but what it
# could not take at a moment its 20 were in flight, which RabbitMQ hands to the lower one too.
HIGH_SHARE = 0.9
ANNOUNCED = 1.5  # members announce their consumers' room and priority every 0.5 s: two rounds and a margin


class Consumer(threading.Thread):
    """One consumer on a member (prefetch 20, ``x-priority`` ``priority``), acking each message as it comes
    unless ``ack`` is False (then it holds its 20 and is blocked), until ``done``."""

    def __init__(self, member, queue: str, priority: int, ack: bool = True) -> None:
        super().__init__(daemon=True)
        self.member, self.queue, self.priority, self.ack = member, queue, priority, ack
        self.got: list[bytes] = []
        self.ready = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        conn, ch = channel(self.member)
        ch.basic_qos(prefetch_count=PREFETCH)

        def on_message(c, method, _props, body) -> None:
            self.got.append(body)
            if self.ack:
                c.basic_ack(method.delivery_tag)

        ch.basic_consume(self.queue, on_message, arguments={"x-priority": self.priority})
        self.ready.set()
        while not self.done.is_set():
            conn.process_data_events(time_limit=0.05)
        conn.close()


def publish(member, queue: str, bodies: list[bytes]) -> None:
    conn, ch = channel(member)
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()


def consumers_on_both(start_broker, pg_dsn, high_acks: bool) -> tuple[object, object, Consumer, Consumer]:
    """Members a and b, a quorum queue, a consumer of priority 10 on b and one of priority 0 on a, both
    announced to the other member."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("prio-q", durable=True, arguments=QUORUM)
    conn.close()
    assert known_on(b, "prio-q")
    high, low = Consumer(b, "prio-q", HIGH, ack=high_acks), Consumer(a, "prio-q", LOW)
    for c in (high, low):
        c.start()
    assert high.ready.wait(10) and low.ready.wait(10)
    time.sleep(ANNOUNCED)
    return a, b, high, low


def wait_for_all(consumers: list[Consumer], n: int, timeout: float) -> float:
    """Until the consumers got ``n`` in all (or ``timeout``); then they stop, in the order given (a consumer
    holding unacked messages last: closing, it hands them back, and one still running would get them again)."""
    started = time.monotonic()
    while sum(len(c.got) for c in consumers) < n and time.monotonic() - started < timeout:
        time.sleep(0.05)
    took = time.monotonic() - started
    time.sleep(0.3)  # a duplicate would come now
    for c in consumers:
        c.done.set()
        c.join(10)
    return took


@pytest.mark.parametrize("published_on", ["low", "high"])
def test_the_higher_priority_consumer_on_another_member_gets_the_messages_while_it_has_room(
        start_broker, pg_dsn, published_on):
    """1,000 messages published (confirmed) on the member of the priority-0 consumer, or on the member of the
    priority-10 one: the priority-10 consumer, acking at once, gets at least 90 %; together exactly once each."""
    a, b, high, low = consumers_on_both(start_broker, pg_dsn, high_acks=True)
    sent = [b"m%d" % i for i in range(N)]
    publish(a if published_on == "low" else b, "prio-q", sent)
    took = wait_for_all([high, low], N, 30)
    print(f"published on the {published_on} member: priority {HIGH} got {len(high.got)}, priority {LOW} "
          f"{len(low.got)}; all consumed {took:.2f} s after the last confirm")
    assert sorted(high.got + low.got) == sorted(sent), (len(high.got), len(low.got))
    assert len(high.got) >= HIGH_SHARE * N, f"priority {HIGH} {len(high.got)}, priority {LOW} {len(low.got)}"


def test_the_lower_priority_consumer_gets_the_rest_once_the_higher_one_is_blocked(start_broker, pg_dsn):
    """The priority-10 consumer on b never acks: it takes its prefetch (20) and is blocked; the 980 others
    reach the priority-0 consumer on a, the publisher's member, within seconds (b's announcement goes stale)."""
    a, _b, high, low = consumers_on_both(start_broker, pg_dsn, high_acks=False)
    sent = [b"m%d" % i for i in range(N)]
    publish(a, "prio-q", sent)
    took = wait_for_all([low, high], N, 30)
    print(f"blocked priority {HIGH} got {len(high.got)}, priority {LOW} {len(low.got)} in {took:.2f} s")
    assert len(high.got) == PREFETCH, len(high.got)
    assert sorted(high.got + low.got) == sorted(sent), (len(high.got), len(low.got))
