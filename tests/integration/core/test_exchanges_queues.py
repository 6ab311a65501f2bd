"""Exchange and queue semantics (as RabbitMQ 3.10 answers: docs/decisions/rabbitmq-parity.md), checked through pika's BlockingConnection.

Every test here passes against RabbitMQ 3.10 (run with ``LEVERET_TEST_AMQP_URL``); Leveret must give the same
answers. Errors are checked by reply code *and* by kind: soft errors (403, 404, 405, 406) close only the
channel (``ChannelClosedByBroker``, connection still open), hard errors close the connection
(``ConnectionClosedByBroker``).

Ordering assumption used throughout: a ``basic.publish`` followed by a synchronous method on the *same*
channel (``basic.get``, ``queue.declare``, ...) is processed after the publish has been routed, so a
``basic.get`` right after a publish sees the message (or proves it was not routed there).
This does NOT hold for the counts in ``queue.declare-ok``: RabbitMQ answers the queue's ``stat`` call with
priority, ahead of publishes still in the queue's mailbox, so tests that read those counts publish in
confirm mode (the confirm means the message is enqueued) or poll.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pika
import pika.exceptions
import pika.spec
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

# Each test is small; this bounds any blocking pika call that never gets its reply.
pytestmark = pytest.mark.timeout(20)

WAIT = 5.0  # upper bound for things the broker does asynchronously (auto-delete, exclusive cleanup, cancels)


# ------------------------------------------------------------------------------------------------------
# fixtures and helpers
# ------------------------------------------------------------------------------------------------------


@pytest.fixture
def connect(broker) -> Callable[[], BlockingConnection]:
    """Open a BlockingConnection to the broker; all of them are closed at teardown."""
    opened: list[BlockingConnection] = []

    def _connect() -> BlockingConnection:
        c = pika.BlockingConnection(broker.pika_params())
        opened.append(c)
        return c

    yield _connect
    for c in opened:
        if c.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                c.close()


@pytest.fixture
def conn(connect) -> BlockingConnection:
    return connect()


@pytest.fixture
def ch(conn) -> BlockingChannel:
    return conn.channel()


class Cleanup:
    """Names of non-exclusive objects a test created; deleted (idempotently) at teardown."""

    def __init__(self, broker):
        self.broker = broker
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    def exchange(self, name: str) -> str:
        self.exchanges.append(name)
        return name

    def queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def run(self) -> None:
        if not (self.exchanges or self.queues):
            return
        c = pika.BlockingConnection(self.broker.pika_params())
        try:
            for kind, names in (("queue", self.queues), ("exchange", self.exchanges)):
                for name in names:
                    ch = c.channel()
                    try:
                        if kind == "queue":
                            ch.queue_delete(name)
                        else:
                            ch.exchange_delete(name)
                        ch.close()
                    except pika.exceptions.ChannelClosed:
                        pass
        finally:
            if c.is_open:
                c.close()


@pytest.fixture
def cleanup(broker):
    c = Cleanup(broker)
    yield c
    c.run()


def channel_error(
    conn: BlockingConnection, code: int, fn, *args, **kwargs
) -> pika.exceptions.ChannelClosedByBroker:
    """Run fn and check the broker closed the channel (not the connection) with reply code `code`."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        fn(*args, **kwargs)
    assert ei.value.reply_code == code, f"expected {code}, got {ei.value.reply_code} {ei.value.reply_text!r}"
    assert conn.is_open, "a channel-level error must leave the connection open"
    return ei.value


def connection_error(conn: BlockingConnection, code: int, fn, *args, **kwargs):
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        fn(*args, **kwargs)
    assert ei.value.reply_code == code, f"expected {code}, got {ei.value.reply_code} {ei.value.reply_text!r}"
    assert conn.is_closed
    return ei.value


def text_has(exc, *fragments: str) -> None:
    for f in fragments:
        assert f in exc.reply_text, f"{f!r} not in reply text {exc.reply_text!r}"


def drain(ch: BlockingChannel, queue: str) -> list[bytes]:
    """All ready messages of `queue`, taken with basic.get (auto-ack)."""
    out: list[bytes] = []
    for _ in range(1000):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)
    raise AssertionError("queue did not drain")


def exchange_exists(conn: BlockingConnection, name: str) -> bool:
    c = conn.channel()
    try:
        c.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False
    c.close()
    return True


def queue_state(conn: BlockingConnection, name: str):
    """The passive declare-ok method of `name`, or None when the queue does not exist."""
    c = conn.channel()
    try:
        ok = c.queue_declare(name, passive=True).method
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return None
    c.close()
    return ok


def queue_exists(conn: BlockingConnection, name: str) -> bool:
    return queue_state(conn, name) is not None


def eventually(conn: BlockingConnection, pred: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll `pred` (servicing `conn` in between) until it is true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        conn.process_data_events(time_limit=min(0.05, remaining))


def pump(conn: BlockingConnection, pred: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Process I/O on `conn` (delivering callbacks) until `pred()` or the deadline."""
    deadline = time.monotonic() + timeout
    while not pred():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        conn.process_data_events(time_limit=min(0.05, remaining))
    return True


def temp_queue(ch: BlockingChannel) -> str:
    return ch.queue_declare("", exclusive=True).method.queue


# ------------------------------------------------------------------------------------------------------
# exchange.declare
# ------------------------------------------------------------------------------------------------------

TYPE_CASES = {
    # type: (binding key, binding args, (matching key, headers), (non-matching key, headers) or None)
    "direct": ("rk", None, ("rk", None), ("other", None)),
    "fanout": ("ignored", None, ("anything", None), None),
    "topic": ("a.*", None, ("a.b", None), ("b.a", None)),
    "headers": ("", {"x-match": "all", "h": "v"}, ("whatever", {"h": "v"}), ("whatever", {"h": "w"})),
}


@pytest.mark.parametrize("kind", list(TYPE_CASES))
def test_exchange_declare_each_type_and_route(conn, ch, cleanup, uid, kind):
    bkey, bargs, (hit_key, hit_hdr), miss = TYPE_CASES[kind]
    x = cleanup.exchange(f"{uid}-x")
    ok = ch.exchange_declare(x, exchange_type=kind)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    assert exchange_exists(conn, x)
    q = temp_queue(ch)
    ch.queue_bind(q, x, routing_key=bkey, arguments=bargs)
    ch.basic_publish(x, hit_key, b"hit", pika.BasicProperties(headers=hit_hdr))
    if miss is not None:
        ch.basic_publish(x, miss[0], b"miss", pika.BasicProperties(headers=miss[1]))
    assert drain(ch, q) == [b"hit"]


def test_exchange_redeclare_equivalent_is_ok(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    args = {"alternate-exchange": f"{uid}-ae"}
    ch.exchange_declare(x, "topic", durable=False, auto_delete=False, arguments=args)
    ok = ch.exchange_declare(x, "topic", durable=False, auto_delete=False, arguments=args)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    assert ch.is_open


def test_exchange_redeclare_different_type_is_406(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    e = channel_error(conn, 406, ch.exchange_declare, x, "fanout")
    text_has(e, "PRECONDITION_FAILED", "inequivalent arg 'type'")
    assert exchange_exists(conn, x)  # the original is untouched


def test_exchange_redeclare_different_durable_is_406(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct", durable=False)
    e = channel_error(conn, 406, ch.exchange_declare, x, "direct", durable=True)
    text_has(e, "PRECONDITION_FAILED", "inequivalent arg 'durable'")


def test_exchange_redeclare_different_auto_delete_is_406(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct", auto_delete=False)
    e = channel_error(conn, 406, ch.exchange_declare, x, "direct", auto_delete=True)
    text_has(e, "inequivalent arg 'auto_delete'")


def test_exchange_declare_amq_prefix_is_403(conn, ch, uid):
    e = channel_error(conn, 403, ch.exchange_declare, f"amq.{uid}", "direct")
    text_has(e, "ACCESS_REFUSED", "reserved prefix 'amq.*'")
    assert not exchange_exists(conn, f"amq.{uid}")


def test_exchange_redeclare_existing_amq_exchange_is_allowed(conn, ch):
    # The reserved-prefix check applies only to names that do not exist yet: an equivalent (non-passive)
    # redeclare of a predeclared amq.* exchange is answered with declare-ok.
    ok = ch.exchange_declare("amq.direct", "direct", durable=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)


@pytest.mark.parametrize("name", ["amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"])
def test_predeclared_amq_exchanges_exist(conn, name):
    assert exchange_exists(conn, name)


def test_exchange_declare_passive_missing_is_404(conn, ch, uid):
    e = channel_error(conn, 404, ch.exchange_declare, f"{uid}-missing", passive=True)
    text_has(e, "NOT_FOUND", f"no exchange '{uid}-missing'")


def test_exchange_declare_passive_missing_amq_name_is_404_not_403(conn, ch, uid):
    # Passive declares skip the reserved-prefix check: they only test for existence.
    channel_error(conn, 404, ch.exchange_declare, f"amq.{uid}", passive=True)


def test_exchange_declare_passive_ignores_type_and_flags(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    ok = ch.exchange_declare(x, "fanout", passive=True, durable=True, auto_delete=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    assert ch.is_open


@pytest.mark.parametrize("passive", [False, True], ids=["active", "passive"])
def test_exchange_declare_default_exchange_is_403(conn, ch, passive):
    # RabbitMQ refuses even a passive declare of "" (403), and "amq.default" is only a display name (404 below).
    e = channel_error(conn, 403, ch.exchange_declare, "", "direct", passive=passive, durable=True)
    text_has(e, "operation not permitted on the default exchange")


def test_amq_default_is_not_a_real_exchange(conn, ch):
    channel_error(conn, 404, ch.exchange_declare, "amq.default", passive=True)


def test_exchange_declare_unknown_type(conn, ch, uid):
    # RabbitMQ before 3.13.x (this includes 3.10) answers 503 COMMAND_INVALID "unknown exchange type 'x'",
    # a *connection* error; 3.13.x (May 2024) and 4.x answer 406 PRECONDITION_FAILED as a *channel* error.
    # Either is accepted; what is not accepted is declare-ok or any other code.
    x = f"{uid}-x"
    with pytest.raises(
        (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)
    ) as ei:
        ch.exchange_declare(x, exchange_type="no-such-type")
    e = ei.value
    if isinstance(e, pika.exceptions.ConnectionClosedByBroker):
        assert e.reply_code == 503, e
        assert conn.is_closed
    else:
        assert e.reply_code == 406, e
        assert conn.is_open
    assert "unknown exchange type 'no-such-type'" in e.reply_text


# ------------------------------------------------------------------------------------------------------
# exchange.delete
# ------------------------------------------------------------------------------------------------------


def test_exchange_delete_is_idempotent(conn, ch, uid):
    x = f"{uid}-x"
    ok = ch.exchange_delete(x)  # never existed
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    ch.exchange_declare(x, "direct")
    ch.exchange_delete(x)
    assert not exchange_exists(conn, x)
    ok = ch.exchange_delete(x)  # again
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    assert ch.is_open


def test_exchange_delete_if_unused_while_bound_is_406(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    e = channel_error(conn, 406, ch.exchange_delete, x, if_unused=True)
    text_has(e, "PRECONDITION_FAILED", "in use")
    assert exchange_exists(conn, x)
    ch2 = conn.channel()
    ch2.queue_unbind(q, x, "k")
    ch2.exchange_delete(x, if_unused=True)
    assert not exchange_exists(conn, x)


def test_exchange_delete_if_unused_counts_only_bindings_as_source(conn, ch, cleanup, uid):
    # An exchange that is only the *destination* of an exchange-to-exchange binding is "unused".
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "fanout")
    ch.exchange_bind(destination=x, source="amq.direct", routing_key=f"{uid}-k")
    ch.exchange_delete(x, if_unused=True)
    assert not exchange_exists(conn, x)


def test_exchange_delete_removes_its_bindings(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.exchange_delete(x)
    assert queue_exists(conn, q)
    ch.exchange_declare(x, "direct")  # same name again: the old binding must be gone
    ch.basic_publish(x, "k", b"m")
    assert drain(ch, q) == []


def test_exchange_delete_amq_direct_is_403(conn, ch):
    e = channel_error(conn, 403, ch.exchange_delete, "amq.direct")
    text_has(e, "ACCESS_REFUSED", "amq.direct")
    assert exchange_exists(conn, "amq.direct")


def test_exchange_delete_default_exchange_is_403(conn, ch):
    e = channel_error(conn, 403, ch.exchange_delete, "")
    text_has(e, "ACCESS_REFUSED", "operation not permitted on the default exchange")


# ------------------------------------------------------------------------------------------------------
# internal exchanges, exchange-to-exchange bindings, auto-delete exchanges, alternate exchanges
# ------------------------------------------------------------------------------------------------------


def test_publish_to_internal_exchange_is_403(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-int")
    ch.exchange_declare(x, "fanout", internal=True)
    # basic.publish has no reply; the channel close shows up at the next synchronous call at the latest.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.basic_publish(x, "", b"m")
        ch.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 403, ei.value
    text_has(ei.value, "ACCESS_REFUSED", "cannot publish to internal exchange")
    assert conn.is_open


def test_internal_exchange_is_reachable_through_an_exchange_binding(conn, ch, cleanup, uid):
    internal = cleanup.exchange(f"{uid}-int")
    public = cleanup.exchange(f"{uid}-pub")
    ch.exchange_declare(internal, "fanout", internal=True)
    ch.exchange_declare(public, "direct")
    ch.exchange_bind(destination=internal, source=public, routing_key="k")
    q = temp_queue(ch)
    ch.queue_bind(q, internal, "")
    ch.basic_publish(public, "k", b"via-e2e")
    assert drain(ch, q) == [b"via-e2e"]


def test_exchange_bind_routes_and_unbind_stops(conn, ch, cleanup, uid):
    src = cleanup.exchange(f"{uid}-src")
    dst = cleanup.exchange(f"{uid}-dst")
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(dst, "fanout")
    ok = ch.exchange_bind(destination=dst, source=src, routing_key="k")
    assert isinstance(ok.method, pika.spec.Exchange.BindOk)
    q = temp_queue(ch)
    ch.queue_bind(q, dst, "")
    ch.basic_publish(src, "k", b"one")
    ch.basic_publish(src, "other", b"not-routed")
    assert drain(ch, q) == [b"one"]
    ok = ch.exchange_unbind(destination=dst, source=src, routing_key="k")
    assert isinstance(ok.method, pika.spec.Exchange.UnbindOk)  # method id 51 on the wire
    ch.basic_publish(src, "k", b"two")
    assert drain(ch, q) == []


def test_exchange_bind_chain_of_three_topic_exchanges(conn, ch, cleanup, uid):
    a, b, c = (cleanup.exchange(f"{uid}-{n}") for n in "abc")
    for x in (a, b, c):
        ch.exchange_declare(x, "topic")
    ch.exchange_bind(destination=b, source=a, routing_key="orders.#")
    ch.exchange_bind(destination=c, source=b, routing_key="*.eu.*")
    q = temp_queue(ch)
    ch.queue_bind(q, c, "#")
    for key in ("orders.eu.new", "orders.us.new", "billing.eu.new", "orders.eu"):
        ch.basic_publish(a, key, key.encode())
    assert drain(ch, q) == [b"orders.eu.new"]


def test_exchange_bind_cycle_delivers_once(conn, ch, cleanup, uid):
    x1 = cleanup.exchange(f"{uid}-1")
    x2 = cleanup.exchange(f"{uid}-2")
    ch.exchange_declare(x1, "fanout")
    ch.exchange_declare(x2, "fanout")
    ch.exchange_bind(destination=x2, source=x1)
    ch.exchange_bind(destination=x1, source=x2)
    q = temp_queue(ch)
    ch.queue_bind(q, x1)
    ch.queue_bind(q, x2)
    ch.basic_publish(x1, "", b"m")
    assert drain(ch, q) == [b"m"]  # no loop, and one copy although two paths lead to q


def test_exchange_bind_missing_source_is_404(conn, ch, cleanup, uid):
    dst = cleanup.exchange(f"{uid}-dst")
    ch.exchange_declare(dst, "fanout")
    channel_error(conn, 404, ch.exchange_bind, destination=dst, source=f"{uid}-missing")


def test_exchange_bind_default_exchange_is_403(conn, ch):
    channel_error(conn, 403, ch.exchange_bind, destination="", source="amq.direct", routing_key="k")


def test_auto_delete_exchange_goes_with_its_last_source_binding(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-ad")
    ch.exchange_declare(x, "direct", auto_delete=True)
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(q1, x, "k")
    ch.queue_bind(q2, x, "k")
    ch.queue_unbind(q1, x, "k")
    assert exchange_exists(conn, x), "one binding is left, the exchange must stay"
    ch.queue_unbind(q2, x, "k")
    assert eventually(conn, lambda: not exchange_exists(conn, x)), (
        "auto-delete exchange outlived its last binding"
    )


def test_auto_delete_exchange_goes_when_last_bound_queue_is_deleted(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-ad")
    ch.exchange_declare(x, "direct", auto_delete=True)
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.queue_delete(q)
    assert eventually(conn, lambda: not exchange_exists(conn, x))


def test_auto_delete_exchange_goes_with_last_exchange_binding_as_source(conn, ch, cleanup, uid):
    src = cleanup.exchange(f"{uid}-src")
    dst = cleanup.exchange(f"{uid}-dst")
    ch.exchange_declare(src, "fanout", auto_delete=True)
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(destination=dst, source=src)
    ch.exchange_unbind(destination=dst, source=src)
    assert eventually(conn, lambda: not exchange_exists(conn, src))
    assert exchange_exists(conn, dst)


def test_auto_delete_exchange_stays_when_never_bound_or_only_a_destination(conn, ch, cleanup, uid):
    never = cleanup.exchange(f"{uid}-never")
    dest = cleanup.exchange(f"{uid}-dest")
    ch.exchange_declare(never, "direct", auto_delete=True)
    ch.exchange_declare(dest, "fanout", auto_delete=True)
    ch.exchange_bind(destination=dest, source="amq.direct", routing_key=f"{uid}-k")
    ch.exchange_unbind(destination=dest, source="amq.direct", routing_key=f"{uid}-k")
    assert exchange_exists(conn, never)
    assert exchange_exists(conn, dest)  # only bindings where it is the *source* count


def test_alternate_exchange_takes_unroutable_messages(conn, ch, cleanup, uid):
    ae = cleanup.exchange(f"{uid}-ae")
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(x, "direct", arguments={"alternate-exchange": ae})  # no "x-" prefix
    q_main, q_ae = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(q_main, x, "k")
    ch.queue_bind(q_ae, ae, "")
    ch.basic_publish(x, "k", b"routed")
    ch.basic_publish(x, "nope", b"unroutable")
    assert drain(ch, q_main) == [b"routed"]
    assert drain(ch, q_ae) == [b"unroutable"]


def test_alternate_exchange_message_is_not_returned_to_mandatory_publisher(conn, ch, cleanup, uid):
    ae = cleanup.exchange(f"{uid}-ae")
    x = cleanup.exchange(f"{uid}-x")
    plain = cleanup.exchange(f"{uid}-plain")
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(x, "direct", arguments={"alternate-exchange": ae})
    ch.exchange_declare(plain, "direct")
    q_ae = temp_queue(ch)
    ch.queue_bind(q_ae, ae, "")
    ch.confirm_delivery()
    ch.basic_publish(x, "nope", b"m", mandatory=True)  # taken by the AE: counts as routed, no basic.return
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(plain, "nope", b"m", mandatory=True)
    assert drain(ch, q_ae) == [b"m"]


def test_alternate_exchange_that_does_not_exist_drops_silently(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct", arguments={"alternate-exchange": f"{uid}-missing"})
    ch.basic_publish(x, "nope", b"m")
    assert temp_queue(ch)  # channel still fine
    assert ch.is_open


# ------------------------------------------------------------------------------------------------------
# topic routing
# ------------------------------------------------------------------------------------------------------

TOPIC_KEYS = [
    "",
    "a",
    "b",
    "ab",
    "a.b",
    "a.x.b",
    "a.x.y.b",
    "a..b",
    ".",
    "a.",
    ".b",
    "x.a.y",
    "a.b.c",
    "a.b.x.c",
    "a.a.b",
]

# pattern -> routing keys (from TOPIC_KEYS) it matches; observed on RabbitMQ 3.10.8.
# "" is zero words (so "*" does not match it but "#" does); "." is two empty words; "a." is "a" + "".
TOPIC_CASES = {
    "star": ("*", ["a", "b", "ab"]),
    "hash": ("#", TOPIC_KEYS),
    "hash.hash": ("#.#", TOPIC_KEYS),
    "a.hash.b": ("a.#.b", ["a.b", "a.x.b", "a.x.y.b", "a..b", "a.a.b"]),
    "a.hash.hash.b": ("a.#.#.b", ["a.b", "a.x.b", "a.x.y.b", "a..b", "a.a.b"]),
    "a.star": ("a.*", ["a.b", "a."]),
    "a.hash": ("a.#", ["a", "a.b", "a.x.b", "a.x.y.b", "a..b", "a.", "a.b.c", "a.b.x.c", "a.a.b"]),
    "star.b": ("*.b", ["a.b", ".b"]),
    "hash.b": ("#.b", ["b", "a.b", "a.x.b", "a.x.y.b", "a..b", ".b", "a.a.b"]),
    "a.star.b": ("a.*.b", ["a.x.b", "a..b", "a.a.b"]),
    "star.star": ("*.*", ["a.b", ".", "a.", ".b"]),
    "hash.star": ("#.*", [k for k in TOPIC_KEYS if k != ""]),
    "star.hash": ("*.#", [k for k in TOPIC_KEYS if k != ""]),
    "hash.a.hash": (
        "#.a.#",
        ["a", "a.b", "a.x.b", "a.x.y.b", "a..b", "a.", "x.a.y", "a.b.c", "a.b.x.c", "a.a.b"],
    ),
    "a.b.hash.c": ("a.b.#.c", ["a.b.c", "a.b.x.c"]),
    "empty-word": ("a..b", ["a..b"]),
    "empty-pattern": ("", [""]),
    "literal": ("a", ["a"]),
}


@pytest.mark.parametrize("case", list(TOPIC_CASES))
def test_topic_pattern(conn, ch, cleanup, uid, case):
    pattern, expected = TOPIC_CASES[case]
    x = cleanup.exchange(f"{uid}-t")
    ch.exchange_declare(x, "topic")
    q = temp_queue(ch)
    ch.queue_bind(q, x, routing_key=pattern)
    for key in TOPIC_KEYS:
        ch.basic_publish(x, key, key.encode())
    got = [b.decode() for b in drain(ch, q)]
    assert got == expected, f"pattern {pattern!r}"


def test_topic_many_patterns_many_queues(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-t")
    ch.exchange_declare(x, "topic")
    bindings = {
        "eu": ["*.eu.*", "audit.#"],  # a message matching both is delivered once
        "orders": ["orders.#"],
        "new": ["#.new"],
        "exact": ["orders.us.new"],
        "none": ["nothing.matches.this"],
    }
    queues = {}
    for name, patterns in bindings.items():
        queues[name] = temp_queue(ch)
        for p in patterns:
            ch.queue_bind(queues[name], x, p)
    keys = ["orders.eu.new", "orders.us.new", "audit.eu.x", "billing.eu.paid", "orders", "new"]
    for k in keys:
        ch.basic_publish(x, k, k.encode())
    got = {name: [b.decode() for b in drain(ch, q)] for name, q in queues.items()}
    assert got == {
        "eu": ["orders.eu.new", "audit.eu.x", "billing.eu.paid"],
        "orders": ["orders.eu.new", "orders.us.new", "orders"],
        "new": ["orders.eu.new", "orders.us.new", "new"],
        "exact": ["orders.us.new"],
        "none": [],
    }


def test_same_queue_bound_twice_gets_one_copy(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-d")
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.queue_bind(q, x, "k")  # identical binding: no-op
    ch.basic_publish(x, "k", b"m")
    assert drain(ch, q) == [b"m"]
    ch.queue_unbind(q, x, "k")  # one unbind removes it
    ch.basic_publish(x, "k", b"m2")
    assert drain(ch, q) == []


# ------------------------------------------------------------------------------------------------------
# headers exchange
# ------------------------------------------------------------------------------------------------------


def _headers_route(ch, x, binding_args, messages):
    """Bind a fresh queue with binding_args, publish each headers dict, return the indexes that arrived."""
    q = temp_queue(ch)
    ch.queue_bind(q, x, "", arguments=binding_args)
    for i, hdr in enumerate(messages):
        ch.basic_publish(x, "ignored", str(i).encode(), pika.BasicProperties(headers=hdr))
    return [int(b) for b in drain(ch, q)]


@pytest.fixture
def hx(ch, cleanup, uid) -> str:
    x = cleanup.exchange(f"{uid}-h")
    ch.exchange_declare(x, "headers")
    return x


def test_headers_match_all(ch, hx):
    msgs = [{"a": 1, "b": "two"}, {"a": 1}, {"a": 1, "b": "two", "c": 3}, {"a": 2, "b": "two"}, {}, None]
    assert _headers_route(ch, hx, {"x-match": "all", "a": 1, "b": "two"}, msgs) == [0, 2]


def test_headers_default_x_match_is_all(ch, hx):
    msgs = [{"a": 1, "b": "two"}, {"a": 1}, {"b": "two"}]
    assert _headers_route(ch, hx, {"a": 1, "b": "two"}, msgs) == [0]


def test_headers_match_any(ch, hx):
    msgs = [{"a": 1}, {"b": "two"}, {"a": 2}, {}, {"c": 1}, {"a": 1, "b": "zzz"}, None]
    assert _headers_route(ch, hx, {"x-match": "any", "a": 1, "b": "two"}, msgs) == [0, 1, 5]


def test_headers_values_compare_with_their_type(ch, hx):
    # int 1 and string "1" are different values
    assert _headers_route(ch, hx, {"a": 1}, [{"a": 1}, {"a": "1"}]) == [0]
    assert _headers_route(ch, hx, {"a": "1"}, [{"a": 1}, {"a": "1"}]) == [1]


def test_headers_byte_array_matches_the_same_string_and_true_does_not_match_one(ch, hx):
    # RabbitMQ compares the values as Erlang terms: a byte array and a long string with the same bytes are
    # both binaries (equal), a boolean is an atom (not the integer 1), and numbers compare by value.
    assert _headers_route(ch, hx, {"a": "x"}, [{"a": b"x"}, {"a": "x"}, {"a": b"y"}]) == [0, 1]
    assert _headers_route(ch, hx, {"a": 1}, [{"a": True}, {"a": 1}]) == [1]
    assert _headers_route(ch, hx, {"a": True}, [{"a": 1}, {"a": True}, {"a": False}]) == [1]


def test_headers_void_binding_value_matches_presence(ch, hx):
    assert _headers_route(ch, hx, {"a": None}, [{"a": 1}, {"a": "zz"}, {"b": 1}, {}]) == [0, 1]


def test_headers_x_arguments_ignored_by_all_and_any(ch, hx):
    # In all/any, binding arguments starting with "x-" are left out of matching.
    assert _headers_route(ch, hx, {"x-match": "any", "x-foo": "1"}, [{"x-foo": "1"}, {}]) == []
    assert _headers_route(ch, hx, {"x-match": "all", "x-foo": "1", "a": 1}, [{"a": 1}, {"x-foo": "1"}]) == [0]


def test_headers_all_with_nothing_to_match_matches_everything_any_matches_nothing(ch, hx):
    msgs = [{}, {"a": 1}, None]
    assert _headers_route(ch, hx, {"x-match": "all"}, msgs) == [0, 1, 2]
    assert _headers_route(ch, hx, None, msgs) == [0, 1, 2]
    assert _headers_route(ch, hx, {"x-match": "any"}, msgs) == []


def test_headers_all_with_x(ch, hx):
    # Supported by RabbitMQ 3.10 (the error text for a bad x-match lists all four modes).
    args = {"x-match": "all-with-x", "x-foo": "1", "a": 1}
    assert _headers_route(ch, hx, args, [{"a": 1}, {"a": 1, "x-foo": "1"}, {"x-foo": "1"}]) == [1]


def test_headers_any_with_x(ch, hx):
    args = {"x-match": "any-with-x", "x-foo": "1", "a": 1}
    assert _headers_route(ch, hx, args, [{"x-foo": "1"}, {"a": 1}, {"x-foo": "2"}, {}]) == [0, 1]


def test_headers_invalid_x_match_is_406_at_bind(conn, ch, hx):
    q = temp_queue(ch)
    e = channel_error(conn, 406, ch.queue_bind, q, hx, "", arguments={"x-match": "bogus"})
    text_has(e, "PRECONDITION_FAILED", "x-match")


# ------------------------------------------------------------------------------------------------------
# queue.declare
# ------------------------------------------------------------------------------------------------------


def test_queue_declare_server_named(conn, ch):
    ok1 = ch.queue_declare("", exclusive=True).method
    ok2 = ch.queue_declare("", exclusive=True).method
    assert isinstance(ok1, pika.spec.Queue.DeclareOk)
    assert ok1.queue.startswith("amq.gen-") and len(ok1.queue) > len("amq.gen-")
    assert ok2.queue.startswith("amq.gen-")
    assert ok1.queue != ok2.queue
    assert (ok1.message_count, ok1.consumer_count) == (0, 0)
    ch.basic_publish("", ok1.queue, b"m")
    assert drain(ch, ok1.queue) == [b"m"]


def test_queue_declare_passive_missing_is_404(conn, ch, uid):
    e = channel_error(conn, 404, ch.queue_declare, f"{uid}-missing", passive=True)
    text_has(e, "NOT_FOUND", f"no queue '{uid}-missing'")


def test_queue_declare_passive_ignores_flags_and_arguments(conn, ch, cleanup, uid):
    q = cleanup.queue(f"{uid}-q")
    ch.queue_declare(q, auto_delete=True)
    ok = ch.queue_declare(q, passive=True, durable=True, arguments={"x-message-ttl": 5})
    assert ok.method.queue == q
    assert ch.is_open


def test_queue_redeclare_equivalent_is_ok(conn, ch, uid):
    q = f"{uid}-q"
    args = {"x-message-ttl": 60000, "x-max-length": 10}
    ch.queue_declare(q, exclusive=True, arguments=args)
    ch.confirm_delivery()  # see the module docstring: declare-ok counts may overtake unconfirmed publishes
    ch.basic_publish("", q, b"m")
    ok = ch.queue_declare(q, exclusive=True, arguments=args).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 1, 0)


def test_queue_redeclare_different_durable_is_406(conn, ch, cleanup, uid):
    q = cleanup.queue(f"{uid}-q")
    ch.queue_declare(q, durable=False, auto_delete=True)
    e = channel_error(conn, 406, ch.queue_declare, q, durable=True, auto_delete=True)
    text_has(e, "PRECONDITION_FAILED", "inequivalent arg 'durable'", f"for queue '{q}'")


def test_queue_redeclare_different_message_ttl_is_406(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 1000})
    e = channel_error(conn, 406, ch.queue_declare, q, exclusive=True, arguments={"x-message-ttl": 2000})
    text_has(e, "inequivalent arg 'x-message-ttl'")


def test_queue_redeclare_without_message_ttl_is_406(conn, ch, uid):
    # An argument present on the queue but missing from the redeclare is a mismatch too
    # (RabbitMQ: "received none but current is the value '1000' of type 'signedint'").
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 1000})
    e = channel_error(conn, 406, ch.queue_declare, q, exclusive=True)
    text_has(e, "inequivalent arg 'x-message-ttl'")


def test_exclusive_queue_durable_flag_is_ignored(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True, durable=False)
    ok = ch.queue_declare(q, exclusive=True, durable=True)
    assert ok.method.queue == q


def test_queue_declare_amq_prefix_is_403(conn, ch, uid):
    e = channel_error(conn, 403, ch.queue_declare, f"amq.{uid}")
    text_has(e, "ACCESS_REFUSED", "reserved prefix 'amq.*'")
    ch2 = conn.channel()
    channel_error(conn, 404, ch2.queue_declare, f"amq.{uid}", passive=True)  # passive: existence only


def test_queue_declare_ok_counts_ready_messages_only(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"m%d" % i)
    method, _, _ = ch.basic_get(q, auto_ack=False)  # now 1 unacked, 2 ready
    assert method is not None
    assert method.message_count == 2  # get-ok: ready messages left after this one
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (2, 0)
    ok = ch.queue_declare(q, exclusive=True).method  # a non-passive redeclare reports the same
    assert (ok.message_count, ok.consumer_count) == (2, 0)
    ch.basic_reject(method.delivery_tag, requeue=True)  # async: poll until the requeue shows
    assert eventually(conn, lambda: queue_state(conn, q).message_count == 3)


def test_queue_declare_ok_consumer_count(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = conn.channel().basic_consume(q, lambda *a: None)
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (0, 2)
    ch.basic_cancel(t1)
    assert t2
    ok = ch.queue_declare(q, passive=True).method
    assert ok.consumer_count == 1


# ------------------------------------------------------------------------------------------------------
# exclusive queues
# ------------------------------------------------------------------------------------------------------

EXCLUSIVE_OPS = {
    "declare": lambda ch, q: ch.queue_declare(q, exclusive=True),
    "declare-nonexclusive": lambda ch, q: ch.queue_declare(q),
    "declare-passive": lambda ch, q: ch.queue_declare(q, passive=True),
    "consume": lambda ch, q: ch.basic_consume(q, lambda *a: None),
    "get": lambda ch, q: ch.basic_get(q),
    "purge": lambda ch, q: ch.queue_purge(q),
    "delete": lambda ch, q: ch.queue_delete(q),
    "bind": lambda ch, q: ch.queue_bind(q, "amq.direct", "k"),
}


@pytest.mark.parametrize("op", list(EXCLUSIVE_OPS))
def test_exclusive_queue_locked_to_other_connections_405(connect, uid, op):
    owner = connect()
    q = f"{uid}-excl"
    owner.channel().queue_declare(q, exclusive=True)
    other = connect()
    e = channel_error(other, 405, EXCLUSIVE_OPS[op], other.channel(), q)
    text_has(e, "RESOURCE_LOCKED", q)
    assert queue_exists(owner, q)


def test_exclusive_queue_accepts_publishes_from_other_connections(connect, uid):
    owner = connect()
    och = owner.channel()
    q = f"{uid}-excl"
    och.queue_declare(q, exclusive=True)
    other = connect()
    och_other = other.channel()
    och_other.confirm_delivery()  # another connection: only the confirm says the message is in the queue
    och_other.basic_publish("", q, b"from-other", mandatory=True)
    assert drain(och, q) == [b"from-other"]


def test_exclusive_queue_survives_close_of_declaring_channel(conn, uid):
    q = f"{uid}-excl"
    ch1 = conn.channel()
    ch1.queue_declare(q, exclusive=True)
    ch1.close()
    ch2 = conn.channel()
    ok = ch2.queue_declare(q, passive=True).method
    assert ok.queue == q
    ch2.basic_publish("", q, b"m")
    assert drain(ch2, q) == [b"m"]


def test_exclusive_queue_deleted_when_connection_closes(connect, uid):
    owner = connect()
    q = f"{uid}-excl"
    owner.channel().queue_declare(q, exclusive=True)
    observer = connect()
    ch = observer.channel()
    channel_error(observer, 405, ch.queue_declare, q, passive=True)  # exists, but locked
    owner.close()
    assert eventually(observer, lambda: not queue_exists(observer, q)), (
        "exclusive queue outlived its connection"
    )
    assert observer.channel().queue_delete(q).method.message_count == 0  # and the name is free again


# ------------------------------------------------------------------------------------------------------
# auto-delete queues
# ------------------------------------------------------------------------------------------------------


def test_auto_delete_queue_deleted_when_last_consumer_cancels(connect, cleanup, uid):
    c = connect()
    ch = c.channel()
    q = cleanup.queue(f"{uid}-ad")
    ch.queue_declare(q, auto_delete=True)
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    state = queue_state(c, q)
    assert state is not None and state.consumer_count == 1, "one consumer left: the queue must stay"
    ch.basic_cancel(t2)
    assert eventually(c, lambda: not queue_exists(c, q)), "auto-delete queue outlived its last consumer"


def test_auto_delete_queue_deleted_when_consumer_channel_closes(connect, cleanup, uid):
    c = connect()
    q = cleanup.queue(f"{uid}-ad")
    ch = c.channel()
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    assert eventually(c, lambda: not queue_exists(c, q))


def test_auto_delete_queue_never_consumed_stays(connect, cleanup, uid):
    c = connect()
    ch = c.channel()
    q = cleanup.queue(f"{uid}-ad")
    ch.queue_declare(q, auto_delete=True)
    ch.basic_publish("", q, b"m")
    assert drain(ch, q) == [b"m"]  # basic.get does not count as a consumer
    ch.close()
    c2 = connect()
    c.close()
    assert queue_exists(c2, q)


# ------------------------------------------------------------------------------------------------------
# queue.bind / queue.unbind
# ------------------------------------------------------------------------------------------------------


def test_queue_bind_to_default_exchange_is_403(conn, ch):
    q = temp_queue(ch)
    e = channel_error(conn, 403, ch.queue_bind, q, "", routing_key=q)
    text_has(e, "ACCESS_REFUSED", "operation not permitted on the default exchange")


def test_queue_unbind_from_default_exchange_is_403(conn, ch):
    q = temp_queue(ch)
    e = channel_error(conn, 403, ch.queue_unbind, q, "", routing_key=q)
    text_has(e, "operation not permitted on the default exchange")


def test_queue_unbind_is_idempotent(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind(q, x, "k")
    assert isinstance(ch.queue_unbind(q, x, "k").method, pika.spec.Queue.UnbindOk)
    assert isinstance(ch.queue_unbind(q, x, "k").method, pika.spec.Queue.UnbindOk)  # binding already gone
    ch.queue_unbind(q, x, "never-bound")
    ch.queue_unbind(f"{uid}-missing-q", x, "k")  # missing queue
    ch.queue_unbind(q, f"{uid}-missing-x", "k")  # missing exchange
    ch.queue_unbind(f"{uid}-missing-q", f"{uid}-missing-x", "k")
    assert ch.is_open


def test_queue_bind_missing_exchange_is_404(conn, ch, uid):
    q = temp_queue(ch)
    e = channel_error(conn, 404, ch.queue_bind, q, f"{uid}-missing", "k")
    text_has(e, "NOT_FOUND", f"no exchange '{uid}-missing'")


def test_queue_bind_missing_queue_is_404(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    e = channel_error(conn, 404, ch.queue_bind, f"{uid}-missing", x, "k")
    text_has(e, "NOT_FOUND", f"no queue '{uid}-missing'")


def test_queue_bind_routes_by_key(conn, ch):
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.queue_bind(q1, "amq.direct", q1)
    ch.queue_bind(q2, "amq.direct", q2)
    ch.basic_publish("amq.direct", q1, b"for-1")
    ch.basic_publish("amq.direct", q2, b"for-2")
    assert drain(ch, q1) == [b"for-1"]
    assert drain(ch, q2) == [b"for-2"]


# ------------------------------------------------------------------------------------------------------
# queue.purge
# ------------------------------------------------------------------------------------------------------


def test_queue_purge_removes_ready_only(conn, ch):
    q = temp_queue(ch)
    for i in range(4):
        ch.basic_publish("", q, b"m%d" % i)
    method, _, body = ch.basic_get(q, auto_ack=False)
    assert body == b"m0"
    ok = ch.queue_purge(q).method
    assert isinstance(ok, pika.spec.Queue.PurgeOk)
    assert ok.message_count == 3
    assert ch.basic_get(q)[0] is None
    ch.basic_reject(method.delivery_tag, requeue=True)  # the unacked one was not purged
    m2, _, body2 = ch.basic_get(q, auto_ack=True)
    assert body2 == b"m0" and m2.redelivered
    assert ch.queue_purge(q).method.message_count == 0


# ------------------------------------------------------------------------------------------------------
# queue.delete
# ------------------------------------------------------------------------------------------------------


def test_queue_delete_missing_is_ok_with_count_0(conn, ch, uid):
    ok = ch.queue_delete(f"{uid}-missing").method
    assert isinstance(ok, pika.spec.Queue.DeleteOk)
    assert ok.message_count == 0
    assert ch.is_open


def test_queue_delete_returns_message_count(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    for _ in range(3):
        ch.basic_publish("", q, b"m")
    assert ch.queue_delete(q).method.message_count == 3
    assert not queue_exists(conn, q)
    assert ch.queue_delete(q).method.message_count == 0  # again: idempotent


def test_queue_delete_count_excludes_unacked(conn, ch, uid):
    # RabbitMQ 3.10 reports the ready messages (BQ:len) in delete-ok, not those delivered and unacked.
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    for _ in range(3):
        ch.basic_publish("", q, b"m")
    assert ch.basic_get(q, auto_ack=False)[0] is not None
    assert ch.queue_delete(q).method.message_count == 2


def test_queue_delete_if_unused_with_consumer_is_406(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    e = channel_error(conn, 406, ch2.queue_delete, q, if_unused=True)
    text_has(e, "PRECONDITION_FAILED", "in use")
    assert queue_exists(conn, q)


def test_queue_delete_if_empty_with_messages_is_406(conn, ch, uid):
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    ch.confirm_delivery()  # the delete comes on another channel: make sure the message is enqueued first
    ch.basic_publish("", q, b"m")
    ch2 = conn.channel()
    e = channel_error(conn, 406, ch2.queue_delete, q, if_empty=True)
    text_has(e, "PRECONDITION_FAILED", "not empty")
    assert queue_exists(conn, q)
    drain(ch, q)
    assert conn.channel().queue_delete(q, if_empty=True, if_unused=True).method.message_count == 0
    assert not queue_exists(conn, q)


def test_queue_delete_sends_basic_cancel_to_consumers(connect, uid):
    consumer_conn = connect()
    cch = consumer_conn.channel()
    q = f"{uid}-q"
    cch.queue_declare(q, exclusive=True)
    cancels: list[pika.spec.Basic.Cancel] = []
    cch.add_on_cancel_callback(lambda frame: cancels.append(frame.method))
    tag = cch.basic_consume(q, lambda *a: None)
    assert tag in cch.consumer_tags
    consumer_conn.channel().queue_delete(q)  # another channel of the owning connection
    assert pump(consumer_conn, lambda: bool(cancels)), "no server-initiated basic.cancel"
    assert isinstance(cancels[0], pika.spec.Basic.Cancel)
    assert cancels[0].consumer_tag == tag
    assert tag not in cch.consumer_tags
    assert cch.is_open  # a cancel, not a channel close
    assert temp_queue(cch)
    cch.basic_cancel(tag)  # cancelling an already server-cancelled tag is not an error
    assert cch.is_open


def test_queue_delete_removes_bindings(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    q = f"{uid}-q"
    ch.queue_declare(q, exclusive=True)
    ch.queue_bind(q, x, "k")
    ch.queue_delete(q)
    ch.queue_declare(q, exclusive=True)  # same name: a new queue without the old binding
    ch.basic_publish(x, "k", b"m")
    assert drain(ch, q) == []


# ------------------------------------------------------------------------------------------------------
# the "last declared queue" shortcut (empty queue name)
# ------------------------------------------------------------------------------------------------------


def test_shortcut_bind_and_get(conn, ch, cleanup, uid):
    x = cleanup.exchange(f"{uid}-x")
    ch.exchange_declare(x, "direct")
    q = temp_queue(ch)
    ch.queue_bind("", x, "k")
    ch.basic_publish(x, "k", b"m")
    _, _, body = ch.basic_get("", auto_ack=True)
    assert body == b"m"
    assert drain(ch, q) == []


def test_shortcut_purge(conn, ch):
    q = temp_queue(ch)
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    assert ch.queue_purge("").method.message_count == 2


def test_shortcut_consume(conn, ch):
    q = temp_queue(ch)
    got: list[bytes] = []
    ch.basic_consume("", lambda c, m, p, body: got.append(body), auto_ack=True)
    assert queue_state(conn, q).consumer_count == 1
    ch.basic_publish("", q, b"m")
    assert pump(conn, lambda: bool(got))
    assert got == [b"m"]


def test_shortcut_delete(conn, ch):
    q = temp_queue(ch)
    ch.basic_publish("", q, b"m")
    assert ch.queue_delete("").method.message_count == 1
    assert not queue_exists(conn, q)


def test_shortcut_follows_latest_declare_including_passive(conn, ch):
    q1 = temp_queue(ch)
    q2 = temp_queue(ch)
    ch.basic_publish("", q1, b"in-1")
    ch.basic_publish("", q2, b"in-2")
    assert ch.basic_get("", auto_ack=True)[2] == b"in-2"
    ch.queue_declare(q1, passive=True)
    assert ch.basic_get("", auto_ack=True)[2] == b"in-1"


SHORTCUT_OPS = {
    "bind": lambda ch: ch.queue_bind("", "amq.direct", "k"),
    "consume": lambda ch: ch.basic_consume("", lambda *a: None),
    "purge": lambda ch: ch.queue_purge(""),
    "get": lambda ch: ch.basic_get(""),
    "delete": lambda ch: ch.queue_delete(""),
}


@pytest.mark.parametrize("op", list(SHORTCUT_OPS))
def test_shortcut_without_declared_queue_is_404(conn, ch, op):
    e = channel_error(conn, 404, SHORTCUT_OPS[op], ch)
    text_has(e, "NOT_FOUND", "no previously declared queue")


def test_shortcut_is_per_channel(conn, ch):
    temp_queue(ch)
    other = conn.channel()
    channel_error(conn, 404, other.basic_get, "")


# ------------------------------------------------------------------------------------------------------
# default exchange
# ------------------------------------------------------------------------------------------------------


def test_default_exchange_routes_by_queue_name(conn, ch):
    q1, q2 = temp_queue(ch), temp_queue(ch)
    ch.basic_publish("", q1, b"to-1")
    ch.basic_publish("", q2, b"to-2")
    ch.basic_publish("", "no-such-queue-" + q1, b"dropped")
    assert drain(ch, q1) == [b"to-1"]
    assert drain(ch, q2) == [b"to-2"]


def test_default_exchange_unknown_queue_is_unroutable(conn, ch, uid):
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", f"{uid}-missing", b"m", mandatory=True)
    assert ch.is_open


def test_publish_to_amq_default_is_404(conn, ch):
    q = temp_queue(ch)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.basic_publish("amq.default", q, b"m")
        ch.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 404
    assert conn.is_open


def test_publish_to_missing_exchange_is_404(conn, ch, uid):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.basic_publish(f"{uid}-missing", "k", b"m")
        ch.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 404
    text_has(ei.value, "NOT_FOUND", f"no exchange '{uid}-missing'")
    assert conn.is_open
