"""Dead-lettering: ``x-dead-letter-exchange`` / ``x-dead-letter-routing-key``, the reasons, and the exact
``x-death`` header, as RabbitMQ 3.10 writes it (docs/decisions/rabbitmq-parity.md).

What RabbitMQ 3.10.8 does, and what these tests check:

* reasons ``rejected`` (basic.reject / basic.nack with requeue=false), ``expired``, ``maxlen``
  (``delivery_limit`` is in test_queue_features.py, with quorum queues);
* ``x-death`` is an array of tables, newest first, one per {queue, reason}: ``queue``, ``reason``, ``exchange``
  (longstr), ``count`` (long, AMQP field type ``l``), ``time`` (timestamp), ``routing-keys`` (array of longstr,
  CC keys included, BCC never), plus ``original-expiration`` (longstr) only when the message had an
  ``expiration`` — which is then removed from the dead-lettered message. A repeat death for the same pair
  increments ``count`` and moves that entry to the front; its ``exchange`` and ``routing-keys`` stay those of
  the first death for that pair;
* ``x-first-death-queue/-reason/-exchange`` are set once;
* the dead-lettered message is published to the DLX with the DLRK if the queue has one (and then the CC header
  is removed) or else with its original routing keys, CC included;
* a message that would come back to a queue it already died in, with no ``rejected`` death in the cycle, is
  dropped; a cycle that contains a rejection goes on.

``x-last-death-queue/-reason/-exchange`` are written by RabbitMQ 3.13+ but NOT by 3.10, so those assertions
only run against a server that is not RabbitMQ < 3.13 (Leveret copies 3.13+): see ``writes_last_death``.

pika decodes the AMQP field type ``l`` (signed 64-bit) to ``pika.compat.long`` and ``I`` (signed 32-bit) to a
plain ``int``, so ``is_long`` checks the wire type of ``count``.
"""

from __future__ import annotations

import datetime

import pika
import pytest
from amqp_helpers import get_all, is_long, publish_to, pump, ready_count, settle, wait_get, wait_ready
from pika.exceptions import ChannelClosedByBroker

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------------------


def writes_last_death(conn) -> bool:
    """RabbitMQ writes x-last-death-* from 3.13 on; 3.10 does not. Leveret (and any other server) must."""
    props = conn._impl.server_properties or {}
    product, version = props.get("product"), props.get("version")
    if isinstance(product, bytes):
        product = product.decode()
    if isinstance(version, bytes):
        version = version.decode()
    if product != "RabbitMQ":
        return True
    try:
        major, minor = (int(p) for p in str(version).split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (3, 13)


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def check_death_entry(
    entry: dict,
    *,
    queue: str,
    reason: str,
    count: int,
    exchange: str,
    routing_keys: list[str],
    original_expiration: str | None = None,
    after: datetime.datetime | None = None,
    before: datetime.datetime | None = None,
) -> None:
    """Assert one x-death table exactly: its keys, values and decoded types."""
    expected_keys = {"queue", "reason", "count", "time", "exchange", "routing-keys"}
    if original_expiration is not None:
        expected_keys.add("original-expiration")
    assert set(entry) == expected_keys, entry
    assert entry["queue"] == queue and isinstance(entry["queue"], str)
    assert entry["reason"] == reason and isinstance(entry["reason"], str)
    assert entry["count"] == count and is_long(entry["count"]), (entry["count"], type(entry["count"]))
    assert entry["exchange"] == exchange and isinstance(entry["exchange"], str)
    assert entry["routing-keys"] == routing_keys
    assert all(isinstance(k, str) for k in entry["routing-keys"])
    assert isinstance(entry["time"], datetime.datetime)  # AMQP timestamp, whole seconds
    if after is not None:
        assert entry["time"] >= after.replace(microsecond=0) - datetime.timedelta(seconds=1)
    if before is not None:
        assert entry["time"] <= before + datetime.timedelta(seconds=1)
    if original_expiration is not None:
        assert entry["original-expiration"] == original_expiration
        assert isinstance(entry["original-expiration"], str)


# -- reasons and the x-death entry -------------------------------------------------------------------------


def test_reject_without_requeue_dead_letters_with_full_x_death(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    props = pika.BasicProperties(
        headers={"app": "kept", "n": 7},
        message_id="mid-1",
        priority=3,
        content_type="text/plain",
        delivery_mode=2,
    )
    before = now_utc()
    publish_to(conn, "", q, b"body", properties=props)
    ch = conn.channel()
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = wait_get(ch, dlq)
    after = now_utc()
    assert body == b"body"
    # delivered from the DLX with the original routing key (no DLRK set)
    assert (method.exchange, method.routing_key, method.redelivered) == (dlx, q, False)
    # the other properties and headers are untouched
    assert (props.message_id, props.priority, props.content_type, props.delivery_mode) == (
        "mid-1",
        3,
        "text/plain",
        2,
    )
    assert props.headers["app"] == "kept" and props.headers["n"] == 7
    assert props.expiration is None
    (death,) = props.headers["x-death"]
    check_death_entry(
        death, queue=q, reason="rejected", count=1, exchange="", routing_keys=[q], after=before, before=after
    )
    assert props.headers["x-first-death-queue"] == q
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-exchange"] == ""
    if writes_last_death(conn):  # RabbitMQ 3.10 does not write x-last-death-*; 3.13+ and Leveret do
        assert props.headers["x-last-death-queue"] == q
        assert props.headers["x-last-death-reason"] == "rejected"
        assert props.headers["x-last-death-exchange"] == ""
    else:
        assert not any(k.startswith("x-last-death-") for k in props.headers)
    assert ready_count(conn, q) == 0


def test_nack_without_requeue_dead_letters_all_in_order(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish_to(conn, "", q, b"n1", b"n2", b"n3")
    ch = conn.channel()
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[-1], multiple=True, requeue=False)
    assert wait_ready(conn, dlq, 3) == 3
    got = get_all(ch, dlq)
    assert [m[2] for m in got] == [b"n1", b"n2", b"n3"]
    for _m, props, _b in got:
        (death,) = props.headers["x-death"]
        assert (death["queue"], death["reason"], death["count"]) == (q, "rejected", 1)


def test_consumer_nack_single_dead_letters_that_one(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish_to(conn, "", q, b"keep", b"drop")
    seen = []

    def on_message(ch, method, _props, body):
        seen.append(body)
        if body == b"drop":
            ch.basic_nack(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)

    conn.channel().basic_consume(q, on_message)
    assert pump(conn, lambda: len(seen) == 2)
    ch = conn.channel()
    _m, props, body = wait_get(ch, dlq)
    assert body == b"drop"
    assert props.headers["x-death"][0]["reason"] == "rejected"
    settle(conn, 0.1)
    assert get_all(ch, dlq) == []


def test_reject_with_requeue_does_not_dead_letter(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish_to(conn, "", q, b"m")
    ch = conn.channel()
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=True)
    ch.basic_nack(ch.basic_get(q)[0].delivery_tag, requeue=True)
    settle(conn, 0.2)
    assert ready_count(conn, dlq) == 0
    assert ready_count(conn, q) == 1


def test_queue_ttl_expiry_dead_letters_as_expired(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx, "x-message-ttl": 100})
    publish_to(conn, "", q, b"old")
    _m, props, body = wait_get(conn.channel(), dlq)
    assert body == b"old"
    (death,) = props.headers["x-death"]
    # no expiration property on the message, so no original-expiration (the queue TTL is not recorded)
    check_death_entry(death, queue=q, reason="expired", count=1, exchange="", routing_keys=[q])
    assert props.headers["x-first-death-reason"] == "expired"
    if writes_last_death(conn):  # not written by RabbitMQ 3.10
        assert props.headers["x-last-death-reason"] == "expired"
        assert props.headers["x-last-death-queue"] == q


def test_per_message_expiration_dead_letters_with_original_expiration(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish_to(conn, "", q, b"e", properties=pika.BasicProperties(expiration="100", headers={"k": "v"}))
    _m, props, body = wait_get(conn.channel(), dlq)
    assert body == b"e"
    assert props.expiration is None  # removed, so that it does not expire again in the next queue
    (death,) = props.headers["x-death"]
    check_death_entry(
        death, queue=q, reason="expired", count=1, exchange="", routing_keys=[q], original_expiration="100"
    )
    assert props.headers["k"] == "v"


def test_rejected_message_with_expiration_records_original_expiration(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    publish_to(conn, "", q, b"e", properties=pika.BasicProperties(expiration="60000"))
    ch = conn.channel()
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    _m, props, _b = wait_get(ch, dlq)
    assert props.expiration is None
    (death,) = props.headers["x-death"]
    check_death_entry(
        death, queue=q, reason="rejected", count=1, exchange="", routing_keys=[q], original_expiration="60000"
    )


def test_max_length_drop_head_dead_letters_as_maxlen(conn, make_queue, dl_setup):
    dlx, dlq = dl_setup
    q = make_queue(arguments={"x-dead-letter-exchange": dlx, "x-max-length": 1})
    publish_to(conn, "", q, b"first", b"second")
    _m, props, body = wait_get(conn.channel(), dlq)
    assert body == b"first"
    (death,) = props.headers["x-death"]
    check_death_entry(death, queue=q, reason="maxlen", count=1, exchange="", routing_keys=[q])
    assert props.headers["x-first-death-reason"] == "maxlen"


def test_dead_letter_records_publishing_exchange_and_key(conn, make_queue, make_exchange, dl_setup):
    dlx, dlq = dl_setup
    x = make_exchange("src", "topic")
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    conn.channel().queue_bind(q, x, "orders.*")
    publish_to(conn, x, "orders.new", b"o")
    ch = conn.channel()
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    method, props, _b = wait_get(ch, dlq)
    assert (method.exchange, method.routing_key) == (dlx, "orders.new")
    (death,) = props.headers["x-death"]
    check_death_entry(death, queue=q, reason="rejected", count=1, exchange=x, routing_keys=["orders.new"])
    assert props.headers["x-first-death-exchange"] == x


# -- routing of dead-lettered messages: DLRK, CC, BCC ------------------------------------------------------


def test_dead_letter_routing_key_replaces_routing_key(conn, make_queue, make_exchange):
    dlx = make_exchange("dlx", "direct")
    hit, miss = make_queue("hit"), make_queue("miss")
    ch = conn.channel()
    ch.queue_bind(hit, dlx, "dead")
    q = make_queue(arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"})
    ch.queue_bind(miss, dlx, q)  # the original routing key must not be used
    publish_to(conn, "", q, b"m")
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    method, props, _b = wait_get(ch, hit)
    assert (method.exchange, method.routing_key) == (dlx, "dead")
    # x-death records the key the message was published with, not the DLRK
    assert props.headers["x-death"][0]["routing-keys"] == [q]
    settle(conn, 0.1)
    assert ready_count(conn, miss) == 0


def test_without_dlrk_cc_keys_are_kept_and_recorded(conn, make_queue, make_exchange):
    src = make_exchange("src", "direct")
    dlx = make_exchange("dlx", "direct")
    ch = conn.channel()
    out = {k: make_queue(f"out-{k}") for k in ("k1", "k2", "other")}
    for k, name in out.items():
        ch.queue_bind(name, dlx, k)
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(q, src, "k1")
    publish_to(conn, src, "k1", b"m", properties=pika.BasicProperties(headers={"CC": ["k2"], "BCC": ["k3"]}))
    method, props, _b = wait_get(ch, q, auto_ack=False)
    assert props.headers == {"CC": ["k2"]}  # BCC is stripped at publish
    ch.basic_reject(method.delivery_tag, requeue=False)
    # routed again with all its original keys: the routing key and the CC keys
    for k in ("k1", "k2"):
        method, props, body = wait_get(ch, out[k])
        assert body == b"m", k
        assert (method.exchange, method.routing_key) == (dlx, "k1")
        assert props.headers["CC"] == ["k2"]
        assert "BCC" not in props.headers
        (death,) = props.headers["x-death"]
        check_death_entry(death, queue=q, reason="rejected", count=1, exchange=src, routing_keys=["k1", "k2"])
    settle(conn, 0.1)
    assert ready_count(conn, out["other"]) == 0
    # (RabbitMQ 3.10 also routes the dead-lettered copy with the BCC key "k3"; not asserted either way)


def test_with_dlrk_cc_header_is_removed(conn, make_queue, make_exchange):
    src = make_exchange("src", "direct")
    dlx = make_exchange("dlx", "direct")
    ch = conn.channel()
    out = {k: make_queue(f"out-{k}") for k in ("dead", "k1", "k2")}
    for k, name in out.items():
        ch.queue_bind(name, dlx, k)
    q = make_queue(arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"})
    ch.queue_bind(q, src, "k1")
    publish_to(
        conn,
        src,
        "k1",
        b"m",
        properties=pika.BasicProperties(headers={"CC": ["k2"], "BCC": ["k3"], "keep": 1}),
    )
    ch.basic_reject(wait_get(ch, q, auto_ack=False)[0].delivery_tag, requeue=False)
    method, props, _b = wait_get(ch, out["dead"])
    assert (method.exchange, method.routing_key) == (dlx, "dead")
    assert "CC" not in props.headers and "BCC" not in props.headers
    assert props.headers["keep"] == 1
    # routing-keys still record what the message was published with (CC included, BCC not)
    assert props.headers["x-death"][0]["routing-keys"] == ["k1", "k2"]
    settle(conn, 0.1)
    assert ready_count(conn, out["k1"]) == 0
    assert ready_count(conn, out["k2"]) == 0


def test_missing_dead_letter_exchange_drops_message(conn, make_queue, uid):
    q = make_queue(arguments={"x-dead-letter-exchange": f"{uid}-no-such-exchange"})
    publish_to(conn, "", q, b"m")
    ch = conn.channel()
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=False)
    settle(conn, 0.2)
    assert ch.is_open and conn.is_open
    assert ready_count(conn, q) == 0


def refused_declare(conn, name: str, arguments: dict, durable: bool = False) -> str:
    """Declare ``name`` with ``arguments``, which the broker must refuse with 406 closing only the channel;
    returns the reply text."""
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(name, durable=durable, arguments=arguments)
    assert ei.value.reply_code == 406
    assert conn.is_open
    return ei.value.reply_text


@pytest.mark.parametrize("strategy", ["at-most-once", "at-least-once", "exactly-once"])
def test_a_classic_queue_refuses_a_dead_letter_strategy(conn, uid, strategy):
    """Only quorum queues take x-dead-letter-strategy (RabbitMQ 3.10.8 refuses it on a classic queue, whatever
    its value)."""
    text = refused_declare(conn, f"{uid}-q", {"x-dead-letter-strategy": strategy})
    assert text == (f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '{uid}-q' in vhost '/' "
                    "of queue type rabbit_classic_queue")


def test_a_quorum_queue_takes_the_known_dead_letter_strategies_only(conn, uid):
    text = refused_declare(conn, f"{uid}-bad", {"x-queue-type": "quorum", "x-dead-letter-strategy": "exactly-once"},
                           durable=True)
    assert text.startswith(f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '{uid}-bad'")
    ch = conn.channel()
    try:
        for strategy in ("at-most-once", "at-least-once"):
            ch.queue_declare(f"{uid}-{strategy}", durable=True, arguments={
                "x-queue-type": "quorum", "x-dead-letter-strategy": strategy, "x-overflow": "reject-publish"})
    finally:
        for strategy in ("at-most-once", "at-least-once"):
            ch.queue_delete(f"{uid}-{strategy}")
        ch.close()


def test_dlrk_without_dlx_is_406(conn, uid):
    text = refused_declare(conn, f"{uid}-q", {"x-dead-letter-routing-key": "k"})
    assert text.startswith("PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key'")


def test_non_string_dlx_is_406(conn, uid):
    """The channel's own check, before the queue's argument checks. RabbitMQ names the field type as it came on
    the wire (pika sends 5 as a signed 32-bit "signedint"); Leveret has only the decoded value ("long")."""
    text = refused_declare(conn, f"{uid}-q", {"x-dead-letter-exchange": 5})
    assert text.startswith("PRECONDITION_FAILED - invalid type '")
    assert text.endswith(f"' for arg 'x-dead-letter-exchange' in queue '{uid}-q' in vhost '/'")


# -- repeated deaths and cycles ----------------------------------------------------------------------------


def test_repeated_deaths_through_two_queues(conn, make_queue, make_exchange):
    """A (rejected by us) -> DLX "toB" -> B (TTL 100 ms, expires) -> DLX "toA" -> A -> rejected again ...

    An observer queue also bound to "toB" keeps a copy of every message leaving A, so x-death can be read
    both after A's deaths and (in A) after B's."""
    dlx = make_exchange("dlx", "direct")
    a = make_queue("A", arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "toB"})
    b = make_queue(
        "B",
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "toA", "x-message-ttl": 100},
    )
    obs = make_queue("obs")
    ch = conn.channel()
    ch.queue_bind(a, dlx, "toA")
    ch.queue_bind(b, dlx, "toB")
    ch.queue_bind(obs, dlx, "toB")
    start = now_utc()
    publish_to(conn, "", a, b"loop", properties=pika.BasicProperties(expiration="60000", message_id="m"))

    # round 1: rejected from A
    method, props, _b = wait_get(ch, a, auto_ack=False)
    assert props.expiration == "60000" and props.headers is None
    ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = wait_get(ch, obs)
    assert props.expiration is None
    (d_a,) = props.headers["x-death"]
    check_death_entry(
        d_a,
        queue=a,
        reason="rejected",
        count=1,
        exchange="",
        routing_keys=[a],
        original_expiration="60000",
        after=start,
        before=now_utc(),
    )

    # B expires it back into A: B's entry first, A's entry unchanged after it
    method, props, _b = wait_get(ch, a, auto_ack=False)
    assert (method.exchange, method.routing_key) == (dlx, "toA")
    d_b, d_a1 = props.headers["x-death"]
    check_death_entry(d_b, queue=b, reason="expired", count=1, exchange=dlx, routing_keys=["toB"])
    check_death_entry(
        d_a1, queue=a, reason="rejected", count=1, exchange="", routing_keys=[a], original_expiration="60000"
    )
    assert d_a1["time"] == d_a["time"]
    assert (
        props.headers["x-first-death-queue"],
        props.headers["x-first-death-reason"],
        props.headers["x-first-death-exchange"],
    ) == (a, "rejected", "")
    if writes_last_death(conn):  # RabbitMQ 3.10 does not write x-last-death-*; 3.13+ and Leveret do
        assert (
            props.headers["x-last-death-queue"],
            props.headers["x-last-death-reason"],
            props.headers["x-last-death-exchange"],
        ) == (b, "expired", dlx)

    # round 2: rejected from A again -> A's entry counts 2 and moves to the front; it keeps the exchange,
    # routing keys and time of its first death although this time the message came from the DLX with "toA"
    ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = wait_get(ch, obs)
    d_a2, d_b2 = props.headers["x-death"]
    check_death_entry(
        d_a2, queue=a, reason="rejected", count=2, exchange="", routing_keys=[a], original_expiration="60000"
    )
    assert d_a2["time"] == d_a["time"]
    check_death_entry(d_b2, queue=b, reason="expired", count=1, exchange=dlx, routing_keys=["toB"])
    assert (
        props.headers["x-first-death-queue"],
        props.headers["x-first-death-reason"],
        props.headers["x-first-death-exchange"],
    ) == (a, "rejected", "")
    if writes_last_death(conn):  # not on RabbitMQ 3.10
        assert (
            props.headers["x-last-death-queue"],
            props.headers["x-last-death-reason"],
            props.headers["x-last-death-exchange"],
        ) == (a, "rejected", dlx)

    # and B expires it once more: B's entry back in front with count 2
    method, props, _b = wait_get(ch, a, auto_ack=False)
    d_b3, d_a3 = props.headers["x-death"]
    assert (d_b3["queue"], d_b3["reason"], d_b3["count"]) == (b, "expired", 2)
    assert (d_a3["queue"], d_a3["reason"], d_a3["count"]) == (a, "rejected", 2)
    assert is_long(d_b3["count"]) and is_long(d_a3["count"])
    assert props.headers["x-first-death-queue"] == a
    ch.basic_ack(method.delivery_tag)


def test_rejection_cycle_into_same_queue_continues(conn, make_queue, make_exchange):
    dlx = make_exchange("dlx", "fanout")
    q = make_queue(arguments={"x-dead-letter-exchange": dlx})
    ch = conn.channel()
    ch.queue_bind(q, dlx)
    publish_to(conn, "", q, b"again")
    method, props, _b = wait_get(ch, q, auto_ack=False)
    assert props.headers is None
    for n in (1, 2, 3):
        ch.basic_reject(method.delivery_tag, requeue=False)
        method, props, body = wait_get(ch, q, auto_ack=False)
        assert body == b"again"
        (death,) = props.headers["x-death"]
        check_death_entry(death, queue=q, reason="rejected", count=n, exchange="", routing_keys=[q])
        assert method.exchange == dlx
    ch.basic_ack(method.delivery_tag)


def test_expiry_cycle_into_same_queue_is_dropped(conn, make_queue, make_exchange):
    """A queue whose TTL dead-letters into itself (no rejection anywhere): the message is dropped instead of
    re-entering the queue it died in. Other queues bound to the DLX still get their copy."""
    dlx = make_exchange("dlx", "fanout")
    q = make_queue(arguments={"x-dead-letter-exchange": dlx, "x-message-ttl": 100})
    obs = make_queue("obs")
    ch = conn.channel()
    ch.queue_bind(q, dlx)
    ch.queue_bind(obs, dlx)
    publish_to(conn, "", q, b"cycle")
    _m, props, _b = wait_get(ch, obs)
    (death,) = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (q, "expired", 1)
    settle(conn, 0.5)  # several TTL periods
    assert ready_count(conn, q) == 0
    assert ch.basic_get(q)[0] is None
    assert get_all(ch, obs) == []  # it never came back to expire a second time


def test_expiry_cycle_through_two_queues_is_dropped(conn, make_queue, make_exchange):
    """A (TTL) -> B (TTL) -> A: when it would re-enter A with only expiries in the cycle, it is dropped."""
    dlx = make_exchange("dlx", "direct")
    a = make_queue(
        "A",
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "toB", "x-message-ttl": 100},
    )
    b = make_queue(
        "B",
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "toA", "x-message-ttl": 100},
    )
    obs = make_queue("obs")
    ch = conn.channel()
    ch.queue_bind(a, dlx, "toA")
    ch.queue_bind(b, dlx, "toB")
    ch.queue_bind(obs, dlx, "toA")  # sees what B dead-letters towards A
    publish_to(conn, "", a, b"m")
    _m, props, _b = wait_get(ch, obs)
    assert [(d["queue"], d["reason"]) for d in props.headers["x-death"]] == [(b, "expired"), (a, "expired")]
    settle(conn, 0.5)
    assert ready_count(conn, a) == 0
    assert ready_count(conn, b) == 0
    assert get_all(ch, obs) == []
