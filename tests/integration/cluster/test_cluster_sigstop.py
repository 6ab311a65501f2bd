"""A hung cluster member (issue 15: "SIGSTOP of a node"): its process stops without closing anything, so its
sessions to PostgreSQL stay open and hold its epoch's advisory key; only its lease (renewed every third of
``cluster.postgres.lease_seconds``) stops being renewed. The other member must notice the lapse, end the hung
node's sessions, requeue what it held (redelivered) and deliver it to its own consumer; the hung node, once
continued, must find itself fenced, come back under a new epoch without touching what the other member now
holds (the acks its old consumer sends match nothing), and serve the queue again. Nothing confirmed is lost.
Real broker processes, a real PostgreSQL (tests/pg_server.py), pika clients; a 3 s lease keeps it short
(storage/pg/SCHEMA.md, "A hung node")."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import asyncpg
import pika
import pika.exceptions
import pytest

from tests.integration.cluster.test_cluster_definitions import member
from tests.integration.cluster.test_cluster_quorum import PERSISTENT, declare, queue_messages
from tests.integration.management.test_management_api import wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL

LEASE = 3  # cluster.postgres.lease_seconds for both members (the default is 15)
MARGIN = 7.0  # past the lease: a reaper round to end the hung node's sessions, one to reap, delivery, a loaded CI
N = 200  # confirmed messages the hung node holds unacknowledged


def sql(dsn: str, query: str, *args: Any) -> Any:
    """One value from the cluster's database (a session of the test's own)."""
    async def run() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()
    return asyncio.run(run())


def pump(conn: pika.BlockingConnection, until: Callable[[], bool], timeout: float) -> bool:
    """Process ``conn``'s events until ``until()`` holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            return False
        conn.process_data_events(time_limit=0.02)
    return True


def log_match(b, pattern: str) -> re.Match[str] | None:
    return re.search(pattern, b.log_text())


def reserved_by(dsn: str, epoch: int) -> int:
    return int(sql(dsn, "SELECT count(*) FROM leveret.message WHERE state = 1 AND owner = $1", epoch))


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_hung_member_is_fenced_and_its_deliveries_go_to_the_other(start_broker, pg_dsn):
    lease = ("--set", f"cluster.postgres.lease_seconds={LEASE}")
    a = member(start_broker, pg_dsn, "a@test", *lease)
    b = member(start_broker, pg_dsn, "b@test", *lease)
    epoch_a, epoch_b = (int(sql(pg_dsn, "SELECT max(epoch) FROM leveret.node WHERE name = $1", name))
                        for name in ("a@test", "b@test"))
    declare(a, "hung")
    assert wait_for(lambda: queue_messages(b, "hung") is not None, 30)

    # N persistent messages, each confirmed (in PostgreSQL), published through a.
    confirmed: set[bytes] = set()
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", "hung", b"m%d" % i, PERSISTENT)
        confirmed.add(b"m%d" % i)
    conn.close()

    # A consumer on a takes them all and holds them unacknowledged.
    held: dict[bytes, int] = {}  # body -> a's delivery tag
    conn_a = pika.BlockingConnection(a.pika_params())
    ch_a = conn_a.channel()
    ch_a.basic_qos(prefetch_count=N)
    ch_a.basic_consume("hung", lambda _ch, m, _p, body: held.__setitem__(body, m.delivery_tag))
    assert pump(conn_a, lambda: len(held) == N, 15), f"the consumer on a got {len(held)} of {N}"
    assert set(held) == confirmed
    assert reserved_by(pg_dsn, epoch_a) == N

    # A consumer on b waits; it gets nothing while a holds everything.
    got_b: list[tuple[bytes, bool, int]] = []  # body, redelivered, b's delivery tag
    conn_b = pika.BlockingConnection(b.pika_params())
    ch_b = conn_b.channel()
    ch_b.basic_qos(prefetch_count=N)
    ch_b.basic_consume("hung", lambda _ch, m, _p, body: got_b.append((body, m.redelivered, m.delivery_tag)))
    conn_b.process_data_events(time_limit=0.2)
    assert got_b == []

    # a hangs: connected to PostgreSQL, holding its key, but its heartbeat stops.
    stopped = time.monotonic()
    os.kill(a.pid, signal.SIGSTOP)
    try:
        ok = pump(conn_b, lambda: len({body for body, _, _ in got_b}) == N, LEASE + MARGIN)
        took = time.monotonic() - stopped
        print(f"\nlease {LEASE} s: b received the {len({x[0] for x in got_b})} messages a held "
              f"{took:.2f} s after SIGSTOP")
        assert ok, f"b received {len(got_b)} of {N} within {LEASE + MARGIN:g} s of a's SIGSTOP"
        # Not a delivery by some other path: the lease had to lapse first (its last renewal was at most a third
        # of a lease and a reaper tick before the SIGSTOP).
        assert took >= LEASE / 3, took
        assert {body for body, _, _ in got_b} == set(held) and len(got_b) == N
        assert all(redelivered for _, redelivered, _ in got_b), "a message a held came back not redelivered"
        # By the lease: b ended a's sessions because its lease had lapsed, then reaped its epoch.
        assert log_match(b, rf"node epoch {epoch_a} is past its lease: terminating its sessions")
        assert log_match(b, rf"reaped node epoch {epoch_a}, requeued {N} rows")
        assert sql(pg_dsn, "SELECT dead_at IS NOT NULL FROM leveret.node WHERE epoch = $1", epoch_a)
        assert reserved_by(pg_dsn, epoch_b) == N and reserved_by(pg_dsn, epoch_a) == 0
        assert a.process.poll() is None
    finally:
        os.kill(a.pid, signal.SIGCONT)  # also on a failure: the fixture's SIGKILL at teardown works either way

    # a notices it was fenced and reconnects under a new epoch.
    fenced = wait_for(lambda: log_match(a, rf"node a@test \(epoch {epoch_a}\) fenced: (.*)"), 15)
    assert fenced, a.log_text()[-3000:]
    back = wait_for(lambda: log_match(a, rf"node a@test reconnected with epoch (\d+) \(was {epoch_a}\)"), 15)
    assert back, a.log_text()[-3000:]
    new_epoch_a = int(back.group(1))
    assert new_epoch_a > max(epoch_a, epoch_b)
    print(f"a fenced ({fenced.group(1)}), reconnected with epoch {new_epoch_a} (was {epoch_a})")

    # The acks a's old consumer sends for its old deliveries (if its connection survived) delete nothing that
    # b holds: they were made under the old epoch.
    old_consumer = "survived"
    try:
        conn_a.process_data_events(time_limit=0.1)
        for tag in sorted(held.values()):
            ch_a.basic_ack(tag)
        ch_a.basic_qos(prefetch_count=N)  # a round trip: a has read the acks before it answers
        conn_a.close()
    except (pika.exceptions.AMQPError, OSError) as exc:
        old_consumer = f"closed ({exc!r})"
    print(f"a's old consumer connection: {old_consumer}")
    assert reserved_by(pg_dsn, epoch_b) == N, "an ack made on a under its old epoch took a row b holds"

    # b hands them back (requeue): had anything been deleted, the drain below would miss it.
    ch_b.basic_nack(delivery_tag=max(tag for _, _, tag in got_b), multiple=True, requeue=True)
    ch_b.close()
    conn_b.close()

    # a serves the queue again: a publish through it is confirmed (it may be nacked until a is back in
    # full; a confirming publisher publishes again), and a consumer on it gets everything.
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    nacked = 0

    def published() -> bool:
        nonlocal nacked
        try:
            ch.basic_publish("", "hung", b"after", PERSISTENT)
            return True
        except pika.exceptions.NackError:
            nacked += 1
            return False

    assert wait_for(published, 30), "a publish through a still nacked 30 s after it reconnected"
    confirmed.add(b"after")
    ch.basic_qos(prefetch_count=500)
    drained: Counter[bytes] = Counter()
    redelivered = 0
    deadline = time.monotonic() + 20
    for method, _props, body in ch.consume("hung", inactivity_timeout=0.5):
        if method is None:
            if confirmed <= set(drained) or time.monotonic() > deadline:
                break
            continue
        drained[body] += 1
        redelivered += method.redelivered
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.close()
    lost = sorted(confirmed - set(drained))
    duplicates = sum(drained.values()) - len(drained)
    print(f"drained through a: {sum(drained.values())} deliveries of {len(drained)} bodies "
          f"({redelivered} redelivered, {duplicates} duplicates); the publish through a was nacked {nacked} times")
    assert lost == [], f"{len(lost)} confirmed messages lost, e.g. {lost[:10]}"
    assert drained[b"after"] >= 1
    assert a.process.poll() is None and b.process.poll() is None, "a broker process died"
