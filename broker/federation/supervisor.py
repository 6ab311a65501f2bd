"""The node's federation links: one :class:`FederationLink` per (vhost, exchange, upstream) that the vhosts'
policies and ``federation-upstream`` parameters ask for (plan.py).

The supervisor reconciles every :data:`RECONCILE_INTERVAL` seconds: links asked for are started, links no longer asked for (policy, parameter or exchange gone) are
stopped, a link whose upstream's value or exchange type changed is started again. Reading the vhosts
instead of hooking every policy, exchange and binding change keeps the rest of the broker unaware of
federation; what it costs is a pass over each vhost's exchanges and policies once a second, and up to that
long before a new policy takes effect (RabbitMQ's links start asynchronously too).

The downstream side of a link connects to this node's own AMQP listener as a node-internal user made per
vhost (``leveret-federation-VHOST``, auth.UserStore.internal, as a local shovel's), with all permissions on
that vhost and the ``impersonator`` tag, so that ``trust-user-id`` can pass a message's user-id through.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import structlog

from broker.federation.definition import Upstream
from broker.federation.link import BindingKeys, FederationLink, binding_key
from broker.federation.plan import plan, plan_queues
from broker.federation.queue_link import QueueLink
from broker.policies.policy import Policy
from broker.security.auth import Permission, User
from broker.shovel.worker import LocalLogin

log = structlog.get_logger("leveret.federation")

RECONCILE_INTERVAL = 1.0


class BindingView(Protocol):
    @property
    def routing_key(self) -> str: ...

    @property
    def arguments(self) -> dict[str, Any]: ...


class ExchangeView(Protocol):
    @property
    def type_name(self) -> str: ...

    @property
    def internal(self) -> bool: ...

    @property
    def bindings(self) -> Mapping[Any, BindingView]: ...


class QueuesView(Protocol):
    def __iter__(self) -> Iterator[Any]: ...

    def get(self, name: str) -> Any: ...


class VHostView(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def exchanges(self) -> Mapping[str, ExchangeView]: ...

    @property
    def policies(self) -> Mapping[str, Policy]: ...

    @property
    def parameters(self) -> Mapping[tuple[str, str], Any]: ...

    @property
    def queues(self) -> QueuesView: ...


class UsersView(Protocol):
    @property
    def internal(self) -> dict[str, tuple[str, User]]: ...


class FederationHost(Protocol):
    """What the supervisor reads of the node (broker/node.py's Node is one)."""

    @property
    def name(self) -> str: ...

    @property
    def cluster_name(self) -> str: ...

    @property
    def vhosts(self) -> Mapping[str, VHostView]: ...

    @property
    def listeners(self) -> list[dict[str, Any]]: ...

    @property
    def users(self) -> UsersView: ...


class FederationSupervisor:
    def __init__(self, node: FederationHost) -> None:
        self.node = node
        self.links: dict[tuple[str, str, str], FederationLink] = {}
        self.queue_links: dict[tuple[str, str, str], QueueLink] = {}
        self.running = False
        self._task: asyncio.Task[None] | None = None
        self._removals: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Once the node listens (a link's downstream side connects to its own listener)."""
        self.running = True
        self.reconcile()
        self.reconcile_queues()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="federation supervisor")

    async def stop(self) -> None:
        self.running = False
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for task in list(self._removals):
            task.cancel()
        await asyncio.gather(*(link.stop() for link in self.links.values()),
                             *(link.stop() for link in self.queue_links.values()), *self._removals,
                             return_exceptions=True)
        self.links.clear()
        self.queue_links.clear()

    async def _loop(self) -> None:
        while self.running:
            await asyncio.sleep(RECONCILE_INTERVAL)
            try:
                self.reconcile()
                self.reconcile_queues()
            except Exception:  # a bug must not stop federation for good: log it, try again next tick
                log.exception("federation reconcile failed")

    def reconcile(self) -> None:
        wanted: dict[tuple[str, str, str], tuple[Upstream, str]] = {}
        for vh in list(self.node.vhosts.values()):
            exchanges = vh.exchanges
            # (The exchange names are read lazily: plan answers at once, without a pass over them, for a vhost
            # with no upstream or no policy, as nearly every vhost has, each second.)
            for (exchange, upstream_name), upstream in plan(iter(exchanges), vh.policies.values(),
                                                            vh.parameters).items():
                ex = exchanges.get(exchange)
                # An internal exchange is not federated, as RabbitMQ's rabbit_federation_exchange:federate/1
                # decides (its own upstream exchanges are internal; a policy matching one starts no link).
                if ex is not None and not ex.internal:
                    wanted[(vh.name, exchange, upstream_name)] = (upstream, ex.type_name)
        for key in [k for k, link in self.links.items()
                    if k not in wanted or (link.upstream, link.exchange_type) != wanted[k]]:
            link = self.links.pop(key)
            log.info("federation link stopped", vhost=key[0], exchange=key[1], upstream=key[2])
            removed = key not in wanted
            if link.task is not None:
                link.task.cancel()
            if removed:  # not merely changed: its upstream queue and exchange go too
                task = asyncio.get_running_loop().create_task(self._remove(link))
                self._removals.add(task)
                task.add_done_callback(self._removals.discard)
        for key, (upstream, exchange_type) in wanted.items():
            if key in self.links:
                continue
            vhost, exchange, _name = key
            link = FederationLink(vhost, exchange, exchange_type, upstream, self.node.name,
                                  lambda: self.node.cluster_name, self.local_login,
                                  self._bindings_of(vhost, exchange))
            self.links[key] = link
            link.start()

    def reconcile_queues(self) -> None:
        wanted: dict[tuple[str, str, str], Upstream] = {}
        for vh in list(self.node.vhosts.values()):
            queues = ((q.name, q.settings.queue_type) for q in vh.queues)  # lazily, as above
            for (queue, upstream_name), upstream in plan_queues(queues, vh.policies.values(),
                                                                vh.parameters).items():
                wanted[(vh.name, queue, upstream_name)] = upstream
        for key in [k for k, link in self.queue_links.items() if wanted.get(k) != link.upstream]:
            link = self.queue_links.pop(key)
            log.info("federation link stopped", vhost=key[0], queue=key[1], upstream=key[2])
            if link.task is not None:
                link.task.cancel()
        for key, upstream in wanted.items():
            if key not in self.queue_links:
                vhost, queue, _name = key
                qlink = QueueLink(vhost, queue, upstream, self.node.name, lambda: self.node.cluster_name,
                                  self.local_login, self._demand_of(vhost, queue))
                self.queue_links[key] = qlink
                qlink.start()

    def _demand_of(self, vhost: str, queue: str) -> Callable[[], bool]:
        """A federated queue wants messages from upstream: it has consumers and nothing ready for them."""
        def demand() -> bool:
            vh = self.node.vhosts.get(vhost)
            q = vh.queues.get(queue) if vh is not None else None
            return q is not None and q.consumer_count > 0 and q.message_count() == 0
        return demand

    async def _remove(self, link: FederationLink) -> None:
        await link.stop()
        await link.remove_upstream()

    def _bindings_of(self, vhost: str, exchange: str) -> Callable[[], BindingKeys]:
        def bindings() -> BindingKeys:
            vh = self.node.vhosts.get(vhost)
            ex = vh.exchanges.get(exchange) if vh is not None else None
            if ex is None:
                return {}
            return {binding_key(b.routing_key, b.arguments): (b.routing_key, dict(b.arguments))
                    for b in list(ex.bindings.values())}
        return bindings

    def local_login(self, vhost: str) -> LocalLogin:
        """How a link reaches this node: its plain AMQP listener, as ``leveret-federation-VHOST``."""
        listener = next((li for li in self.node.listeners if li["protocol"] == "amqp"), None)
        if listener is None:
            raise OSError("the node has no plain AMQP listener for a federation link to connect to")
        host = listener["ip_address"]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        name = f"leveret-federation-{vhost}"
        internal = self.node.users.internal
        entry = internal.get(name)
        if entry is None:
            user = User(name, "", ["impersonator"], permissions={vhost: Permission(".*", ".*", ".*")})
            entry = internal[name] = (secrets.token_urlsafe(24), user)
        return LocalLogin(host, int(listener["port"]), name, entry[0])

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        links: list[FederationLink] = [link for _k, link in sorted(self.links.items())]
        links += [link for _k, link in sorted(self.queue_links.items())]
        return [link.status() for link in links if vhost is None or link.vhost == vhost]
