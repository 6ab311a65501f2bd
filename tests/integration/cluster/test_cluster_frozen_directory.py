"""Nothing on a member's event loop waits for the directory of node-local queues (issue 34, "one concurrency
model"): PostgreSQL frozen (SIGSTOP: sessions stay open, nothing answers) for 8 s while one client declares a new
classic queue on member a (a claim of its name in the directory, storage/pg/forwarding.py), another passively
declares a name a does not know and a third publishes to one (look-ups in the directory). A client of a classic queue on a, which never needs
PostgreSQL, must keep every round trip (a publish and its confirm) under 500 ms meanwhile.

The declare of the classic queue is answered when the claim is (the channel holds its reply and later frames,
broker/amqp/channel.py): declare-ok once PostgreSQL answers, or, when the directory gives up on it (its timeout,
3 s), declare-ok for the queue made here without its row, as before (the row is written when PostgreSQL is
back). The passive declare of a name nobody holds is 404 either way, and the mandatory publish to one is returned. Before the directory calls were deferred,
the member's loop waited up to 3 s for each of them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import asyncpg
import pika
import pika.exceptions
import pytest

from tests.integration.cluster.test_cluster_definitions import member
from tests.integration.cluster.test_cluster_frozen_pg import (
    FREEZE,
    MAX_ROUND_TRIP,
    round_trip,
    round_trips_while_frozen,
)
from tests.integration.management.test_management_api import Http

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # own_postgres: a server of the test's own, which it freezes


def _answered(answer: dict[str, object], act: Callable[[], object]) -> Callable[[], None]:
    """A client's call, run in a thread: ``answer`` gets "ok" or the reply code that closed the channel, and
    how long it took."""

    def run() -> None:
        start = time.monotonic()
        try:
            act()
            answer["reply"] = "ok"
        except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as exc:
            answer["reply"] = exc.reply_code
        answer["after"] = time.monotonic() - start

    return run


# A latency bound (500 ms against a stall of seconds): measured in the serial pass, where a loaded CI machine's
# parallel pass cannot be what made a round trip slow.
@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(120)
def test_a_frozen_postgresql_does_not_stall_the_member_on_a_classic_declare(start_broker, own_postgres):
    a = member(start_broker, own_postgres.dsn(), "a@test")

    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    ch.queue_declare("local-q", arguments={"x-queue-type": "classic"})
    ch.confirm_delivery()
    declarer = pika.BlockingConnection(a.pika_params())
    dch = declarer.channel()
    asker = pika.BlockingConnection(a.pika_params())
    ach = asker.channel()
    publisher = pika.BlockingConnection(a.pika_params())
    pch = publisher.channel()
    pch.confirm_delivery()

    declared: dict[str, object] = {}
    looked_up: dict[str, object] = {}
    declare = _answered(declared, lambda: dch.queue_declare("frozen-classic", durable=True,
                                                            arguments={"x-queue-type": "classic"}))
    look_up = _answered(looked_up, lambda: ach.queue_declare("nobody-has-this-q", passive=True))
    published: dict[str, object] = {}

    def publish() -> None:
        start = time.monotonic()
        try:
            pch.basic_publish("", "nobody-has-this-q-either", b"z", mandatory=True)
            published["reply"] = "confirmed"
        except pika.exceptions.UnroutableError:
            published["reply"] = "returned"
        published["after"] = time.monotonic() - start

    threads = [threading.Thread(target=f, daemon=True) for f in (declare, look_up, publish)]
    worst, n = round_trips_while_frozen(ch, own_postgres, lambda: [t.start() for t in threads])
    for t in threads:
        t.join(30)
    print(f"{n} round trips while PostgreSQL was frozen for {FREEZE:g} s: worst {worst * 1000:.0f} ms; the classic "
          f"declare answered {declared.get('reply')} after {declared.get('after', 0):.1f} s, the passive declare "
          f"{looked_up.get('reply')} after {looked_up.get('after', 0):.1f} s, the publish to a name nobody holds "
          f"{published.get('reply')} after {published.get('after', 0):.1f} s")
    assert worst < MAX_ROUND_TRIP, f"a classic queue's round trip took {worst * 1000:.0f} ms while PostgreSQL was " \
                                   "frozen: the member's event loop waited for the directory"
    # The directory gives up after its timeout and the queue is made here (its row written once PostgreSQL is
    # back), as when the directory is out of reach: declare-ok. A name nobody holds: 404.
    assert declared.get("reply") == "ok", declared
    assert looked_up.get("reply") == 404, looked_up
    assert published.get("reply") == "returned", published  # mandatory, unroutable: basic.return, then the ack
    # The member serves on: the classic queue, and the one declared during the freeze.
    assert round_trip(ch) < MAX_ROUND_TRIP
    dch.basic_publish("", "frozen-classic", b"y")
    deadline = time.monotonic() + 10
    while dch.queue_declare("frozen-classic", passive=True).method.message_count != 1:
        assert time.monotonic() < deadline, "the message published to the queue declared during the freeze is not there"
        time.sleep(0.05)
    for c in (conn, declarer, asker, publisher):
        if c.is_open:
            c.close()


def _directory_rows(dsn: str, name: str) -> list[str]:
    """The members that hold ``name`` in the directory of node-local queues (storage/pg/forwarding.py)."""

    async def read() -> list[str]:
        conn = await asyncpg.connect(dsn)
        try:
            return [r[0] for r in await conn.fetch("SELECT node FROM leveret.local_queue WHERE name = $1", name)]
        finally:
            await conn.close()

    return asyncio.run(read())


# The client that goes away mid-claim: a process of its own, killed while its declare waits for the claim.
_DECLARER = """
import sys, pika
conn = pika.BlockingConnection(pika.ConnectionParameters(host=sys.argv[1], port=int(sys.argv[2])))
ch = conn.channel()
print("connected", flush=True)
sys.stdin.readline()  # go
ch.queue_declare(sys.argv[3], durable=True)
print("declared", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_claim_whose_client_went_away_mid_claim_is_released(start_broker, own_postgres):
    """A classic queue's declare claims its name in the directory before declare-ok (the claim waits for
    PostgreSQL, frozen here). The client is killed meanwhile, its connection and channel closed before the claim
    is answered: once it is, the name is released (broker/topology.py ``Answers.settle``), not left held by a
    member that has no such queue (its messages forwarded there would be dropped, and a declare on another member
    would answer a queue that does not exist). The freeze is shorter than the directory's timeout (3 s), so the
    claim is answered "yours" after the thaw."""
    a = member(start_broker, own_postgres.dsn(), "a@test")
    b = member(start_broker, own_postgres.dsn(), "b@test")
    name = "claimed-by-a-gone-client"
    declarer = subprocess.Popen([sys.executable, "-c", _DECLARER, "127.0.0.1", str(a.port), name],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert declarer.stdout is not None and declarer.stdout.readline().strip() == "connected"
        own_postgres.freeze()
        try:
            assert declarer.stdin is not None
            declarer.stdin.write("go\n")
            declarer.stdin.flush()
            time.sleep(0.5)  # the declare is sent, its claim waits for PostgreSQL
            declarer.kill()
            declarer.wait(10)
            time.sleep(0.5)  # a sees the connection closed while the claim is still on its way
        finally:
            own_postgres.thaw()
    finally:
        if declarer.poll() is None:
            declarer.kill()
    assert declarer.returncode != 0, "the declare was answered while PostgreSQL was frozen"
    deadline = time.monotonic() + 5
    while _directory_rows(own_postgres.dsn(), name):
        assert time.monotonic() < deadline, "the claim of a declare whose client went away is still held"
        time.sleep(0.05)
    http = Http(a.management_port)
    assert http("GET", f"/api/queues/%2F/{name}")[0] == 404  # (no queue on a: the declare was never made)
    # The name is free: b's declare makes b's own queue.
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    assert _directory_rows(own_postgres.dsn(), name) == ["b@test"]
