"""The ``x-delayed-message`` exchange type (docs/decisions/delayed-messages.md; the rabbitmq-delayed-message-exchange plugin's
interface): routes like its ``x-delayed-type`` (direct, fanout, topic or headers), and holds a message whose
``x-delay`` / ``x-deliver-at`` asks for a later time in the node's delay store (storage/delay/) until then.
The header rules are broker/delayed/delayed_message.py's; dispatch, confirms and checkpoints broker/delayed/delayed_dispatch.py's.

Semantics, and where they differ from the plugin on purpose:

- Declare: ``x-delayed-type`` is required and must name one of the four routing types; the plugin's 406 texts
  for a missing or self-referring type, the core's "unknown exchange type" for an unknown name. The underlying
  type's own argument and binding checks apply.
- Publish with no delay (absent, <= 0, or not a number type): routed at once by the underlying type, as any
  publish (mandatory, confirms, alternate exchange as usual).
- Publish with a delay: appended to the delay store. Confirm: a persistent message on a durable exchange
  is confirmed once its record is fsynced (the plugin confirms before its write reaches the disk); a transient
  message, or any message on a non-durable exchange, at once. Mandatory: basic.return 312 only if no binding
  (nor the alternate exchange) would route it now; it is held either way, as the plugin does.
- When due: routed through the one publish path by the bindings as they are then (TTL, dead-lettering,
  max-length, alternate exchange of that moment apply), carrying ``x-delay`` negated. Unroutable then:
  dropped, as the plugin does (there is no publisher left to tell).
- Deleting the exchange drops its pending messages (the plugin keeps them for a later namesake). Each
  incarnation of an exchange has its own ``xref``, never reused (a durable one's is in the metadata store).
- A transient message held by a durable exchange survives a restart like a persistent one (it is in the
  same log); it is let go as transient.
- Not kept across the delay: CC / BCC routing keys (only the message's routing key routes it when due).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from broker.delayed.delayed_dispatch import DelayDispatcher, dispatcher_for
from broker.delayed.delayed_message import delivered_header, due_time, due_time_of, raw_delay_headers
from broker.errors import AMQPError
from broker.exchanges.exchange import (
    Binding,
    DirectExchange,
    Exchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)
from broker.message import Message
from broker.publish import PENDING, ROUTED
from protocol.constants import PRECONDITION_FAILED
from protocol.fastcodec import shortstr
from storage.delay import DelayRecord, DueRecord, ExchangeStats
from storage.dispatch_evidence import origin_msg_id

if TYPE_CHECKING:
    from broker.publish import Publisher

TYPE_NAME = "x-delayed-message"
UNDERLYING: dict[str, type[Exchange]] = {cls.type_name: cls for cls in
                                         (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)}
FLAG_PERSISTENT = 1
XREF_KIND, XREF_COUNTER = "delayed_exchange", ("delayed-exchange-xref",)


def underlying_type(arguments: dict[str, Any]) -> type[Exchange]:
    """The routing type named by ``x-delayed-type``, or the plugin's 406."""
    value = arguments.get("x-delayed-type")
    if isinstance(value, (bytes, bytearray)):
        value = value.decode(errors="replace")
    if not isinstance(value, str):
        raise AMQPError(PRECONDITION_FAILED, "Invalid argument, 'x-delayed-type' must be an existing exchange type")
    if value == TYPE_NAME:
        raise AMQPError(PRECONDITION_FAILED, f"Invalid argument, '{TYPE_NAME}' can't be used for 'x-delayed-type'")
    cls = UNDERLYING.get(value)
    if cls is None:
        raise AMQPError(PRECONDITION_FAILED, f"unknown exchange type '{value}'")
    return cls


class DelayedExchange(Exchange):
    type_name = TYPE_NAME
    description: ClassVar[str] = "Delayed Message Exchange."
    holds_messages = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._inner = underlying_type(self.arguments)(self.name, arguments=self.arguments)
        self.xref: int | None = None
        self._dispatcher: DelayDispatcher | None = None
        self._max_delay_ms = 0

    @classmethod
    def validate_arguments(cls, name: str, vhost: str, arguments: dict[str, Any]) -> None:
        super().validate_arguments(name, vhost, arguments)
        underlying_type(arguments).validate_arguments(name, vhost, arguments)

    # -- routing: the underlying type's ---------------------------------------------------------------------
    @property
    def routes_as(self) -> Exchange:
        return self._inner

    def validate_binding(self, binding: Binding) -> str | None:
        return self._inner.validate_binding(binding)

    def _index_add(self, binding: Binding) -> None:
        self._inner.add_binding(binding)

    def _index_remove(self, binding: Binding) -> None:
        self._inner.remove_binding(binding.key)

    def route(self, routing_key: str, msg: Message, queues: set[str], exchanges: set[str]) -> None:
        self._inner.route(routing_key, msg, queues, exchanges)

    # -- life -----------------------------------------------------------------------------------------------
    def _open(self, recovered: bool) -> None:
        durable = self.services.durable
        if durable is None:
            return  # a vhost without storage (unit tests): hold() refuses delayed messages
        storage = durable.storage
        meta = storage.metadata
        key = (self.services.vhost, self.name)
        row = meta.get(XREF_KIND, key) if recovered else None
        if isinstance(row, dict) and isinstance(row.get("xref"), int):
            xref = row["xref"]
        else:
            xref = self._new_xref()
        self.xref = xref
        self._max_delay_ms = storage.delay_max_ms
        self._dispatcher = dispatcher_for(storage.open_delay_store, self.services.clock)
        self._dispatcher.register(xref, self)

    def _new_xref(self) -> int:
        """A reference no exchange incarnation had before (the node's counter), recorded for a durable one."""
        durable = self.services.durable
        assert durable is not None
        meta = durable.storage.metadata
        counter = meta.get("node", XREF_COUNTER)
        xref = counter["next"] if isinstance(counter, dict) else 1
        meta.put("node", XREF_COUNTER, {"next": xref + 1})
        if self.durable:
            meta.put(XREF_KIND, (self.services.vhost, self.name), {"xref": xref})
        return xref

    def on_declare(self) -> None:
        self._open(recovered=False)

    def on_recover(self) -> None:
        self._open(recovered=True)

    def on_delete(self) -> None:
        d, xref = self._dispatcher, self.xref
        if d is None or xref is None:
            return
        d.unregister(xref)
        if not d.store.closed:
            d.store.drop_exchange(xref)
        durable = self.services.durable
        if durable is not None and self.durable:
            durable.storage.metadata.delete(XREF_KIND, (self.services.vhost, self.name))
        self._dispatcher = None

    def close(self) -> None:
        if self._dispatcher is not None and self.xref is not None:
            self._dispatcher.unregister(self.xref)
            self._dispatcher = None

    def pending(self) -> int:
        """Messages held and not yet let go (the plugin's ``messages_delayed``)."""
        stats = self.delayed_stats()
        return 0 if stats is None else stats.count

    # -- operators (HTTP API, Prometheus: docs/decisions/delayed-messages.md) ---------------------------------------------------------
    @property
    def dispatcher(self) -> DelayDispatcher | None:
        """The node's dispatcher this exchange holds messages with (None without storage, or once closed)."""
        d = self._dispatcher
        return None if d is None or d.store.closed else d

    def delayed_stats(self) -> ExchangeStats | None:
        """Pending count, bytes and next due time; None when the exchange holds nothing (no storage)."""
        d, xref = self.dispatcher, self.xref
        return None if d is None or xref is None else d.store.exchange_stats(xref)

    def list_delayed(self, after: tuple[int, int] | None, limit: int) -> list[DelayRecord]:
        """Pending messages by ``(due_ms, seq)``, those after the cursor ``after``, at most ``limit``."""
        d, xref = self.dispatcher, self.xref
        return [] if d is None or xref is None else d.store.list_records(xref, after, limit)

    def get_delayed(self, due_ms: int, seq: int) -> DelayRecord | None:
        """One pending message of this exchange by its id (another exchange's record is not found here)."""
        d = self.dispatcher
        if d is None:
            return None
        rec = d.store.get(seq, due_ms)
        return rec if rec is not None and rec.xref == self.xref else None

    def cancel_delayed(self, due_ms: int, seq: int) -> bool:
        """Cancel one pending message: it is never routed. False if it is not pending here (or is being
        dispatched at this moment)."""
        d = self.dispatcher
        if d is None or self.get_delayed(due_ms, seq) is None:
            return False
        return d.store.cancel(seq, due_ms)

    def purge_delayed(self) -> int:
        """Cancel every pending message at once: the store drops this exchange's reference (durably, as on
        deletion) and the exchange goes on under a fresh one, so a purge costs the same whatever the count.
        Returns how many were pending."""
        d, old = self.dispatcher, self.xref
        if d is None or old is None:
            return 0
        new = self._new_xref()
        d.register(new, self)  # before unregistering the old one: the dispatcher stops with no holder left
        d.unregister(old)
        self.xref = new
        return d.store.purge_exchange(old)

    # -- publishing -----------------------------------------------------------------------------------------
    def hold(self, msg: Message, persistent: bool, publisher: Publisher | None, confirm_seq: int) -> int:
        """Route at once if no delay is asked for; else keep the message in the delay store (see the module
        docstring for its confirm and mandatory answers)."""
        services = self.services
        now = int(services.clock.now_ms())
        d = self._dispatcher
        horizon = self._max_delay_ms if d is not None else 1 << 62
        raw = raw_delay_headers(msg.header, msg.props.headers_span)  # not the whole table decoded, mostly
        due = due_time(msg.headers, now, horizon) if raw is None else due_time_of(raw[0], raw[1], now, horizon)
        if due is None:
            return services.publish(self, msg, persistent, False, publisher, confirm_seq, held=True)
        if d is None or self.xref is None or d.store.closed:
            raise AMQPError(PRECONDITION_FAILED, f"exchange '{self.name}' cannot hold delayed messages: the node "
                            "has no storage open")
        due_ms, delay_ms = due
        seq = d.store.append(DelayRecord(due_ms, self.xref, msg.routing_key.encode(), msg.header, msg.body,
                                         delay_ms, FLAG_PERSISTENT if persistent else 0))
        result = ROUTED if services.route(self, msg) else 0
        if confirm_seq and publisher is not None and persistent and self.durable:
            d.confirm_when_durable(seq, publisher, confirm_seq)
            result |= 1 << PENDING
        return result

    def _due_message(self, rec: DelayRecord) -> Message:
        rk = rec.routing_key.decode(errors="replace")
        return Message(self.name, rk, shortstr(self.name) + shortstr(rk),
                       delivered_header(rec.properties, rec.delay_ms), rec.body)

    def release_due(self, due: DueRecord, publisher: Any, confirm_seq: int, epoch: int,
                    skip: frozenset[str] = frozenset()) -> int:
        """The dispatcher lets a due record go: routed now through the one publish path (``held``), to every
        queue the bindings name except those in ``skip``. A persistent one carries its origin id (dispatch
        ``epoch``, store seq) as message id: the queues' proof that they have it (broker/delayed/delayed_dispatch.py)."""
        rec = due.record
        msg = self._due_message(rec)
        persistent = bool(rec.flags & FLAG_PERSISTENT)
        if persistent:
            msg.msg_id = origin_msg_id(epoch, rec.seq)
        return self.services.publish(self, msg, persistent, False, publisher, confirm_seq, held=True, skip=skip)

    def in_doubt_plan(self, dues: list[DueRecord]) -> list[tuple[DueRecord, frozenset[str] | None]]:
        """For records whose dispatch was in progress at a crash: the durable queues the bindings route each
        to that already hold it (to be skipped when it is sent again), or None when there is nothing to send
        (all of them hold it, or it is transient: at most once). Each durable queue is asked once."""
        seqs = {d.record.seq for d in dues if d.record.flags & FLAG_PERSISTENT}
        held_by: dict[str, set[int]] = {}
        plan: list[tuple[DueRecord, frozenset[str] | None]] = []
        for due in dues:
            seq = due.record.seq
            if seq not in seqs:
                plan.append((due, None))
                continue
            durable = [q for q in self.services.route(self, self._due_message(due.record)) if q.durable]
            have = set()
            for q in durable:
                held = held_by.get(q.name)
                if held is None:
                    held = held_by[q.name] = q.origins_held(seqs)
                if seq in held:
                    have.add(q.name)
            plan.append((due, None if len(have) == len(durable) else frozenset(have)))
        return plan

    def after_recovery(self) -> None:
        """Every exchange, queue and binding is back: settle the dispatches a crash left in doubt."""
        if self._dispatcher is not None:
            self._dispatcher.resolve_in_doubt()
