"""The connection's timers on the node's clock (broker/amqp/reader.py): handshake timeout, heartbeats (sent
when the server is silent, the socket closed after two missed ones) and the close-ok timeout, driven by a
ManualClock with no sleep. The reader gets its frames as bytes, as from a socket, and writes to a stand-in
transport."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from pamqp import commands as spec

from broker.amqp.reader import CLOSE_OK_TIMEOUT, Reader
from broker.clock import ManualClock
from broker.security.auth import User
from protocol.constants import PROTOCOL_HEADER
from protocol.frames import HEARTBEAT_FRAME
from protocol.methods import method_frame


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 5555 if name == "peername" else 5672)

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Users:
    def authenticate(self, mechanism, response, peer_host, loopback_users):
        return User("guest", "")


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def connect(clock: ManualClock, handshake_timeout: float = 100.0) -> tuple[Reader, Transport]:
    settings = SimpleNamespace(handshake_timeout=handshake_timeout, heartbeat=60, frame_max=131072,
                               channel_max=2047, loopback_users={"guest"}, max_message_size=1 << 20,
                               auth_mechanisms=["AMQPLAIN", "PLAIN"], ssl_cert_login_from="distinguished_name")
    node = SimpleNamespace(settings=settings, clock=clock, connections=set(), counters=SimpleNamespace(
        auth_attempts=0, auth_attempts_failed=0, auth_attempts_succeeded=0, connections_closed=0),
        alarm_state=SimpleNamespace(blocked=set(), active=False), users=Users(), cluster_name="leveret@test")
    reader = Reader(node)  # type: ignore[arg-type]
    transport = Transport()
    reader.connection_made(transport)  # type: ignore[arg-type]
    return reader, transport


def tuned(reader: Reader, loop: asyncio.AbstractEventLoop, heartbeat: int) -> None:
    """Through the handshake up to tune-ok (heartbeats start there)."""
    reader.data_received(PROTOCOL_HEADER)
    reader.data_received(method_frame(0, spec.Connection.StartOk, client_properties={}, mechanism="PLAIN",
                                      response="\x00guest\x00guest", locale="en_US"))
    reader.data_received(method_frame(0, spec.Connection.TuneOk, channel_max=2047, frame_max=131072,
                                      heartbeat=heartbeat))
    assert reader.state == Reader.OPENING
    ticked(loop)


def ticked(loop: asyncio.AbstractEventLoop) -> None:
    """Let the reader's end-of-tick flush (call_soon) run."""
    loop.run_until_complete(asyncio.sleep(0))


def test_connected_at_is_read_from_the_clock(loop, clock):
    reader, _ = connect(clock)
    assert reader.connected_at == clock.now_ms() / 1000.0


def test_a_silent_client_loses_its_socket_at_the_handshake_timeout(loop, clock):
    reader, transport = connect(clock, handshake_timeout=10.0)
    reader.data_received(PROTOCOL_HEADER)
    clock.advance(9.99)
    assert not transport.closed
    clock.advance(0.01)
    assert transport.closed


def test_heartbeats_are_sent_while_the_server_is_silent(loop, clock):
    reader, transport = connect(clock)
    tuned(reader, loop, heartbeat=4)
    transport.written.clear()
    for _ in range(8):
        clock.advance(2.0)  # one half interval
        reader.data_received(HEARTBEAT_FRAME)  # the client is alive
        ticked(loop)
    # A half interval in which the server wrote nothing (a heartbeat included) sends one: one per interval.
    assert transport.written == [HEARTBEAT_FRAME] * 4
    assert not transport.closed


def test_two_missed_heartbeats_close_the_socket(loop, clock):
    reader, transport = connect(clock)
    tuned(reader, loop, heartbeat=2)
    clock.advance(1.0)  # the first half interval saw the tune-ok
    clock.advance(3.99)  # three silent halves
    assert not transport.closed
    clock.advance(0.01)  # the fourth: two heartbeats missed
    assert transport.closed


def test_the_socket_closes_if_close_ok_does_not_come(loop, clock):
    reader, transport = connect(clock)
    reader.data_received(PROTOCOL_HEADER)
    reader.close_connection(320, "going away")
    clock.advance(CLOSE_OK_TIMEOUT - 0.01)
    assert not transport.closed
    clock.advance(0.01)
    assert transport.closed
