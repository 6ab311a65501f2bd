"""max-length on a quorum queue with publishers on both members of a cluster (issue 15): the limit is the
queue's, not each member's.

Member ``b`` has the queue open (a passive declare) before ``a`` fills it to its limit of 5; ``b`` then
publishes 3 more with confirms. With ``reject-publish`` the 3 are nacked and the queue keeps a's 5; with
``drop-head`` they are taken and the 3 oldest go, so the queue keeps the newest 5. (Before: ``b`` judged the
limit on what it held itself, so it accepted the 3 in both modes, and a drop-head on a member whose head rows
were still in PostgreSQL dropped nothing: 8 messages in a queue of at most 5.)
"""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from tests.integration.cluster.test_cluster_forwarding import channel, drain, two

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]

LIMIT = 5


def publish_confirmed(b, queue: str, bodies: list[bytes]) -> list[bool]:
    """Publish each with confirms on ``b``: True if confirmed, False if nacked."""
    conn, ch = channel(b)
    ch.confirm_delivery()
    out = []
    for body in bodies:
        try:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
            out.append(True)
        except pika.exceptions.NackError:
            out.append(False)
    conn.close()
    return out


def wait_count(b, queue: str, n: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn, ch = channel(b)
        count = ch.queue_declare(queue, passive=True).method.message_count
        conn.close()
        if count == n:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("overflow", ["reject-publish", "drop-head"])
def test_max_length_is_the_queues_across_members(start_broker, pg_dsn, overflow):
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare("capped", durable=True,
                     arguments={"x-queue-type": "quorum", "x-max-length": LIMIT, "x-overflow": overflow})
    conn.close()
    conn, ch = channel(b)
    assert ch.queue_declare("capped", passive=True).method.message_count == 0
    conn.close()

    assert publish_confirmed(a, "capped", [b"a%d" % i for i in range(LIMIT)]) == [True] * LIMIT
    # b learns of a's publishes from the doorbell's recount, within milliseconds on a quiet machine (the
    # window storage/pg/SCHEMA.md states); a passive declare waits for one, so b's publishes are judged on the full queue.
    assert wait_count(b, "capped", LIMIT)
    # Which messages are the oldest is decided by seq, numbered on each member from blocks of one PostgreSQL
    # sequence, so across members only within about a second (storage/pg/SCHEMA.md: ordering across members; an idle
    # member renews its block once a second). b publishes once its block is newer than the one a's went out
    # under, so "the oldest" is a's here (seen in a loaded CI run: b0 dropped, a2 kept).
    time.sleep(1.6)
    from_b = publish_confirmed(b, "capped", [b"b%d" % i for i in range(3)])
    if overflow == "drop-head":
        # b drops the head rows once its reservation of them arrives, which can be after b's confirms (storage/pg/SCHEMA.md,
        # max-length): a drain on a before then could take them first. The queue comes down to its limit.
        assert wait_count(a, "capped", LIMIT)

    conn, ch = channel(a)
    got = drain(conn, ch, "capped", 20, timeout=5)
    conn.close()
    if overflow == "reject-publish":
        assert from_b == [False] * 3
        assert sorted(got) == [b"a%d" % i for i in range(LIMIT)]
    else:
        assert from_b == [True] * 3
        assert sorted(got) == sorted([b"a3", b"a4", b"b0", b"b1", b"b2"]), got
