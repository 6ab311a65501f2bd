"""One federation link: a federated exchange here (the downstream) and one upstream.

On the upstream broker the link declares an exchange and a queue, both named ``federation: X -> NODE`` (X the
federated exchange, NODE this node's cluster name, its own name unless it is a cluster member, as RabbitMQ
names them). The exchange is a plain ``fanout``,
internal, bound to the upstream exchange once per distinct binding key (and arguments) of X here; the queue is
bound to it with no key. RabbitMQ declares that exchange with its ``x-federation-upstream`` type, which drops a
message that has crossed ``max-hops`` already before it leaves the upstream; that type exists only where the
federation plugin runs, and a Leveret or a RabbitMQ without the plugin is an upstream too. So the exchange is a
fanout everywhere, and the hop rule is applied here on arrival: a message whose ``x-received-from`` has
``max-hops`` entries, or one naming this node's cluster, is acked and dropped. The cost is that such a message
crosses the network once for nothing; routing is the same (a message matching several keys still reaches the
queue once, exchange-to-exchange routing visiting each exchange once).

The link consumes the queue with ``prefetch-count`` and publishes each message into X here, through a
connection to this node's own listener (as a local shovel does), with an entry prepended to its
``x-received-from`` header: the upstream's ``uri`` (without credentials), ``exchange``, ``redelivered``,
``cluster-name`` (RabbitMQ's four keys) and Leveret's ``vhost``. ``ack-mode``: ``on-confirm`` acks upstream
when this node confirms the publish; ``on-publish`` once written; ``no-ack`` consumes without acks. Without
``trust-user-id`` a message's user-id is removed (this node cannot check it), as RabbitMQ does.

Bindings are kept in step by comparing X's binding keys with those bound upstream every
:data:`BINDINGS_INTERVAL` seconds (and at every connect): a binding made here starts matching upstream within
that time. What a link bound is remembered across its sessions, so a binding removed here while the upstream
was away is unbound when it is back (not across a restart of this node: the upstream then keeps a stale
binding, whose messages cross and are routed nowhere here). A link no longer wanted deletes its queue and
exchange upstream. Any failure ends the session; the link reports ``error`` with the reason and connects again after
``reconnect-delay``. What was unacked upstream then is redelivered (on-confirm loses nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import structlog
from pamqp import commands

from broker.federation.definition import Upstream
from broker.shovel.link import ChannelClosed, Link, LinkError
from broker.shovel.uri import parse_uri, redact
from broker.shovel.worker import LocalLogin
from protocol.methods import method_frame
from protocol.properties import decode_properties, with_properties

log = structlog.get_logger("leveret.federation")

BINDINGS_INTERVAL = 1.0
RECEIVED_FROM = "x-received-from"
NOT_FOUND = 404
# A downstream binding as bound upstream: (routing key, arguments), keyed by a comparable form.
BindingKeys = dict[tuple[str, str], tuple[str, dict[str, Any]]]


def binding_key(routing_key: str, arguments: dict[str, Any]) -> tuple[str, str]:
    return routing_key, repr(sorted(arguments.items())) if arguments else ""


def link_id(vhost: str, exchange: str, upstream: str) -> str:
    """A short stable id per link (RabbitMQ's is a hash of the link's identity too)."""
    return hashlib.sha1(f"{vhost}\0{exchange}\0{upstream}".encode()).hexdigest()[:8]


class FederationLink:
    def __init__(self, vhost: str, exchange: str, exchange_type: str, upstream: Upstream, node_name: str,
                 cluster_name: Callable[[], str], local: Callable[[str], LocalLogin],
                 bindings: Callable[[], BindingKeys]) -> None:
        self.vhost, self.exchange, self.exchange_type, self.upstream = vhost, exchange, exchange_type, upstream
        self.upstream_exchange = upstream.exchange or exchange
        self.node_name = node_name
        self.cluster_name = cluster_name
        self.local = local
        self.bindings = bindings
        # Named after the cluster (a single node's name is its own), as RabbitMQ's local-nodename: the members of
        # a Leveret cluster, each running the link, share one upstream queue and take turns at its messages,
        # so a message crosses once whichever member's link takes it.
        self.internal_name = f"federation: {exchange} -> {cluster_name()}"
        # The upstream exchange that carries X's bindings to that queue: one of two per member, "A" and "B"
        # (RabbitMQ's scheme), a fresh one each session. What the link had bound upstream is known only to the
        # process that bound it; after a restart the keys unbound here meanwhile would stay bound upstream for
        # good. So each session binds the current keys on the other exchange of the pair, then deletes the old
        # one with whatever it carried: no message is lost in between (both route into the queue meanwhile, a
        # message once). Per member: the members of a cluster each keep their own pair, not each other's.
        self.internal_exchange = ""
        self.id = link_id(vhost, exchange, upstream.name)
        self.state = "starting"
        self.error: str | None = None
        self.since = time.time()
        self.uri = redact(upstream.uris[0])
        self.local_connection = f"Federation link {self.id} (upstream {upstream.name}, exchange {exchange})"
        self.task: asyncio.Task[None] | None = None
        # Counters (the metrics'): messages published here, acked upstream, dropped by the hop rule.
        self.published = 0
        self.acked = 0
        self.dropped = 0
        self._up: Link | None = None
        self._down: Link | None = None
        self._session: asyncio.Future[None] | None = None
        self._bound: BindingKeys = {}
        self._pending: dict[int, int] = {}  # downstream publish seq → upstream delivery tag (on-confirm)
        self._seq = 0
        self._upstream_cluster = ""
        self._upstream_vhost = "/"

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"federation {self.vhost}/{self.exchange}/{self.upstream.name}")

    async def stop(self) -> None:
        task = self.task
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    def _set(self, state: str, error: str | None = None) -> None:
        self.state, self.error, self.since = state, error, time.time()

    async def _run(self) -> None:
        while True:
            self._set("starting")
            try:
                await self._run_session()
            except (LinkError, OSError) as exc:
                reason = str(exc)
            except Exception as exc:  # a bug must not end the link silently: report and retry
                log.exception("federation link failed", vhost=self.vhost, exchange=self.exchange,
                              upstream=self.upstream.name)
                reason = f"internal error: {exc!r}"
            self._set("error", reason)
            log.warning("federation link down; reconnecting after reconnect-delay", vhost=self.vhost,
                        exchange=self.exchange, upstream=self.upstream.name, reason=reason,
                        reconnect_delay=self.upstream.reconnect_delay)
            await asyncio.sleep(self.upstream.reconnect_delay)

    async def _connect(self, uris: tuple[str, ...], role: str, vhost: str | None = None) -> tuple[Link, str]:
        """The first URI that connects (RabbitMQ tries them in order); ``vhost``: this node's vhost."""
        problems = []
        for text in uris:
            uri = parse_uri(text)
            target_vhost = vhost if vhost is not None else uri.vhost
            if uri.is_local or vhost is not None:
                login = self.local(target_vhost)
                target: tuple[str, int, str, str] = (login.host, login.port, login.user, login.password)
            else:
                assert uri.host is not None
                target = (uri.host, uri.port, uri.user, uri.password)
            link = Link(_Events(self, role), self.local_connection)
            try:
                await link.open(uri, *target, target_vhost)
                if vhost is None:
                    self._upstream_vhost = uri.vhost
                return link, redact(text)
            except LinkError as exc:
                await link.close()
                problems.append(f"{redact(text)}: {exc}")
        raise LinkError(f"{role}: " + "; ".join(problems))

    async def _run_session(self) -> None:
        u = self.upstream
        self._session = asyncio.get_running_loop().create_future()
        self._pending, self._seq = {}, 0
        try:
            self._up, self.uri = await self._connect(u.uris, "upstream")
            self._down, _ = await self._connect(("amqp://",), "downstream", self.vhost)
            up, down = self._up, self._down
            self._upstream_cluster = str(up.server_properties.get("cluster_name") or "")
            old = await self._declare_upstream(up)
            self._bound = {}  # a fresh internal exchange: every key X is bound with here is bound on it now
            await self._sync_bindings(up)
            for name in old:  # and only then is the old one deleted, with the stale keys it carried
                await up.rpc(method_frame(1, commands.Exchange.Delete, exchange=name), commands.Exchange.DeleteOk)
            if u.ack_mode == "on-confirm":
                await down.rpc(method_frame(1, commands.Confirm.Select), commands.Confirm.SelectOk)
            if u.ack_mode != "no-ack":
                await up.rpc(method_frame(1, commands.Basic.Qos, prefetch_count=u.prefetch_count),
                             commands.Basic.QosOk)
            await up.rpc(method_frame(1, commands.Basic.Consume, queue=self.internal_name,
                                      consumer_tag=f"federation-link-{self.id}", no_ack=u.ack_mode == "no-ack"),
                         commands.Basic.ConsumeOk)
            self._set("running")
            log.info("federation link running", vhost=self.vhost, exchange=self.exchange, upstream=u.name,
                     uri=self.uri)
            while True:
                done, _ = await asyncio.wait({self._session}, timeout=BINDINGS_INTERVAL)
                if done:
                    self._session.result()  # raises why the session ended
                await self._sync_bindings(up)
        finally:
            links = [link for link in (self._up, self._down) if link is not None]
            self._up = self._down = None
            try:
                await asyncio.gather(*(link.close() for link in links))
            finally:  # cancelled while closing: no socket is left open
                for link in links:
                    link.abandon()

    def _pair(self) -> tuple[str, str]:
        """``<queue name> <member> A`` and ``... B``: the member as 8 hex digits of its name's hash (a node name
        beside the queue's could pass AMQP's 255 bytes), the queue's name cut short where the whole would."""
        member = hashlib.sha1(self.node_name.encode()).hexdigest()[:8]
        base = self.internal_name.encode()[:255 - len(member) - 3].decode(errors="ignore")
        return f"{base} {member} A", f"{base} {member} B"

    async def _exists(self, up: Link, exchange: str) -> bool:
        """A passive declare: a 404 closes the channel, which is opened again."""
        try:
            await up.rpc(method_frame(1, commands.Exchange.Declare, exchange=exchange, passive=True),
                         commands.Exchange.DeclareOk)
            return True
        except ChannelClosed as exc:
            if exc.code != NOT_FOUND:
                raise
            await up.open_channel()
            return False

    async def _declare_upstream(self, up: Link) -> list[str]:
        """The upstream exchange (declared like X here when it does not exist), the link's queue (``expires``,
        ``message-ttl``) and a fresh internal fanout exchange bound to it: the one of this member's pair that is
        not in use (emptied first if both were left by a session that ended mid-switch). Returns the exchanges to
        delete once X's keys are bound on the new one: the other of the pair, and the single internal exchange
        (named like the queue) that Leveret used before the pair, if they exist."""
        u = self.upstream
        try:
            await up.rpc(method_frame(1, commands.Exchange.Declare, exchange=self.upstream_exchange, passive=True),
                         commands.Exchange.DeclareOk)
        except ChannelClosed as exc:
            if exc.code != NOT_FOUND:
                raise
            await up.open_channel()
            await up.rpc(method_frame(1, commands.Exchange.Declare, exchange=self.upstream_exchange,
                                      exchange_type=self.exchange_type, durable=True), commands.Exchange.DeclareOk)
        a, b = self._pair()
        old, new = (a, b) if await self._exists(up, a) else (b, a)
        if await self._exists(up, new):  # both left: the new one may carry stale keys
            await up.rpc(method_frame(1, commands.Exchange.Delete, exchange=new), commands.Exchange.DeleteOk)
        await up.rpc(method_frame(1, commands.Exchange.Declare, exchange=new, exchange_type="fanout",
                                  durable=True, internal=True), commands.Exchange.DeclareOk)
        self.internal_exchange = new
        arguments: dict[str, Any] = {}
        if u.expires is not None:
            arguments["x-expires"] = u.expires
        if u.message_ttl is not None:
            arguments["x-message-ttl"] = u.message_ttl
        await up.rpc(method_frame(1, commands.Queue.Declare, queue=self.internal_name, durable=True,
                                  arguments=arguments), commands.Queue.DeclareOk)
        await up.rpc(method_frame(1, commands.Queue.Bind, queue=self.internal_name, exchange=new,
                                  routing_key=""), commands.Queue.BindOk)
        return [name for name in (old, self.internal_name) if await self._exists(up, name)]

    async def _sync_bindings(self, up: Link) -> None:
        """Bind upstream what X is bound with here and is not yet, unbind what X no longer is."""
        want = self.bindings()
        for key in [k for k in self._bound if k not in want]:
            routing_key, arguments = self._bound.pop(key)
            await up.rpc(method_frame(1, commands.Exchange.Unbind, destination=self.internal_exchange,
                                      source=self.upstream_exchange, routing_key=routing_key, arguments=arguments),
                         commands.Exchange.UnbindOk)
        for key, (routing_key, arguments) in want.items():
            if key not in self._bound:
                await up.rpc(method_frame(1, commands.Exchange.Bind, destination=self.internal_exchange,
                                          source=self.upstream_exchange, routing_key=routing_key,
                                          arguments=arguments), commands.Exchange.BindOk)
                self._bound[key] = (routing_key, arguments)

    async def remove_upstream(self) -> None:
        """The link is no longer wanted (policy, upstream or exchange gone): delete its queue and exchange
        upstream, as RabbitMQ does, so that the upstream does not keep queueing for nobody. Best effort: an
        upstream that cannot be reached keeps them (an ``expires`` on the upstream deletes an unused queue)."""
        try:
            up, _ = await self._connect(self.upstream.uris, "upstream")
        except (LinkError, OSError) as exc:
            log.warning("federation link removed; its upstream queue could not be deleted", vhost=self.vhost,
                        exchange=self.exchange, upstream=self.upstream.name, reason=str(exc))
            return
        try:
            await up.rpc(method_frame(1, commands.Queue.Delete, queue=self.internal_name), commands.Queue.DeleteOk)
            for name in (*self._pair(), self.internal_name):
                if await self._exists(up, name):
                    await up.rpc(method_frame(1, commands.Exchange.Delete, exchange=name),
                                 commands.Exchange.DeleteOk)
        except LinkError as exc:
            log.warning("federation link removed; deleting its upstream queue failed", vhost=self.vhost,
                        exchange=self.exchange, upstream=self.upstream.name, reason=str(exc))
        finally:
            await up.close()
            up.abandon()

    # -- the message path ----------------------------------------------------------------------------------
    def delivered(self, tag: int, redelivered: bool, routing_key: str, header: bytes, body: bytes) -> None:
        up, down, u = self._up, self._down, self.upstream
        if up is None or down is None:
            return
        props = decode_properties(header)
        earlier = (props.headers or {}).get(RECEIVED_FROM)
        hops = list(earlier) if isinstance(earlier, list) else []
        own = self.cluster_name()
        if len(hops) >= u.max_hops or any(isinstance(h, dict) and h.get("cluster-name") == own for h in hops):
            self.dropped += 1  # crossed enough, or came from here: it goes no further (RabbitMQ's rule)
            if u.ack_mode != "no-ack":
                up.ack(tag, False)
                self.acked += 1
            return
        entry = {"uri": self.uri, "exchange": self.upstream_exchange, "redelivered": redelivered,
                 "cluster-name": self._upstream_cluster, "vhost": self._upstream_vhost}
        changes: dict[str, Any] = {}
        if props.user_id and not u.trust_user_id:
            changes["user_id"] = None
        header = with_properties(header, headers_set={RECEIVED_FROM: [entry, *hops]}, **changes)
        down.publish(self.exchange, routing_key, header, body)
        self.published += 1
        if u.ack_mode == "on-confirm":
            self._seq += 1
            self._pending[self._seq] = tag
        elif u.ack_mode == "on-publish":
            up.ack(tag, False)
            self.acked += 1

    def confirmed(self, seq: int, multiple: bool, nack: bool) -> None:
        """This node confirmed (or nacked) publishes up to ``seq``: ack (or requeue) their deliveries
        upstream; with one ``multiple`` ack when no older delivery is still waiting."""
        up = self._up
        if up is None:
            return
        if multiple:
            seqs = []
            for s in self._pending:
                if s > seq:
                    break
                seqs.append(s)
        else:
            seqs = [seq] if seq in self._pending else []
        tags = [self._pending.pop(s) for s in seqs]
        if not tags:
            return
        if nack:
            for tag in tags:
                up.nack(tag, False, True)
            return
        top = max(tags)
        oldest_waiting = next(iter(self._pending.values()), None)
        if len(tags) > 1 and (oldest_waiting is None or oldest_waiting > top):
            up.ack(top, True)  # dropped deliveries were acked one by one already
        else:
            for tag in tags:
                up.ack(tag, False)
        self.acked += len(tags)

    def link_closed(self, role: str, reason: str) -> None:
        if self._session is not None and not self._session.done():
            self._session.set_exception(LinkError(f"{role}: {reason}"))

    def writable(self, role: str, writable: bool) -> None:
        """This node pushes back (its socket's buffer, or connection.blocked): stop reading upstream."""
        if role == "downstream" and self._up is not None:
            (self._up.resume_reading if writable else self._up.pause_reading)()

    # -- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """GET /api/federation-links' object (rabbitmq_federation_management's fields for an exchange link),
        plus Leveret's counters."""
        out: dict[str, Any] = {
            "node": self.node_name, "exchange": self.exchange, "upstream_exchange": self.upstream_exchange,
            "type": "exchange", "vhost": self.vhost, "upstream": self.upstream.name, "id": self.id,
            "status": self.state, "local_connection": self.local_connection, "uri": self.uri,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)),
            "messages_published": self.published, "messages_acked": self.acked,
            "messages_dropped": self.dropped}
        if self.state == "error":
            out["error"] = self.error
        return out


class _Events:
    """A connection's events, routed to its link with the connection's role (upstream, downstream)."""

    __slots__ = ("link", "role")

    def __init__(self, link: FederationLink, role: str) -> None:
        self.link, self.role = link, role

    def on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                    body: bytes) -> None:
        if self.role == "upstream":
            self.link.delivered(tag, redelivered, routing_key, header, body)

    def on_confirm(self, tag: int, multiple: bool, nack: bool) -> None:
        if self.role == "downstream":
            self.link.confirmed(tag, multiple, nack)

    def on_closed(self, reason: str) -> None:
        self.link.link_closed(self.role, reason)

    def on_writable(self, writable: bool) -> None:
        self.link.writable(self.role, writable)
