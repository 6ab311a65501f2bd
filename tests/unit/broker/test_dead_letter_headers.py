"""Dead-letter headers (broker/queues/dead_letter.py, RabbitMQ 3.13's ``rabbit_dead_letter``): the ``x-death``
entry of each {queue, reason}, its count folding, ``x-first-death-*`` / ``x-last-death-*``, what happens to
``expiration``, CC and BCC, and the cycle rule. Time comes from a ManualClock, as the queue process hands it
its vhost's clock, so the ``time`` field is checked exactly."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.message import Message
from broker.publish import ROUTED
from broker.queues import dead_letter
from broker.queues.dead_letter import EXPIRED, MAXLEN, REJECTED, deaths_of, is_cycle, make_dead_letter
from broker.vhost import VHost
from protocol.fastcodec import build_content_header, shortstr
from protocol.properties import decode_properties

START_MS = 1_700_000_000_000.0  # 2023-11-14 22:13:20 UTC


def message(exchange: str, key: str, body: bytes = b"m", **props) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(**props).marshal())
    return Message(exchange, key, shortstr(exchange) + shortstr(key), header, body)


def utc(ms: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(ms / 1000), tz=datetime.UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_MS + 250)  # a fraction of a second: x-death's time is whole seconds


def test_first_death_writes_one_entry_and_the_first_and_last_headers(clock):
    msg = message("orders", "new", expiration="5000", delivery_mode=2, message_id="m-1",
                  headers={"h": 1})
    dead = make_dead_letter(msg, "work", EXPIRED, "dlx", None, clock.now_ms())
    assert (dead.exchange, dead.routing_key, dead.published_at) == ("dlx", "new", clock.now_ms())
    assert dead.names_raw == shortstr("dlx") + shortstr("new")
    headers = dead.headers
    assert headers["x-death"] == [{"count": 1, "reason": "expired", "queue": "work", "time": utc(START_MS),
                                   "exchange": "orders", "routing-keys": ["new"],
                                   "original-expiration": "5000"}]
    assert {k: v for k, v in headers.items() if k.startswith("x-") and k != "x-death"} == {
        "x-first-death-queue": "work", "x-first-death-reason": "expired", "x-first-death-exchange": "orders",
        "x-last-death-queue": "work", "x-last-death-reason": "expired", "x-last-death-exchange": "orders"}
    assert headers["h"] == 1
    props = decode_properties(dead.header)
    # expiration is moved into the x-death entry; every other property is kept.
    assert (props.expiration, props.delivery_mode, props.message_id) == (None, 2, "m-1")
    assert dead.body == msg.body


def test_no_original_expiration_without_an_expiration(clock):
    dead = make_dead_letter(message("", "q"), "q", REJECTED, "dlx", None, clock.now_ms())
    (entry,) = dead.headers["x-death"]
    assert "original-expiration" not in entry
    assert entry["exchange"] == "" and entry["reason"] == "rejected"


def test_a_repeat_death_folds_into_its_entry_and_moves_it_to_the_front(clock):
    msg = message("orders", "new")
    first = make_dead_letter(msg, "work", EXPIRED, "dlx", "retry", clock.now_ms())
    clock.advance(60)
    second = make_dead_letter(first, "retry-q", REJECTED, "back", None, clock.now_ms())
    clock.advance(60)
    third = make_dead_letter(second, "work", EXPIRED, "dlx", "retry", clock.now_ms())
    deaths = third.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [("work", "expired", 2),
                                                                       ("retry-q", "rejected", 1)]
    # The folded entry keeps the time, exchange and routing keys of its first death.
    assert deaths[0]["time"] == utc(START_MS)
    assert (deaths[0]["exchange"], deaths[0]["routing-keys"]) == ("orders", ["new"])
    assert deaths[1]["time"] == utc(START_MS + 60_000)
    assert (deaths[1]["exchange"], deaths[1]["routing-keys"]) == ("dlx", ["retry"])
    assert deaths_of(third) == [("work", "expired"), ("retry-q", "rejected")]
    headers = third.headers
    # First-death headers are written once; last-death ones every time (the exchange it was last published to).
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"], headers["x-first-death-exchange"]) \
        == ("work", "expired", "orders")
    assert (headers["x-last-death-queue"], headers["x-last-death-reason"], headers["x-last-death-exchange"]) \
        == ("work", "expired", "back")


def test_same_queue_other_reason_is_a_new_entry(clock):
    once = make_dead_letter(message("x", "k"), "q", MAXLEN, "dlx", None, clock.now_ms())
    clock.advance(2)
    twice = make_dead_letter(once, "q", EXPIRED, "dlx", None, clock.now_ms())
    assert [(d["reason"], d["count"], d["time"]) for d in twice.headers["x-death"]] == [
        ("expired", 1, utc(START_MS + 2000)), ("maxlen", 1, utc(START_MS))]


def test_cc_keys_are_recorded_and_kept_bcc_is_removed(clock):
    msg = message("x", "k", headers={"CC": ["c1", "c2"], "BCC": ["b"]})
    dead = make_dead_letter(msg, "q", REJECTED, "dlx", None, clock.now_ms())
    assert dead.headers["x-death"][0]["routing-keys"] == ["k", "c1", "c2"]
    assert "BCC" not in dead.headers and dead.headers["CC"] == ["c1", "c2"]
    assert (dead.routing_key, dead.extra_keys) == ("k", ["c1", "c2"])  # routed by the original keys


def test_a_dead_letter_routing_key_replaces_the_keys_and_drops_cc(clock):
    msg = message("x", "k", headers={"CC": ["c1"], "BCC": ["b"]})
    dead = make_dead_letter(msg, "q", REJECTED, "dlx", "dead", clock.now_ms())
    assert (dead.routing_key, dead.extra_keys) == ("dead", None)
    assert "CC" not in dead.headers and "BCC" not in dead.headers
    assert dead.headers["x-death"][0]["routing-keys"] == ["k", "c1"]  # what it was published with


def test_the_cycle_rule():
    # Dropped when it would reach a queue it already died in, unless a rejection came since.
    assert is_cycle("a", [("a", EXPIRED)])
    assert is_cycle("a", [("b", EXPIRED), ("a", MAXLEN)])
    assert not is_cycle("a", [("b", EXPIRED)])
    assert not is_cycle("a", [("a", REJECTED)])
    assert not is_cycle("a", [("b", REJECTED), ("a", EXPIRED)])
    assert is_cycle("a", [("b", EXPIRED), ("a", EXPIRED), ("c", REJECTED)])  # the rejection was before
    assert not is_cycle("a", [])


@pytest.fixture
def vh(clock):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield VHost("/", clock=clock)
    asyncio.set_event_loop(None)
    loop.close()


def test_publishing_a_dead_letter_skips_the_queues_of_a_cycle(vh, clock):
    src = vh.queues.declare("src", False, False, False, False, {}, None)[0]
    other = vh.queues.declare("other", False, False, False, False, {}, None)[0]
    vh.declare_exchange("dlx", "fanout", False, False, False, False, {})
    vh.bind("dlx", "src", "queue", "", {})
    vh.bind("dlx", "other", "queue", "", {})
    dead = make_dead_letter(message("", "src"), "src", EXPIRED, "dlx", None, clock.now_ms())
    clock.advance(1.5)
    assert vh.publish(vh.exchanges["dlx"], dead, False, dead_letter=True) == ROUTED
    assert (src.message_count(), other.message_count()) == (0, 1)
    assert dead.published_at == clock.now_ms()  # stamped again, on the vhost's clock, when republished
    rejected = make_dead_letter(message("", "src"), "src", dead_letter.REJECTED, "dlx", None, clock.now_ms())
    assert vh.publish(vh.exchanges["dlx"], rejected, False, dead_letter=True) == ROUTED
    assert (src.message_count(), other.message_count()) == (1, 2)  # a rejection is no cycle
