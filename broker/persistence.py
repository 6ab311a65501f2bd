"""What survives a restart: durable exchanges, queues and bindings in the metadata store, messages in
the variable queues, and the recovery that brings them back at start.

storage/ stores bytes and knows nothing of AMQP; this module is the translation: a message is stored as
msgpack ``[exchange, routing_key, content header, body, published_at, expiration_ms]`` (the header
keeps its raw properties, so a recovered message is delivered byte for byte as it was published), and
queue and exchange arguments as AMQP field tables.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack
import structlog
from pamqp import decode as amqp_decode
from pamqp import encode as amqp_encode

from broker.exchange import EXCHANGE, QUEUE, Binding, Exchange
from broker.message import Message
from protocol.fastcodec import shortstr
from storage.backing_queue import BackingQueue
from storage.node_storage import NodeStorage

if TYPE_CHECKING:
    from broker.queue_process import QueueProcess
    from broker.vhost import VHost

log = structlog.get_logger("leveret.persistence")


def encode_message(msg: Message) -> bytes:
    return msgpack.packb([msg.exchange, msg.routing_key, msg.header, msg.body, msg.published_at,
                          msg.expiration_ms], use_bin_type=True)


def decode_message(data: bytes) -> Message:
    exchange, routing_key, header, body, published_at, expiration_ms = msgpack.unpackb(data, raw=False)
    msg = Message(exchange, routing_key, shortstr(exchange) + shortstr(routing_key), header, body, published_at)
    msg.expiration_ms = expiration_ms
    return msg


def _table(arguments: dict[str, Any]) -> bytes:
    return amqp_encode.field_table(arguments)


def _untable(raw: bytes) -> dict[str, Any]:
    return dict(amqp_decode.field_table(raw)[1]) if raw else {}


class DurableDefinitions:
    """The durable part of every vhost's topology, written as it changes and read back at start.

    Exclusive queues are never durable (RabbitMQ ignores the flag on them); a binding is durable when its
    source exchange and its destination both are.
    """

    def __init__(self, storage: NodeStorage) -> None:
        self.storage = storage
        self.metadata = storage.metadata

    # -- writing ---------------------------------------------------------------------------------------
    def exchange_declared(self, vhost: str, ex: Exchange) -> None:
        if ex.durable:
            self.metadata.put("exchange", (vhost, ex.name), {
                "type": ex.type_name, "auto_delete": ex.auto_delete, "internal": ex.internal,
                "arguments": _table(ex.arguments)})

    def exchange_deleted(self, vhost: str, name: str) -> None:
        self.metadata.delete("exchange", (vhost, name))

    def queue_declared(self, vhost: str, q: QueueProcess) -> None:
        if q.durable and q.exclusive_owner is None:
            self.metadata.put("queue", (vhost, q.name), {
                "auto_delete": q.auto_delete, "arguments": _table(q.arguments)})

    def queue_deleted(self, vhost: str, name: str) -> None:
        self.metadata.delete("queue", (vhost, name))

    @staticmethod
    def _binding_key(vhost: str, b: Binding) -> tuple[str, ...]:
        args = hashlib.sha1(_table(b.arguments)).hexdigest()
        return (vhost, b.source, b.kind, b.destination, b.routing_key, args)

    def binding_added(self, vh: VHost, b: Binding) -> None:
        source = vh.exchanges.get(b.source)
        if source is None or not source.durable:
            return
        if b.kind == QUEUE:
            q = vh.queues.get(b.destination)
            if q is None or not q.durable or q.exclusive_owner is not None:
                return
        else:
            dest = vh.exchanges.get(b.destination)
            if dest is None or not dest.durable:
                return
        self.metadata.put("binding", self._binding_key(vh.name, b), {"arguments": _table(b.arguments)})

    def binding_removed(self, vhost: str, b: Binding) -> None:
        self.metadata.delete("binding", self._binding_key(vhost, b))

    def vhost_deleted(self, vhost: str) -> None:
        for kind in ("exchange", "queue", "binding"):
            self.metadata.delete_prefix(kind, (vhost,))

    # -- recovery ----------------------------------------------------------------------------------------
    def recover(self, vhosts: dict[str, VHost], make_vhost: Callable[[str], VHost]) -> None:
        """Re-create the durable exchanges, then the queues (their messages come back with them), then
        the bindings. Called once, before the node listens."""
        counts = {"exchange": 0, "queue": 0, "binding": 0}
        for (vhost, name), v in self.metadata.items("exchange"):
            vh = vhosts.get(vhost) or make_vhost(vhost)
            vh.restore_exchange(name, v["type"], v["auto_delete"], v["internal"], _untable(v["arguments"]))
            counts["exchange"] += 1
        for (vhost, name), v in self.metadata.items("queue"):
            vh = vhosts.get(vhost) or make_vhost(vhost)
            vh.queues.restore(name, v["auto_delete"], _untable(v["arguments"]))
            counts["queue"] += 1
        for (vhost, source, kind, dest, rk, _h), v in self.metadata.items("binding"):
            vh = vhosts.get(vhost)
            ex = vh.exchanges.get(source) if vh is not None else None
            if ex is None or (kind == QUEUE and vh.queues.get(dest) is None) or \
                    (kind == EXCHANGE and dest not in vh.exchanges):
                continue
            ex.add_binding(Binding(source, dest, kind, rk, _untable(v["arguments"])))
            counts["binding"] += 1
        self.storage.finish_recovery()
        log.info("recovered durable definitions", clean=self.storage.was_clean, **counts)


class BackingQueueFactory:
    """Opens the backing queue of a queue: a variable queue over the node's stores (paging to disk under
    memory pressure; persistent messages of durable queues survive restarts)."""

    def __init__(self, storage: NodeStorage, vhost: str) -> None:
        self.storage = storage
        self.vhost = vhost

    def __call__(self, name: str, durable: bool, priority: int | None = None,
                 on_confirm: Callable[[], None] | None = None) -> BackingQueue:
        storage_name = name if priority is None else f"{name}\x00priority-{priority}"
        return self.storage.open_queue(self.vhost, storage_name, durable, encode=encode_message,
                                       decode=decode_message, on_confirm=on_confirm)
