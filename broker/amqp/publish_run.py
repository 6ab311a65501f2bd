"""A run of publishes handled as one (issue 38: "one routing decision and one enqueue call per run of publishes
to the same exchange and routing key found in one socket read").

A publisher that writes faster than the broker reads leaves many whole publishes in one read, and they are
mostly alike: the same exchange, routing key and properties, only the body differs (every load generator, a
Celery worker's task stream, a logger). The reader finds such runs (``publish_run_end`` in
broker/amqp/reader.py: consecutive whole publishes on one channel with the same method payload and the same
content header) and hands each to its channel's :class:`PublishRun`, which does once for the run what
basic.publish does for every message — decode the method, check the size, the permissions, the exchange, the
topic permission and the properties, route — and then hands the run's messages to each queue in one call
(broker/queues/delegate.py ``deliver_run``), settling the confirms and returns of each.

A run is taken only where doing the checks once cannot change an answer, else it goes message by message as
before (:meth:`PublishRun.take` returns its start):

* the properties ask for nothing per message: no headers (CC / BCC), no expiration, no user-id, no reply-to;
  at most a delivery mode, which is the same for the whole run;
* the exchange exists, is not internal and routes at once (not a delayed or deduplicating exchange, which hold
  messages); the routing key is no direct reply-to key;
* the channel is not in a transaction, the vhost is not traced and not a cluster member's (whose routing may
  wait for the directory).

Routing once is right because an exchange routes a message by its routing key and properties alone
(broker/exchanges/exchange_types.py), which the run shares, and nothing in the run can change the bindings:
no method frame is inside it. Each queue still takes each message as before (its overflow, TTL and
deduplication decided per message), so confirms, nacks of refused messages and returns are the ones the
message-by-message path gives, in the same order. A run routed to several queues is handed over message by
message across them (broker/queues/delegate.py ``deliver_run``), as one by one; a run to one queue is taken
whole. A queue that may dead-letter as it takes a publish (``Queue.dead_letters_on_publish``: its dead letters
would reach other queues in another order, and escape the reader's hand-over budget for a turn) sends the run
message by message. The budget itself (broker/amqp/reader.py's ``ROUTED_PER_TURN``) cuts a run: at most what
is left of it over the number of queues.

Errors come from the checks only, before anything is published, so they belong to the run's first publish:
the reader answers it as that frame's, and the rest of the run meets the closing channel as it would have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from broker.errors import AMQPError
from broker.message import Message
from broker.publish import (
    FLAG_DELIVERY_MODE,
    FLAGS_TO_READ,
    PENDING,
    REFUSED,
    REPLY_TO_PREFIX,
    check_properties,
)
from protocol import fastcodec
from protocol.constants import CLASS_BASIC, NO_ROUTE, NOT_IMPLEMENTED

if TYPE_CHECKING:
    from broker.amqp.command_assembler import CommandAssembler
    from broker.amqp.confirms import Confirms
    from broker.amqp.tx import Transaction
    from broker.exchanges.exchange import Exchange
    from broker.security.topic_permissions import TopicCheck
    from broker.vhost import VHost


class RunChannel(Protocol):
    """What a run needs of its channel (broker/amqp/channel.py): what basic.publish reads and counts."""

    id: int
    vhost: VHost
    reader: Any  # the connection: send, send_content, confirms_pending, user
    assembler: CommandAssembler
    confirms: Confirms | None
    tx: Transaction | None
    publishing: bool
    published_to: set[Any]
    msg_publish: int
    msg_return_unroutable: int
    msg_drop_unroutable: int

    def publish_check(self, exchange: str) -> TopicCheck | None: ...

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None: ...


class PublishRun:
    """One channel's taker of publish runs. An error :meth:`take` raises belongs to the run's first publish
    (the module docstring)."""

    __slots__ = ("_channel",)

    def __init__(self, channel: RunChannel) -> None:
        self._channel = channel

    def take(self, frames: list[Any], start: int, end: int, budget: int) -> int:
        """Publish ``frames[start:end]`` (FRAME_PUBLISH items alike but for their bodies) as one run, as far as
        ``budget`` hand-overs to queues allow (at least one publish). Returns the index of the first frame not
        taken: ``start`` if the run must go message by message."""
        channel = self._channel
        method, header, first_body = frames[start][2]
        args = fastcodec.decode_basic_publish(method, 4)
        target = self._checked(args, header)
        if target is None:
            return start
        exchange, persistent = target
        vhost = channel.vhost
        now = vhost.clock.now_ms()
        first = Message(args.exchange, args.routing_key, args.names_raw, header, first_body, now)
        queues = vhost.route(exchange, first)
        for q in queues:
            if q.dead_letters_on_publish:
                return start  # its dead letters must be counted and ordered as one by one (Queue's docstring)
        n = end - start
        if queues:
            n = min(n, max(1, budget // len(queues)))
        msgs = [first]
        for i in range(start + 1, start + n):
            msgs.append(Message(args.exchange, args.routing_key, args.names_raw, header, frames[i][2][2], now))
        confirms = channel.confirms
        first_seq = 0
        if confirms is not None:
            first_seq = confirms.seq + 1
            confirms.seq += n
        results = vhost.publish_run(exchange, queues, msgs, persistent, args.mandatory, channel, first_seq)
        channel.msg_publish += n
        reader = channel.reader
        if results is None:
            if args.mandatory:
                channel.msg_return_unroutable += n
                for msg in msgs:
                    reader.send(fastcodec.encode_basic_return(channel.id, NO_ROUTE, "NO_ROUTE", args.names_raw))
                    reader.send_content(channel.id, msg.header, msg.body)
            else:
                channel.msg_drop_unroutable += n
        if confirms is not None:
            flush = False
            if results is None:
                for seq in range(first_seq, first_seq + n):
                    flush = confirms.published(seq, 0, 0) or flush
            else:
                for i, result in enumerate(results):
                    flush = confirms.published(first_seq + i, result >> PENDING, result & REFUSED) or flush
            if flush:
                reader.confirms_pending(channel)
        return start + n

    def _checked(self, args: fastcodec.PublishArgs, header: bytes) -> tuple[Exchange, bool] | None:
        """basic.publish's checks, in its order, for the whole run: the exchange to publish to and whether the
        run is persistent; None where the run must go message by message. Raises what basic.publish raises."""
        channel = self._channel
        channel.assembler.checked_body_size(header)  # 505 / 406 as on_whole_publish: one header, one size
        if args.immediate:
            raise AMQPError(NOT_IMPLEMENTED, "immediate=true", CLASS_BASIC, 40)
        vhost = channel.vhost
        if channel.tx is not None or vhost.tracing is not None or vhost.clustered:
            return None
        exchange = vhost.exchanges.get(args.exchange) if args.exchange else vhost.default_exchange
        if exchange is None or exchange.internal or exchange.holds_messages:
            return None  # 404 / 403 (or, later, a wait) and holding exchanges: message by message
        if not args.exchange and args.routing_key.startswith(REPLY_TO_PREFIX):
            return None
        flags = (header[12] << 8) | header[13] if len(header) >= 14 else 0
        to_read = flags & FLAGS_TO_READ
        if to_read and to_read != FLAG_DELIVERY_MODE:
            return None
        topic = channel.publish_check(args.exchange)
        if topic is not None:
            topic.check(exchange, args.routing_key)
        channel.publishing = True
        persistent = bool(to_read) and check_properties(
            Message(args.exchange, args.routing_key, args.names_raw, header, b""), flags, channel.reader.user)
        return exchange, persistent
