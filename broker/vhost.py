"""A virtual host: its exchanges, its queue registry, the bindings between them, routing, and
:meth:`VHost.publish`, the one way a message enters the broker (broker/publish.py).

Routing starts at the exchange a message was published to, follows exchange-to-exchange bindings
(each exchange visited once, so cycles end) and falls back to an exchange's alternate exchange when that
exchange's own bindings select nothing, as RabbitMQ does.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.clock import Clock, LoopClock
from broker.errors import AMQPError
from broker.exchanges.exchange import EXCHANGE, QUEUE, Binding, Exchange, ExchangeServices
from broker.exchanges.exchange_types import exchange_type, make_exchange
from broker.message import Message
from broker.observability.counters import MESSAGE_SIZE_BOUNDS
from broker.observability.trace import TRACE_EXCHANGE
from broker.policies.policy import Policy, best_match
from broker.publish import REPLY_TO_PREFIX, ROUTED, Publisher, ReplyTo, check_properties, property_flags
from broker.queues import delegate
from broker.queues.amqqueue import Definitions, QueueRegistry
from broker.queues.dead_letter import deaths_of, is_cycle
from broker.queues.queue_args import effective_settings
from broker.security import permissions, topic_permissions
from broker.topology import LOCAL, NEVER_BEHIND, CatchUp, OtherMembersQueue, Topology
from protocol.constants import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED

if TYPE_CHECKING:
    import asyncio

    from broker.observability.counters import GlobalCounters
    from broker.observability.trace import Tracer
    from broker.queues.queue_types import Queue
    from broker.security.auth import User

log = structlog.get_logger("leveret.vhost")

STANDARD_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                      ("amq.headers", "headers"), ("amq.match", "headers"))


class VHostDefinitions(Definitions, Protocol):
    """Where a vhost writes its durable exchanges, bindings, policies and runtime parameters, and its registry
    its queues (broker/persistence.py's DurableDefinitions): each write is made first, and raises if it cannot,
    so that nothing changes in memory that a restart would not bring back."""

    def exchange_declared(self, vhost: str, ex: Exchange) -> None: ...

    def exchange_deleted(self, vhost: str, name: str) -> None: ...

    def binding_added(self, vh: VHost, b: Binding) -> None: ...

    def binding_removed(self, vhost: str, b: Binding) -> None: ...

    def policy_set(self, vhost: str, policy: Policy, operator: bool) -> None: ...

    def policy_cleared(self, vhost: str, name: str, operator: bool) -> None: ...

    def parameter_set(self, vhost: str, component: str, name: str, value: Any) -> None: ...

    def parameter_cleared(self, vhost: str, component: str, name: str) -> None: ...


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class VHost:
    def __init__(self, name: str, counters: GlobalCounters | None = None, replies: ReplyTo | None = None,
                 clock: Clock | None = None, *, description: str = "", tags: list[str] | None = None,
                 default_queue_type: str = "classic", max_bindings_per_queue: int = 0) -> None:
        self.name = name
        # What the operator said about it (the HTTP API's vhost object; RabbitMQ's vhost metadata).
        self.description = description
        self.tags: list[str] = list(tags or [])
        self.default_queue_type = default_queue_type
        # Runtime parameters, (component, name) → value: vhost-limits (broker/policies/limits.py reads them
        # here), and whatever a definitions import carries (federation upstreams, ...).
        self.parameters: dict[tuple[str, str], Any] = {}
        # Told (vhost, component, name, value or None when cleared) after a parameter changes: the node's
        # shovel supervisor (broker/shovel/supervisor.py) starts and stops shovels from it.
        self.on_parameter: Callable[[str, str, str, Any], None] | None = None
        # The one source of time for this vhost's queues, exchanges and dead-lettering (broker/clock.py).
        self.clock: Clock = clock if clock is not None else LoopClock()
        # The node's GlobalCounters (broker/observability/counters.py), if this vhost belongs to a node.
        self.counters = counters
        # The node's direct reply-to consumers, if this vhost belongs to a node.
        self.replies = replies
        # Where durable exchanges, queues and bindings are written (broker/persistence.py), once the
        # node's storage is open; None for a vhost that keeps nothing (tests, before start).
        self.durable: VHostDefinitions | None = None
        self.exchanges: dict[str, Exchange] = {}
        self.queues = QueueRegistry(self)
        # What every exchange of this vhost is built with (broker/exchanges/exchange_types.py).
        self.exchange_services = ExchangeServices(name, self.clock, self.publish, self.route, lambda: self.durable)
        # The default exchange is not in ``exchanges``: it cannot be declared, bound or deleted.
        self.default_exchange: Exchange = self._make_exchange("direct", "")
        self.policies: dict[str, Policy] = {}
        self.operator_policies: dict[str, Policy] = {}
        for ex_name, ex_type in STANDARD_EXCHANGES:
            self.exchanges[ex_name] = self._make_exchange(ex_type, ex_name)
        # The firehose's exchange (RabbitMQ declares it in every vhost: topic, durable, internal).
        topic = exchange_type("topic")
        assert topic is not None
        self.exchanges[TRACE_EXCHANGE] = make_exchange(topic, TRACE_EXCHANGE, self.exchange_services, internal=True)
        # broker/observability/trace.py's Tracer while this vhost traces (trace_on), else None: the hot paths
        # check it, nothing more. Not persistent, as in RabbitMQ: a vhost starts with tracing off.
        self.tracing: Tracer | None = None
        # leveret.max_bindings_per_queue (the node sets it): bindings that may end at one queue, or at one
        # exchange for exchange-to-exchange bindings; 0: no limit (RabbitMQ has none).
        self.max_bindings_per_queue = max_bindings_per_queue
        # The other members' queues and the hooks for this member's own (broker/topology.py): a cluster
        # member's broker/clustering/cluster_forwarding.py VHostLink, else LocalTopology. Set with
        # use_topology, which keeps ``clustered`` with it: the one thing the publish path tests per message.
        self.remote: Topology = LOCAL
        self.clustered = False
        # A cluster member's reading of the definitions feed (broker/clustering/cluster_definitions.py DefinitionsFollower,
        # set by the node): asked before a name this member does not know is answered with 404 or routed nowhere.
        self.catch_up: CatchUp = NEVER_BEHIND

    def use_topology(self, topology: Topology | None) -> None:
        """This vhost's view of the other members (a cluster member's, once its forwarding starts), or None:
        this node alone again (LocalTopology)."""
        self.remote = topology if topology is not None else LOCAL
        self.clustered = topology is not None

    # -- policies and runtime parameters -------------------------------------------------------------------
    def policies_for_queue(self, name: str, queue_type: str = "classic") -> tuple[Policy | None, Policy | None]:
        return best_match(self.policies, name, queue_type), best_match(self.operator_policies, name, queue_type)

    def set_policy(self, policy: Policy, operator: bool = False) -> None:
        """Written to the metadata store first (raises if it cannot, nothing changed), then applied."""
        if self.durable is not None:
            self.durable.policy_set(self.name, policy, operator)
        (self.operator_policies if operator else self.policies)[policy.name] = policy
        self.apply_policies()

    def clear_policy(self, name: str, operator: bool = False) -> bool:
        policies = self.operator_policies if operator else self.policies
        if name not in policies:
            return False
        if self.durable is not None:
            self.durable.policy_cleared(self.name, name, operator)
        del policies[name]
        self.apply_policies()
        return True

    def set_parameter(self, component: str, name: str, value: Any) -> None:
        """A runtime parameter (validated already; ``parameters`` is set up by the node), stored first."""
        if self.durable is not None:
            self.durable.parameter_set(self.name, component, name, value)
        self.parameters[(component, name)] = value
        if self.on_parameter is not None:
            self.on_parameter(self.name, component, name, value)

    def clear_parameter(self, component: str, name: str) -> bool:
        if (component, name) not in self.parameters:
            return False
        if self.durable is not None:
            self.durable.parameter_cleared(self.name, component, name)
        del self.parameters[(component, name)]
        if self.on_parameter is not None:
            self.on_parameter(self.name, component, name, None)
        return True

    def apply_policies(self) -> None:
        """Policies changed: every queue takes its (possibly new) effective settings at once."""
        for q in self.queues:
            q.apply_settings(effective_settings(q.arguments, *self.policies_for_queue(q.name,
                                                                                      q.settings.queue_type)))

    # -- exchanges --------------------------------------------------------------------------------------
    def _make_exchange(self, type_name: str, name: str) -> Exchange:
        cls = exchange_type(type_name)
        assert cls is not None, type_name
        return make_exchange(cls, name, self.exchange_services)

    def lookup_exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None and self.catch_up.now():
            ex = self.exchanges.get(name)  # declared on another cluster member since the feed was read
        if ex is None:
            raise AMQPError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")
        return ex

    def declare_exchange(self, name: str, type_name: str, passive: bool, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict[str, Any]) -> tuple[Exchange, bool]:
        if passive:
            if name == "":
                raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
            return self.lookup_exchange(name), False
        if name == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        cls = exchange_type(type_name)
        if cls is None:
            # RabbitMQ 3.10 answers 503 COMMAND_INVALID (a connection error); 3.13+ a 406 channel error.
            # Leveret follows the newer behaviour.
            raise AMQPError(PRECONDITION_FAILED, f"unknown exchange type '{type_name}'")
        cls.validate_arguments(name, self.name, arguments)
        existing = self.exchanges.get(name)
        if existing is not None:
            where = f"for exchange '{name}' in vhost '{self.name}'"
            for field, new, old in (("type", type_name, existing.type_name),
                                    ("durable", durable, existing.durable),
                                    ("auto_delete", auto_delete, existing.auto_delete),
                                    ("internal", internal, existing.internal)):
                if new != old:
                    raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg '{field}' {where}: received "
                                    f"'{_fmt(new)}' but current is '{_fmt(old)}'")
            new_ae, old_ae = arguments.get("alternate-exchange"), existing.arguments.get("alternate-exchange")
            if new_ae != old_ae:
                raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg 'alternate-exchange' {where}: "
                                f"received '{new_ae}' but current is '{old_ae}'")
            return existing, False
        if name.startswith("amq."):
            raise AMQPError(ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'")
        ex = make_exchange(cls, name, self.exchange_services, durable=durable, auto_delete=auto_delete,
                           internal=internal, arguments=arguments)
        self.exchanges[name] = ex
        if self.durable is not None:
            self.durable.exchange_declared(self.name, ex)
        ex.on_declare()
        return ex, True

    def restore_exchange(self, name: str, type_name: str, auto_delete: bool, internal: bool,
                         arguments: dict[str, Any]) -> None:
        """Recovery: a durable exchange as it was declared (unknown types are skipped with a log line)."""
        if name in self.exchanges:
            return
        cls = exchange_type(type_name)
        if cls is None:
            log.warning("durable exchange of an unknown type not recovered", vhost=self.name, exchange=name,
                        type=type_name)
            return
        ex = self.exchanges[name] = make_exchange(cls, name, self.exchange_services, durable=True,
                                                  auto_delete=auto_delete, internal=internal, arguments=arguments)
        ex.on_recover()

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        if name == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise AMQPError(ACCESS_REFUSED, f"deletion of system exchange '{name}' in vhost '{self.name}' "
                            "not allowed")
        ex = self.exchanges.get(name)
        if ex is None:
            return  # idempotent, as in RabbitMQ
        if if_unused and ex.bindings:
            raise AMQPError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use")
        del self.exchanges[name]
        if self.durable is not None:
            self.durable.exchange_deleted(self.name, name)
        for binding in list(ex.bindings.values()):
            ex.remove_binding(binding.key)
            if self.durable is not None:
                self.durable.binding_removed(self.name, binding)
        # Bindings whose destination is this exchange go too.
        for other in list(self.exchanges.values()):
            for binding in other.bindings_to(EXCHANGE, name):
                self._unbind(other, binding)
        ex.on_delete()
        self.remote.exchange_gone(name)

    def stop_exchanges(self, vhost_deleted: bool = False) -> None:
        """The node stops (each exchange's ``close``: what is durable stays for ``on_recover``) or this vhost
        is deleted (``on_delete``: what exchanges keep goes, files too)."""
        for ex in list(self.exchanges.values()):
            if vhost_deleted:
                ex.on_delete()
            else:
                ex.close()

    # -- bindings ---------------------------------------------------------------------------------------
    def bind(self, source: str, destination: str, kind: str, routing_key: str,
             arguments: dict[str, Any]) -> None:
        if source == "" or (kind == EXCHANGE and destination == ""):
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        ex = self.lookup_exchange(source)
        if kind == EXCHANGE:
            self.lookup_exchange(destination)
        binding = Binding(source, destination, kind, routing_key, arguments)
        error = ex.validate_binding(binding)
        if error:
            raise AMQPError(PRECONDITION_FAILED, error)
        limit = self.max_bindings_per_queue
        if limit and binding.key not in ex.bindings and \
                self.exchange_services.bindings_to(kind, destination) >= limit:
            # Re-binding what is bound stays the no-op it is; only a new binding is refused.
            raise AMQPError(PRECONDITION_FAILED, f"{kind} '{destination}' in vhost '{self.name}' has reached "
                            f"its limit of {limit} bindings (leveret.max_bindings_per_queue)")
        if ex.add_binding(binding):
            if self.durable is not None:
                self.durable.binding_added(self, binding)
            if kind == QUEUE:
                self.remote.bound_here(ex, binding)

    def unbind(self, source: str, destination: str, kind: str, routing_key: str,
               arguments: dict[str, Any]) -> asyncio.Future[None] | None:
        """Idempotent: unbinding what is not bound succeeds. In a cluster, the unbind of another member's queue
        is that member's to carry out: the future is done once it has (unbind-ok waits for it); else None."""
        if source == "" or (kind == EXCHANGE and destination == ""):
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        ex = self.exchanges.get(source)
        if ex is None and self.catch_up.now():
            ex = self.exchanges.get(source)  # declared on another cluster member since the last poll
        if ex is None:
            return None
        binding = Binding(source, destination, kind, routing_key, arguments)
        existing = ex.bindings.get(binding.key)
        if existing is None and self.catch_up.now():
            ex = self.exchanges.get(source) or ex  # bound on another cluster member since the last poll
            existing = ex.bindings.get(binding.key)
        if existing is not None:
            self._unbind(ex, existing)
        elif kind == QUEUE and self.queues.get(destination) is None:
            return self.remote.unbind_remote(binding)  # another cluster member's queue: removed there
        return None

    def _unbind(self, ex: Exchange, binding: Binding) -> None:
        ex.remove_binding(binding.key)
        self.remote.unbound_here(binding)
        if self.durable is not None:
            self.durable.binding_removed(self.name, binding)
        if ex.auto_delete and not ex.bindings and self.exchanges.get(ex.name) is ex:
            self.delete_exchange(ex.name, if_unused=False)

    def remove_bindings_to_queue(self, queue_name: str) -> None:
        for ex in list(self.exchanges.values()):
            for binding in ex.bindings_to(QUEUE, queue_name):
                self._unbind(ex, binding)

    def bindings(self) -> list[Binding]:
        return [b for ex in self.exchanges.values() for b in ex.bindings.values()]

    # -- routing ----------------------------------------------------------------------------------------
    def route(self, exchange: Exchange, msg: Message) -> list[Queue | OtherMembersQueue]:
        """The queues a message published to ``exchange`` reaches (each once)."""
        clustered = self.clustered  # (one attribute test per message on a single node, as ever)
        if exchange.name == "":
            if msg.extra_keys is None:
                q: Queue | OtherMembersQueue | None = self.queues.get(msg.routing_key)
                if q is None and clustered:
                    q = self.remote.queue(msg.routing_key)
                return [q] if q is not None else []
            names = {msg.routing_key, *msg.extra_keys}
            get = self._local_or_remote if clustered else self.queues.get
            return [q for q in map(get, names) if q is not None]
        queue_names: set[str] = set()
        more: set[str] = set()
        keys = (msg.routing_key,) if msg.extra_keys is None else (msg.routing_key, *msg.extra_keys)
        for key in keys:
            exchange.route(key, msg, queue_names, more)
        if clustered:  # bindings to other members' queues (broker/clustering/remote_queue.py)
            self.remote.route(exchange.name, keys, msg, queue_names)
        ae = exchange.alternate_exchange
        if ae and not queue_names and not more:
            more.add(ae)
        if more:
            visited = {exchange.name}
            while more:
                name = more.pop()
                if name in visited:
                    continue
                visited.add(name)
                ex = self.exchanges.get(name)
                if ex is None:
                    continue
                found_q: set[str] = set()
                found_x: set[str] = set()
                for key in keys:
                    ex.route(key, msg, found_q, found_x)
                if clustered:
                    self.remote.route(name, keys, msg, found_q)
                if not found_q and not found_x and ex.alternate_exchange:
                    found_x.add(ex.alternate_exchange)
                queue_names |= found_q
                more |= found_x - visited
        get = self._local_or_remote if clustered else self.queues.get
        return [q for q in map(get, queue_names) if q is not None]

    def _local_or_remote(self, name: str) -> Queue | OtherMembersQueue | None:
        """A cluster member's routing: this node's queue of that name, else another member's."""
        q = self.queues.get(name)
        return q if q is not None else self.remote.queue(name)

    # -- publishing: the one path (broker/publish.py) -----------------------------------------------------
    def publish(self, exchange: Exchange, msg: Message, persistent: bool, mandatory: bool = False,
                publisher: Publisher | None = None, confirm_seq: int = 0, dead_letter: bool = False,
                held: bool = False, skip: Collection[str] = ()) -> int:
        """Put ``msg``, published to ``exchange``, into the queues it routes to; returns broker/publish.py's
        packed result (ROUTED, REFUSED, the queues that confirm later).

        ``persistent``: delivery mode 2 (persistent in the durable queues it reaches). ``mandatory`` only
        decides which counter an unroutable message goes to; the caller sends basic.return. ``publisher``
        (a channel) is counted as a publisher of the queues, receives their confirms when ``confirm_seq`` is
        set (> 0: its confirm sequence number, < 0: a transaction's token) and is paused by credit flow.
        ``dead_letter``: a queue republishing a dead message: the queues it already died in are skipped (the
        cycle rule) and the client counters (received, routed, unroutable) are left alone, as in RabbitMQ.
        An exchange that ``holds_messages`` keeps the message (Exchange.hold answers for it) unless ``held``:
        the exchange letting go of a message it held (not counted again as a client's publish); ``skip``: queues
        it must not reach although bound (a delayed message in doubt after a crash, already in them).
        TTLs count from here: the message's publish time is stamped now, on the vhost's clock. Direct, no task,
        no allocation beyond the routing sets: this is the hot path of every basic.publish. While the vhost
        traces, a client's publish (not a dead letter, not a held message let go, not the tracer's own copies,
        which are published ``held``) is traced (broker/observability/trace.py); otherwise that costs one attribute check."""
        msg.published_at = self.clock.now_ms()
        tracer = self.tracing
        if tracer is not None and not (dead_letter or held):
            tracer.stamp(msg)
        result = 0
        if exchange.name == "":
            key = msg.routing_key
            if key.startswith(REPLY_TO_PREFIX) and not dead_letter:
                # Direct reply-to: straight to the consumer's channel, no queue (a dead letter never is).
                queues = None
                if self.replies is not None and self.replies.deliver_reply(msg):
                    result = ROUTED
            elif msg.extra_keys is None:
                q: Queue | OtherMembersQueue | None = self.queues.get(key)
                if q is None and self.clustered:
                    q = self.remote.queue(key)  # another cluster member's (broker/clustering/remote_queue.py)
                    if q is None:
                        # Maybe a shared queue declared on another member just now: the feed is read for the
                        # next message (a client's publish waited for that read: Channel.basic_publish).
                        self.catch_up.soon()
                queues = [q] if q is not None else None
            else:
                queues = self.route(exchange, msg)
        elif exchange.holds_messages and not held:
            queues = None
            result = exchange.hold(msg, persistent, publisher, confirm_seq)
        else:
            queues = self.route(exchange, msg)
        if tracer is not None and not (dead_letter or held):
            # Before the delivery (a consumer waiting on the queue gets it at once): publish, then deliver,
            # in the trace as in RabbitMQ's.
            tracer.published(exchange.name, msg, queues, publisher)
        if queues:
            if skip:
                queues = [q for q in queues if q.name not in skip]
            if dead_letter:
                deaths = deaths_of(msg)
                queues = [q for q in queues if not is_cycle(q.name, deaths)]
                if not queues:
                    return 0
            result = delegate.deliver(queues, msg, persistent, publisher, confirm_seq) | ROUTED
            if not dead_letter:
                exchange.publish_out += len(queues)
        if dead_letter or held:
            return result
        exchange.publish_in += 1
        counters = self.counters
        if counters is not None:
            counters.messages_received += 1
            size = len(msg.body)
            sizes = counters.message_sizes
            sizes.buckets[bisect_left(MESSAGE_SIZE_BOUNDS, size)] += 1
            sizes.sum += size
            if confirm_seq > 0:
                counters.messages_received_confirm += 1
            if result:
                counters.messages_routed += 1
            elif mandatory:
                counters.messages_unroutable_returned += 1
            else:
                counters.messages_unroutable_dropped += 1
        return result

    def publish_run(self, exchange: Exchange, queues: list[Queue | OtherMembersQueue], msgs: list[Message], persistent: bool,
                    mandatory: bool, publisher: Publisher, first_seq: int = 0) -> list[int] | None:
        """:meth:`publish` for a run of a client's publishes to one exchange with one routing key and one
        content header (broker/amqp/publish_run.py), routed once to ``queues`` (:meth:`route` of the first;
        empty: unroutable). Returns each message's confirm part of :meth:`publish`'s result (REFUSED, the queues
        that confirm later above PENDING; ROUTED is implied), None for an unroutable run.

        Only for what that path takes: a single node, tracing off, an exchange that routes at once, no direct
        reply-to key and no CC / BCC keys. The messages carry their publish time already."""
        n = len(msgs)
        results = delegate.deliver_run(queues, msgs, persistent, publisher, first_seq) if queues else None
        exchange.publish_in += n
        if queues:
            exchange.publish_out += len(queues) * n
        counters = self.counters
        if counters is not None:
            counters.messages_received += n
            size = len(msgs[0].body)  # one content header: one body size
            sizes = counters.message_sizes
            sizes.buckets[bisect_left(MESSAGE_SIZE_BOUNDS, size)] += n
            sizes.sum += size * n
            if first_seq > 0:
                counters.messages_received_confirm += n
            if results is not None:
                counters.messages_routed += n
            elif mandatory:
                counters.messages_unroutable_returned += n
            else:
                counters.messages_unroutable_dropped += n
        return results

    def publish_events(self, exchange: Exchange, msgs: list[Message]) -> int:
        """The broker's own transient messages to ``exchange`` (the firehose's events of one loop turn,
        broker/observability/trace.py), as :meth:`publish` with ``held`` would put them one by one: each routed
        by the bindings as they are, stamped now, not counted as a client's publish, no confirms, no credit
        flow. Consecutive messages routed to the same queues are handed over as one run
        (``delegate.deliver_run``): a stream appends the run in one write. Only for an exchange that routes at
        once (no delayed or deduplicating exchange) and messages without a direct reply-to key.

        Failures do not stop the rest: a message that fails to route is dropped alone, a run whose hand-over
        raises is dropped whole (part of it may have been taken before the error: not handed over again, which
        could duplicate it), and the others go on. With one sink bound to every event, a turn is one run. The
        failures of a call are logged once. Returns how many messages were dropped."""
        now = self.clock.now_ms()
        route = self.route
        failed: list[tuple[int, BaseException]] = []  # (messages dropped, why)
        run: list[Message] = []
        run_queues: list[Queue | OtherMembersQueue] = []
        for msg in msgs:
            msg.published_at = now
            try:
                queues = route(exchange, msg)
            except Exception as e:  # noqa: BLE001 (logged once, at the end of the call)
                failed.append((1, e))
                continue
            if queues != run_queues:
                self._deliver_events(exchange, run_queues, run, failed)
                run = []
                run_queues = queues
            run.append(msg)
        self._deliver_events(exchange, run_queues, run, failed)
        if not failed:
            return 0
        dropped = sum(n for n, _ in failed)
        log.error("broker messages dropped", vhost=self.name, exchange=exchange.name, dropped=dropped,
                  of=len(msgs), failures=len(failed), exc_info=failed[0][1])
        return dropped

    @staticmethod
    def _deliver_events(exchange: Exchange, queues: list[Queue | OtherMembersQueue], run: list[Message],
                        failed: list[tuple[int, BaseException]]) -> None:
        """One run of :meth:`publish_events`, counted out of ``exchange`` once handed over; a failure is added to
        ``failed``."""
        if not run or not queues:
            return
        try:
            delegate.deliver_run(queues, run, False, None)
        except Exception as e:  # noqa: BLE001 (logged once, at the end of publish_events)
            failed.append((len(run), e))
            return
        exchange.publish_out += len(run) * len(queues)

    def publish_as(self, user: User, msg: Message, mandatory: bool = False, publisher: Publisher | None = None,
                   confirm_seq: int = 0) -> int:
        """A publish by ``user`` from outside AMQP (the HTTP API; later the Spark writer): the checks a
        channel's basic.publish makes — write permission on the exchange, the exchange itself, topic
        permissions of the routing key and the CC / BCC keys, the properties (user-id, expiration, ...) —
        then :meth:`publish`. Refusals are AMQPErrors with basic.publish's codes and texts."""
        permissions.basic_publish(user, self.name, msg.exchange)
        exchange = self.check_publishable(msg.exchange)
        topic = topic_permissions.publish_check(user, self.name, msg.exchange)
        if topic is not None:
            topic.check(exchange, msg.routing_key)
        persistent = check_properties(msg, property_flags(msg.header), user)
        if topic is not None and msg.extra_keys:
            topic.check_all(exchange, msg.extra_keys)
        return self.publish(exchange, msg, persistent, mandatory, publisher, confirm_seq)

    def check_publishable(self, exchange_name: str) -> Exchange:
        ex = self.exchanges.get(exchange_name)
        if ex is None:
            if exchange_name == "":
                return self.default_exchange
            ex = self.lookup_exchange(exchange_name)  # 404, unless another cluster member declared it
        if ex.internal:
            raise AMQPError(ACCESS_REFUSED,
                            f"cannot publish to internal exchange '{exchange_name}' in vhost '{self.name}'")
        return ex
