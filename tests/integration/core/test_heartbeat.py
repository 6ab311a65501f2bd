"""Heartbeats: negotiation in tune/tune-ok, frames sent by the broker, and the dead-peer timeout.

Measured on RabbitMQ 3.10.8 with the heartbeat the client puts in tune-ok (the server proposes 60):
heartbeat frames arrive every heartbeat/2 seconds (0.5 s for 1 s), and a client that sends nothing at all is
disconnected after about 3 heartbeat intervals (3.0 s for 1 s, 6.0 s for 2 s) by closing the socket, without a
connection.close. Any frame from the client counts as activity, not only heartbeat frames. With tune-ok
heartbeat 0 the broker sends no heartbeats and never times the client out. RabbitMQ skips its heartbeat when it
sent other frames during the interval, so no test demands heartbeats while the broker is busy talking.

The "0 from one side does not disable heartbeats unless both are 0" rule is how
RabbitMQ's own clients choose the value they put in tune-ok; the broker only proposes its value in tune and
then applies whatever tune-ok says, which is what these tests check.
"""

from __future__ import annotations

import itertools
import time

import pytest
from rawamqp import (  # tests/ is on sys.path (rootdir conftest)
    FRAME_HEARTBEAT,
    ConnectionClosedError,
    FrameTimeout,
    RawAMQPClient,
    commands,
)

pytestmark = pytest.mark.timeout(60)




def watch(c: RawAMQPClient, duration: float, *, send_every: float | None = None,
          send=None) -> tuple[list[float], float | None, list]:
    """Read frames for duration seconds, optionally sending something every send_every seconds.

    Returns (times of heartbeats received, time the socket closed or None, other frames received), times
    measured from the call.
    """
    t0 = time.monotonic()
    end = t0 + duration
    next_send = t0 if send_every else None
    heartbeats: list[float] = []
    others: list = []
    while True:
        now = time.monotonic()
        if now >= end:
            return heartbeats, None, others
        if next_send is not None and now >= next_send:
            try:
                (send or c.send_heartbeat)()
            except ConnectionClosedError:
                return heartbeats, now - t0, others
            next_send += send_every
        wake = end if next_send is None else min(end, next_send)
        try:
            f = c.recv_frame(max(0.005, wake - time.monotonic()))
        except FrameTimeout:
            continue
        except ConnectionClosedError:
            return heartbeats, time.monotonic() - t0, others
        if f.type == FRAME_HEARTBEAT:
            assert f.channel == 0 and f.payload == b""
            heartbeats.append(time.monotonic() - t0)
        else:
            others.append(f)


def assert_alive(c: RawAMQPClient, channel: int = 1) -> None:
    c.open_channel(channel)
    c.send_method(channel, commands.Queue.Declare(queue="", exclusive=True))
    c.expect_method(commands.Queue.DeclareOk, channel)


# -- negotiation ----------------------------------------------------------------------------------------

def test_tune_proposes_server_defaults(raw):
    c = raw()
    tune = c.handshake(heartbeat=0)
    assert tune.heartbeat == 60
    assert tune.frame_max == 131072
    assert tune.channel_max == 2047
    c.close_connection()


def test_tune_ok_zero_disables_heartbeats(raw):
    # the server proposed 60; the client's tune-ok says 0: no heartbeats, and silence is not punished
    c = raw()
    c.handshake(heartbeat=0)
    heartbeats, closed, others = watch(c, 2.5)
    assert heartbeats == []
    assert closed is None
    assert others == []
    assert_alive(c)
    c.close_connection()


def test_broker_honours_client_tune_ok_value(raw):
    # the server proposed 60, the client answers 2: heartbeats every ~1 s, a silent client dropped within
    # a few intervals (RabbitMQ 3.10: after 6.0 s)
    c = raw()
    tune = c.handshake(heartbeat=2)
    assert tune.heartbeat == 60
    heartbeats, closed, others = watch(c, 12)
    assert closed is not None, "broker never dropped a client silent for 12 s with heartbeat=2"
    assert 3.0 <= closed <= 10.0, closed
    assert heartbeats and heartbeats[0] <= 2.2, heartbeats
    gaps = [b - a for a, b in itertools.pairwise(heartbeats)]
    assert all(g <= 2.2 for g in gaps), heartbeats
    assert all(f.is_method(commands.Connection.Close) for f in others), others


# -- timeout of a silent client -------------------------------------------------------------------------

def test_silent_client_is_disconnected(raw):
    c = raw()
    c.handshake(heartbeat=1)
    heartbeats, closed, others = watch(c, 8)
    assert closed is not None, "broker kept a silent heartbeat=1 client for 8 s"
    # RabbitMQ 3.10 closes the socket at 3.0 s; never before one full missed interval plus slack
    assert 1.5 <= closed <= 6.0, closed
    # only heartbeats arrive meanwhile (a broker may say goodbye with connection.close before dropping)
    assert all(f.is_method(commands.Connection.Close) for f in others), others
    assert len(heartbeats) >= 1


def test_client_sending_heartbeats_stays_connected(raw):
    c = raw()
    c.handshake(heartbeat=1)
    _heartbeats, closed, others = watch(c, 4, send_every=0.5)
    assert closed is None, f"dropped after {closed:.2f}s despite heartbeats"
    assert others == []
    assert_alive(c)
    c.close_connection()


def test_any_traffic_counts_as_activity(raw):
    # a client that never sends a heartbeat frame but keeps sending methods is alive
    c = raw()
    c.handshake(heartbeat=1)
    c.open_channel(1)

    def qos() -> None:
        c.send_method(1, commands.Basic.Qos(prefetch_count=10))

    _heartbeats, closed, others = watch(c, 4, send_every=0.5, send=qos)
    assert closed is None, f"dropped after {closed:.2f}s despite traffic"
    assert others and all(f.is_method(commands.Basic.QosOk, 1) for f in others)
    assert_alive(c, 2)
    c.close_connection()


# -- heartbeats sent by the broker ------------------------------------------------------------------------

def test_broker_sends_heartbeats(raw):
    c = raw()
    c.handshake(heartbeat=1)
    heartbeats, closed, _ = watch(c, 3, send_every=0.5)
    assert closed is None
    assert len(heartbeats) >= 2, heartbeats  # RabbitMQ 3.10: one every 0.5 s
    gaps = [b - a for a, b in itertools.pairwise(heartbeats)]
    assert all(g <= 1.2 for g in gaps), heartbeats
    c.close_connection()

