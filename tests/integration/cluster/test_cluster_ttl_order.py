"""A quorum queue delivers in order across members, with a message TTL or without (issue 35): RabbitMQ's quorum
queue hands out messages in queue order and expires them from the head. Here the publishing member's consumer is
full (prefetch 1, not acking) and another member's consumer takes the rest, acking at once. Before, the
publishing member reserved up to 100 rows only to look at the head (for its TTL timer; or because its count said
the queue was empty while its full consumer waited) and handed them back (storage/pg/backing_queue.py
``hand_back_unused``): for that round trip the other member skipped them (``SKIP LOCKED``) and took newer rows
first, one message ahead of an older one in 3 of 4 runs. Now such a member reads the head's expiries instead
(storage/pg/workers.py ``HEAD``). Real broker processes, a real PostgreSQL (tests/pg_server.py), pika clients."""

from __future__ import annotations

import itertools

import pika
import pytest

from tests.integration.cluster.test_cluster_cross_member import two
from tests.integration.cluster.test_cluster_cross_member_more import Consumer, declared, pump
from tests.integration.cluster.test_cluster_forwarding import channel

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

N = 300


class AckingConsumer(Consumer):
    def _on(self, ch, method, props, body) -> None:
        super()._on(ch, method, props, body)
        ch.basic_ack(method.delivery_tag)


def inversions(bodies: list[bytes]) -> list[tuple[int, int]]:
    """Each (earlier, later) neighbour pair delivered out of publish order."""
    nums = [int(b[1:]) for b in bodies]
    return [(x, y) for x, y in itertools.pairwise(nums) if y < x]


@pytest.mark.parametrize("ttl", [None, 60_000])
def test_a_ttl_queue_delivers_in_order_to_the_other_member(start_broker, pg_dsn, ttl):
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "tq", **({"x-message-ttl": ttl} if ttl else {}))
    full_on_a = Consumer(a, "tq", 1)
    on_b = AckingConsumer(b, "tq", 20)
    pump([full_on_a, on_b], seconds=1.5)  # b's room announced (every 0.5 s)
    conn, ch = channel(a)
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", "tq", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        if i % 10 == 0:
            pump([full_on_a, on_b], seconds=0.01)
    conn.close()
    assert pump([full_on_a, on_b], lambda: len(on_b.got) + len(full_on_a.got) >= N, 60), (
        len(on_b.got), len(full_on_a.got))
    got_b = on_b.bodies()
    for c in (full_on_a, on_b):
        c.conn.close()
    bad = inversions(got_b)
    print(f"\na's consumer held {full_on_a.bodies()}; b got {len(got_b)}, out of order: {bad}")
    assert not bad, f"b's consumer got {len(bad)} messages ahead of an older one: {bad[:10]}"
