"""One queue federation link: a federated queue here and one upstream (RabbitMQ's queue federation).

The link consumes the upstream queue of the same name (or the upstream's ``queue``), declared durable there
if it does not exist, only while the queue here has demand: consumers and no message ready. Every
:data:`DEMAND_INTERVAL` seconds it looks: with demand and no upstream consumer it starts one (basic.consume with
``prefetch-count``), without demand it cancels it; what was delivered meanwhile is still moved. So messages
move to where consumers are, and a queue with consumers of its own upstream keeps its messages for them. The
overshoot is at most ``prefetch-count`` messages, which wait here for the local consumers.

Each message is published here to the default exchange with the queue's name as routing key and an
``x-received-from`` entry, and acked upstream per ``ack-mode`` (on-confirm: after this node's confirm), as an
exchange link does (link.py: the connections, reconnecting and acks are that class's). Queue federation has no
hop count (RabbitMQ's has none either): a message may move between federated queues more than once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands

from broker.federation.definition import Upstream
from broker.federation.link import NOT_FOUND, RECEIVED_FROM, FederationLink, link_id, log
from broker.shovel.link import ChannelClosed, Link
from broker.shovel.worker import LocalLogin
from protocol.methods import method_frame
from protocol.properties import decode_properties, with_properties

DEMAND_INTERVAL = 0.2


class QueueLink(FederationLink):
    def __init__(self, vhost: str, queue: str, upstream: Upstream, node_name: str, cluster_name: Callable[[], str],
                 local: Callable[[str], LocalLogin], demand: Callable[[], bool]) -> None:
        super().__init__(vhost, queue, "", upstream, node_name, cluster_name, local, dict)
        self.queue = queue
        self.upstream_queue = upstream.queue or queue
        self.demand = demand
        self.id = link_id(vhost, f"queue {queue}", upstream.name)
        self.local_connection = f"Federation link {self.id} (upstream {upstream.name}, queue {queue})"
        self._consumer_tag = f"federation-link-{self.id}"
        self._consuming = False

    async def _run_session(self) -> None:
        u = self.upstream
        self._session = asyncio.get_running_loop().create_future()
        self._pending, self._seq, self._consuming = {}, 0, False
        try:
            self._up, self.uri = await self._connect(u.uris, "upstream")
            self._down, _ = await self._connect(("amqp://",), "downstream", self.vhost)
            up, down = self._up, self._down
            self._upstream_cluster = str(up.server_properties.get("cluster_name") or "")
            await self._declare_upstream_queue(up)
            if u.ack_mode == "on-confirm":
                await down.rpc(method_frame(1, commands.Confirm.Select), commands.Confirm.SelectOk)
            if u.ack_mode != "no-ack":
                await up.rpc(method_frame(1, commands.Basic.Qos, prefetch_count=u.prefetch_count),
                             commands.Basic.QosOk)
            self._set("running")
            log.info("federation link running", vhost=self.vhost, queue=self.queue, upstream=u.name, uri=self.uri)
            while True:
                done, _ = await asyncio.wait({self._session}, timeout=DEMAND_INTERVAL)
                if done:
                    self._session.result()  # raises why the session ended
                wanted = self.demand()
                if wanted and not self._consuming:
                    await up.rpc(method_frame(1, commands.Basic.Consume, queue=self.upstream_queue,
                                              consumer_tag=self._consumer_tag, no_ack=u.ack_mode == "no-ack"),
                                 commands.Basic.ConsumeOk)
                    self._consuming = True
                elif not wanted and self._consuming:
                    await up.rpc(method_frame(1, commands.Basic.Cancel, consumer_tag=self._consumer_tag),
                                 commands.Basic.CancelOk)
                    self._consuming = False
        finally:
            links = [link for link in (self._up, self._down) if link is not None]
            self._up = self._down = None
            try:
                await asyncio.gather(*(link.close() for link in links))
            finally:
                for link in links:
                    link.abandon()

    async def _declare_upstream_queue(self, up: Link) -> None:
        """The upstream queue as it is (a passive declare), else declared durable."""
        try:
            await up.rpc(method_frame(1, commands.Queue.Declare, queue=self.upstream_queue, passive=True),
                         commands.Queue.DeclareOk)
        except ChannelClosed as exc:
            if exc.code != NOT_FOUND:
                raise
            await up.open_channel()
            await up.rpc(method_frame(1, commands.Queue.Declare, queue=self.upstream_queue, durable=True),
                         commands.Queue.DeclareOk)

    def delivered(self, tag: int, redelivered: bool, routing_key: str, header: bytes, body: bytes) -> None:
        up, down, u = self._up, self._down, self.upstream
        if up is None or down is None:
            return
        props = decode_properties(header)
        earlier = (props.headers or {}).get(RECEIVED_FROM)
        hops = list(earlier) if isinstance(earlier, list) else []
        entry = {"uri": self.uri, "queue": self.upstream_queue, "redelivered": redelivered,
                 "cluster-name": self._upstream_cluster, "vhost": self._upstream_vhost}
        changes: dict[str, Any] = {}
        if props.user_id and not u.trust_user_id:
            changes["user_id"] = None
        header = with_properties(header, headers_set={RECEIVED_FROM: [entry, *hops]}, **changes)
        down.publish("", self.queue, header, body)
        self.published += 1
        if u.ack_mode == "on-confirm":
            self._seq += 1
            self._pending[self._seq] = tag
        elif u.ack_mode == "on-publish":
            up.ack(tag, False)
            self.acked += 1

    async def remove_upstream(self) -> None:
        """Nothing to remove: the upstream queue is the upstream's own."""

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.node_name, "queue": self.queue, "upstream_queue": self.upstream_queue, "type": "queue",
            "vhost": self.vhost, "upstream": self.upstream.name, "id": self.id, "status": self.state,
            "local_connection": self.local_connection, "uri": self.uri,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)),
            "messages_published": self.published, "messages_acked": self.acked, "consuming": self._consuming}
        if self.state == "error":
            out["error"] = self.error
        return out
