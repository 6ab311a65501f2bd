"""The ``x-delayed-message`` exchange (issue 14; broker/exchanges/delayed_exchange.py) with pika against a real broker:
declare errors, delays, bindings as they are at due time, the negated header, ``x-deliver-at``, the horizon,
confirms, mandatory, restart and kill -9 survival, exchange deletion, TTL / dead-lettering of the target.

The whole module is Leveret-only: RabbitMQ without the plugin refuses the exchange type, and the plugin
differs on purpose (horizon refusal, mandatory, deletion, ``x-deliver-at``)."""

from __future__ import annotations

import datetime
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, UnroutableError

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]
pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup

DELAYED = "x-delayed-message"
YEAR_MS = 365 * 24 * 3_600_000


def declare_delayed(ch, name: str, kind: str = "direct", durable: bool = False) -> None:
    ch.exchange_declare(name, DELAYED, durable=durable, arguments={"x-delayed-type": kind})


def publish(ch, exchange: str, key: str, body: bytes, headers: dict | None = None, persistent: bool = False,
            mandatory: bool = False, **props) -> None:
    ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers, delivery_mode=2 if persistent else 1,
                                                               **props), mandatory=mandatory)


def wait_get(ch, queue: str, timeout: float = 5.0):
    """(properties, body, arrival time) of the next message of ``queue``, polling until ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return props, body, time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"nothing arrived in {queue} within {timeout}s")


def drain(ch, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


@pytest.fixture
def ch(conn):
    return conn.channel()


@pytest.fixture
def names(uid, cleanup):
    def make(suffix: str) -> str:
        name = f"{uid}-{suffix}"
        cleanup[0].append(name)
        cleanup[1].append(name)
        return name
    return make


# -- declare ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("arguments", "text"), [
    ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": 5}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": DELAYED}, "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"),
    ({"x-delayed-type": "nonesuch"}, "unknown exchange type 'nonesuch'"),
])
def test_declare_refuses_a_missing_or_unknown_delayed_type(conn, names, arguments, text):
    with pytest.raises(ChannelClosedByBroker) as e:
        conn.channel().exchange_declare(names("x"), DELAYED, arguments=arguments)
    assert e.value.reply_code == 406 and text in e.value.reply_text


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
def test_every_routing_type_is_accepted_and_routes_at_once_without_a_delay(ch, names, kind):
    x, q = names("x"), names("q")
    declare_delayed(ch, x, kind)
    ch.queue_declare(q)
    ch.queue_bind(q, x, "k.a", arguments={"x-match": "any", "h": 1} if kind == "headers" else None)
    publish(ch, x, "k.a", b"now", headers={"h": 1})
    assert wait_get(ch, q, 1.0)[1] == b"now"


# -- delays -------------------------------------------------------------------------------------------------
def test_a_delayed_message_is_routed_when_due_by_the_bindings_as_they_are_then(ch, names):
    x, q = names("x"), names("q")
    declare_delayed(ch, x)
    ch.queue_declare(q)
    t0 = time.monotonic()
    publish(ch, x, "k", b"later", headers={"x-delay": 800})
    ch.queue_bind(q, x, "k")  # bound after the publish: the binding of due time counts
    time.sleep(0.4)
    assert drain(ch, q) == []
    props, body, at = wait_get(ch, q, 5.0)
    assert body == b"later"
    assert at - t0 >= 0.75
    assert props.headers["x-delay"] == -800  # negated, as the plugin does


@pytest.mark.parametrize("delay", [0, -5, None, "0"])
def test_zero_negative_or_absent_delay_routes_at_once(ch, names, delay):
    x, q = names("x"), names("q")
    declare_delayed(ch, x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    ch.confirm_delivery()
    publish(ch, x, "", b"m", headers=None if delay is None else {"x-delay": delay}, mandatory=True)
    props, body, _ = wait_get(ch, q, 0.5)
    assert body == b"m"
    assert (props.headers or {}).get("x-delay") == delay  # not held: not rewritten


def test_a_numeric_string_delay_is_a_delay_and_a_word_is_refused(conn, names):
    ch = conn.channel()
    x, q = names("x"), names("q")
    declare_delayed(ch, x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    publish(ch, x, "", b"s", headers={"x-delay": "600"})
    time.sleep(0.3)
    assert drain(ch, q) == []
    assert wait_get(ch, q, 5.0)[0].headers["x-delay"] == -600
    publish(ch, x, "", b"w", headers={"x-delay": "soon"})
    with pytest.raises(ChannelClosedByBroker) as e:
        ch.queue_declare(q, passive=True)
    assert e.value.reply_code == 406 and "x-delay" in e.value.reply_text


def test_x_deliver_at_schedules_for_an_absolute_time(ch, names):
    x, q = names("x"), names("q")
    declare_delayed(ch, x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    at_ms = int(time.time() * 1000) + 1000
    t0 = time.monotonic()
    publish(ch, x, "", b"ms", headers={"x-deliver-at": at_ms})
    stamp = datetime.datetime.fromtimestamp(time.time() + 2, tz=datetime.UTC).replace(microsecond=0)
    publish(ch, x, "", b"ts", headers={"x-deliver-at": stamp})
    time.sleep(0.5)
    assert drain(ch, q) == []
    props, body, at = wait_get(ch, q, 5.0)
    assert body == b"ms" and at - t0 >= 0.9 and props.headers["x-delay"] < 0
    assert wait_get(ch, q, 5.0)[1] == b"ts"


def test_a_delay_beyond_the_horizon_is_refused_naming_it(conn, names):
    ch = conn.channel()
    x = names("x")
    declare_delayed(ch, x, "fanout")
    publish(ch, x, "", b"far", headers={"x-delay": 3 * YEAR_MS})
    with pytest.raises(ChannelClosedByBroker) as e:
        ch.exchange_declare(x, passive=True)
    assert e.value.reply_code == 406
    assert "delayed_message.max_delay" in e.value.reply_text and str(2 * YEAR_MS) in e.value.reply_text
    ch2 = conn.channel()  # within the horizon: accepted (2^32 ms, which the plugin delivers at once)
    ch2.confirm_delivery()
    publish(ch2, x, "", b"long", headers={"x-delay": 2**32 + 5})


# -- confirms and mandatory ---------------------------------------------------------------------------------
def test_a_persistent_delayed_message_is_confirmed_and_arrives_after_the_confirm(ch, names):
    x, q = names("x"), names("q")
    declare_delayed(ch, x, "direct", durable=True)
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, x, "k")
    ch.confirm_delivery()
    t0 = time.monotonic()
    # Due in 3 s: a loaded CI machine's fsynced confirm takes up to a second or so, still well before it.
    publish(ch, x, "k", b"p", headers={"x-delay": 3000}, persistent=True)  # raises unless acked
    confirmed = time.monotonic()
    assert confirmed - t0 < 3.0  # the confirm does not wait for the due time
    assert drain(ch, q) == []
    props, body, at = wait_get(ch, q, 15.0)
    assert body == b"p" and props.delivery_mode == 2 and at >= confirmed


def test_mandatory_returns_only_when_no_binding_would_route_now(ch, names):
    x, q = names("x"), names("q")
    declare_delayed(ch, x, "direct")
    ch.queue_declare(q)
    ch.queue_bind(q, x, "bound")
    ch.confirm_delivery()
    publish(ch, x, "bound", b"routable", headers={"x-delay": 300}, mandatory=True)  # no return
    with pytest.raises(UnroutableError):
        publish(ch, x, "nobody", b"unroutable", headers={"x-delay": 300}, mandatory=True)
    assert wait_get(ch, q, 5.0)[1] == b"routable"


# -- target queue behaviour ---------------------------------------------------------------------------------
def test_a_due_message_meets_the_target_queues_ttl_and_dead_lettering(ch, names):
    x, q, dlx, dlq = names("x"), names("q"), names("dlx"), names("dlq")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    declare_delayed(ch, x, "fanout")
    ch.queue_declare(q, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": dlx})
    ch.queue_bind(q, x)
    publish(ch, x, "", b"d", headers={"x-delay": 400})
    props, body, _ = wait_get(ch, dlq, 5.0)
    assert body == b"d"
    death = props.headers["x-death"][0]
    assert death["reason"] == "expired" and death["queue"] == q
    assert props.headers["x-delay"] == -400


# -- deletion -----------------------------------------------------------------------------------------------
def test_deleting_the_exchange_drops_its_pending_messages(ch, names):
    x, q = names("x"), names("q")
    declare_delayed(ch, x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    publish(ch, x, "", b"gone", headers={"x-delay": 500})
    ch.exchange_delete(x)
    declare_delayed(ch, x, "fanout")  # a namesake does not inherit them (the plugin's #220)
    ch.queue_bind(q, x)
    time.sleep(1.2)
    assert drain(ch, q) == []


# -- restart ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_pending_messages_survive_a_restart_and_arrive_once(start_broker, how):
    b = start_broker("--management-port", "0", "--prometheus-port", "0")
    c = pika.BlockingConnection(b.pika_params())
    ch = c.channel()
    declare_delayed(ch, "dx", "direct", durable=True)
    ch.queue_declare("dq", durable=True)
    ch.queue_bind("dq", "dx", "k")
    ch.confirm_delivery()
    for i in range(20):
        publish(ch, "dx", "k", b"m%d" % i, headers={"x-delay": 1500 + 10 * i}, persistent=True)
    assert ch.queue_declare("dq", durable=True, passive=True).method.message_count == 0  # all still held
    if how == "kill9":
        b.kill9()
    else:
        b.stop()
    b.start()
    c = pika.BlockingConnection(b.pika_params())
    ch = c.channel()
    got = []  # (the restart may take longer than the delays: then they are due at once)
    deadline = time.monotonic() + 15
    while len(got) < 20 and time.monotonic() < deadline:
        got.extend(drain(ch, "dq"))
        time.sleep(0.05)
    time.sleep(0.5)
    got.extend(drain(ch, "dq"))
    assert sorted(got) == sorted(b"m%d" % i for i in range(20))  # each once
    # Dispatched ones stay dispatched across a further restart.
    c.close()
    b.kill9()
    b.start()
    c = pika.BlockingConnection(b.pika_params())
    ch = c.channel()
    time.sleep(1.0)
    assert drain(ch, "dq") == []
    c.close()
