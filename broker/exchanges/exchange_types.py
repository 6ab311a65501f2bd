"""The exchange types a client can declare, and the one place exchanges are built (RabbitMQ's registry of
``rabbit_exchange_type`` modules, looked up by ``rabbit_exchange:type_to_module/1``).

A vhost builds every exchange through :func:`make_exchange`, which hands it the vhost's
:class:`~broker.exchanges.exchange.ExchangeServices`; the vhost then calls the type's hooks as the exchange lives
(declare, recover, delete, close). The HTTP API lists :data:`EXCHANGE_TYPES` with each type's ``description``.

How to add an exchange type (say ``x-delayed-message``, docs/decisions/delayed-messages.md):

1. Write ``broker/exchanges/<name>_exchange.py`` with a subclass of :class:`broker.exchanges.exchange.Exchange` that sets
   ``type_name`` (what exchange.declare names) and ``description``, and implements ``route`` (its bindings'
   routing: ``_index_add``/``_index_remove`` keep whatever index makes it fast; or extend one of the built-in
   types to reuse its routing). A route must follow from the routing key, the message's properties and the
   bindings alone: a run of alike publishes is routed once for all (broker/amqp/publish_run.py), so a type
   that routes by chance or by turn must hold its messages (below) instead.
2. Add it to ``_TYPES`` below. That is all a routing-only type needs.

A type may also, in the same file:

- check its declare arguments: override the classmethod ``validate_arguments`` (call ``super()`` first) and
  raise ``AMQPError(PRECONDITION_FAILED, ...)``, e.g. for a missing or unknown ``x-delayed-type``;
- check a binding's arguments: ``validate_binding`` returns an error text;
- keep state, through ``self.services`` only: ``clock`` (now_ms for due times), ``call_later`` (timers, on the
  same clock: a test drives them with a ManualClock), ``durable`` (the node's storage, for its own files; None
  in a vhost that keeps nothing), ``route`` (would this message be routed now?), ``publish`` (the one publish
  path). Start and stop it in ``on_declare`` / ``on_recover`` (after a restart) / ``on_delete`` (drop it, files
  too) / ``close`` (the node stops);
- keep a published message instead of routing it: set ``holds_messages = True`` and implement ``hold``, which
  answers the publisher (ROUTED for no basic.return; ``1 << PENDING`` to confirm it later through
  ``publisher.confirm_from_queue``); when the message is due, ``self.services.publish(self, msg, persistent,
  held=True)`` routes it by the exchange's bindings as they are then, with TTL, dead-lettering, max-length
  and confirms of the target queues applied as for any publish.

tests/unit/broker/test_exchange_types.py registers a small stateful type of this kind and drives it.
"""

from __future__ import annotations

from typing import Any

from broker.exchanges.deduplication_exchange import DeduplicationExchange
from broker.exchanges.delayed_exchange import DelayedExchange
from broker.exchanges.exchange import (
    DirectExchange,
    Exchange,
    ExchangeServices,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)

_TYPES: tuple[type[Exchange], ...] = (
    DirectExchange,
    FanoutExchange,
    TopicExchange,
    HeadersExchange,
    DeduplicationExchange,
    DelayedExchange,
)

EXCHANGE_TYPES: dict[str, type[Exchange]] = {cls.type_name: cls for cls in _TYPES}
"""Every declarable type by its ``type_name``. Tests may add a type here for their duration."""


def exchange_type(type_name: str) -> type[Exchange] | None:
    """The class of a declarable type, or None for a name no type has."""
    return EXCHANGE_TYPES.get(type_name)


def make_exchange(cls: type[Exchange], name: str, services: ExchangeServices, *, durable: bool = True,
                  auto_delete: bool = False, internal: bool = False,
                  arguments: dict[str, Any] | None = None) -> Exchange:
    """A new exchange of type ``cls`` with its vhost's services (its hooks are the vhost's to call)."""
    return cls(name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments,
               services=services)
