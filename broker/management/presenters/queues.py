"""Queues as the HTTP API shows them (``/api/queues``), with RabbitMQ's field names (``messages_ready``,
``messages_unacknowledged``, ``message_stats``, ``consumers``, ...).

Every field is read from a declared member of the queue seam (broker/queues/queue_types.py's Queue: its
figures from ``Queue.figures()``, its counters from ``Queue.stats``, its type's own items from
``Queue.info_items``): a field the broker does not have fails loudly here (and in mypy) instead of showing a
default, and nothing here tests the queue's class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.json_values import json_safe
from broker.management.presenters.connections import consumer_info, iter_consumers
from broker.management.presenters.queue_figures import figures_of, is_shared
from broker.management.presenters.rates import RateSampler, with_details
from broker.management.presenters.times import format_timestamp
from broker.queues.queue_args import lower_limit
from broker.queues.queue_types import Queue

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.node import Node
    from storage.backing_queue import Figures


def queue_message_counts(q: Queue) -> dict[str, int]:
    return q.stats.message_stats()


def queue_message_stats(q: Queue, sampler: RateSampler | None, shared: Snapshot | None) -> dict[str, Any]:
    """A queue's ``message_stats``. For a shared queue of a cluster member, every member's counters summed and
    their rates, as PostgreSQL holds them (``shared``, storage/pg/queue_stats.py): the same on every member
    (totals up to about 2 s behind; rates the same for every member asked within one rate slot of
    ``collect_statistics_interval``). Any other queue's are its own, with the sampler's rates."""
    if shared is None or not is_shared(q):
        return with_details(queue_message_counts(q), sampler, id(q))
    activity = shared.activity(q.vhost.name, q.name)
    c, rates = activity.counts, activity.rates
    counts = {"publish": c["publish"], "deliver_get": c["deliver"] + c["get"], "deliver": c["deliver"],
              "get": c["get"], "redeliver": c["redeliver"], "ack": c["ack"]}
    out: dict[str, Any] = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": rates[name]}
    return out


def queue_type(q: Queue) -> str:
    """The queue's type name as the HTTP API shows it ("classic", "quorum"; broker/queues/queue_types.py)."""
    return q.type_name


def effective_policy_definition(q: Queue) -> dict[str, Any]:
    """The queue's policy definition with its operator policy's merged in (RabbitMQ's
    ``effective_policy_definition``): where both give a number the lower wins (a delivery limit below zero is
    none: ``lower_limit``), else the operator policy's."""
    vh = q.vhost
    policy = vh.policies.get(q.settings.policy) if q.settings.policy is not None else None
    operator = vh.operator_policies.get(q.settings.operator_policy) if q.settings.operator_policy is not None \
        else None
    out = dict(policy.definition) if policy is not None else {}
    for key, value in (operator.definition.items() if operator is not None else ()):
        current = out.get(key)
        if isinstance(current, int) and not isinstance(current, bool) and isinstance(value, int) \
                and not isinstance(value, bool):
            out[key] = lower_limit(key, current, value)
        else:
            out[key] = value
    return out


# What a queue's memory estimate adds to the bytes of its ready messages in RAM (Queue.ram_bytes(),
# which counts their bookkeeping too): the queue object itself, and each unacknowledged message's object and
# status (storage/variable_queue.py's MSG_OVERHEAD + STATUS_OVERHEAD).
QUEUE_BASE_MEMORY = 2048


UNACKED_MESSAGE_OVERHEAD = 600


def queue_memory(q: Queue, f: Figures) -> int:
    """An estimate of the bytes of RAM the queue holds (RabbitMQ's ``memory``, which is the queue process's
    heap): the ready messages in RAM with their bookkeeping (what the memory budget pages by,
    ``Queue.ram_bytes()``; 0 for a stream, whose log is on disk), plus the unacknowledged messages'
    bodies and ``UNACKED_MESSAGE_OVERHEAD`` each, plus ``QUEUE_BASE_MEMORY`` for the queue itself. Python does
    not measure a queue's objects; this is the figure paging works with, not a measurement."""
    return QUEUE_BASE_MEMORY + q.ram_bytes() + f.unacked_bytes + f.unacked * UNACKED_MESSAGE_OVERHEAD


def queue_info(node: Node, q: Queue, sampler: RateSampler | None = None,
               shared: Snapshot | None = None) -> dict[str, Any]:
    """``shared``: a cluster member's count of the shared queues (figures_of)."""
    f = figures_of(q, shared)
    consumers = q.consumers.count
    key = id(q)
    info: dict[str, Any] = {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner is not None,
        "arguments": json_safe(q.arguments),
        "node": node.name,
        "type": queue_type(q),
        "state": "running",
        "consumers": consumers,
        "publishers": len(q.publisher_channels),
        "consumer_capacity": 1.0 if consumers else 0.0,
        "consumer_utilisation": 1.0 if consumers else 0.0,
        "exclusive_consumer_tag": q.exclusive_consumer.tag if q.exclusive_consumer is not None else None,
        "policy": q.settings.policy,
        "operator_policy": q.settings.operator_policy,
        "effective_policy_definition": json_safe(effective_policy_definition(q)),
        "message_bytes": f.bytes,
        "message_bytes_ready": f.ready_bytes,
        "message_bytes_unacknowledged": f.unacked_bytes,
        "messages_paged_out": f.paged_out,
        "memory": queue_memory(q, f),
        "message_stats": queue_message_stats(q, sampler, shared),
    }
    idle_since = sampler.idle.observe(q, key, None, shared) if sampler is not None else None
    if idle_since is not None:  # RabbitMQ shows the field only while the queue is idle
        info["idle_since"] = format_timestamp(idle_since)
    # A shared queue's count rates as PostgreSQL sampled them (storage/pg/queue_stats.py): the same on every
    # member asked within one rate slot; any other queue's from the sampler.
    shared_rates = shared.activity(q.vhost.name, q.name).rates if shared is not None and is_shared(q) else None
    for name, value in (("messages", f.messages), ("messages_ready", f.ready),
                        ("messages_unacknowledged", f.unacked)):
        info[name] = value
        if shared_rates is not None:
            info[name + "_details"] = {"rate": shared_rates[name]}
        else:
            info[name + "_details"] = {"rate": sampler.rate((key, name)) if sampler else 0.0}
    if q.exclusive_owner is not None:
        info["owner_pid_details"] = {"name": q.exclusive_owner.name}
    if q.dedup is not None:  # the plugin shows it in backing_queue_status; the queue object is where it is read
        info["message_deduplication_cache_info"] = q.dedup.info()
    info.update(q.info_items(node.name))  # the items its type adds (a stream's offsets: broker/queues/queue_info.py)
    if shared is not None and is_shared(q):
        # Every live member serves a shared queue (RabbitMQ's quorum queue fields: its members, those online);
        # its leader is the member that reports it to Prometheus (Snapshot.leader), the same on every member.
        info["members"] = list(shared.members)
        info["online"] = list(shared.members)
        info["leader"] = shared.leader(q.vhost.name, q.name, node.name)
    return info


def queue_consumer_details(node: Node, q: Queue) -> list[dict[str, Any]]:
    """The consumers of one queue (RabbitMQ's ``consumer_details`` of ``GET /api/queues/{vhost}/{name}``)."""
    return [consumer_info(node, conn, ch, c) for conn, ch, c in iter_consumers(node) if c.queue is q]
