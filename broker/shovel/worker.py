"""One dynamic shovel: a task that connects to the first reachable source and destination URIs, declares
what the definition names, consumes with ``src-prefetch-count`` and publishes each delivery to the
destination; on any failure it closes both, reports ``terminated`` with the reason and tries again after
``reconnect-delay`` seconds, as rabbit_shovel_worker does.

Acknowledgement (``ack-mode``):

* ``on-confirm`` (default): the destination channel is in confirm mode and the source delivery is acked
  only when the destination confirms it. Every delivery of a session is published once and in order, so
  the destination's publish sequence number equals the source's delivery tag: a confirm of tag n
  (``multiple`` or not) is acked on the source as n, and a nack is nacked back (requeued). No table per
  message is needed. What was in flight when a connection died is requeued by the source broker and comes
  again with ``redelivered`` set: those are the only possible duplicates.
* ``on-publish``: the source delivery is acked once written to the destination's socket.
* ``no-ack``: the source consumer does not ack at all (messages in flight at a failure are lost).

``src-delete-after``: after that many messages (or the source queue's length when the shovel started,
``queue-length``) are acked, the shovel stops and the supervisor deletes its parameter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from pamqp import commands

from broker.shovel.definition import ShovelDefinition
from broker.shovel.link import ChannelClosed, Link, LinkError
from broker.shovel.uri import ShovelURI, parse_uri, redact
from protocol.methods import method_frame
from protocol.properties import Long, decode_properties, with_properties

log = structlog.get_logger("leveret.shovel")
NOT_FOUND = 404


@dataclass(frozen=True)
class LocalLogin:
    """How a worker reaches this node for an ``amqp://`` URI with no host."""

    host: str
    port: int
    user: str
    password: str


class _Finished(Exception):
    """The session moved all it was asked to (src-delete-after)."""


class ShovelWorker:
    def __init__(self, definition: ShovelDefinition, node_name: str, local: Callable[[str], LocalLogin],
                 on_finished: Callable[[ShovelWorker], None]) -> None:
        self.d = definition
        self.node_name = node_name
        self.local = local
        self.on_finished = on_finished
        self.state = "starting"
        self.reason: str | None = None
        self.since = time.time()
        self.src_uri = redact(definition.src_uris[0])
        self.dest_uri = redact(definition.dest_uris[0])
        self.task: asyncio.Task[None] | None = None
        # Counters (the metrics'): messages published to the destination and acked at the source.
        self.published = 0
        self.acked = 0
        self.left: int | None = None  # messages still to move before src-delete-after is reached
        self._src: Link | None = None
        self._dest: Link | None = None
        self._session: asyncio.Future[None] | None = None
        self._delivered = 0
        self._session_limit: int | None = None
        self._confirmed_to = 0
        self._forward: dict[str, Any] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"shovel {self.d.vhost}/{self.d.name}")

    async def stop(self) -> None:
        task = self.task
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    async def _run(self) -> None:
        while True:
            self._set("starting")
            try:
                await self._run_session()
            except _Finished:
                log.info("shovel finished: src-delete-after reached, deleting it", vhost=self.d.vhost,
                         shovel=self.d.name, moved=self.acked)
                self._set("terminated", "src-delete-after reached")
                self.on_finished(self)
                return
            except (LinkError, OSError) as exc:
                reason = str(exc)
            except Exception as exc:  # a bug must not end the shovel silently: report and retry
                log.exception("shovel failed", vhost=self.d.vhost, shovel=self.d.name)
                reason = f"internal error: {exc!r}"
            self._set("terminated", reason)
            log.warning("shovel terminated; reconnecting after reconnect-delay", vhost=self.d.vhost,
                        shovel=self.d.name, reason=reason, reconnect_delay=self.d.reconnect_delay)
            await asyncio.sleep(self.d.reconnect_delay)

    async def _connect(self, uris: list[str], role: str) -> tuple[Link, str]:
        """The first URI of the list that connects (RabbitMQ tries them in order)."""
        problems = []
        for text in uris:
            uri = parse_uri(text)
            if uri.is_local:
                login = self.local(uri.vhost)
                target: tuple[str, int, str, str] = (login.host, login.port, login.user, login.password)
            else:
                assert uri.host is not None
                target = (uri.host, uri.port, uri.user, uri.password)
            link = Link(_Events(self, role), f"Shovel {self.d.name}")
            try:
                await link.open(uri, *target, uri.vhost)
                return link, redact(text)
            except LinkError as exc:
                await link.close()
                problems.append(f"{redact(text)}: {exc}")
        raise LinkError(f"{role}: " + "; ".join(problems))

    async def _run_session(self) -> None:
        d = self.d
        self._session = asyncio.get_running_loop().create_future()
        self._delivered = self._confirmed_to = 0
        try:
            self._src, self.src_uri = await self._connect(d.src_uris, "source")
            self._dest, self.dest_uri = await self._connect(d.dest_uris, "destination")
            self._forward = self._forward_table() if d.add_forward_headers else None
            queue, count = await self._declare_source(self._src)
            if d.dest_queue is not None:
                await _ensure_queue(self._dest, d.dest_queue, d.dest_queue_args)
            if d.ack_mode == "on-confirm":
                await self._dest.rpc(method_frame(1, commands.Confirm.Select), commands.Confirm.SelectOk)
            if self.left is None and d.delete_after == "queue-length":
                # the length when the shovel first started, as RabbitMQ reads it once
                self.left = count if d.src_queue is not None else 0
            elif self.left is None and isinstance(d.delete_after, int):
                self.left = d.delete_after
            if self.left is not None and self.left <= 0:
                raise _Finished()
            # what this session may still move (self.left counts down as acks come; deliveries count up)
            self._session_limit = self.left
            prefetch = d.prefetch_count if self.left is None else min(d.prefetch_count, self.left)
            if d.ack_mode != "no-ack":
                await self._src.rpc(method_frame(1, commands.Basic.Qos, prefetch_count=prefetch),
                                    commands.Basic.QosOk)
            await self._src.rpc(method_frame(1, commands.Basic.Consume, queue=queue,
                                             consumer_tag=f"shovel-{d.name}", no_ack=d.ack_mode == "no-ack"),
                                commands.Basic.ConsumeOk)
            self._set("running")
            log.info("shovel running", vhost=d.vhost, shovel=d.name, src_uri=self.src_uri, dest_uri=self.dest_uri)
            await self._session
        finally:
            links = [link for link in (self._src, self._dest) if link is not None]
            self._src = self._dest = None
            try:
                await asyncio.gather(*(link.close() for link in links))
            finally:  # cancelled while closing: no socket is left open
                for link in links:
                    link.abandon()

    async def _declare_source(self, src: Link) -> tuple[str, int]:
        d = self.d
        if d.src_queue is not None:
            return d.src_queue, await _ensure_queue(src, d.src_queue, d.src_queue_args)
        ok = await src.rpc(method_frame(1, commands.Queue.Declare, queue="", exclusive=True),
                           commands.Queue.DeclareOk)
        await src.rpc(method_frame(1, commands.Queue.Bind, queue=ok.queue, exchange=d.src_exchange or "",
                                   routing_key=d.src_exchange_key), commands.Queue.BindOk)
        return ok.queue, 0

    # -- the message path ----------------------------------------------------------------------------------
    def delivered(self, tag: int, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                  body: bytes) -> None:
        src, dest, d = self._src, self._dest, self.d
        if src is None or dest is None:
            return
        if self._session_limit is not None and self._delivered >= self._session_limit:
            src.nack(tag, False, True)  # beyond src-delete-after: back to the source queue
            return
        self._delivered += 1
        if d.dest_queue is not None:
            exchange, routing_key = "", d.dest_queue
        elif d.dest_exchange is not None:
            exchange = d.dest_exchange
            routing_key = d.dest_exchange_key if d.dest_exchange_key is not None else routing_key
        if self._forward is not None or d.add_timestamp_header or d.publish_properties:
            header = self._edit(header)
        dest.publish(exchange, routing_key, header, body)
        self.published += 1
        if d.ack_mode == "on-publish":
            src.ack(tag, False)
            self._count_acked(1)

    def confirmed(self, tag: int, multiple: bool, nack: bool) -> None:
        src = self._src
        if src is None:
            return
        n = tag - self._confirmed_to if multiple else 1
        self._confirmed_to = max(self._confirmed_to, tag)
        if nack:
            src.nack(tag, multiple, True)
            return
        src.ack(tag, multiple)
        self._count_acked(n)

    def _count_acked(self, n: int) -> None:
        self.acked += n
        if self.left is not None:
            self.left -= n
            if self.left <= 0 and self._session is not None and not self._session.done():
                self._session.set_exception(_Finished())

    def link_closed(self, role: str, reason: str) -> None:
        if self._session is not None and not self._session.done():
            self._session.set_exception(LinkError(f"{role}: {reason}"))

    def writable(self, role: str, writable: bool) -> None:
        """The destination pushes back: stop reading the source until it drains."""
        if role == "destination" and self._src is not None:
            (self._src.resume_reading if writable else self._src.pause_reading)()

    # -- headers -------------------------------------------------------------------------------------------
    def _forward_table(self) -> dict[str, Any]:
        d = self.d
        table: dict[str, Any] = {"shovelled-by": self.node_name, "shovel-type": "dynamic",
                                 "shovel-name": d.name, "shovel-vhost": d.vhost,
                                 "src-uri": self.src_uri, "dest-uri": self.dest_uri}
        if d.src_queue is not None:
            table["src-queue"] = d.src_queue
        else:
            table["src-exchange"], table["src-exchange-key"] = d.src_exchange, d.src_exchange_key
        if d.dest_queue is not None:
            table["dest-queue"] = d.dest_queue
        elif d.dest_exchange is not None:
            table["dest-exchange"] = d.dest_exchange
            if d.dest_exchange_key is not None:
                table["dest-exchange-key"] = d.dest_exchange_key
        return table

    def _edit(self, header: bytes) -> bytes:
        d = self.d
        changes: dict[str, Any] = {PUBLISH_NAMES.get(k, k): v for k, v in d.publish_properties.items()}
        headers_set: dict[str, Any] = {}
        if self._forward is not None:
            earlier = decode_properties(header).headers or {}
            previous = earlier.get("x-shovelled")
            headers_set["x-shovelled"] = [self._forward] + (list(previous) if isinstance(previous, list) else [])
        if d.add_timestamp_header:
            headers_set["x-shovelled-timestamp"] = Long(int(time.time()))
        return with_properties(header, headers_set=headers_set or None, **changes)

    # -- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """GET /api/shovels' object (rabbit_shovel_mgmt's fields for a dynamic amqp091 shovel), plus Leveret's
        own ``messages_published``/``messages_acked`` (the metrics' counters; RabbitMQ 3.10's status has no
        count, and the web UI's Shovels page shows how far a move has gone from them)."""
        d = self.d
        out: dict[str, Any] = {"node": self.node_name,
                               "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)),
                               "name": d.name, "vhost": d.vhost, "type": "dynamic", "state": self.state,
                               "ack_mode": d.ack_mode, "messages_published": self.published,
                               "messages_acked": self.acked}
        if self.state == "terminated":
            out["reason"] = self.reason
        if self.state == "running":
            out.update({"src_uri": self.src_uri, "src_protocol": "amqp091", "dest_protocol": "amqp091",
                        "dest_uri": self.dest_uri})
            if d.src_queue is not None:
                out["src_queue"] = d.src_queue
            else:
                out["src_exchange"], out["src_exchange_key"] = d.src_exchange, d.src_exchange_key
            if d.dest_queue is not None:
                out["dest_queue"] = d.dest_queue
            elif d.dest_exchange is not None:
                out["dest_exchange"] = d.dest_exchange
                if d.dest_exchange_key is not None:
                    out["dest_exchange_key"] = d.dest_exchange_key
        return out


PUBLISH_NAMES = {"type": "message_type"}


async def _ensure_queue(link: Link, queue: str, arguments: dict[str, Any]) -> int:
    """The queue's message count; declared durable if it does not exist (a passive declare first, so an
    existing queue of any type and arguments is used as it is, as rabbit_shovel_parameters' ensure_queue)."""
    try:
        ok = await link.rpc(method_frame(1, commands.Queue.Declare, queue=queue, passive=True),
                            commands.Queue.DeclareOk)
    except ChannelClosed as exc:
        if exc.code != NOT_FOUND:
            raise
        await link.open_channel()
        ok = await link.rpc(method_frame(1, commands.Queue.Declare, queue=queue, durable=True,
                                         arguments=arguments), commands.Queue.DeclareOk)
    return int(ok.message_count)


class _Events:
    """A link's events, routed to its worker with the link's role."""

    __slots__ = ("role", "worker")

    def __init__(self, worker: ShovelWorker, role: str) -> None:
        self.worker, self.role = worker, role

    def on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str, header: bytes,
                    body: bytes) -> None:
        self.worker.delivered(tag, redelivered, exchange, routing_key, header, body)

    def on_confirm(self, tag: int, multiple: bool, nack: bool) -> None:
        self.worker.confirmed(tag, multiple, nack)

    def on_closed(self, reason: str) -> None:
        self.worker.link_closed(self.role, reason)

    def on_writable(self, writable: bool) -> None:
        self.worker.writable(self.role, writable)


__all__ = ["LocalLogin", "ShovelURI", "ShovelWorker"]
