"""A purge of a quorum queue made on one member of a Leveret cluster removes every ready message queue-wide, those
another member has reserved for its consumers and not delivered yet included, as RabbitMQ's quorum queue purges
every ready message (issue 35); the messages a consumer holds unacked stay, and purge-ok counts what was removed.

How a member comes to hold rows it has not delivered: a consumer without a prefetch of its own on a channel with
a global prefetch (``basic.qos(global=True)``, a limit on the whole channel) is counted as having room for a
whole batch (storage/pg/workers.py ``batch_for``), so its member reserves up to 100 rows; the channel's limit lets
it deliver only that many, and the rest sit reserved on that member (for up to RELEASE_IDLE_AFTER, 2 s, before
they go back ready). Real broker processes, a real PostgreSQL (tests/pg_server.py), pika clients."""

from __future__ import annotations

import threading

import pytest

from tests.integration.cluster.test_cluster_cross_member import ready, two
from tests.integration.cluster.test_cluster_cross_member_more import Consumer, declared, pump
from tests.integration.cluster.test_cluster_forwarding import channel
from tests.integration.cluster.test_cluster_overflow import publish_confirmed

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

N = 50
CHANNEL_PREFETCH = 5
# Long enough for the member holding reserved rows to hand them back when idle (RELEASE_IDLE_AFTER, 2 s) and for
# a consumer to be handed whatever it would get: a purge that left rows shows them within this.
SETTLE = 3.0


class GlobalPrefetchConsumer(Consumer):
    """A manual-ack consumer with no prefetch of its own on a channel limited to CHANNEL_PREFETCH unacked."""

    def __init__(self, m, queue: str, ack: bool = False) -> None:
        self.ack = ack
        super().__init__(m, queue, 0)
        # After the basic.consume: a quorum queue refuses a consume on a channel with a global prefetch
        # (RabbitMQ's 540 NOT_IMPLEMENTED), not a limit set afterwards.
        self.ch.basic_qos(prefetch_count=CHANNEL_PREFETCH, global_qos=True)

    def _on(self, ch, method, props, body) -> None:
        super()._on(ch, method, props, body)
        if self.ack:
            ch.basic_ack(method.delivery_tag)


def test_a_purge_removes_the_rows_another_member_reserved_and_has_not_delivered(start_broker, pg_dsn):
    """b's consumer holds CHANNEL_PREFETCH deliveries and b has reserved the rest of the 50 for it. A purge on a
    answers 45 (RabbitMQ: every ready message), and once b's consumer acks its five, nothing more reaches it
    and nothing is ready on either member (before: purge-ok 0, and b's consumer received the 45 afterwards)."""
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "pq1")
    on_b = GlobalPrefetchConsumer(b, "pq1")
    publish_confirmed(a, "pq1", [b"m%d" % i for i in range(N)])
    assert pump([on_b], lambda: len(on_b.got) == CHANNEL_PREFETCH, 30), on_b.bodies()
    pump([on_b], seconds=0.3)
    assert len(on_b.got) == CHANNEL_PREFETCH, f"b's consumer got {len(on_b.got)} past its channel's prefetch"
    conn_a, ch_a = channel(a)
    purged = ch_a.queue_purge("pq1").method.message_count
    conn_a.close()
    held = [g[3] for g in on_b.got]
    on_b.ch.basic_ack(held[-1], multiple=True)
    pump([on_b], seconds=SETTLE)
    after = on_b.bodies()[CHANNEL_PREFETCH:]
    left = {"a": ready(a, "pq1"), "b": ready(b, "pq1")}
    on_b.conn.close()
    assert purged == N - CHANNEL_PREFETCH and after == [] and left == {"a": 0, "b": 0}, (
        f"purge-ok {purged} (expected {N - CHANNEL_PREFETCH}); b's consumer got {len(after)} after the purge "
        f"({after[:5]}...); ready after: {left}")


def test_a_purge_racing_deliveries_on_the_other_member_counts_each_message_once(start_broker, pg_dsn):
    """b's consumer acks as it receives (channel prefetch 5, so b delivers from its reserved rows as acks come)
    while a purges: each of the 400 messages is either delivered to b's consumer or counted by purge-ok, never
    both and never neither (RabbitMQ: a delivered message is no longer ready; the purge counts the ready ones),
    and nothing is ready afterwards."""
    total = 400
    a, b = two(start_broker, pg_dsn)
    declared(a, b, "pq2")
    on_b = GlobalPrefetchConsumer(b, "pq2", ack=True)
    publish_confirmed(a, "pq2", [b"m%d" % i for i in range(total)])
    purge_result: dict[str, int] = {}

    def purge() -> None:
        conn_a, ch_a = channel(a)
        purge_result["n"] = ch_a.queue_purge("pq2").method.message_count
        conn_a.close()

    # The purge starts once b's consumer is under way (some delivered, most still to come).
    assert pump([on_b], lambda: len(on_b.got) >= 20, 30), on_b.bodies()
    purger = threading.Thread(target=purge)
    purger.start()
    pump([on_b], lambda: not purger.is_alive(), 30)
    purger.join(30)
    assert "n" in purge_result, "purge-ok never came"
    pump([on_b], seconds=SETTLE)
    delivered = on_b.bodies()
    left = {"a": ready(a, "pq2"), "b": ready(b, "pq2")}
    on_b.conn.close()
    doubles = len(delivered) - len(set(delivered))
    print(f"\npurge-ok {purge_result['n']}, delivered {len(delivered)} of {total}")
    assert doubles == 0 and len(delivered) + purge_result["n"] == total and left == {"a": 0, "b": 0}, (
        f"delivered {len(delivered)} ({doubles} twice) + purge-ok {purge_result['n']} != {total}; "
        f"ready after: {left}")
