"""Connections, channels and consumers as the HTTP API shows them (``/api/connections``,
``/api/channels``, ``/api/consumers``), with their counters, and the walks over them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from broker.amqp.reader import open_connections
from broker.json_values import json_safe
from broker.management.presenters.rates import RateSampler, with_details
from broker.security.tls import connection_tls_info

if TYPE_CHECKING:
    from broker.amqp.channel import Channel
    from broker.amqp.reader import Reader
    from broker.node import Node
    from broker.queues.queue_consumers import Consumer


def _ms(ts: float) -> int:
    return int(ts * 1000)


def user_provided_name(conn: Reader) -> str | None:
    """The name the client gave its connection (the ``connection_name`` client property), as RabbitMQ's
    ``user_provided_name``; None if it gave none."""
    name = conn.client_properties.get("connection_name")
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).decode(errors="replace")
    return name if isinstance(name, str) else None


def connection_info(node: Node, conn: Reader, sampler: RateSampler | None = None) -> dict[str, Any]:
    transport = conn.transport
    local = transport.get_extra_info("sockname") if transport is not None else None
    local = local if isinstance(local, tuple) else ("", 0)
    user = conn.user
    vhost = conn.vhost
    info: dict[str, Any] = {
        "name": conn.name,
        "node": node.name,
        "vhost": vhost.name if vhost is not None else None,
        "user": user.name,
        "user_who_performed_action": user.name,
        "state": conn.connection_state,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "auth_mechanism": conn.auth_mechanism,
        **connection_tls_info(transport),  # ssl and, over TLS, the protocol, cipher and client certificate
        "peer_host": conn.peer[0],
        "peer_port": conn.peer[1],
        "host": str(local[0]),
        "port": int(local[1]) if len(local) > 1 else 0,
        "channels": len(conn.channels),
        "channel_max": conn.channel_max,
        "frame_max": conn.frame_max,
        "timeout": conn.heartbeat,
        "connected_at": _ms(conn.connected_at),
        "client_properties": json_safe(conn.client_properties),
        **connection_byte_counts(conn),
        # The socket's write buffer (RabbitMQ: the bytes waiting in the port's send queue).
        "send_pend": transport.get_write_buffer_size() if transport is not None else 0,
        "blocked": conn.blocked_by_alarm,
    }
    for name in ("recv_oct", "send_oct"):  # the two counters RabbitMQ gives a rate
        info[name + "_details"] = {"rate": sampler.rate((id(conn), name)) if sampler else 0.0}
    provided = user_provided_name(conn)
    if provided is not None:  # RabbitMQ has the key only for a connection the client named
        info["user_provided_name"] = provided
    return info


def channel_name(conn: Reader, ch: Channel) -> str:
    return f"{conn.name} ({ch.id})"


def channel_info(node: Node, conn: Reader, ch: Channel, sampler: RateSampler | None = None) -> dict[str, Any]:
    user = conn.user
    tx = ch.tx
    return {
        "name": channel_name(conn, ch),
        "number": ch.id,
        "node": node.name,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "user": user.name,
        "user_who_performed_action": user.name,
        "state": "closing" if ch.closing else "running",
        "connection_details": {"name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1]},
        "consumer_count": len(ch.consumers),
        "messages_unacknowledged": len(ch.unacked),
        "messages_unconfirmed": ch.messages_unconfirmed,
        "messages_uncommitted": len(tx) if tx else 0,
        "acks_uncommitted": 0,
        "prefetch_count": ch.prefetch_count,
        "global_prefetch_count": ch.global_prefetch,
        "confirm": ch.confirm,
        "transactional": tx is not None,
        "pending_raft_commands": 0,
        "message_stats": with_details(channel_message_counts(ch), sampler, id(ch)),
    }


def consumer_info(node: Node, conn: Reader, ch: Channel, consumer: Consumer) -> dict[str, Any]:
    """A consumer as RabbitMQ's /api/consumers shows it. ``active`` / ``activity_status``: on a
    single-active-consumer queue only the active one is active ("single_active"), the others "waiting";
    elsewhere every consumer is "up". ``consumer_timeout`` (milliseconds: the queue's ``x-consumer-timeout``,
    or the node's ``consumer_timeout``) is present only where a timeout applies: a JSON null there is what
    rabbitmqadmin's table output cannot print."""
    q = consumer.queue
    consumers = q.consumers
    if consumers.single_active:
        active = consumers.active is consumer
        status = "single_active" if active else "waiting"
    else:
        active, status = True, "up"
    info: dict[str, Any] = {
        "consumer_tag": consumer.tag,
        "queue": {"name": q.name, "vhost": q.vhost.name},
        "channel_details": {"name": channel_name(conn, ch), "number": ch.id, "node": node.name,
                            "connection_name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1],
                            "user": conn.user.name},
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "arguments": json_safe(consumer.arguments),
        "active": active,
        "activity_status": status,
        "priority": consumer.priority,
    }
    timeout = q.settings.consumer_timeout or node.settings.consumer_timeout
    if timeout is not None:
        info["consumer_timeout"] = timeout
    return info


def iter_channels(node: Node) -> Iterator[tuple[Reader, Channel]]:
    for conn in open_connections(node):
        for ch in list(conn.channels.values()):
            yield conn, ch


def iter_consumers(node: Node) -> Iterator[tuple[Reader, Channel, Consumer]]:
    for conn, ch in iter_channels(node):
        for consumer in list(ch.consumers.values()):
            yield conn, ch, consumer


# A channel's message_stats counters (RabbitMQ's fields for a channel) and a connection's socket counters, in the
# order channel_message_values and connection_byte_values give them (the rate sampler keeps one tuple per object).
CHANNEL_SAMPLED = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver_get", "deliver",
                   "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack")
CONNECTION_SAMPLED = ("recv_oct", "recv_cnt", "send_oct", "send_cnt")


def channel_message_values(ch: Channel) -> tuple[int, ...]:
    """A channel's ``message_stats`` in :data:`CHANNEL_SAMPLED` order, from the plain ints the channel keeps
    (``Channel.msg_*``): publishes and their confirms and unroutable outcomes, deliveries to its consumers and
    basic.get answers (``deliver_get`` is their sum), redeliveries and acks."""
    deliver, deliver_no_ack, get, get_no_ack = ch.msg_deliver, ch.msg_deliver_no_ack, ch.msg_get, ch.msg_get_no_ack
    return (ch.msg_publish, ch.msg_confirm, ch.msg_return_unroutable, ch.msg_drop_unroutable,
            deliver + deliver_no_ack + get + get_no_ack, deliver, deliver_no_ack, get, get_no_ack, ch.msg_get_empty,
            ch.msg_redeliver, ch.msg_ack)


def channel_message_counts(ch: Channel) -> dict[str, int]:
    """A channel's ``message_stats`` by RabbitMQ's names (:func:`channel_message_values`)."""
    return dict(zip(CHANNEL_SAMPLED, channel_message_values(ch), strict=True))


def connection_byte_values(conn: Reader) -> tuple[int, ...]:
    """A connection's socket counters (bytes and reads/writes) in :data:`CONNECTION_SAMPLED` order."""
    return conn.recv_oct, conn.recv_cnt, conn.send_oct, conn.send_cnt


def connection_byte_counts(conn: Reader) -> dict[str, int]:
    """A connection's socket counters, as RabbitMQ's connection object names them."""
    return dict(zip(CONNECTION_SAMPLED, connection_byte_values(conn), strict=True))