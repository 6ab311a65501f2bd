"""The ``x-message-deduplication`` exchange type (the rabbitmq-message-deduplication plugin's
``RabbitMQMessageDeduplication.Exchange``): routes like a fanout, and drops a message whose
``x-deduplication-header`` value it has seen before. The semantics, and where they differ from the plugin and
LavinMQ, are broker/deduplication.py's docstring.

It is a holding type of broker/exchanges/exchange_types.py's seam, though it never keeps a message: ``hold`` is where the
exchange learns the publisher and its confirm number, which it needs to answer a duplicate (an ack that waits
until the entry the duplicate matched is on disk). A message that is no duplicate is routed at once through the
one publish path (``held=True``: TTL, dead-lettering, max-length and the queues' confirms apply as for any
publish), and its value admitted unless a queue refused it. Reached through an exchange-to-exchange binding or
as an alternate exchange, the exchange is only its ``route``: a fanout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from broker.deduplication import DedupCache, exchange_settings, open_cache
from broker.exchanges.exchange import FanoutExchange
from broker.message import Message
from broker.publish import PENDING, REFUSED

if TYPE_CHECKING:
    from broker.publish import Publisher


class DeduplicationExchange(FanoutExchange):
    type_name = "x-message-deduplication"
    description: ClassVar[str] = "Message Deduplication Exchange."  # the plugin's description
    holds_messages = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cache: DedupCache | None = None

    @classmethod
    def validate_arguments(cls, name: str, vhost: str, arguments: dict[str, Any]) -> None:
        super().validate_arguments(name, vhost, arguments)
        exchange_settings(arguments)

    # -- life ---------------------------------------------------------------------------------------------
    def _open(self, recovered: bool) -> None:
        services = self.services
        durable = services.durable
        self.cache = open_cache(exchange_settings(self.arguments), services.clock,
                                durable.storage if durable is not None else None, "exchange", services.vhost,
                                self.name, durable=self.durable, recovered=recovered)

    def on_declare(self) -> None:
        self._open(recovered=False)

    def on_recover(self) -> None:
        self._open(recovered=True)

    def on_delete(self) -> None:
        if self.cache is not None:
            self.cache.delete()
            self.cache = None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    # -- publishing ---------------------------------------------------------------------------------------
    def hold(self, msg: Message, persistent: bool, publisher: Publisher | None, confirm_seq: int) -> int:
        """A duplicate goes nowhere: 0 (unroutable: basic.return if mandatory, then the ack), or ``1 << PENDING``
        when the entry it matched is not on disk yet (the ack comes after its fsync). Anything else is routed
        now and its value admitted, unless a queue refused it (the publisher is nacked and may publish again)."""
        cache = self.cache
        key = cache.key_of(msg) if cache is not None else None
        if key is not None and cache is not None and cache.seen(key):
            cache.dropped += 1
            if not confirm_seq or publisher is None or cache.durable:
                return 0
            cache.confirm_when_durable(publisher, confirm_seq)
            return 1 << PENDING
        result = self.services.publish(self, msg, persistent, False, publisher, confirm_seq, held=True)
        if key is not None and cache is not None and not result & REFUSED:
            cache.admit(key, msg)
        return result
