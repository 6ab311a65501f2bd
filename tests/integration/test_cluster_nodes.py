"""Broker processes against the cluster's database as operators meet it (issue 15): three members serving one
quorum queue, a member started against a database another (older) Leveret left at schema version 1, and one
started against a database of a newer Leveret. Real broker processes, a real PostgreSQL, pika clients."""

from __future__ import annotations

import asyncio
import threading

import asyncpg
import pika
import pytest
from test_cluster_definitions import member, passive_exists
from test_cluster_quorum import PERSISTENT, QUORUM, consume
from test_management_api import wait_for

from storage.pg.schema import MIGRATIONS, current_version, latest_version, migrate

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL


def sql(dsn: str, coro_of_conn) -> object:
    async def run():
        conn = await asyncpg.connect(dsn)
        try:
            return await coro_of_conn(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


def publish_confirmed(b, queue: str, bodies: list[bytes]) -> None:
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)
    conn.close()


def test_three_members_share_one_quorum_queue(start_broker, pg_dsn, uid):
    """Publishers on two members, consumers on all three: every message consumed once, none twice."""
    nodes = [member(start_broker, pg_dsn, name) for name in ("a", "b", "c")]
    queue = f"{uid}-q"
    conn = pika.BlockingConnection(nodes[0].pika_params())
    conn.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    conn.close()
    assert all(wait_for(lambda n=n: passive_exists(n, "queue", queue), 5) for n in nodes)
    per_publisher = 300
    sent = {f"a-{i}".encode() for i in range(per_publisher)} | {f"b-{i}".encode() for i in range(per_publisher)}
    got: list[list[tuple[bytes, bool]]] = [[] for _ in nodes]

    def consume_on(i: int) -> None:
        got[i] = consume(nodes[i], queue, len(sent), timeout=4.0)

    consumers = [threading.Thread(target=consume_on, args=(i,)) for i in range(3)]
    for t in consumers:
        t.start()
    publish_confirmed(nodes[0], queue, [f"a-{i}".encode() for i in range(per_publisher)])
    publish_confirmed(nodes[1], queue, [f"b-{i}".encode() for i in range(per_publisher)])
    for t in consumers:
        t.join(60)
    bodies = [body for each in got for body, _redelivered in each]
    assert sorted(bodies) == sorted(sent), f"per node {[len(g) for g in got]}"
    assert sum(1 for g in got if g) >= 2, "the messages were not shared out between the members"


def test_a_member_migrates_a_database_left_at_schema_version_1(start_broker, pg_dsn, uid):
    """An older Leveret made the database (version 1 only); this one brings it to its latest version on start
    and serves quorum queues and shared definitions from it."""
    sql(pg_dsn, lambda conn: migrate(conn, MIGRATIONS[:1]))
    assert sql(pg_dsn, current_version) == 1
    a = member(start_broker, pg_dsn, "a")
    assert sql(pg_dsn, current_version) == latest_version()
    b = member(start_broker, pg_dsn, "b")
    queue = f"{uid}-q"
    conn = pika.BlockingConnection(a.pika_params())
    conn.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    conn.close()
    assert wait_for(lambda: passive_exists(b, "queue", queue), 5)
    publish_confirmed(a, queue, [b"one", b"two"])
    assert [body for body, _ in consume(b, queue, 2)] == [b"one", b"two"]


def test_a_member_refuses_a_database_of_a_newer_leveret(start_broker, pg_dsn):
    """A database past this Leveret's latest schema version: the node does not start, and says why."""
    newer = latest_version() + 1
    sql(pg_dsn, lambda conn: migrate(conn, [*MIGRATIONS, (newer, "SELECT 1")]))
    with pytest.raises(RuntimeError) as exc:
        member(start_broker, pg_dsn, "a")
    text = str(exc.value)
    assert f"version {newer}" in text and "newer" in text
    assert sql(pg_dsn, current_version) == newer  # nothing was changed
