"""Helpers shared by the pika-based integration tests: connection and queue fixtures, I/O loops with
deadlines, publishing, counting and fetching messages, and checking channel / connection errors.

Import what a test module needs (``from amqp_helpers import ...``; tests/integration is on sys.path). The
fixtures must be imported by name into the test module for pytest to find them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pika
import pika.compat
import pika.exceptions
import pytest
from pika import spec
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

SETTLE = 0.3  # seconds to wait to be reasonably sure that nothing more arrives

Message = tuple[spec.Basic.GetOk, pika.BasicProperties, bytes]


# -- fixtures ---------------------------------------------------------------------------------------------


def member_params(broker, i: int, **kw) -> pika.ConnectionParameters:
    """The connection parameters of the ``i``-th connection of a test: against a cluster
    (``LEVERET_TEST_CLUSTER``, conftest.py's ClusterBroker) its members in turn from the first, so a test's
    first and second connections are on different members; else the broker's."""
    nodes = getattr(broker, "nodes", None)
    if nodes:
        return nodes[i % len(nodes)].pika_params(**kw)
    return broker.pika_params(**kw)


@pytest.fixture
def connect(broker) -> Iterator[Callable[..., pika.BlockingConnection]]:
    """Open BlockingConnections to the broker; all are closed at teardown. Against a cluster, the test's
    connections go to its members in turn (``conn`` is the first one)."""
    conns: list[pika.BlockingConnection] = []

    def _connect(**kw) -> pika.BlockingConnection:
        c = pika.BlockingConnection(member_params(broker, len(conns), **kw))
        conns.append(c)
        return c

    yield _connect
    for c in conns:
        if c.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                c.close()


@pytest.fixture
def conn(connect) -> pika.BlockingConnection:
    """One connection, closed at teardown."""
    return connect()


@pytest.fixture
def cleanup(broker) -> Iterator[tuple[list[str], list[str]]]:
    """Names of queues and exchanges to delete at teardown (deleting a missing one is not an error)."""
    queues: list[str] = []
    exchanges: list[str] = []
    yield queues, exchanges
    if queues or exchanges:
        _on_own_connection(broker, lambda ch: _delete_all(ch, queues, exchanges))


def _delete_all(ch: BlockingChannel, queues: list[str], exchanges: list[str]) -> None:
    for q in queues:
        ch.queue_delete(q)
    for x in exchanges:
        ch.exchange_delete(x)


def _on_own_connection(broker, action: Callable[[BlockingChannel], object]) -> None:
    """Run ``action(channel)`` on a connection of its own, closed afterwards. Against a cluster, on the member
    of the test's first connection (``conn``): a classic queue lives on the member that declared it, and the
    test uses it through ``conn``; a quorum queue is every member's."""
    c = pika.BlockingConnection(member_params(broker, 0))
    try:
        action(c.channel())
    finally:
        c.close()


@pytest.fixture
def make_queue(broker, uid, cleanup) -> Callable[..., str]:
    """Declare a (non-exclusive) queue ``{uid}-{suffix}`` visible to every connection; deleted at teardown."""

    def _make(suffix: str = "q", arguments: dict | None = None, durable: bool = False) -> str:
        name = f"{uid}-{suffix}"
        _on_own_connection(broker, lambda ch: ch.queue_declare(name, durable=durable, arguments=arguments))
        cleanup[0].append(name)
        return name

    return _make


@pytest.fixture
def make_exchange(broker, uid, cleanup) -> Callable[..., str]:
    """Declare an exchange ``{uid}-{suffix}`` of the given kind; deleted at teardown."""

    def _make(suffix: str = "x", kind: str = "fanout") -> str:
        name = f"{uid}-{suffix}"
        _on_own_connection(broker, lambda ch: ch.exchange_declare(name, kind))
        cleanup[1].append(name)
        return name

    return _make


@pytest.fixture
def dl_setup(conn, make_queue, make_exchange) -> tuple[str, str]:
    """A fanout DLX with a queue ``dlq`` bound to it; returns (dlx, dlq)."""
    dlx = make_exchange("dlx", "fanout")
    dlq = make_queue("dlq")
    conn.channel().queue_bind(dlq, dlx)
    return dlx, dlq


# -- publishing -------------------------------------------------------------------------------------------


def publish_to(
    conn: pika.BlockingConnection,
    exchange: str,
    routing_key: str,
    *bodies: bytes | str,
    properties: pika.BasicProperties | None = None,
) -> None:
    """Publish on a channel of its own, waiting for each confirm, so the messages are routed (in this order)
    when this returns, whatever channel looks next."""
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, routing_key, body.encode() if isinstance(body, str) else body, properties)
    ch.close()


def publish(
    conn: pika.BlockingConnection,
    queue: str,
    *bodies: bytes | str,
    properties: pika.BasicProperties | None = None,
) -> None:
    """``publish_to`` through the default exchange: the messages are in ``queue`` when this returns."""
    publish_to(conn, "", queue, *bodies, properties=properties)


# -- waiting ----------------------------------------------------------------------------------------------


def pump(conn: pika.BlockingConnection, until: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Process I/O until ``until()`` is true or the deadline passes; returns ``until()``."""
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.02)
    return until()


def settle(conn: pika.BlockingConnection, seconds: float = SETTLE) -> None:
    """Process I/O for a while, to let anything that should NOT arrive show up (a sleep that keeps
    consumers served)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.02)


# -- queue state and messages -----------------------------------------------------------------------------


def declare_ok(conn: pika.BlockingConnection, queue: str) -> spec.Queue.DeclareOk:
    """The queue.declare-ok of a passive declare, on a channel of its own."""
    ch = conn.channel()
    m = ch.queue_declare(queue, passive=True).method
    ch.close()
    return m


def ready_count(conn: pika.BlockingConnection, queue: str) -> int:
    """The ready count of ``queue`` (passive declare)."""
    return declare_ok(conn, queue).message_count


def wait_ready(conn: pika.BlockingConnection, queue: str, expected: int, timeout: float = 5.0) -> int:
    """Poll the ready count (passive declare) until it equals ``expected``; returns the last count."""
    deadline = time.monotonic() + timeout
    while True:
        n = ready_count(conn, queue)
        if n == expected or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


def wait_get(ch, queue: str, timeout: float = 5.0, auto_ack: bool = True):
    """basic.get until a message comes; returns (method, props, body), or (None, None, None) at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = ch.basic_get(queue, auto_ack=auto_ack)
        if got[0] is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def get_all(ch, queue: str, limit: int = 100, auto_ack: bool = True) -> list[Message]:
    """basic.get until get-empty (at most ``limit`` messages)."""
    out = []
    for _ in range(limit):
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            break
        out.append((method, props, body))
    return out


def is_long(value) -> bool:
    """True if pika decoded ``value`` from the AMQP field type ``l`` (long-long int)."""
    return type(value) is pika.compat.long


class Collector:
    """An on_message_callback that records deliveries."""

    def __init__(self) -> None:
        self.msgs: list[tuple[spec.Basic.Deliver, pika.BasicProperties, bytes]] = []

    def __call__(self, _ch, method, props, body) -> None:
        self.msgs.append((method, props, body))

    def __len__(self) -> int:
        return len(self.msgs)

    @property
    def bodies(self) -> list[bytes]:
        return [m[2] for m in self.msgs]

    @property
    def tags(self) -> list[int]:
        return [m[0].delivery_tag for m in self.msgs]

    @property
    def redelivered(self) -> list[bool]:
        return [m[0].redelivered for m in self.msgs]


# -- errors -----------------------------------------------------------------------------------------------


def expect_channel_error(conn: pika.BlockingConnection, ch, timeout: float = 5.0) -> ChannelClosedByBroker:
    """Wait for the broker to close ``ch``; the connection must stay open (and still open channels)."""
    pump(conn, lambda: ch.is_closed, timeout)
    assert ch.is_closed, "broker did not close the channel"
    reason = ch._closing_reason
    assert isinstance(reason, ChannelClosedByBroker), repr(reason)
    assert conn.is_open, "a channel error must not close the connection"
    conn.channel().close()  # and the connection is still usable
    return reason


def expect_connection_error(conn: pika.BlockingConnection, timeout: float = 5.0) -> ConnectionClosedByBroker:
    """Wait for the broker to close the whole connection."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.02)
    except ConnectionClosedByBroker as e:
        assert conn.is_closed
        return e
    pytest.fail("broker did not close the connection")
