"""Bindings counted per destination (broker/exchanges/exchange.py's ``ExchangeServices.bound``) and the limit
that reads the count (``leveret.max_bindings_per_queue``, broker/vhost.py's ``bind``).

The count is kept where bindings are added and removed, not computed by a scan, so every way a binding goes
must take it down: unbind, a deleted source exchange, a deleted destination exchange, a deleted queue, an
auto-delete exchange losing its last binding. A random mix of all of them is checked against a scan after
every step. An exchange inside another (``x-delayed-message``'s underlying type) does not count a binding
twice."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from broker.clock import ManualClock
from broker.errors import AMQPError
from broker.exchanges.exchange import EXCHANGE, QUEUE
from broker.vhost import VHost
from protocol.constants import PRECONDITION_FAILED


@pytest.fixture
def vh():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield VHost("/", clock=ManualClock())
    asyncio.set_event_loop(None)
    loop.close()


def scanned(vh: VHost) -> dict[tuple[str, str], int]:
    """The count as a scan of every exchange's bindings would give it."""
    return dict(Counter((b.kind, b.destination) for b in vh.bindings()))


def declare(vh: VHost, name: str, type_name: str = "direct", auto_delete: bool = False, **arguments) -> None:
    vh.declare_exchange(name, type_name, False, False, auto_delete, False, dict(arguments))


def test_the_count_follows_bind_unbind_and_deletions(vh):
    bound = vh.exchange_services
    for x in ("x1", "x2", "dx"):
        declare(vh, x)
    vh.bind("x1", "q", QUEUE, "a", {})
    vh.bind("x1", "q", QUEUE, "b", {})
    vh.bind("x2", "q", QUEUE, "a", {})
    vh.bind("x1", "q", QUEUE, "a", {})  # the same binding again: not a new one
    vh.bind("x1", "dx", EXCHANGE, "a", {})
    vh.bind("x2", "dx", EXCHANGE, "a", {})
    assert bound.bindings_to(QUEUE, "q") == 3
    assert bound.bindings_to(EXCHANGE, "dx") == 2
    assert bound.bindings_to(EXCHANGE, "q") == 0  # a queue and an exchange of one name are counted apart

    vh.unbind("x1", "q", QUEUE, "b", {})
    vh.unbind("x1", "q", QUEUE, "b", {})  # not bound any more: nothing to take down
    assert bound.bindings_to(QUEUE, "q") == 2
    vh.delete_exchange("x2", if_unused=False)  # its bindings to q and to dx go
    assert bound.bindings_to(QUEUE, "q") == 1
    assert bound.bindings_to(EXCHANGE, "dx") == 1
    vh.delete_exchange("dx", if_unused=False)  # the bindings whose destination it is go too
    assert bound.bindings_to(EXCHANGE, "dx") == 0
    vh.remove_bindings_to_queue("q")  # what deleting the queue does
    assert bound.bindings_to(QUEUE, "q") == 0
    assert bound.bound == {}  # nothing left behind for names that have no bindings


def test_an_exchange_inside_another_counts_a_binding_once(vh):
    declare(vh, "delayed", "x-delayed-message", **{"x-delayed-type": "direct"})
    vh.bind("delayed", "q", QUEUE, "k", {})
    assert vh.exchange_services.bindings_to(QUEUE, "q") == 1
    vh.delete_exchange("delayed", if_unused=False)
    assert vh.exchange_services.bound == {}


def test_the_limit_refuses_a_new_binding_only(vh):
    vh.max_bindings_per_queue = 2
    declare(vh, "x")
    declare(vh, "y", "fanout")
    declare(vh, "dx")
    vh.bind("x", "q", QUEUE, "a", {})
    vh.bind("x", "q", QUEUE, "b", {})
    vh.bind("x", "q", QUEUE, "a", {})  # at the limit, binding what is bound is still the no-op it is
    with pytest.raises(AMQPError) as e:
        vh.bind("y", "q", QUEUE, "", {})
    assert e.value.reply_code == PRECONDITION_FAILED
    assert e.value.reply_text == ("PRECONDITION_FAILED - queue 'q' in vhost '/' has reached its limit of 2 "
                                  "bindings (leveret.max_bindings_per_queue)")
    assert not vh.exchanges["y"].bindings  # refused: nothing half made
    vh.bind("y", "other-q", QUEUE, "", {})  # the limit is per destination

    vh.bind("x", "dx", EXCHANGE, "a", {})
    vh.bind("y", "dx", EXCHANGE, "", {})
    with pytest.raises(AMQPError) as e:
        vh.bind("x", "dx", EXCHANGE, "b", {})
    assert e.value.text.startswith("exchange 'dx' in vhost '/' has reached its limit of 2 bindings")

    vh.unbind("x", "q", QUEUE, "b", {})  # a place comes back
    vh.bind("y", "q", QUEUE, "", {})
    vh.max_bindings_per_queue = 0  # no limit
    for i in range(10):
        vh.bind("x", "q", QUEUE, f"k{i}", {})
    assert vh.exchange_services.bindings_to(QUEUE, "q") == 12


def test_the_count_equals_a_scan_after_any_mix_of_changes(vh):
    rng = random.Random(17)
    names = [f"x{i}" for i in range(5)]
    queues = [f"q{i}" for i in range(4)]
    for step in range(3000):
        op = rng.random()
        x = rng.choice(names)
        try:
            if op < 0.15:
                declare(vh, x, rng.choice(("direct", "fanout", "topic", "headers")), auto_delete=rng.random() < 0.3)
            elif op < 0.55:
                dest, kind = (rng.choice(queues), QUEUE) if rng.random() < 0.7 else (rng.choice(names), EXCHANGE)
                vh.bind(x, dest, kind, rng.choice(("a", "b", "a.b", "#")), {})
            elif op < 0.8:
                dest, kind = (rng.choice(queues), QUEUE) if rng.random() < 0.7 else (rng.choice(names), EXCHANGE)
                vh.unbind(x, dest, kind, rng.choice(("a", "b", "a.b", "#")), {})
            elif op < 0.92:
                vh.delete_exchange(x, if_unused=rng.random() < 0.3)
            else:
                vh.remove_bindings_to_queue(rng.choice(queues))
        except AMQPError:
            pass  # an exchange not declared (404), in use (406), a type redeclared (406)
        assert vh.exchange_services.bound == scanned(vh), f"step {step}"
