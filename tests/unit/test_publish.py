"""The one publish path in process (broker/publish.py, VHost.publish): its packed result, the publish time it
stamps, its counters, dead letters (no client counters, the cycle rule), direct reply-to, and the checks of a
client's properties (user-id, expiration, CC / BCC) that the channel and the HTTP API share."""

from __future__ import annotations

import asyncio
import time

import pytest
from pamqp import commands as spec

from broker.errors import AMQPError
from broker.message import Message
from broker.observability.counters import MessageSizes
from broker.publish import PENDING, REFUSED, ROUTED, check_properties, property_flags
from broker.security.auth import User
from broker.vhost import VHost
from protocol.fastcodec import build_content_header, shortstr

COUNTERS = ("messages_received", "messages_received_confirm", "messages_routed", "messages_unroutable_dropped",
            "messages_unroutable_returned")


class Counters:
    def __init__(self) -> None:
        for name in COUNTERS:
            setattr(self, name, 0)
        self.message_sizes = MessageSizes()

    def values(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS if getattr(self, name)}


class Replies:
    def __init__(self) -> None:
        self.got: list[Message] = []

    def deliver_reply(self, msg: Message) -> int:
        if msg.routing_key.endswith(".known"):
            self.got.append(msg)
            return 1
        return 0


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture
def vh(loop) -> VHost:
    return VHost("/", Counters(), Replies())


def message(exchange: str, key: str, body: bytes = b"m", **props) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(**props).marshal())
    return Message(exchange, key, shortstr(exchange) + shortstr(key), header, body)


def declare(vh: VHost, name: str, **arguments):
    return vh.queues.declare(name, False, False, False, False, arguments, None)[0]


def test_a_routed_publish_is_stamped_counted_and_enqueued(vh):
    q = declare(vh, "q")
    msg = message("", "q")
    before = time.time() * 1000
    assert vh.publish(vh.default_exchange, msg, False) == ROUTED
    assert before <= msg.published_at <= time.time() * 1000  # TTLs count from here
    assert q.message_count() == 1
    assert vh.counters.values() == {"messages_received": 1, "messages_routed": 1}


def test_unroutable_publishes_count_as_returned_or_dropped(vh):
    assert vh.publish(vh.default_exchange, message("", "nowhere"), False, mandatory=True) == 0
    assert vh.publish(vh.exchanges["amq.direct"], message("amq.direct", "k"), False) == 0
    assert vh.counters.values() == {"messages_received": 2, "messages_unroutable_returned": 1,
                                    "messages_unroutable_dropped": 1}


def test_exchange_bindings_and_alternate_exchange_are_followed(vh):
    declare(vh, "q1")
    declare(vh, "q2")
    vh.declare_exchange("ae", "fanout", False, False, False, False, {})
    vh.declare_exchange("x", "direct", False, False, False, False, {"alternate-exchange": "ae"})
    vh.bind("x", "amq.topic", "exchange", "k", {})
    vh.bind("amq.topic", "q1", "queue", "#", {})
    vh.bind("ae", "q2", "queue", "", {})
    assert vh.publish(vh.exchanges["x"], message("x", "k"), False) == ROUTED
    assert vh.publish(vh.exchanges["x"], message("x", "other"), False) == ROUTED
    assert [vh.queues.get("q1").message_count(), vh.queues.get("q2").message_count()] == [1, 1]


def test_a_refusing_queue_sets_refused_and_confirms_are_counted(vh):
    declare(vh, "full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    declare(vh, "ok")

    class Publisher:
        def __init__(self) -> None:
            self.reader = None
            self.published_to: set = set()

        def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
            pass

    vh.declare_exchange("fan", "fanout", False, False, False, False, {})
    vh.bind("fan", "full", "queue", "", {})
    vh.bind("fan", "ok", "queue", "", {})
    result = vh.publish(vh.exchanges["fan"], message("fan", ""), False, False, Publisher(), 1)
    assert result & ROUTED and result & REFUSED and result >> PENDING == 0
    assert vh.counters.values() == {"messages_received": 1, "messages_received_confirm": 1, "messages_routed": 1}


def test_direct_reply_to_goes_to_the_reply_consumer(vh):
    msg = message("", "amq.rabbitmq.reply-to.known")
    assert vh.publish(vh.default_exchange, msg, False) == ROUTED
    assert vh.replies.got == [msg]
    assert vh.publish(vh.default_exchange, message("", "amq.rabbitmq.reply-to.gone"), False) == 0


def test_a_dead_letter_skips_client_counters_and_queues_it_died_in(vh):
    from broker.queues import dead_letter

    declare(vh, "src")
    other = declare(vh, "other")
    vh.declare_exchange("dlx", "fanout", False, False, False, False, {})
    vh.bind("dlx", "src", "queue", "", {})
    vh.bind("dlx", "other", "queue", "", {})
    dead = dead_letter.make_dead_letter(message("", "src"), "src", dead_letter.EXPIRED, "dlx", None, vh.clock.now_ms())
    assert vh.publish(vh.exchanges["dlx"], dead, False, dead_letter=True) == ROUTED
    assert (vh.queues.get("src").message_count(), other.message_count()) == (0, 1)
    assert vh.counters.values() == {}
    only_src = dead_letter.make_dead_letter(message("", "src"), "src", dead_letter.EXPIRED, "", "src", vh.clock.now_ms())
    assert vh.publish(vh.default_exchange, only_src, False, dead_letter=True) == 0  # a cycle: dropped


# -- a client's properties ------------------------------------------------------------------------------------

def check(msg: Message, user: User, reply_key: str | None = None) -> bool:
    return check_properties(msg, property_flags(msg.header), user, reply_key)


def test_user_id_must_be_the_publisher_unless_impersonator():
    guest, imp = User("guest", "", []), User("imp", "", ["impersonator"])
    assert check(message("", "q", user_id="guest"), guest) is False
    with pytest.raises(AMQPError) as err:
        check(message("", "q", user_id="else"), guest)
    assert (err.value.reply_code, err.value.reply_text) == (
        406, "PRECONDITION_FAILED - user_id property set to 'else' but authenticated user was 'guest'")
    check(message("", "q", user_id="else"), imp)


def test_expiration_delivery_mode_cc_bcc_and_reply_to():
    guest = User("guest", "", [])
    msg = message("", "q", expiration="1500", delivery_mode=2, headers={"CC": ["a"], "BCC": ["b"], "h": 1})
    assert check(msg, guest) is True
    assert msg.expiration_ms == 1500 and msg.extra_keys == ["a", "b"]
    assert msg.headers == {"CC": ["a"], "h": 1}
    with pytest.raises(AMQPError, match="invalid expiration '-1'"):
        check(message("", "q", expiration="-1"), guest)
    with pytest.raises(AMQPError, match="fast reply consumer does not exist"):
        check(message("", "q", reply_to="amq.rabbitmq.reply-to"), guest)
    rpc = message("", "q", reply_to="amq.rabbitmq.reply-to")
    check(rpc, guest, "KEY")
    assert rpc.props.reply_to == "amq.rabbitmq.reply-to.KEY"
