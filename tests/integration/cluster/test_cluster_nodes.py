"""Broker processes against the cluster's database as operators meet it (issue 15): three members serving one
quorum queue, a member started against a database another (older) Leveret left at schema version 1, and one
started against a database of a newer Leveret. Real broker processes, a real PostgreSQL, pika clients."""

from __future__ import annotations

import asyncio
import threading

import asyncpg
import pika
import pytest
from pamqp import commands as spec

from broker.message import Message
from broker.queues.message_codec import encode_message
from protocol.fastcodec import build_content_header, shortstr
from storage.pg.schema import MIGRATIONS, current_version, latest_version, migrate
from tests.integration.cluster.test_cluster_definitions import member, passive_exists
from tests.integration.cluster.test_cluster_quorum import PERSISTENT, QUORUM, consume
from tests.integration.management.test_management_api import wait_for

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
    assert all(wait_for(lambda n=n: passive_exists(n, "queue", queue), 30) for n in nodes)
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
    assert wait_for(lambda: passive_exists(b, "queue", queue), 30)
    publish_confirmed(a, queue, [b"one", b"two"])
    assert [body for body, _ in consume(b, queue, 2)] == [b"one", b"two"]


def test_messages_a_version_1_cluster_left_are_served_after_the_migration(start_broker, pg_dsn, uid):
    """A quorum queue's messages stored under schema version 1 (its table of messages is unchanged since) are
    delivered, in order and with their properties, by a member of this release once an application declares
    the queue again (version 1 kept definitions in each node's own files, so the new member learns of the queue
    from the declare, and finds its rows by vhost and name)."""
    queue = f"{uid}-old"
    bodies = [b"left-%d" % i for i in range(3)]

    async def leave_messages(conn) -> None:
        await migrate(conn, MIGRATIONS[:1])
        qid = await conn.fetchval("INSERT INTO leveret.queue (vhost, name) VALUES ('/', $1) RETURNING queue_id",
                                  queue)
        for i, body in enumerate(bodies):
            props = spec.Basic.Properties(delivery_mode=2, message_id=f"m{i}").marshal()
            msg = Message("", queue, shortstr("") + shortstr(queue), build_content_header(len(body), props), body)
            await conn.execute("INSERT INTO leveret.message (seq, queue_id, state, persistent, size, body) "
                               "VALUES ($1, $2, 0, true, $3, $4)", 1000 + i, qid, len(body), encode_message(msg))

    sql(pg_dsn, leave_messages)
    a = member(start_broker, pg_dsn, "a")
    assert sql(pg_dsn, current_version) == latest_version()
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    assert ch.queue_declare(queue, durable=True, arguments=QUORUM).method.message_count == 3
    got = []
    for _ in bodies:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None, got
        got.append((body, props.message_id, props.delivery_mode))
    conn.close()
    assert got == [(body, f"m{i}", 2) for i, body in enumerate(bodies)]


def test_a_member_refuses_a_database_of_a_newer_leveret(start_broker, pg_dsn):
    """A database past this Leveret's latest schema version: the node does not start, and says why."""
    newer = latest_version() + 1
    sql(pg_dsn, lambda conn: migrate(conn, [*MIGRATIONS, (newer, "SELECT 1")]))
    with pytest.raises(RuntimeError) as exc:
        member(start_broker, pg_dsn, "a")
    text = str(exc.value)
    assert f"version {newer}" in text and "newer" in text
    assert sql(pg_dsn, current_version) == newer  # nothing was changed
