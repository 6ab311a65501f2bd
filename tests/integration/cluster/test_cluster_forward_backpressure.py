"""A member that falls behind on the messages forwarded to its queues holds their publishers back (issue 15):
the forward table in PostgreSQL does not grow without bound.

Member ``a`` owns a classic queue; ``a`` is stopped with SIGSTOP (it stays a live member: its lease is long).
A raw-socket publisher in confirm mode on ``b`` writes ``TOTAL`` small publishes to that queue in one go
(``b`` forwards them through PostgreSQL and confirms each once its INSERT commits). Without the owner's lag
counted, ``b`` confirms all of them while ``a`` takes none. With it, ``b`` stops reading the publisher once
``a`` is OWNER_LAG_HIGH behind (its rows not committed yet counted with it): the confirms stop near the mark,
short of ``TOTAL``, and stay there. After SIGCONT, ``a`` takes the backlog, ``b`` lets the publisher go on, every
publish is confirmed and the queue on ``a`` holds all of them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pika
import pytest
from pamqp import commands
from rawamqp import FrameTimeout, RawAMQPClient, body_frame, content_header_frame, method_frame

from tests.integration.cluster.test_cluster_definitions import member
from tests.integration.cluster.test_cluster_forwarding import known_on
from tests.integration.management.test_management_api import wait_for

pytestmark = [pytest.mark.leveret_only, pytest.mark.slow]
pytest_plugins = ["pg_fixtures"]

TOTAL = 40_000  # twice broker/clustering/cluster_forwarding.py's OWNER_LAG_HIGH (20,000)
STALL_CAP = 22_000  # confirms while the owner is stopped: the mark (uncommitted rows count), plus one read
# of the publisher's socket (20,035 measured; 34,371 when only committed rows counted)
LONG_LEASE = ("--set", "cluster.postgres.lease_seconds=120")


def confirmed_count(client: RawAMQPClient, until: float, have: int) -> int:
    """Read basic.ack frames until ``until`` (monotonic); the highest delivery tag acknowledged."""
    while time.monotonic() < until:
        try:
            frame = client.recv_frame(timeout=max(0.05, until - time.monotonic()))
        except FrameTimeout:
            break
        if frame.is_method(commands.Basic.Ack):
            have = max(have, frame.value.delivery_tag)
        elif frame.is_method(commands.Basic.Nack):
            raise AssertionError(f"publish {frame.value.delivery_tag} nacked")
    return have


def test_publishers_wait_for_a_member_that_lags_on_its_forwarded_messages(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test", *LONG_LEASE)
    b = member(start_broker, pg_dsn, "b@test", *LONG_LEASE)
    conn = pika.BlockingConnection(a.pika_params())
    conn.channel().queue_declare("lagging-owner")
    conn.close()
    assert known_on(b, "lagging-owner")

    os.kill(a.pid, signal.SIGSTOP)
    try:
        with RawAMQPClient.for_broker(b, timeout=30) as client:
            client.handshake(heartbeat=0)
            client.open_channel(1)
            client.send_method(1, commands.Confirm.Select())
            client.expect_method(commands.Confirm.SelectOk)
            one = (method_frame(1, commands.Basic.Publish(exchange="", routing_key="lagging-owner"))
                   + content_header_frame(1, 16) + body_frame(1, b"m" * 16))
            writer = threading.Thread(target=client.send_raw, args=(one * TOTAL,), daemon=True)
            writer.start()

            # Confirms come while a is within the mark, then stop: read until they have not moved for 3 s.
            confirmed, deadline = 0, time.monotonic() + 40
            while time.monotonic() < deadline:
                before = confirmed
                confirmed = confirmed_count(client, time.monotonic() + 3, confirmed)
                if confirmed == before and confirmed > 0:
                    break
            assert 0 < confirmed < TOTAL, f"{confirmed} of {TOTAL} confirmed while the owner took none"
            assert confirmed <= STALL_CAP, f"{confirmed} confirmed: the publisher was not held at the mark"

            os.kill(a.pid, signal.SIGCONT)
            deadline = time.monotonic() + 60
            while confirmed < TOTAL and time.monotonic() < deadline:
                confirmed = confirmed_count(client, time.monotonic() + 1, confirmed)
            assert confirmed == TOTAL, f"{confirmed} of {TOTAL} confirmed after the owner came back"
            writer.join(10)
            assert not writer.is_alive()
    finally:
        os.kill(a.pid, signal.SIGCONT)

    def held() -> bool:
        c = pika.BlockingConnection(a.pika_params())
        try:
            return c.channel().queue_declare("lagging-owner", passive=True).method.message_count == TOTAL
        finally:
            c.close()

    assert wait_for(held, 30), "the owner's queue does not hold every confirmed message"
