"""The server: builds a node and starts everything around it — the data directory lock and the storage
(with the one ordered recovery pass), the resource monitor and memory budget, the definitions file, the AMQP,
HTTP API and Prometheus listeners, signals — and shuts it all down gracefully.

This is the top of the broker (only ``cli`` sits above it): the node (broker/node.py) is the shared state
every connection, the HTTP API and the exporter read and change; nothing below imports this module. RabbitMQ
splits the same way (rabbit_sup / rabbit_networking start what rabbit_vhost, rabbit_auth_backend_internal and
friends hold).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import os
import platform
import signal
import socket
import ssl
import time
from typing import Any

import structlog
from aiohttp import web

from broker import PRODUCT, VERSION, definitions
from broker.amqp.guarded_reader import GuardedReader, LoginGuard
from broker.amqp.reader import open_connections
from broker.amqp.tls_accept import TLSAcceptor
from broker.clustering.cluster_errors import ClusterError
from broker.management.app import make_app
from broker.node import Node
from broker.observability.logs import log_banner
from broker.persistence import NODE_METADATA_KEY, DurableDefinitions
from broker.prometheus import metrics
from broker.resources.alarms import ResourceMonitor, configured_disk_free_limit, configured_memory_limit
from broker.resources.memory_budget import MemoryBudget, set_memory_limit
from broker.resources.os_probes import total_memory
from broker.security import tls
from protocol import CODEC  # compiled or pure-python wire codec, for the banner
from storage.data_dir_lock import DataDirLock, DataDirLocked
from storage.metadata_store import MetadataStore, MetadataStoreError, MetadataWriteError
from storage.node_storage import METADATA_FILE as METADATA_DB
from storage.node_storage import NODE_KIND, DataDirectoryError, NodeStorage, reset_data_dir

log = structlog.get_logger("leveret.server")

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


def _address(host: str, port: int) -> str:
    """``127.0.0.1:5672``, ``[::1]:5672``: an address and port as an operator types them."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# RabbitMQ's default HTTPS ports of the management and Prometheus plugins (when their .ssl.port is not given).
HTTPS_PORT = 15671
PROMETHEUS_HTTPS_PORT = 15691


class StartupError(Exception):
    """Start-up cannot go on (a port taken, a definitions file that does not load): one line for stderr."""


class Server:
    """Starts and stops one node. ``force_reset``: ``leveret serve --force-reset`` (rabbitmqctl force_reset)
    wipes the data directory at start."""

    def __init__(self, node: Node, *, force_reset: bool = False) -> None:
        self.node = node
        self.force_reset = force_reset
        # An older node's metadata.json, read (and checked) before the message stores open, to be
        # migrated into the metadata store at start.
        self._metadata_doc: dict[str, Any] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None  # listeners.ssl.default: AMQP over TLS
        self._tls_context: ssl.SSLContext | None = None
        self._http_runners: list[Any] = []
        # The HTTPS listeners' contexts (management.ssl.*, prometheus.ssl.*) by key prefix.
        self._https_contexts: dict[str, ssl.SSLContext] = {}
        self._tls_handshakes: set[asyncio.Task[None]] = set()  # TLS handshakes under way (tls_accept.py)
        self._guard: LoginGuard | None = None
        self._data_dir_lock: DataDirLock | None = None  # held from start to exit: one broker per directory

    def start_resource_monitor(self) -> ResourceMonitor:
        """Memory limit: the absolute watermark if set, else the relative one times the machine's RAM; disk
        limit: the relative one times the machine's RAM if set, else the absolute one."""
        s = self.node.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self.node.resource_monitor = ResourceMonitor(self.node.alarm_state, self.node.connections, s.data_dir,
                                                configured_memory_limit(s), configured_disk_free_limit(s),
                                                     clock=self.node.clock)
        if self.node.storage is not None:  # the storage tells the disk monitor what it writes and when writes fail
            self.node.storage.syncer.on_written = self.node.resource_monitor.note_written
            self.node.storage.syncer.on_write_failure = self.node.resource_monitor.set_storage_failing
        self.node.resource_monitor.start()
        return self.node.resource_monitor

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
        data_dir = str(self.node.settings.data_dir)
        try:
            self._data_dir_lock = DataDirLock.acquire(data_dir)
        except DataDirLocked as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(f"cannot use the data directory {data_dir}: {exc.strerror or exc}") from None
        if self.force_reset:
            self._wipe_data_dir(data_dir)
        json_path = self.node.settings.data_dir / definitions.METADATA_FILE
        try:
            self.node.storage = NodeStorage(data_dir, asyncio.get_running_loop(),
                                       queue_index_embed_msgs_below=self.node.settings.queue_index_embed_msgs_below,
                                       check_metadata=self._read_metadata_file,
                                       delay_max_ms=self.node.settings.delayed_message_max_delay,
                                       delay_bucket_ms=self.node.settings.delayed_message_bucket_size)
            # Replies to the methods that write a definition wait for its fsync (storage/metadata_store.py).
            self.node.commits = self.node.storage.metadata_commits
            durable = DurableDefinitions(self.node.storage)
            if self.node.cluster is not None:  # a cluster member: shared definitions first (broker/clustering/cluster.py)
                # the same Metadata (storage/metadata_store.py), split between SQLite and PostgreSQL
                durable.metadata = self.node.cluster.open_definitions(self.node.storage)
            migrating = self._metadata_doc is not None
            if durable.has_node_metadata:
                counts = durable.recover_node_metadata(self.node.users, self.node.vhosts, self.node.add_vhost, self.node.global_parameters)
                log.info("node metadata recovered", **counts)
            elif self._metadata_doc is not None:
                try:  # in memory first (nothing is written yet), then saved below in one commit
                    definitions.apply_metadata(self.node, self._metadata_doc)
                except definitions.DefinitionsError as exc:
                    raise StartupError(f"{json_path} cannot be migrated ({exc}); fix or restore it from a backup. "
                                       f"{FORCE_RESET_HINT}") from None
                self._metadata_doc = None
            self.node.durable_definitions = durable
            for vh in self.node.vhosts.values():
                self.node._attach_storage(vh)
            if not durable.has_node_metadata:
                durable.save_node_metadata(self.node.users, self.node.vhosts, self.node.global_parameters,
                                           drop=definitions.METADATA_WRITTEN)
                if not migrating:  # a new node: its default vhost is created now, once in its life
                    for name in self.node.vhosts:
                        log.info("vhost created", vhost=name)
                if migrating:
                    os.replace(json_path, json_path.with_name(definitions.METADATA_FILE + ".migrated"))
                    log.info("metadata.json migrated into the metadata store", file=str(json_path),
                             renamed_to=definitions.METADATA_FILE + ".migrated", users=len(self.node.users.users),
                             vhosts=len(self.node.vhosts))
            durable.recover(self.node.vhosts, self.node.add_vhost)
        except ClusterError as exc:
            raise StartupError(str(exc)) from None
        except (DataDirectoryError, MetadataStoreError) as exc:
            raise StartupError(f"{exc}. {FORCE_RESET_HINT}") from None
        except MetadataWriteError as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(f"cannot open the data directory {data_dir}: {exc}") from None
        self.node.shutdown_hooks.append(self.node.close_storage)
        if self.node.cluster is not None:
            self.node.shutdown_hooks.insert(0, self.node.cluster.stop)

    def _read_metadata_file(self, store: MetadataStore | None) -> None:
        """NodeStorage's check of an older node's ``metadata.json`` beside the store (None: a new one),
        read only while the store does not hold the node's metadata yet: it must be there (and readable)
        if the store says it was written, and must not outlive a lost store."""
        if store is not None and store.get(NODE_KIND, NODE_METADATA_KEY) is not None:
            if (self.node.settings.data_dir / definitions.METADATA_FILE).exists():
                log.warning("ignoring metadata.json: this node's metadata is in its metadata store",
                            data_dir=str(self.node.settings.data_dir))
            return
        try:
            self._metadata_doc = definitions.read_metadata_file(
                self.node.settings.data_dir,
                written=store is not None and store.get(*definitions.METADATA_WRITTEN) is not None,
                store_created=store is None, store_path=str(self.node.settings.data_dir / METADATA_DB))
        except definitions.DefinitionsError as exc:
            raise DataDirectoryError(str(exc)) from None

    def _wipe_data_dir(self, data_dir: str) -> None:
        """--force-reset: everything in the data directory goes (except a log file kept there)."""
        keep = [str(self.node.settings.log_file)] if self.node.settings.log_file else []
        try:
            removed = reset_data_dir(data_dir, keep)
        except (OSError, DataDirectoryError) as exc:
            raise StartupError(f"--force-reset: cannot wipe {data_dir}: {exc}") from None
        log.warning("force_reset: deleted every message, queue, user and definition of this node; "
                    "starting as a new node", data_dir=data_dir, removed=removed)

    def build_tls_context(self) -> None:
        """The TLS listeners' contexts (listeners.ssl.default; management.ssl.*, prometheus.ssl.*), built once,
        before the data directory is touched: a certificate or key that cannot be read stops the start,
        naming the key and the file."""
        s = self.node.settings
        for prefix, what, on in ((tls.AMQP_PREFIX, "AMQP-over-TLS", s.ssl_port is not None),
                                 ("management.ssl", "HTTPS (HTTP API)", s.management_ssl.configured),
                                 ("prometheus.ssl", "HTTPS (Prometheus)", s.prometheus_ssl.configured)):
            if not on:
                continue
            try:
                context, warnings = tls.server_context(s, prefix)
            except tls.TLSSetupError as exc:
                raise StartupError(f"cannot start the {what} listener: {exc}") from None
            if prefix == tls.AMQP_PREFIX:
                self._tls_context = context
            else:
                self._https_contexts[prefix] = context
            for warning in warnings:
                log.warning(warning)

    def login_guard(self) -> LoginGuard:
        """The node's one failed-login table and handshake counts: AMQP listeners and the HTTP API share it,
        so failures through one door delay logins through every other (docs/decisions/http-api-limits.md)."""
        if self._guard is None:
            self._guard = LoginGuard(self.node.settings, self.node.clock)
        return self._guard

    async def _listen_amqp(self, protocol: str, bind: str, port: int,
                           context: ssl.SSLContext | None = None) -> asyncio.base_events.Server:
        """One AMQP listener, plain or over TLS: the same connections (GuardedReader: a Reader under the
        node's cap on unfinished handshakes and failed-login delay) either way. Over TLS the handshake is
        TLSAcceptor's: one not finished within ssl_handshake_timeout is closed (so is a plaintext client:
        OpenSSL refuses its first bytes), each failure logged with the client's address and the reason; the
        AMQP handshake_timeout starts once TLS is up."""
        loop = asyncio.get_running_loop()
        guard = self.login_guard()
        factory: Any
        if context is None:
            def factory() -> asyncio.Protocol:
                return GuardedReader(self.node, guard)
        else:
            def reader_for(source: str) -> asyncio.Protocol:
                return GuardedReader(self.node, guard, source)

            timeout = self.node.settings.ssl_handshake_timeout

            def factory() -> asyncio.Protocol:
                return TLSAcceptor(context, timeout, guard.admit, guard.release, reader_for,
                                   self._tls_handshakes)
        try:
            server = await loop.create_server(factory, listen_hosts(bind), port, reuse_address=True,
                                              backlog=1024)
        except OSError as exc:
            what = "AMQP over TLS" if context is not None else "AMQP"
            raise StartupError(f"cannot listen for {what} on {bind}:{port}: {exc.strerror or exc}") from None
        for sock in server.sockets:
            address = sock.getsockname()[0]
            self.node.listeners.append({"protocol": protocol, "ip_address": address, "port": port})
            log.info("listening", protocol=protocol, address=address, port=port)
        return server

    async def start(self) -> None:
        self.build_tls_context()
        if self.node.settings.cluster_dsn:  # join before the recovery pass opens queues in PostgreSQL
            # Imported here: only a member pays for asyncpg and storage/pg (broker/clustering/cluster_errors.py).
            from broker.clustering.cluster import Cluster

            self.node.cluster = Cluster(self.node, self.node.settings.cluster_dsn)
            try:
                await self.node.cluster.connect()
            except ClusterError as exc:
                raise StartupError(str(exc)) from None
        self.open_storage()
        monitor = self.start_resource_monitor()
        set_memory_limit(monitor.memory_limit)
        self.node.memory_budget = MemoryBudget(self.node, monitor)
        self.node.memory_budget.start()
        if self.node.settings.load_definitions is not None:
            try:
                definitions.load_file(self.node, self.node.settings.load_definitions)
            except (definitions.DefinitionsError, MetadataWriteError) as exc:
                raise StartupError(f"load_definitions {self.node.settings.load_definitions}: {exc}") from None
            log.info("definitions loaded", file=str(self.node.settings.load_definitions))
        s = self.node.settings
        if self._tls_context is not None and s.ssl_port is not None:
            # Before the plain listener: a client (or test) that waits for the plain port finds both up.
            # RabbitMQ's name of this listener's protocol is amqp/ssl.
            self._tls_server = await self._listen_amqp("amqp/ssl", s.ssl_bind or s.bind, s.ssl_port,
                                                       self._tls_context)
        if self.node.cluster is not None:
            await self.node.cluster.start()
        self._server = await self._listen_amqp("amqp", s.bind, s.port)
        await self._start_http()
        # After the listeners: a local shovel connects to this node's own.
        self.node.shovels.start((vh.name, c, n, v) for vh in self.node.vhosts.values()
                                for (c, n), v in vh.parameters.items())
        self.node.federation.start()
        self._log_banner(monitor)

    def _log_banner(self, monitor: ResourceMonitor) -> None:
        """The start-up banner, once every listener is bound: what RabbitMQ's start-up log tells an operator
        (version, runtime, config files, data directory, logs, listeners, memory and disk limits) in one event.
        The "listening" lines stay too: they come as each listener binds, so a start stopped by a port that is
        taken still shows what was bound before it; the banner is the summary of a start that succeeded."""
        s = self.node.settings
        loop = asyncio.get_running_loop()
        runtime = f"{platform.python_implementation()} {platform.python_version()}"
        if type(loop).__module__.startswith("uvloop"):
            runtime += f", uvloop {importlib.metadata.version('uvloop')}"
        else:
            runtime += ", asyncio event loop (no uvloop)"
        relative = s.vm_memory_high_watermark_relative if not s.vm_memory_high_watermark_absolute else None
        log_banner(
            log, version=f"{PRODUCT} {VERSION}", python=runtime, codec=CODEC,
            config_files=[str(p) for p in s.config_files],
            data_dir=str(s.data_dir.resolve()),
            log_files=([str(s.log_file)] if s.log_file else []) + (["<stderr>"] if s.log_console else []),
            listeners=[{"protocol": li["protocol"], "address": _address(li["ip_address"], li["port"])}
                       for li in self.node.listeners],
            memory_high_watermark={"bytes": monitor.memory_limit, "relative": relative,
                                   "total_memory": total_memory()},
            disk_free_limit={"bytes": monitor.disk_free_limit, "relative": s.disk_free_limit_relative})

    def _http_listeners(self) -> list[tuple[str, int, str | None, Any, ssl.SSLContext | None]]:
        """(protocol, port, address, app maker, TLS context) of each HTTP listener to start. As RabbitMQ's
        management and Prometheus plugins: with a management.ssl.* (prometheus.ssl.*) key, HTTPS is served
        (on 15671, 15691 unless .port is given), and plain HTTP too only if a key of the plain listener was
        given (management.tcp.* or management.listener.*; prometheus.tcp.*; ``--management-port`` is
        management.tcp.port); without one, plain HTTP alone on its default port."""
        s = self.node.settings
        out: list[tuple[str, int, str | None, Any, ssl.SSLContext | None]] = []
        for name, plain_protocol, tls_protocol, port, bind, opts, tls_port, make in (
                ("management", "http", "https", s.management_port, s.management_bind, s.management_ssl,
                 HTTPS_PORT, functools.partial(make_app, login_guard=self.login_guard())),
                ("prometheus", "http/prometheus", "https/prometheus", s.prometheus_port, s.prometheus_bind,
                 s.prometheus_ssl, PROMETHEUS_HTTPS_PORT, metrics.make_app)):
            if port and (name in s.http_configured or not opts.configured):
                out.append((plain_protocol, port, bind, make, None))
            if opts.configured:
                out.append((tls_protocol, opts.port or tls_port, opts.bind or bind, make,
                            self._https_contexts[f"{name}.ssl"]))
        return out

    async def _start_http(self) -> None:
        """The HTTP API and Prometheus listeners, plain and HTTPS, on the same addresses as AMQP unless
        configured. A port that is taken stops the start, naming it, as RabbitMQ does when a listener cannot
        bind: running on without its API would let ``leveret ctl`` talk to whatever owns the port."""
        s = self.node.settings
        runners: dict[Any, web.AppRunner] = {}  # one app (and runner) per maker, served on each of its sites
        for protocol, port, bind, make, context in self._http_listeners():
            runner = runners.get(make)
            if runner is None:
                runner = runners[make] = web.AppRunner(make(self.node), access_log=None, handle_signals=False)
                await runner.setup()
                self._http_runners.append(runner)
            hosts = listen_hosts(bind or s.bind)
            for host in hosts if isinstance(hosts, list) else [hosts]:
                site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=context)
                try:
                    await site.start()
                except OSError as exc:
                    name = "HTTP API" if protocol in ("http", "https") else "Prometheus"
                    keys = "management.tcp.port / prometheus.tcp.port; 0 turns a listener off"
                    if context is not None:
                        keys = "management.ssl.port" if protocol == "https" else "prometheus.ssl.port"
                    raise StartupError(f"cannot listen for the {name} on {host or 'all addresses'}:{port}: "
                                       f"{exc.strerror or exc} ({keys})") from None
                self.node.listeners.append({"protocol": protocol, "ip_address": host or "::", "port": port})
                log.info("listening", protocol=protocol, address=host or "::", port=port)

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting, close every connection with 320 CONNECTION_FORCED, wait for
        them (at most ``leveret.shutdown_timeout``), run the shutdown hooks, close the HTTP listeners."""
        self.node.stopping = True
        await self.node.shovels.stop()  # before connections close: no shovel reconnects meanwhile
        await self.node.federation.stop()
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
        for task in list(self._tls_handshakes):  # TLS handshakes under way get no connection now
            task.cancel()
        for conn in list(self.node.connections):
            conn.force_close(SHUTDOWN_REASON)
        deadline = time.monotonic() + self.node.settings.shutdown_timeout
        while self.node.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in open_connections(self.node):
            if conn.transport is not None:
                conn.transport.close()
        for vh in list(self.node.vhosts.values()):  # stateful exchange types stop their timers, flush state
            vh.stop_exchanges()
        for hook in self.node.shutdown_hooks:
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
        # The handlers go in before start(): the HTTP API answers while start() still awaits later steps, and a
        # SIGTERM in that window killed the process by the signal's default action (a test saw -15 right
        # after a PUT); now it is a graceful stop once the start is done.
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
        await self.start()
        await stop.wait()
        log.info("shutting down")
        await self.stop()
