"""Direct reply-to's consumer side (RabbitMQ's ``rabbit_direct_reply_to`` and the reply consumer in
``rabbit_channel``): a channel's basic.consume of ``amq.rabbitmq.reply-to`` makes no queue; it registers the
channel under a random key, and replies published to ``amq.rabbitmq.reply-to.<key>`` are delivered to it
straight from the publish path (``Node.deliver_reply``), without acks.

This module holds the pseudo-consumer and the rules for starting and stopping it; the channel keeps the one
it has and writes the deliveries. The publishing side (the reply_to property check, routing a reply) is in
broker/publish.py.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any, Protocol

from broker.errors import AMQPError
from protocol.constants import NOT_ALLOWED, PRECONDITION_FAILED

if TYPE_CHECKING:
    from broker.message import Message


class ReplyChannel(Protocol):
    """A channel that consumes ``amq.rabbitmq.reply-to`` (broker/amqp/channel.py's Channel), as the registry sees it."""

    reply_consumer: ReplyConsumer | None

    def deliver_reply(self, msg: Message) -> None: ...


class ReplyRegistry(Protocol):
    """Where reply channels are registered (the node): a key per channel, which names it in reply routing keys."""

    def register_reply_channel(self, channel: Any) -> str: ...

    def unregister_reply_channel(self, key: str) -> None: ...


class ReplyConsumer:
    """The pseudo-consumer of ``amq.rabbitmq.reply-to`` on one channel. ``tag_raw`` is the consumer tag as a
    short string, ready for basic.deliver; ``key`` is the channel's key in the registry."""

    __slots__ = ("key", "tag", "tag_raw")

    def __init__(self, tag: str, key: str) -> None:
        self.tag = tag
        raw = tag.encode()
        self.tag_raw = bytes([len(raw)]) + raw
        self.key = key


def start(registry: ReplyRegistry, channel: Any, tag: str, no_ack: bool, current: ReplyConsumer | None,
          tags_in_use: Container[str]) -> ReplyConsumer:
    """basic.consume of ``amq.rabbitmq.reply-to`` with consumer tag ``tag``: only with no_ack (a reply has no
    queue to go back to), one per channel, and a tag no other consumer of the channel has (RabbitMQ's
    errors, in its order)."""
    if not no_ack:
        raise AMQPError(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
    if current is not None:
        raise AMQPError(PRECONDITION_FAILED, "reply consumer already set")
    if tag in tags_in_use:
        raise AMQPError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
    return ReplyConsumer(tag, registry.register_reply_channel(channel))


def stop(registry: ReplyRegistry, consumer: ReplyConsumer) -> None:
    """The reply consumer is cancelled or its channel closes: replies to its key are no longer routed."""
    registry.unregister_reply_channel(consumer.key)
