"""The node: the broker's shared state (settings, users, vhosts, connections, counters) and its listeners
(AMQP, the HTTP API, Prometheus), start-up (definitions) and graceful shutdown."""

from __future__ import annotations

import asyncio
import base64
import os
import platform
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from broker.alarms import AlarmState, ResourceMonitor, configured_disk_free_limit, configured_memory_limit
from broker.auth import HASHING_ALGORITHMS, SHA256, Permission, User, UserStore, hash_password
from broker.clock import Clock, LoopClock
from broker.config import Settings
from broker.counters import GlobalCounters
from broker.memory_budget import MemoryBudget, set_memory_limit
from broker.message import Message
from broker.persistence import NODE_METADATA_KEY, BackingQueueFactory, DurableDefinitions
from broker.publish import REPLY_TO_PREFIX
from broker.reader import Reader
from broker.vhost import VHost
from storage.data_dir_lock import DataDirLock, DataDirLocked
from storage.metadata_store import MetadataStore, MetadataStoreError, MetadataWriteError
from storage.node_storage import METADATA_FILE as METADATA_DB
from storage.node_storage import NODE_KIND, DataDirectoryError, NodeStorage, reset_data_dir

if TYPE_CHECKING:
    from broker.channel import Channel

log = structlog.get_logger("leveret.node")

# The RabbitMQ version the HTTP API reports as ``rabbitmq_version``, for tools that switch on it.
RABBITMQ_COMPAT_VERSION = "3.13.7"
SHUTDOWN_REASON = "broker forced connection closure with reason 'shutdown'"
# Appended to a refused start caused by the data directory: the other way out than a backup.
FORCE_RESET_HINT = ("To discard every message and definition instead and start as a new node, run "
                    "`leveret serve --force-reset` once")


def _ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def listen_hosts(bind: str) -> str | list[str] | None:
    """The addresses a listener binds for ``bind``: the loopback address (the default) means both
    loopbacks, 127.0.0.1 and ::1 where IPv6 is there, so a client whose ``localhost`` resolves to ::1 is
    served; 0.0.0.0 or :: means every address of both families (None to asyncio), as RabbitMQ listens."""
    if bind in ("0.0.0.0", "::", "*"):
        return None
    if bind in ("127.0.0.1", "localhost"):
        return ["127.0.0.1", "::1"] if _ipv6_loopback_available() else ["127.0.0.1"]
    return bind


class StartupError(Exception):
    """Start-up cannot go on (a port taken, a definitions file that does not load): one line for stderr."""


def init_vhost_metadata(vh: VHost, description: str = "", tags: list[str] | None = None,
                        default_queue_type: str = "classic") -> VHost:
    """The operator-facing attributes of a vhost, kept on the VHost object (set only where missing)."""
    for attr, value in (("description", description), ("tags", list(tags or [])),
                        ("default_queue_type", default_queue_type), ("policies", {}),
                        ("operator_policies", {}), ("parameters", {}), ("limits", {})):
        if not hasattr(vh, attr):
            setattr(vh, attr, value)
    return vh


class Node:
    def __init__(self, settings: Settings, *, force_reset: bool = False) -> None:
        self.settings = settings
        # ``leveret serve --force-reset`` (rabbitmqctl force_reset): wipe the data directory at start.
        self.force_reset = force_reset
        # An older node's metadata.json, read (and checked) before the message stores open, to be
        # migrated into the metadata store at start.
        self._metadata_doc: dict[str, Any] | None = None
        self.name = f"leveret@{platform.node()}"
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
        self.users = UserStore()
        self.users.add(settings.default_user, settings.default_pass, list(settings.default_user_tags))
        self.vhosts: dict[str, VHost] = {}
        self.add_vhost(settings.default_vhost)
        perms = settings.default_permissions
        self.users.set_permissions(settings.default_user, settings.default_vhost, perms["configure"],
                                   perms["write"], perms["read"])
        self.global_parameters: dict[str, Any] = {}
        self.connections: set[Reader] = set()
        # Memory and disk alarms (broker/alarms.py); the monitor that raises them starts with the node.
        self.alarm_state = AlarmState()
        self.resource_monitor: ResourceMonitor | None = None
        self._reply_channels: dict[str, Channel] = {}
        self._server: asyncio.base_events.Server | None = None
        self._http_runners: list[Any] = []
        self.listeners: list[dict[str, Any]] = []
        # Called (and awaited if they return an awaitable) at shutdown, after connections are closed:
        # the place for stores to flush, sync and write their clean-shutdown marker.
        self.shutdown_hooks: list[Callable[[], Awaitable[None] | None]] = []
        self.memory_budget: MemoryBudget | None = None
        self.stopping = False
        self._data_dir_lock: DataDirLock | None = None  # held from start to exit: one broker per directory

    # -- vhosts, users, permissions, global parameters (the HTTP API, ctl and definitions go through these) -----
    # Each method writes its change to the metadata store first (when the node's storage is open) and
    # then changes memory: a write that fails raises MetadataWriteError and nothing has changed.
    def add_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str = "classic") -> VHost:
        """Create a vhost (idempotent; an existing vhost gets the new description and tags)."""
        vh = self.vhosts.get(name)
        new_tags = list(tags or []) if vh is None or tags is not None else list(vh.tags)
        new_description = description or (vh.description if vh is not None else "")
        if self.durable_definitions is not None:
            dqt = default_queue_type if vh is None else vh.default_queue_type
            self.durable_definitions.vhost_put(name, new_description, new_tags, dqt)
        if vh is None:
            vh = self.vhosts[name] = init_vhost_metadata(VHost(name, self.counters, self, self.clock), description, tags,
                                                         default_queue_type)
            self._attach_storage(vh)
            log.info("vhost created", vhost=name)
        else:
            init_vhost_metadata(vh)
            vh.description = new_description
            vh.tags = new_tags
        return vh

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
    def register_reply_channel(self, channel: Channel) -> str:
        key = base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._reply_channels[key] = channel
        return key

    def unregister_reply_channel(self, key: str) -> None:
        self._reply_channels.pop(key, None)

    def deliver_reply(self, msg: Message) -> int:
        """Route a message published to ``amq.rabbitmq.reply-to.<key>`` (VHost.publish, whose ``ReplyTo`` this
        node is); 0 if that consumer is gone."""
        channel = self._reply_channels.get(msg.routing_key[len(REPLY_TO_PREFIX):])
        if channel is None or channel.reply_consumer is None:
            return 0
        channel.deliver_reply(msg)
        return 1

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start_resource_monitor(self) -> None:
        """Memory limit: the absolute watermark if set, else the relative one times the machine's RAM; disk
        limit: the relative one times the machine's RAM if set, else the absolute one."""
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self.resource_monitor = ResourceMonitor(self.alarm_state, self.connections, s.data_dir,
                                                configured_memory_limit(s), configured_disk_free_limit(s))
        if self.storage is not None:  # the storage tells the disk monitor what it writes and when writes fail
            self.storage.syncer.on_written = self.resource_monitor.note_written
            self.storage.syncer.on_write_failure = self.resource_monitor.set_storage_failing
        self.resource_monitor.start()

    def open_storage(self) -> None:
        """Open the message stores and the metadata store, and recover everything in one ordered pass:
        vhosts, users and permissions, policies and parameters, then the durable exchanges, queues (with
        their messages) and bindings. From now on every definition is written to the store as it changes
        and every queue's backing queue is opened from storage.

        A new node writes its defaults (guest, "/") to the store; an older node's ``metadata.json`` is
        migrated into it once, in one commit, and then renamed ``metadata.json.migrated`` (kept as the
        operator's backup; it is never read again).

        A data directory whose metadata is missing, empty, unreadable or lost while message data is there
        stops the start (StartupError, one line naming the file) before any file is changed: recovery
        would otherwise take every queue for an orphan and delete its messages."""
        from broker import definitions

        data_dir = str(self.settings.data_dir)
        try:
            self._data_dir_lock = DataDirLock.acquire(data_dir)
        except DataDirLocked as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(f"cannot use the data directory {data_dir}: {exc.strerror or exc}") from None
        if self.force_reset:
            self._wipe_data_dir(data_dir)
        json_path = self.settings.data_dir / definitions.METADATA_FILE
        try:
            self.storage = NodeStorage(data_dir, asyncio.get_running_loop(),
                                       queue_index_embed_msgs_below=self.settings.queue_index_embed_msgs_below,
                                       check_metadata=self._read_metadata_file)
            durable = DurableDefinitions(self.storage)
            migrating = self._metadata_doc is not None
            if durable.has_node_metadata:
                counts = durable.recover_node_metadata(self.users, self.vhosts, self.add_vhost, self.global_parameters)
                log.info("node metadata recovered", **counts)
            elif self._metadata_doc is not None:
                try:  # in memory first (nothing is written yet), then saved below in one commit
                    definitions.apply_metadata(self, self._metadata_doc)
                except definitions.DefinitionsError as exc:
                    raise StartupError(f"{json_path} cannot be migrated ({exc}); fix or restore it from a backup. "
                                       f"{FORCE_RESET_HINT}") from None
                self._metadata_doc = None
            self.durable_definitions = durable
            for vh in self.vhosts.values():
                self._attach_storage(vh)
            if not durable.has_node_metadata:
                durable.save_node_metadata(self.users, self.vhosts, self.global_parameters,
                                           drop=definitions.METADATA_WRITTEN)
                if migrating:
                    os.replace(json_path, json_path.with_name(definitions.METADATA_FILE + ".migrated"))
                    log.info("metadata.json migrated into the metadata store", file=str(json_path),
                             renamed_to=definitions.METADATA_FILE + ".migrated", users=len(self.users.users),
                             vhosts=len(self.vhosts))
            durable.recover(self.vhosts, self.add_vhost)
        except (DataDirectoryError, MetadataStoreError) as exc:
            raise StartupError(f"{exc}. {FORCE_RESET_HINT}") from None
        except MetadataWriteError as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(f"cannot open the data directory {data_dir}: {exc}") from None
        self.shutdown_hooks.append(self.close_storage)

    def _read_metadata_file(self, store: MetadataStore | None) -> None:
        """NodeStorage's check of an older node's ``metadata.json`` beside the store (None: a new one),
        read only while the store does not hold the node's metadata yet: it must be there (and readable)
        if the store says it was written, and must not outlive a lost store."""
        from broker import definitions

        if store is not None and store.get(NODE_KIND, NODE_METADATA_KEY) is not None:
            if (self.settings.data_dir / definitions.METADATA_FILE).exists():
                log.warning("ignoring metadata.json: this node's metadata is in its metadata store",
                            data_dir=str(self.settings.data_dir))
            return
        try:
            self._metadata_doc = definitions.read_metadata_file(
                self.settings.data_dir,
                written=store is not None and store.get(*definitions.METADATA_WRITTEN) is not None,
                store_created=store is None, store_path=str(self.settings.data_dir / METADATA_DB))
        except definitions.DefinitionsError as exc:
            raise DataDirectoryError(str(exc)) from None

    def _wipe_data_dir(self, data_dir: str) -> None:
        """--force-reset: everything in the data directory goes (except a log file kept there)."""
        keep = [str(self.settings.log_file)] if self.settings.log_file else []
        try:
            removed = reset_data_dir(data_dir, keep)
        except (OSError, DataDirectoryError) as exc:
            raise StartupError(f"--force-reset: cannot wipe {data_dir}: {exc}") from None
        log.warning("force_reset: deleted every message, queue, user and definition of this node; "
                    "starting as a new node", data_dir=data_dir, removed=removed)

    def _attach_storage(self, vh: VHost) -> None:
        if getattr(self, "storage", None) is not None:
            vh.durable = self.durable_definitions
            vh.queues.backing_queue_factory = BackingQueueFactory(self.storage, vh.name)

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

    async def start(self) -> None:
        self.open_storage()
        self.start_resource_monitor()
        set_memory_limit(self.resource_monitor.memory_limit)
        self.memory_budget = MemoryBudget(self, self.resource_monitor)
        self.memory_budget.start()
        from broker import definitions

        if self.settings.load_definitions is not None:
            try:
                definitions.load_file(self, self.settings.load_definitions)
            except (definitions.DefinitionsError, MetadataWriteError) as exc:
                raise StartupError(f"load_definitions {self.settings.load_definitions}: {exc}") from None
            log.info("definitions loaded", file=str(self.settings.load_definitions))
        loop = asyncio.get_running_loop()
        hosts = listen_hosts(self.settings.bind)
        try:
            self._server = await loop.create_server(lambda: Reader(self), hosts, self.settings.port,
                                                    reuse_address=True, backlog=1024)
        except OSError as exc:
            raise StartupError(f"cannot listen for AMQP on {self.settings.bind}:{self.settings.port}: "
                               f"{exc.strerror or exc}") from None
        for sock in self._server.sockets:
            address = sock.getsockname()[0]
            self.listeners.append({"protocol": "amqp", "ip_address": address, "port": self.settings.port})
            log.info("listening", protocol="amqp", address=address, port=self.settings.port)
        await self._start_http()

    async def _start_http(self) -> None:
        """The HTTP API and Prometheus listeners, on the same addresses as AMQP unless configured. A port
        that is taken stops the start, naming it, as RabbitMQ does when a listener cannot bind: running
        on without its API would let ``leveret ctl`` talk to whatever owns the port."""
        from aiohttp import web

        from broker import metrics
        from broker.management.app import make_app

        s = self.settings
        for protocol, port, bind, make in (("http", s.management_port, s.management_bind, make_app),
                                           ("http/prometheus", s.prometheus_port, s.prometheus_bind,
                                            metrics.make_app)):
            if not port:
                continue
            address = bind or s.bind
            hosts = listen_hosts(address)
            runner = web.AppRunner(make(self), access_log=None, handle_signals=False)
            await runner.setup()
            self._http_runners.append(runner)
            for host in hosts if isinstance(hosts, list) else [hosts]:
                site = web.TCPSite(runner, host, port, reuse_address=True)
                try:
                    await site.start()
                except OSError as exc:
                    name = "HTTP API" if protocol == "http" else "Prometheus"
                    raise StartupError(f"cannot listen for the {name} on {host or 'all addresses'}:{port}: "
                                       f"{exc.strerror or exc} (management.tcp.port / prometheus.tcp.port; "
                                       f"0 turns a listener off)") from None
                self.listeners.append({"protocol": protocol, "ip_address": host or "::", "port": port})
                log.info("listening", protocol=protocol, address=host or "::", port=port)

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting, close every connection with 320 CONNECTION_FORCED, wait for
        them (at most ``leveret.shutdown_timeout``), run the shutdown hooks, close the HTTP listeners."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.force_close(SHUTDOWN_REASON)
        deadline = time.monotonic() + self.settings.shutdown_timeout
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for hook in self.shutdown_hooks:
            try:
                result = hook()
                if result is not None:
                    await result
            except Exception:
                log.exception("shutdown hook failed")
        for runner in self._http_runners:
            await runner.cleanup()
        self._http_runners.clear()
        log.info("stopped")

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(signame: str) -> None:
            if stop.is_set():
                log.warning("second signal, exiting at once", signal=signame)
                os._exit(1)
            log.info("signal received, shutting down", signal=signame)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)
        await stop.wait()
        log.info("shutting down")
        await self.stop()
