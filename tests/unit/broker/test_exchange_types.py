"""The exchange-type seam (broker/exchanges/exchange_types.py): a type registered in ``EXCHANGE_TYPES`` is built by its
vhost with the vhost's services, checks its own declare arguments, hears of its life through its hooks, and
may hold a message and let it go later through the one publish path. The toy type here is a small delayed
exchange (``x-delay`` ms, routed by its bindings as they are when due), the shape of issue 14's
``x-delayed-message``; it lives only in this test."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock, TimerHandle
from broker.errors import AMQPError
from broker.exchanges.exchange import DirectExchange, Exchange
from broker.exchanges.exchange_types import EXCHANGE_TYPES, exchange_type
from broker.message import Message
from broker.observability.counters import MessageSizes
from broker.publish import PENDING, ROUTED, Publisher
from broker.vhost import VHost
from protocol.constants import PRECONDITION_FAILED
from protocol.fastcodec import build_content_header, shortstr

TOY = "x-toy-delayed"


class ToyDelayedExchange(DirectExchange):
    """Holds each message ``x-delay`` ms (the direct exchange's routing when due); confirms a publish on the
    next tick, as a store would after its fsync."""

    type_name = TOY
    description = "Toy delayed exchange (tests only)"
    holds_messages = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.events: list[str] = []
        self.timers: list[TimerHandle] = []

    @classmethod
    def validate_arguments(cls, name: str, vhost: str, arguments: dict[str, Any]) -> None:
        super().validate_arguments(name, vhost, arguments)
        if arguments.get("x-toy-type") != "direct":
            raise AMQPError(PRECONDITION_FAILED, f"Invalid argument, 'x-toy-type' must be 'direct' "
                            f"(exchange '{name}' in vhost '{vhost}')")

    def on_declare(self) -> None:
        self.events.append("declare")

    def on_recover(self) -> None:
        self.events.append("recover")

    def on_delete(self) -> None:
        self.events.append("delete")
        for timer in self.timers:
            timer.cancel()

    def close(self) -> None:
        self.events.append("close")

    def hold(self, msg: Message, persistent: bool, publisher: Publisher | None, confirm_seq: int) -> int:
        services = self.services
        delay_ms = int(msg.headers.get("x-delay", 0))
        self.timers.append(services.call_later(delay_ms / 1000, self._due, msg, persistent))
        result = ROUTED if services.route(self, msg) else 0
        if publisher is not None and confirm_seq > 0:
            services.call_later(0, publisher.confirm_from_queue, confirm_seq)
            result |= 1 << PENDING
        return result

    def _due(self, msg: Message, persistent: bool) -> None:
        self.events.append(f"due {self.services.publish(self, msg, persistent, held=True)}")


@pytest.fixture
def toy_type(monkeypatch):
    monkeypatch.setitem(EXCHANGE_TYPES, TOY, ToyDelayedExchange)
    return ToyDelayedExchange


class Counters:
    def __init__(self) -> None:
        self.messages_received = self.messages_received_confirm = self.messages_routed = 0
        self.messages_unroutable_dropped = self.messages_unroutable_returned = 0
        self.message_sizes = MessageSizes()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def vh(clock):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield VHost("/", Counters(), clock=clock)
    asyncio.set_event_loop(None)
    loop.close()


def message(exchange: str, key: str, **headers: Any) -> Message:
    header = build_content_header(1, spec.Basic.Properties(headers=headers or None).marshal())
    return Message(exchange, key, shortstr(exchange) + shortstr(key), header, b"m")


def declare_toy(vh: VHost, name: str = "later") -> ToyDelayedExchange:
    ex, created = vh.declare_exchange(name, TOY, False, True, False, False, {"x-toy-type": "direct"})
    assert created and isinstance(ex, ToyDelayedExchange)
    return ex


def test_the_built_in_types_are_registered_with_a_description():
    assert sorted(EXCHANGE_TYPES) == ["direct", "fanout", "headers", "topic", "x-delayed-message",
                                     "x-message-deduplication"]
    for name, cls in EXCHANGE_TYPES.items():
        assert cls.type_name == name and exchange_type(name) is cls
        if not name.startswith("x-"):
            assert cls.description == f"AMQP {name} exchange, as per the AMQP specification"
    assert EXCHANGE_TYPES["x-message-deduplication"].description == "Message Deduplication Exchange."
    assert exchange_type("x-nothing") is None


def test_every_exchange_of_a_vhost_has_its_services(vh, clock):
    services = vh.exchange_services
    assert vh.default_exchange.services is services
    assert all(ex.services is services for ex in vh.exchanges.values())
    assert services.vhost == "/" and services.clock is clock
    with pytest.raises(RuntimeError, match="built without services"):
        _ = DirectExchange("loose").services


def test_a_registered_type_is_built_with_the_services_and_hears_its_declare(vh, toy_type, clock):
    ex = declare_toy(vh)
    assert vh.exchanges["later"] is ex and ex.type_name == TOY
    assert ex.services is vh.exchange_services
    assert ex.services.clock is clock and ex.services.durable is None
    assert ex.events == ["declare"]
    again, created = vh.declare_exchange("later", TOY, False, True, False, False, {"x-toy-type": "direct"})
    assert (again, created, ex.events) == (ex, False, ["declare"])  # a redeclare is no new declare
    passive, _ = vh.declare_exchange("later", TOY, True, True, False, False, {})
    assert passive is ex

    class Durable:
        storage = object()

    vh.durable = Durable()  # the node opens its storage after the vhost exists: services see it then
    assert ex.services.durable is vh.durable


def test_the_type_checks_its_own_arguments(vh, toy_type):
    with pytest.raises(AMQPError) as err:
        vh.declare_exchange("bad", TOY, False, True, False, False, {"x-toy-type": "fanout"})
    assert err.value.reply_code == PRECONDITION_FAILED
    assert "'x-toy-type' must be 'direct'" in err.value.reply_text
    assert "bad" not in vh.exchanges
    # The check is the type's: a redeclare is checked too, and the common checks still run first.
    declare_toy(vh)
    with pytest.raises(AMQPError, match="x-toy-type"):
        vh.declare_exchange("later", TOY, False, True, False, False, {})
    with pytest.raises(AMQPError, match="invalid arg 'alternate-exchange'"):
        vh.declare_exchange("ae", TOY, False, True, False, False, {"x-toy-type": "direct",
                                                                   "alternate-exchange": b"\xff"})


def test_the_built_in_types_check_alternate_exchange_on_every_declare_path(vh):
    with pytest.raises(AMQPError, match="invalid arg 'alternate-exchange' for exchange 'x'"):
        vh.declare_exchange("x", "topic", False, True, False, False, {"alternate-exchange": b"\xff\xfe"})
    with pytest.raises(AMQPError, match="unknown exchange type 'x-nothing'"):
        vh.declare_exchange("x", "x-nothing", False, True, False, False, {})
    assert "x" not in vh.exchanges


def test_a_held_message_is_routed_by_the_bindings_it_finds_when_due(vh, toy_type, clock):
    ex = declare_toy(vh)
    q = vh.queues.declare("q", False, False, False, False, {}, None)[0]
    msg = message("later", "k", **{"x-delay": 5000})
    # No binding yet: held, and the publisher learns it would not be routed now (a mandatory one is returned).
    assert vh.publish(ex, msg, False, mandatory=True) == 0
    assert q.message_count() == 0 and clock.pending == 1
    vh.bind("later", "q", "queue", "k", {})
    clock.advance(4.999)
    assert q.message_count() == 0
    clock.advance(0.002)
    assert q.message_count() == 1
    assert ex.events == ["declare", f"due {ROUTED}"]
    assert msg.published_at == clock.now_ms() - 1  # stamped when routed: the queue's TTL counts from then
    # Counted once, as the client's publish, not again when let go.
    assert (vh.counters.messages_received, vh.counters.messages_unroutable_returned,
            vh.counters.messages_routed) == (1, 1, 0)
    assert vh.publish(ex, message("later", "k", **{"x-delay": 10}), False) == ROUTED
    clock.advance(0.01)
    assert q.message_count() == 2


def test_a_holding_type_answers_confirms_itself(vh, toy_type, clock):
    ex = declare_toy(vh)
    vh.queues.declare("q", False, False, False, False, {}, None)
    vh.bind("later", "q", "queue", "k", {})

    class Channel:
        def __init__(self) -> None:
            self.reader = None
            self.published_to: set = set()
            self.confirmed: list[int] = []

        def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
            self.confirmed.append(seq)

    channel = Channel()
    result = vh.publish(ex, message("later", "k", **{"x-delay": 1000}), True, False, channel, 7)
    assert result & ROUTED and result >> PENDING == 1  # the channel waits for one confirm
    assert channel.confirmed == []
    clock.advance(0)
    assert channel.confirmed == [7]
    assert vh.counters.messages_received_confirm == 1


def test_deleting_the_exchange_calls_on_delete_and_drops_what_it_held(vh, toy_type, clock):
    ex = declare_toy(vh)
    q = vh.queues.declare("q", False, False, False, False, {}, None)[0]
    vh.bind("later", "q", "queue", "k", {})
    vh.publish(ex, message("later", "k", **{"x-delay": 1000}), False)
    vh.delete_exchange("later", if_unused=False)
    assert "later" not in vh.exchanges and ex.bindings == {}
    assert ex.events == ["declare", "delete"]
    clock.advance(2)
    assert q.message_count() == 0 and clock.pending == 0


def test_auto_delete_goes_through_on_delete_too(vh, toy_type):
    ex, _ = vh.declare_exchange("auto", TOY, False, False, True, False, {"x-toy-type": "direct"})
    vh.queues.declare("q", False, False, False, False, {}, None)
    vh.bind("auto", "q", "queue", "k", {})
    vh.unbind("auto", "q", "queue", "k", {})
    assert "auto" not in vh.exchanges and ex.events == ["declare", "delete"]


def test_recovery_and_stopping_call_their_hooks(vh, toy_type):
    vh.restore_exchange("kept", TOY, False, False, {"x-toy-type": "direct"})
    kept = vh.exchanges["kept"]
    assert isinstance(kept, ToyDelayedExchange) and kept.durable
    assert kept.services is vh.exchange_services and kept.events == ["recover"]
    vh.restore_exchange("kept", TOY, False, False, {"x-toy-type": "direct"})  # already there: left alone
    assert vh.exchanges["kept"] is kept and kept.events == ["recover"]
    vh.restore_exchange("gone", "x-no-such-type", False, False, {})  # skipped (with a log line)
    assert "gone" not in vh.exchanges
    vh.stop_exchanges()
    assert kept.events == ["recover", "close"]
    vh.stop_exchanges(vhost_deleted=True)
    assert kept.events == ["recover", "close", "delete"]


def test_a_type_that_does_not_hold_is_routed_at_once(vh):
    assert Exchange.holds_messages is False
    q = vh.queues.declare("q", False, False, False, False, {}, None)[0]
    vh.bind("amq.direct", "q", "queue", "k", {})
    assert vh.publish(vh.exchanges["amq.direct"], message("amq.direct", "k", **{"x-delay": 5000}), False) == ROUTED
    assert q.message_count() == 1
