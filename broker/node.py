"""The node: the broker's shared state — settings, users and permissions, vhosts, global parameters, open
connections, counters, alarms, the storage once it is open — and the domain methods that change it (each writes
the metadata store first, then memory).

Starting and stopping it (storage recovery, listeners, signals) is broker/server.py's job; the node does not
know the reader: it sees connections through :class:`ClientConnection`, which the reader satisfies."""

from __future__ import annotations

import base64
import os
import platform
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.clock import Clock, LoopClock
from broker.config import Settings
from broker.federation.supervisor import FederationSupervisor
from broker.message import Message
from broker.observability.counters import GlobalCounters
from broker.persistence import BackingQueueFactory, DurableDefinitions
from broker.policies.limits import Connection as LimitedConnection
from broker.publish import REPLY_TO_PREFIX
from broker.queues.direct_reply_to import ReplyChannel
from broker.resources.alarms import (
    AlarmState,
    BlockableConnection,
    ResourceMonitor,
    configured_disk_free_limit,
    configured_memory_limit,
)
from broker.resources.memory_budget import MemoryBudget, set_memory_limit
from broker.security.auth import HASHING_ALGORITHMS, SHA256, Permission, User, UserStore, hash_password
from broker.security.topic_permissions import TopicCheckingConnection
from broker.shovel.supervisor import ShovelSupervisor
from broker.shovel.worker import LocalLogin
from broker.vhost import VHost
from storage.commits import COMMITTED_AT_ONCE, Commits
from storage.node_storage import NodeStorage

if TYPE_CHECKING:
    from broker.clustering.cluster import Cluster

log = structlog.get_logger("leveret.node")

# The RabbitMQ version the HTTP API reports as ``rabbitmq_version``, for tools that switch on it.
RABBITMQ_COMPAT_VERSION = "3.13.7"

class ClientConnection(BlockableConnection, LimitedConnection, TopicCheckingConnection, Protocol):
    """What the node and the modules below it need of an open client connection (broker/amqp/reader.py's Reader
    is one): what the alarms, the limits and the topic-permission cache use, and a way to close it with 320
    CONNECTION_FORCED. Modules above the reader read the node's connections as readers
    (``broker.amqp.reader.open_connections``)."""

    def force_close(self, text: str = ...) -> None: ...


def default_node_name(settings: Settings) -> str:
    """The node's name when ``leveret.nodename`` is not set: ``leveret@<host>``, as RabbitMQ's is rabbit@<host>.
    A cluster member on a port other than 5672 is ``leveret-<port>@<host>``: members on one machine must have
    distinct names (a second start of a running member's name is refused, storage/pg/cluster.py), and their
    AMQP ports differ anyway, so trying a cluster on one machine needs no name set; the port is as stable across
    the member's restarts as the name must be (its node-local queues are found by it)."""
    host = platform.node()
    if settings.cluster_dsn and settings.port != 5672:
        return f"leveret-{settings.port}@{host}"
    return f"leveret@{host}"


class Node:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cluster: Cluster | None = None  # a cluster member's membership (broker/clustering/cluster.py)
        self.name = settings.node_name or default_node_name(settings)
        self.cluster_name = settings.cluster_name or self.name
        self.rabbitmq_version = RABBITMQ_COMPAT_VERSION
        self.started_at = time.time()
        # The one source of time for every part of the node (broker/clock.py); tests may pass a ManualClock.
        self.clock: Clock = LoopClock()
        self.counters = GlobalCounters()
        # Resource alarms in effect ("memory", "disk"); the monitors add and remove them.
        self.active_alarms: set[str] = set()
        # The node's storage (storage/node_storage.py), opened at start before anything listens, and the
        # writer of every definition into its metadata store (None until then: nothing is written).
        self.storage: NodeStorage | None = None
        self.durable_definitions: DurableDefinitions | None = None
        # When the definitions written now are committed (storage/commits.py): the server sets the node's SQLite
        # store (fsynced by the syncer's thread, storage/metadata_store.py) once it is open, a cluster member adds
        # its PostgreSQL tables; replies to the methods that write wait for it. Nothing is written before.
        self.commits: Commits = COMMITTED_AT_ONCE
        self.users = UserStore()
        self.users.add(settings.default_user, settings.default_pass, list(settings.default_user_tags))
        # Dynamic shovels (broker/shovel/): started by the server once it listens, from the vhosts' parameters.
        self.shovels = ShovelSupervisor(self.name, self.shovel_login, self._shovel_finished)
        # Exchange federation (broker/federation/): links follow the vhosts' policies and upstream parameters.
        self.federation = FederationSupervisor(self)
        self.vhosts: dict[str, VHost] = {}
        self.add_vhost(settings.default_vhost)
        perms = settings.default_permissions
        self.users.set_permissions(settings.default_user, settings.default_vhost, perms["configure"],
                                   perms["write"], perms["read"])
        self.global_parameters: dict[str, Any] = {}
        self.connections: set[ClientConnection] = set()
        # Memory and disk alarms (broker/resources/alarms.py); the monitor that raises them starts with the node.
        self.alarm_state = AlarmState()
        self.resource_monitor: ResourceMonitor | None = None
        self._reply_channels: dict[str, ReplyChannel] = {}
        # In a cluster (broker/clustering/cluster_forwarding.py): reply keys start with this member's tag, and a reply to
        # another member's key is forwarded there. On a single node: "" and None (keys as they always were).
        self.reply_key_prefix = ""
        self.forward_reply: Callable[[Message], int] | None = None
        # What the server listens on (broker/server.py fills it; the HTTP API's overview lists it).
        self.listeners: list[dict[str, Any]] = []
        # Called (and awaited if they return an awaitable) at shutdown, after connections are closed:
        # the place for stores to flush, sync and write their clean-shutdown marker.
        self.shutdown_hooks: list[Callable[[], Awaitable[None] | None]] = []
        self.memory_budget: MemoryBudget | None = None
        # A queue's rates (its message counters' and counts', by the HTTP API's names) as the HTTP API's rate
        # sampler last worked them out; set by broker/management/app.py (None without it). A cluster member
        # tells the others these rates of its node-local queues, so that every member shows the same.
        self.queue_rates: Callable[[Any], dict[str, float]] | None = None
        # Set by the server when a graceful shutdown begins (the health checks answer 503 from then on).
        self.stopping = False

    # -- vhosts, users, permissions, global parameters (the HTTP API, ctl and definitions go through these) -----
    # Each method writes its change to the metadata store first (when the node's storage is open) and
    # then changes memory: a write that fails raises MetadataWriteError and nothing has changed.
    def add_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str | None = None) -> VHost:
        """Create a vhost (idempotent; an existing vhost gets the new description and tags). Without a
        ``default_queue_type`` a new vhost takes the node's (``default_queue_type`` in the configuration)."""
        if default_queue_type is None:
            default_queue_type = self.settings.default_queue_type
        vh = self.vhosts.get(name)
        new_tags = list(tags or []) if vh is None or tags is not None else list(vh.tags)
        new_description = description or (vh.description if vh is not None else "")
        if self.durable_definitions is not None:
            dqt = default_queue_type if vh is None else vh.default_queue_type
            self.durable_definitions.vhost_put(name, new_description, new_tags, dqt)
        if vh is None:
            vh = self.vhosts[name] = VHost(name, self.counters, self, self.clock, description=new_description,
                                           tags=new_tags, default_queue_type=default_queue_type,
                                           max_bindings_per_queue=self.settings.max_bindings_per_queue)
            self._attach_storage(vh)
            vh.on_parameter = self.shovels.parameter_changed
            # Only a vhost that is new to the node's store is logged: the defaults made in memory before the
            # store opens, and the vhosts recovery re-creates, are not (every restart once logged "vhost
            # created"); the server logs a new node's defaults when it first writes them (Server.open_storage).
            if self.durable_definitions is not None:
                log.info("vhost created", vhost=name)
        else:
            vh.description = new_description
            vh.tags = new_tags
        return vh

    def shovel_login(self, vhost: str) -> LocalLogin:
        """How a shovel with an ``amqp://`` URI of no host reaches this node: its AMQP listener, as a
        node-internal user (one per vhost, a random secret never stored) with all permissions on that vhost
        only (broker/shovel/supervisor.py says why this and not an in-process path)."""
        listener = next((li for li in self.listeners if li["protocol"] == "amqp"), None)
        if listener is None:
            raise OSError("the node has no plain AMQP listener for a local shovel to connect to")
        host = listener["ip_address"]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        name = f"leveret-shovel-{vhost}"
        entry = self.users.internal.get(name)
        if entry is None:
            user = User(name, "", [], permissions={vhost: Permission(".*", ".*", ".*")})
            entry = self.users.internal[name] = (secrets.token_urlsafe(24), user)
        return LocalLogin(host, int(listener["port"]), name, entry[0])

    def _shovel_finished(self, vhost: str, name: str) -> None:
        """A shovel reached src-delete-after: its parameter goes, as RabbitMQ's does."""
        vh = self.vhosts.get(vhost)
        if vh is not None:
            vh.clear_parameter("shovel", name)

    def delete_vhost(self, name: str) -> bool:
        """Close the vhost's connections (320), delete its queues and every permission in it. The store
        forgets all of it in one commit first; then memory, without a write per queue or binding."""
        vh = self.vhosts.get(name)
        if vh is None:
            return False
        if self.durable_definitions is not None:
            self.durable_definitions.vhost_deleted(name)
        del self.vhosts[name]
        vh.durable = None  # its rows are gone already
        for conn in list(self.connections):
            if conn.vhost is vh:
                conn.force_close(f"vhost '{name}' is deleted")
        for q in list(vh.queues):
            vh.queues.delete(q, reason="vhost deleted")
        vh.stop_exchanges(vhost_deleted=True)
        self.shovels.forget_vhost(name)
        self.users.forget_vhost(name)
        log.info("vhost deleted", vhost=name)
        return True

    def put_user(self, name: str, password_hash: str, tags: list[str] | None = None,
                 hashing_algorithm: str = SHA256, limits: dict[str, int] | None = None) -> User:
        """Create or update a user from a password hash (its permissions are kept; ``limits`` None keeps
        its limits). Raises ValueError for an unknown hashing algorithm."""
        if hashing_algorithm not in HASHING_ALGORITHMS:
            raise ValueError(f"unknown hashing algorithm '{hashing_algorithm}'")
        existing = self.users.users.get(name)
        new_limits = dict(limits) if limits is not None else dict(existing.limits) if existing is not None else {}
        if self.durable_definitions is not None:
            self.durable_definitions.user_put(User(name, password_hash, list(tags or []), hashing_algorithm,
                                                   limits=new_limits))
        user = self.users.put(name, password_hash, tags, hashing_algorithm)
        user.limits = new_limits
        return user

    def add_user(self, name: str, password: str, tags: list[str] | None = None) -> User:
        return self.put_user(name, hash_password(password), tags)

    def set_user_limits(self, name: str, limits: dict[str, int]) -> None:
        """Replace the user's limits (validated already). Raises KeyError for an unknown user."""
        user = self.users.users[name]
        if self.durable_definitions is not None:
            self.durable_definitions.user_put(User(user.name, user.password_hash, list(user.tags),
                                                   user.hashing_algorithm, limits=dict(limits)))
        user.limits = dict(limits)

    def delete_users(self, *names: str) -> int:
        """Delete users with their permissions (one commit for all); returns how many existed."""
        users = [self.users.users[n] for n in dict.fromkeys(names) if n in self.users.users]
        if self.durable_definitions is not None and users:
            with self.durable_definitions.metadata.transaction():
                for user in users:
                    self.durable_definitions.user_deleted(user)
        for user in users:
            self.users.delete(user.name)
        return len(users)

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        """Raises KeyError for an unknown user and re.error for a bad regex (before anything is written)."""
        if user not in self.users.users:
            raise KeyError(user)
        permission = Permission(configure, write, read)
        if self.durable_definitions is not None:
            self.durable_definitions.permission_set(vhost, user, permission)
        self.users.users[user].permissions[vhost] = permission

    def clear_permissions(self, user: str, vhost: str) -> bool:
        u = self.users.users.get(user)
        if u is None or vhost not in u.permissions:
            return False
        if self.durable_definitions is not None:
            self.durable_definitions.permission_cleared(vhost, user)
        del u.permissions[vhost]
        return True

    def set_topic_permission(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        """Raises KeyError for an unknown user."""
        u = self.users.users[user]
        if self.durable_definitions is not None:
            self.durable_definitions.topic_permission_set(vhost, user, exchange, write, read)
        u.topic_permissions.setdefault(vhost, {})[exchange] = (write, read)

    def clear_topic_permissions(self, user: str, vhost: str) -> bool:
        u = self.users.users.get(user)
        if u is None or vhost not in u.topic_permissions:
            return False
        if self.durable_definitions is not None:
            self.durable_definitions.topic_permissions_cleared(vhost, user)
        del u.topic_permissions[vhost]
        return True

    def set_global_parameter(self, name: str, value: Any) -> None:
        if self.durable_definitions is not None:
            self.durable_definitions.global_parameter_set(name, value)
        self.global_parameters[name] = value

    def clear_global_parameter(self, name: str) -> bool:
        if name not in self.global_parameters:
            return False
        if self.durable_definitions is not None:
            self.durable_definitions.global_parameter_cleared(name)
        del self.global_parameters[name]
        return True

    def vhost_access_error(self, user: User, vhost_name: str) -> str | None:
        """For connection.open: None if ``user`` may use the vhost, else RabbitMQ's refusal text (send it
        with 530 NOT_ALLOWED). A vhost that does not exist is reported as RabbitMQ does."""
        if vhost_name not in self.vhosts:
            return f"vhost {vhost_name} not found"
        if vhost_name in user.permissions:
            return None
        return f"access to vhost '{vhost_name}' refused for user '{user.name}'"

    def alarms(self) -> set[str]:
        return set(self.alarm_state.raised)

    @property
    def memory_limit(self) -> int:
        """The memory high watermark in force, in bytes: the configured one, or the one
        ``ctl set_vm_memory_high_watermark`` set since."""
        monitor = self.resource_monitor
        return monitor.memory_limit if monitor is not None else configured_memory_limit(self.settings)

    @property
    def disk_free_limit(self) -> int:
        """The free-disk limit in force, in bytes: the configured one (``disk_free_limit.relative`` applied),
        or the one ``ctl set_disk_free_limit`` set since."""
        monitor = self.resource_monitor
        return monitor.disk_free_limit if monitor is not None else configured_disk_free_limit(self.settings)

    # -- direct reply-to: amq.rabbitmq.reply-to.<key> names one channel's reply consumer ---------------------
    def register_reply_channel(self, channel: ReplyChannel) -> str:
        key = self.reply_key_prefix + base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._reply_channels[key] = channel
        return key

    def unregister_reply_channel(self, key: str) -> None:
        self._reply_channels.pop(key, None)

    def deliver_reply(self, msg: Message) -> int:
        """Route a message published to ``amq.rabbitmq.reply-to.<key>`` (VHost.publish, whose ``ReplyTo`` this
        node is); 0 if that consumer is gone."""
        channel = self._reply_channels.get(msg.routing_key[len(REPLY_TO_PREFIX):])
        if channel is None or channel.reply_consumer is None:
            forward = self.forward_reply  # a cluster member: another member's key goes there
            return 0 if forward is None else forward(msg)
        channel.deliver_reply(msg)
        return 1

    def _attach_storage(self, vh: VHost) -> None:
        if self.storage is not None:
            vh.durable = self.durable_definitions
            vh.queues.backing_queue_factory = BackingQueueFactory(self.storage, vh.name)
            if self.cluster is not None:
                vh.queues.shared_store = self.cluster.queue_store(vh.name)
                self.cluster.vhost_added(vh)

    def close_storage(self) -> None:
        if self.memory_budget is not None:
            self.memory_budget.stop()
        if self.storage is not None:
            self.storage.close()
            self.storage = None
            log.info("storage closed cleanly")

    def set_resource_limits(self, disk_free_limit: int | None = None, memory_limit: int | None = None) -> None:
        """rabbitmqctl set_disk_free_limit / set_vm_memory_high_watermark: new limits, alarms re-checked."""
        monitor = self.resource_monitor
        if monitor is None:
            return
        if disk_free_limit is not None:
            monitor.disk_free_limit = disk_free_limit
        if memory_limit is not None:
            monitor.memory_limit = memory_limit
            set_memory_limit(memory_limit)
        monitor.stop()
        monitor.check()
