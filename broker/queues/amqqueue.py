"""The queue registry of a vhost (RabbitMQ's ``rabbit_amqqueue``): declare, look up and delete queues,
with RabbitMQ's equivalence and exclusivity rules and its error texts.

What a queue is comes from its type (broker/queues/queue_types.py, chosen by ``x-queue-type``); what store holds its
messages is the node's choice (``backing_queue_factory``). The registry only keeps the queues by name."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from broker.deduplication import open_cache, queue_settings
from broker.errors import AMQPError
from broker.exchanges.exchange import DurableStore
from broker.policies import limits
from broker.queues.queue_args import effective_settings, refused_by_type, validate_arguments
from broker.queues.queue_shell import QueueHost, QueueOwner
from broker.queues.queue_types import OpenStore, Queue, memory_store, queue_type_of
from broker.resources.memory_budget import default_budget
from broker.topology import CatchUp, OtherMembersQueue, Topology
from protocol.constants import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED

if TYPE_CHECKING:
    from broker.policies.policy import Policy

# The connection that declares a queue (broker/amqp/reader.py's Reader), as the registry sees it.
Reader = QueueOwner


class Definitions(DurableStore, Protocol):
    """Where the registry writes a durable queue's definition (broker/persistence.py's DurableDefinitions;
    broker/vhost.py's VHostDefinitions adds what the vhost writes). Raises if it cannot, and nothing changes."""

    def queue_declared(self, vhost: str, q: Queue) -> None: ...

    def queue_deleted(self, vhost: str, name: str) -> None: ...


class VHost(QueueHost, Protocol):
    """What the registry asks of its vhost (broker/vhost.py's VHost) beyond what its queues do, declared here so
    that the registry need not import the layer above it."""

    @property
    def durable(self) -> Definitions | None:
        """None for a vhost that keeps nothing (unit tests, before the node's storage is open)."""
        ...

    default_queue_type: str  # of a queue declared without x-queue-type (RabbitMQ's vhost default queue type)
    remote: Topology  # the other members' queues (broker/topology.py): LocalTopology on a single node
    catch_up: CatchUp  # a cluster member's DefinitionsFollower (reads the definitions feed); else NEVER_BEHIND

    def policies_for_queue(self, name: str, queue_type: str = ...) -> tuple[Policy | None, Policy | None]: ...

    def remove_bindings_to_queue(self, queue_name: str) -> None: ...

class Declared(Protocol):
    """What a redeclare is compared with (RabbitMQ's ``assert_equivalence``): a queue of this node (a
    :class:`Queue`), or another cluster member's as its owner answered (:class:`DeclaredElsewhere`, made by
    broker/clustering/cluster_forwarding.py)."""

    @property
    def name(self) -> str: ...

    @property
    def durable(self) -> bool: ...

    @property
    def auto_delete(self) -> bool: ...

    @property
    def exclusive_owner(self) -> QueueOwner | None: ...

    @property
    def arguments(self) -> dict[str, Any]: ...


class DeclaredElsewhere(NamedTuple):
    """A queue as another cluster member answered for it: compared with a declare made here
    (:meth:`QueueRegistry.assert_equivalence`); never exclusive (an exclusive queue is refused before)."""

    name: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]
    exclusive_owner: QueueOwner | None = None


# The queue arguments RabbitMQ compares on redeclare (rabbit_amqqueue's declare_args, and the stream's
# retention and segment size); others are stored but not compared.
EQUIVALENCE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                    "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-type",
                    "x-single-active-consumer", "x-delivery-limit", "x-queue-mode", "x-max-age",
                    "x-stream-max-segment-size-bytes")


def server_generated_name(prefix: str = "amq.gen-") -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _field_type(value: Any) -> str:
    """The AMQP field type RabbitMQ names in an inequivalent-arg text. The decoded table no longer says which
    integer type the client sent: 32-bit values are named ``signedint`` (what pika and most clients send),
    wider ones ``long``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return "longstr"


def _inequivalent(key: str, where: str, new: Any, old: Any) -> AMQPError:
    """RabbitMQ's rabbit_misc:equivalence_fail text: both values quoted when both are there, else the one that
    is there with its type (checked against RabbitMQ 3.10.8)."""
    if new is not None and old is not None:
        received, current = f"'{_fmt(new)}'", f"'{_fmt(old)}'"
    else:
        received = "none" if new is None else f"the value '{_fmt(new)}' of type '{_field_type(new)}'"
        current = "none" if old is None else f"the value '{_fmt(old)}' of type '{_field_type(old)}'"
    return AMQPError(PRECONDITION_FAILED,
                     f"inequivalent arg '{key}' {where}: received {received} but current is {current}")


def _shown(arguments: dict[str, Any], key: str, compared: Any) -> Any:
    """What the text shows of an argument: as the client sent it (bytes as text); None when it is absent or
    compares as absent (``x-queue-type: classic``)."""
    if compared is None:
        return None
    value = arguments.get(key)
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else value


def _arg_value(arguments: dict[str, Any], key: str) -> Any:
    value = arguments.get(key)
    if key == "x-queue-type" and value in (None, "classic", b"classic"):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


class QueueRegistry:
    def __init__(self, vhost: VHost, make_backing_queue: OpenStore | None = None) -> None:
        self.vhost = vhost
        self._queues: dict[str, Queue] = {}
        # The queues that may hold messages: a superset of those that do. A queue is in it from its creation
        # (and recovery), a classic or quorum queue adds itself on every publish (QueueProcess
        # .deliver_or_enqueue), and the HTTP API's rate sampler, which reads every queue's figures each
        # interval, adds those it finds holding messages and drops those it finds empty
        # (broker/management/presenters/sampling.py). Readers of message figures over 100,000 queues (a page
        # sorted by messages, the overview's totals) read only these: every other queue holds none.
        self.occupied: set[Queue] = set()
        # Opens a queue's store: (name, durable, priority=None, on_confirm=None) → BackingQueue (queue_types
        # OpenStore). In memory until the node's storage is open (broker/persistence.py BackingQueueFactory).
        self.backing_queue_factory: OpenStore = make_backing_queue or memory_store
        # A cluster member's store of the queues every member serves (queue types with ``cluster_shared``:
        # broker/clustering/cluster.py sets it); None on a single node, where they use the node's own store too.
        self.shared_store: OpenStore | None = None

    def __len__(self) -> int:
        return len(self._queues)

    def __iter__(self) -> Iterator[Queue]:
        """Every queue of the vhost, of whatever type (a snapshot: the caller may declare or delete meanwhile),
        as the queue seam (broker/queues/queue_types.py's Queue): readers ask it, never its class."""
        return iter(list(self._queues.values()))

    def get(self, name: str) -> Queue | None:
        return self._queues.get(name)

    def lookup(self, name: str, reader: Reader | None = None) -> Queue:
        """The queue, or 404; with ``reader``, 405 if another connection owns it exclusively."""
        q = self._queues.get(name)
        if q is None and self.vhost.catch_up.now():
            q = self._queues.get(name)  # a shared queue declared on another cluster member since the last poll
        if q is None:
            self.vhost.remote.refuse(name, "use")  # 405 naming the member whose queue it is, if it is
            raise AMQPError(NOT_FOUND, f"no queue '{name}' in vhost '{self.vhost.name}'")
        if reader is not None:
            self.check_exclusive_access(q, reader)
        return q

    def check_exclusive_access(self, q: Queue, reader: Reader | None, strict: bool = False) -> None:
        """405 unless ``reader`` may use the queue: it is not exclusive, or ``reader`` owns it.

        ``strict`` is RabbitMQ's check on a redeclare (``assert_equivalence``), where the exclusive flag
        is part of the equivalence: the owner must be exactly ``reader``, which is None for a declaration
        with exclusive=false. So a shared queue declared exclusive, and an exclusive queue declared
        non-exclusive (by its own connection too), are both refused."""
        owner = q.exclusive_owner
        if owner is not reader and (owner is not None or strict):
            raise self._locked(q.name)

    def _locked(self, name: str) -> AMQPError:
        return AMQPError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.vhost.name}'. "
            "It could be originally declared on another connection or the exclusive property value "
            "does not match that of the original declaration.")

    def declare(self, name: str, passive: bool, durable: bool, exclusive: bool, auto_delete: bool,
                arguments: dict[str, Any], reader: Reader | None, server_named: bool = False,
                owner_checks: list[Callable[[], None]] | None = None) -> tuple[Queue | OtherMembersQueue, bool]:
        """(queue, created). Applies RabbitMQ's checks in its order: reserved names, passive, equivalence.

        In a cluster, a name another member holds answers that member's queue, checked against what it answers
        of it; a caller that can wait for that answer without blocking (a channel, the HTTP API) passes
        ``owner_checks``: the part of the check that needs the answer is appended there, to be run once the
        queue's ``message_count_wait`` called back (else it is checked against the owner's last answer)."""
        if passive:
            remote = self.vhost.remote.find(name) if name not in self._queues else None
            if remote is not None:  # another cluster member's queue: it exists (figures are its member's)
                if remote.exclusive:
                    raise self._locked(name)
                return remote, False
            q = self.lookup(name, reader)
            q.reset_expiry_timer()  # a passive declare renews an x-expires lease too
            return q, False
        arguments = self.with_default_type(arguments, durable, exclusive, auto_delete, server_named)
        validate_arguments(arguments, name, self.vhost.name, creating=self._creates(name, arguments))
        queue_settings(arguments, name, self.vhost.name)  # 406 for a deduplication argument it cannot use
        if name.startswith("amq.") and not server_named:
            raise AMQPError(ACCESS_REFUSED,
                            f"queue name '{name}' contains reserved prefix 'amq.*'")
        existing = self._queues.get(name)
        if existing is None and queue_type_of(arguments).cluster_shared and self.vhost.catch_up.now():
            # A cluster's shared queue another member may have declared since the last poll of the definitions:
            # the feed is read now, so this declare is checked against it (406 if inequivalent) instead of
            # making a second queue process and overwriting the other member's definition.
            existing = self._queues.get(name)
        if existing is not None:
            self.check_exclusive_access(existing, reader if exclusive else None, strict=True)
            self.assert_equivalence(existing, durable, exclusive, auto_delete, arguments)
            existing.reset_expiry_timer()  # a redeclare renews an x-expires lease
            return existing, False
        limits.check_queue_limit(self.vhost, name, len(self._queues))
        queue_type_of(arguments).check_declare(f"queue '{name}' in vhost '{self.vhost.name}'", durable, exclusive,
                                               auto_delete, server_named)
        if exclusive:
            durable = False  # RabbitMQ ignores durable on exclusive queues
        # A cluster member: the name is one queue cluster-wide (another member's, or now claimed for this one).
        remote = self.vhost.remote.claim(name, durable, exclusive, arguments, owner_checks)
        if remote is not None:
            if remote.exclusive or exclusive:
                raise self._locked(name)
            return remote, False
        q = self._create(name, durable, reader if exclusive else None, auto_delete, arguments)
        if exclusive:
            assert reader is not None, "an exclusive queue is declared by a connection"
            reader.exclusive_queues.append(q)
        elif self.vhost.durable is not None:
            try:
                self.vhost.durable.queue_declared(self.vhost.name, q)
            except BaseException:  # not written (a full disk, the cluster's PostgreSQL out of reach): not made
                del self._queues[name]
                self.occupied.discard(q)
                self.vhost.remote.queue_gone(q)  # its directory row too (a cluster member's)
                raise
        return q, True

    def _creates(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether a declare of ``name`` makes a new queue, asked for the arguments its type refuses at creation
        only (a redeclare ignores them) and so answered exactly only when the declare carries one. A queue another
        cluster member holds exists as much as a local one: its name is looked up in the directory (a node-local
        queue) and the definitions' feed is read (a shared one), questions to PostgreSQL asked only then."""
        if name in self._queues:
            return False
        _, refused = refused_by_type(arguments)
        if not any(key in arguments for key in refused):
            return True
        if self.vhost.remote.find(name) is not None:
            return False
        return not (self.vhost.catch_up.now() and name in self._queues)

    def with_default_type(self, arguments: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool,
                           server_named: bool) -> dict[str, Any]:
        """RabbitMQ's default queue type: a declare without ``x-queue-type`` gets the vhost's default type
        (else the node's ``default_queue_type``) written into its arguments, so the queue shows and
        redeclares as that type; properties that type cannot have (quorum and stream queues are durable,
        not exclusive, not auto-delete; a stream is not server-named) fall back to classic, as RabbitMQ does."""
        if "x-queue-type" in arguments:
            return arguments
        dqt = self.vhost.default_queue_type
        if dqt == "classic":
            return arguments
        if not durable or exclusive or auto_delete or (server_named and dqt == "stream"):
            return arguments
        return {**arguments, "x-queue-type": dqt}

    def restore(self, name: str, auto_delete: bool, arguments: dict[str, Any]) -> Queue:
        """Recovery: a durable queue as it was declared; its backing queue brings its messages back (and its
        deduplication cache what it had admitted)."""
        return self._create(name, True, None, auto_delete, arguments, recovered=True)

    def _create(self, name: str, durable: bool, owner: Reader | None, auto_delete: bool,
                arguments: dict[str, Any], recovered: bool = False) -> Queue:
        qtype = queue_type_of(arguments)
        settings = effective_settings(arguments, *self.vhost.policies_for_queue(name, qtype.name))
        open_store = self.shared_store if qtype.cluster_shared and self.shared_store is not None \
            else self.backing_queue_factory
        q = qtype.new_queue(self.vhost, name, durable, owner, auto_delete, arguments, settings, open_store)
        dedup = queue_settings(arguments, name, self.vhost.name)
        if dedup is not None:
            storage = self.vhost.durable.storage if self.vhost.durable is not None else None
            q.dedup = open_cache(dedup, self.vhost.clock, storage, "queue", self.vhost.name, name,
                                 durable=durable, recovered=recovered)
        q.set_ram_budget(default_budget(q))
        self._queues[name] = q
        self.occupied.add(q)
        return q

    def assert_equivalence(self, q: Declared, durable: bool, exclusive: bool, auto_delete: bool,
                           arguments: dict[str, Any]) -> None:
        """406 unless a redeclare with these properties and arguments is equivalent to ``q`` as declared
        (RabbitMQ's ``rabbit_amqqueue:assert_equivalence``: durable, auto-delete, :data:`EQUIVALENCE_ARGS` that
        the queue's type takes: a classic queue redeclared with x-max-age, or a quorum queue with x-queue-mode,
        is equivalent, as on RabbitMQ 3.10.8)."""
        where = f"for queue '{q.name}' in vhost '{self.vhost.name}'"
        if q.exclusive_owner is None and q.durable != durable:
            raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg 'durable' {where}: received "
                            f"'{_fmt(durable)}' but current is '{_fmt(q.durable)}'")
        if q.auto_delete != auto_delete:
            raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg 'auto_delete' {where}: received "
                            f"'{_fmt(auto_delete)}' but current is '{_fmt(q.auto_delete)}'")
        _, not_taken = refused_by_type(q.arguments)
        for key in EQUIVALENCE_ARGS:
            if key in not_taken:  # RabbitMQ compares the arguments the queue's type takes, no other
                continue
            new, old = _arg_value(arguments, key), _arg_value(q.arguments, key)
            if new != old:
                raise _inequivalent(key, where, _shown(arguments, key, new), _shown(q.arguments, key, old))

    def delete(self, q: Queue, reason: str = "deleted") -> int:
        """Remove the queue, its bindings and its consumers; returns the number of messages dropped."""
        if self._queues.get(q.name) is not q:
            return 0
        del self._queues[q.name]
        self.occupied.discard(q)
        self.vhost.remote.queue_gone(q)
        if self.vhost.counters is not None:
            self.vhost.counters.queues_deleted += 1
        if q.durable and self.vhost.durable is not None:
            self.vhost.durable.queue_deleted(self.vhost.name, q.name)
        self.vhost.remove_bindings_to_queue(q.name)
        if q.dedup is not None:
            q.dedup.delete()
        if q.exclusive_owner is not None:
            try:
                q.exclusive_owner.exclusive_queues.remove(q)
            except ValueError:
                pass
        return q.terminate()

