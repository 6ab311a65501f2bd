"""Broker objects as the HTTP API shows them, with RabbitMQ's JSON field names (``messages_ready``,
``messages_unacknowledged``, ``message_stats``, ``consumers``, ...), and the rate sampler behind the
``*_details.rate`` fields.

Every field is read from a declared attribute of the object it describes (a queue's figures from
``Queue.figures()``, a connection's state from ``Reader.connection_state``, ...): a field the broker
does not have fails loudly here (and in mypy) instead of showing a default.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.amqp.reader import open_connections
from broker.exchanges.deduplication_exchange import DeduplicationExchange
from broker.exchanges.delayed_exchange import DelayedExchange
from broker.exchanges.exchange import EXCHANGE, QUEUE
from broker.json_values import json_safe
from broker.persistence import untable
from broker.queues.queue_types import Queue, queue_type_of
from broker.security.tls import connection_tls_info
from storage.backing_queue import Figures

if TYPE_CHECKING:
    from broker.amqp.channel import Channel
    from broker.amqp.reader import Reader
    from broker.clustering.cluster_figures import Snapshot
    from broker.exchanges.exchange import Binding, Exchange
    from broker.node import Node
    from broker.queues.queue_consumers import Consumer
    from broker.queues.queue_process import QueueStats
    from broker.security.auth import User
    from broker.vhost import VHost

DEFAULT_EXCHANGE_PATH = "amq.default"


# -- rates ----------------------------------------------------------------------------------------------------------

class RateSampler:
    """Keeps the previous sample of every counter it is asked about; a rate is the change per second
    between the last two samples (taken every ``interval`` seconds by the app, the node's
    ``collect_statistics_interval``), as RabbitMQ's management agent works out ``*_details.rate``:
    ``(value now - value at the previous sample) / (seconds between the two samples)``.

    What is sampled: the node's message counters and object churn (key ``"global"``), each vhost's message
    totals (key ``("vhost", name)``), and per queue, connection, channel and exchange (key ``id(object)``)
    the counters its HTTP API object shows with a rate. Keys of objects gone are dropped at the next sample."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._prev: dict[Any, tuple[float, int]] = {}
        self._rates: dict[Any, float] = {}
        # Queues: id(queue) -> (time, the QUEUE_SAMPLED values) of the last sample; the queues whose last two
        # samples differed (they have rates in _rates).
        self._queue_prev: dict[int, tuple[float, tuple[int, ...]]] = {}
        self._queue_moving: set[int] = set()
        self.idle = IdleTracker()

    def observe(self, key: Any, value: int, now: float) -> None:
        prev = self._prev.get(key)
        if prev is not None and now > prev[0]:
            self._rates[key] = max(0.0, (value - prev[1]) / (now - prev[0]))
        self._prev[key] = (now, value)

    def rate(self, key: Any) -> float:
        return round(self._rates.get(key, 0.0), 1)

    def queue_rates(self, q: Queue) -> dict[str, float]:
        """The rates of one queue's sampled counters and counts (:data:`QUEUE_SAMPLED`), rounded as shown."""
        key = id(q)
        return {name: self.rate((key, name)) for name in QUEUE_SAMPLED}

    def sample(self, node: Node, shared: Snapshot | None = None) -> None:
        """``shared``: a cluster member's count of the shared queues (their figures are taken from it)."""
        now = time.monotonic()
        for name, value in global_message_counts(node, shared).items():
            self.observe(("global", name), value, now)
        for name, value in churn_counts(node).items():
            self.observe(("global", name), value, now)
        live: set[Any] = set()
        for vh in node.vhosts.values():
            for ex in all_exchanges(vh):
                key = id(ex)
                live.add(key)
                for name, value in exchange_message_counts(ex).items():
                    self.observe((key, name), value, now)
            ready = unacked = 0
            for q in vh.queues:
                key = id(q)
                live.add(key)
                f = figures_of(q, shared)
                ready += f.ready
                unacked += f.unacked
                self._sample_queue(key, q.stats, f, now)
                self.idle.observe(q, key, f, shared)
            vkey = ("vhost", vh.name)  # the vhost's totals (its HTTP API object, /api/overview's queue_totals)
            live.add(vkey)
            for name, value in (("messages", ready + unacked), ("messages_ready", ready),
                                ("messages_unacknowledged", unacked)):
                self.observe((vkey, name), value, now)
        for conn in open_connections(node):
            key = id(conn)
            live.add(key)
            for name, value in connection_byte_counts(conn).items():
                self.observe((key, name), value, now)
            for ch in list(conn.channels.values()):
                key = id(ch)
                live.add(key)
                for name, value in channel_message_counts(ch).items():
                    self.observe((key, name), value, now)
        for key in [k for k in self._prev if k[0] != "global" and k[0] not in live]:
            self._prev.pop(key, None)
            self._rates.pop(key, None)
        for qkey in [k for k in self._queue_prev if k not in live]:
            del self._queue_prev[qkey]
            if qkey in self._queue_moving:
                self._queue_moving.discard(qkey)
                for name in QUEUE_SAMPLED:
                    self._rates.pop((qkey, name), None)
        self.idle.forget_all_but(live)

    def _sample_queue(self, key: int, s: QueueStats, f: Figures, now: float) -> None:
        """One queue's sampled counters (:data:`QUEUE_SAMPLED`), kept as one tuple per queue. A queue whose
        counters did not move since the last sample costs one comparison: its rates are zero (absent), and
        only a queue that moved writes rates. With 10,000 idle queues the per-counter way (eight dictionary
        entries written per queue every sample) was half of the idle broker's CPU."""
        values = (s.published, s.delivered + s.get, s.delivered, s.get, s.redelivered, s.acked,
                  f.ready, f.unacked, f.messages)
        prev = self._queue_prev.get(key)
        self._queue_prev[key] = (now, values)
        if prev is None or now <= prev[0]:
            return
        rates = self._rates
        if values == prev[1]:
            if key in self._queue_moving:
                self._queue_moving.discard(key)
                for name in QUEUE_SAMPLED:
                    rates.pop((key, name), None)
            return
        dt = now - prev[0]
        for name, value, before in zip(QUEUE_SAMPLED, values, prev[1]):
            rates[(key, name)] = max(0.0, (value - before) / dt)
        self._queue_moving.add(key)


# A shared queue's cluster-wide counters reach a member once a second (storage/pg/queue_stats.py) and its
# count is up to a second old (queue_figures.MAX_AGE): it is shown idle once they stayed the same this long.
SHARED_IDLE_AFTER = 3.0


class IdleTracker:
    """When each queue last did something, for the queue's ``idle_since``, worked out from counters the queue
    keeps anyway (nothing is added to its hot path): a queue whose activity figures (publishes, deliveries,
    gets, acks, redeliveries, dead-letterings, expiries, drops, its message and consumer counts) are the same
    as when they were last looked at (by the sampler every ``interval`` seconds, or by a request) has been idle
    since they were first seen with these values. ``idle_since`` is therefore late by at most the time between
    two looks, and a queue is first shown idle at the second look that finds it unchanged (RabbitMQ shows a
    queue idle once its process hibernates, after a second or so without work)."""

    def __init__(self) -> None:
        # id(queue) -> (the queue, its activity figures, when first seen with them). Holding the queue keeps
        # its id from being reused by a new queue until the sampler forgets a deleted one.
        self._seen: dict[int, tuple[Queue, tuple[int, ...], float]] = {}

    @staticmethod
    def activity(q: Queue, f: Figures | None = None, shared: Snapshot | None = None) -> tuple[int, ...]:
        """``f``: the queue's figures if the caller has them at hand (figures_of). A cluster member's shared
        queue is judged by the cluster's counters and counts (``shared``), so that a queue busy on another
        member does not show idle here; its consumers on this member count too."""
        if shared is not None and is_shared(q):
            c = shared.activity(q.vhost.name, q.name).counts
            n = shared.counts(q.vhost.name, q.name)
            return (c["publish"], c["deliver"], c["get"], c["ack"], c["redeliver"], n.ready, n.unacked,
                    q.consumers.count)
        s = q.stats
        if f is None:
            f = q.figures()
        return (s.published, s.delivered, s.get, s.acked, s.redelivered, s.dead_lettered, s.expired, s.dropped,
                f.ready, f.unacked, q.consumers.count)

    def observe(self, q: Queue, key: int, f: Figures | None = None,
                shared: Snapshot | None = None) -> float | None:
        """The wall-clock time (seconds since the epoch) the queue has been idle since, None if it did
        something since it was last looked at (or this is the first look); the arguments as :meth:`activity`'s."""
        figures = self.activity(q, f, shared)
        now = q.vhost.clock.now_ms() / 1000.0
        seen = self._seen.get(key)
        if seen is not None and seen[0] is q and seen[1] == figures:
            if shared is not None and now - seen[2] < SHARED_IDLE_AFTER and is_shared(q):
                return None  # the cluster's counters move once a second: unchanged this long says nothing yet
            return seen[2]
        self._seen[key] = (q, figures, now)
        return None

    def forget_all_but(self, live: set[Any]) -> None:
        for key in [k for k in self._seen if k not in live]:
            del self._seen[key]


def with_details(counts: dict[str, int], sampler: RateSampler | None, key: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": sampler.rate((key, name)) if sampler else 0.0}
    return out


def global_message_counts(node: Node, shared: Snapshot | None = None) -> dict[str, int]:
    """The overview's ``message_stats``: this node's counters; on a cluster member (``shared``), plus every other
    live member's as it last wrote them to PostgreSQL (at most a flush, ~1 s, old), so that every member shows
    the cluster's traffic, as RabbitMQ's overview does."""
    out = message_counts(node.counters.as_dict())
    if shared is not None:
        for member, counters in shared.member_counters.items():
            if member != node.name:
                for name, value in message_counts(counters).items():
                    out[name] += value
    return out


def overview_message_stats(node: Node, sampler: RateSampler | None, shared: Snapshot | None) -> dict[str, Any]:
    """The overview's ``message_stats`` with their rates. On a cluster member (``shared``) the rates are the
    members' counter growth over their last sampled slot as PostgreSQL holds it (storage/pg/queue_stats.py,
    schema version 7), summed in member order: the same on every member asked within one slot, where each
    member's own sampler would take the cluster's sums at its own moments. On one node, the sampler's."""
    counts = global_message_counts(node, shared)
    if shared is None:
        return with_details(counts, sampler, "global")
    rates = dict.fromkeys(counts, 0.0)
    for delta in shared.member_deltas:
        for name, grown in message_counts(delta.growth).items():
            rates[name] += grown / delta.seconds
    out: dict[str, Any] = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": round(rates[name], 1)}
    return out


def message_counts(c: Mapping[str, int]) -> dict[str, int]:
    """``message_stats`` from node-wide counters by name (broker/observability/counters.py GlobalCounters.as_dict)."""
    def n(name: str) -> int:
        return int(c.get(name, 0))

    get = n("messages_delivered_get_manual_ack") + n("messages_delivered_get_auto_ack")
    deliver = n("messages_delivered_consume_manual_ack") + n("messages_delivered_consume_auto_ack")
    return {
        "publish": n("messages_received"),
        "confirm": n("messages_confirmed"),
        "return_unroutable": n("messages_unroutable_returned"),
        "drop_unroutable": n("messages_unroutable_dropped"),
        "deliver_get": max(n("messages_delivered"), deliver + get),
        "deliver": n("messages_delivered_consume_manual_ack"),
        "deliver_no_ack": n("messages_delivered_consume_auto_ack"),
        "get": n("messages_delivered_get_manual_ack"),
        "get_no_ack": n("messages_delivered_get_auto_ack"),
        "get_empty": n("messages_get_empty"),
        "redeliver": n("messages_redelivered"),
        "ack": n("messages_acknowledged"),
    }


def churn_counts(node: Node) -> dict[str, int]:
    """The node's object churn counters under the names of RabbitMQ's ``churn_rates`` (in /api/overview)."""
    c = node.counters
    return {
        "channel_closed": c.channels_closed,
        "channel_created": c.channels_opened,
        "connection_closed": c.connections_closed,
        "connection_created": c.connections_opened,
        "queue_created": c.queues_created,
        "queue_declared": c.queues_declared,
        "queue_deleted": c.queues_deleted,
    }


def channel_message_counts(ch: Channel) -> dict[str, int]:
    """A channel's ``message_stats`` (RabbitMQ's fields for a channel), from the plain ints the channel keeps
    (``Channel.msg_*``): publishes and their confirms and unroutable outcomes, deliveries to its consumers and
    basic.get answers (``deliver_get`` is their sum), redeliveries and acks."""
    deliver, deliver_no_ack, get, get_no_ack = ch.msg_deliver, ch.msg_deliver_no_ack, ch.msg_get, ch.msg_get_no_ack
    return {
        "publish": ch.msg_publish,
        "confirm": ch.msg_confirm,
        "return_unroutable": ch.msg_return_unroutable,
        "drop_unroutable": ch.msg_drop_unroutable,
        "deliver_get": deliver + deliver_no_ack + get + get_no_ack,
        "deliver": deliver,
        "deliver_no_ack": deliver_no_ack,
        "get": get,
        "get_no_ack": get_no_ack,
        "get_empty": ch.msg_get_empty,
        "redeliver": ch.msg_redeliver,
        "ack": ch.msg_ack,
    }


def exchange_message_counts(ex: Exchange) -> dict[str, int]:
    """An exchange's ``message_stats``: ``publish_in`` (messages clients published to it) and ``publish_out``
    (one per queue such a message reached), counted by VHost.publish."""
    return {"publish_in": ex.publish_in, "publish_out": ex.publish_out}


def vhost_message_totals(vh: VHost, view: ClusterView | None = None) -> dict[str, int]:
    """The messages in a vhost's queues (``messages``, ``messages_ready``, ``messages_unacknowledged``); on a
    cluster member (``view``) the shared queues as PostgreSQL counts them and the other members' queues too,
    so that every member answers the same totals."""
    ready = unacked = 0
    shared = view.shared if view is not None else None
    for q in vh.queues:
        f = figures_of(q, shared)
        ready += f.ready
        unacked += f.unacked
    for other in view.others if view is not None else ():
        if other.vhost.name == vh.name:
            f = other.figures()
            ready += f.ready
            unacked += f.unacked
    return {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}


# The vhost totals' names (vhost_message_totals), whose rates vhost_message_rates works out.
TOTALS = ("messages", "messages_ready", "messages_unacknowledged")


def vhost_message_rates(vh: VHost, sampler: RateSampler | None, view: ClusterView | None = None) -> dict[str, float]:
    """The rates of a vhost's :func:`vhost_message_totals`. On one node, the sampler's rate of the totals. On a
    cluster member (``view``), the sum of the rates of the queues in them, each as every member shows it (a
    shared queue's as PostgreSQL sampled it, this member's own queues' from its sampler, another member's
    queues' as that member answered): the same on every member asked within one sample, where the rate of
    each member's own sum would count the other members' queues at zero."""
    if sampler is None:
        return dict.fromkeys(TOTALS, 0.0)
    if view is None:
        return {name: sampler.rate((("vhost", vh.name), name)) for name in TOTALS}
    shared = view.shared
    sums = dict.fromkeys(TOTALS, 0.0)
    for q in vh.queues:
        if shared is not None and is_shared(q):
            rates = shared.activity(q.vhost.name, q.name).rates
        else:
            rates = sampler.queue_rates(q)
        for name in TOTALS:
            sums[name] += rates.get(name, 0.0)
    for other in view.others:
        if other.vhost.name == vh.name:
            rates = other.rates()
            for name in TOTALS:
                sums[name] += float(rates.get(name, 0.0))
    return {name: round(value, 1) for name, value in sums.items()}


def connection_byte_counts(conn: Reader) -> dict[str, int]:
    """A connection's socket counters (bytes and reads/writes), as RabbitMQ's connection object names them."""
    return {"recv_oct": conn.recv_oct, "recv_cnt": conn.recv_cnt, "send_oct": conn.send_oct,
            "send_cnt": conn.send_cnt}


# What the rate sampler keeps of each queue (RateSampler._sample_queue), in this order: the message_stats
# counters (queue_message_counts) and the message figures.
QUEUE_SAMPLED = ("publish", "deliver_get", "deliver", "get", "redeliver", "ack",
                 "messages_ready", "messages_unacknowledged", "messages")


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


# -- queues -------------------------------------------------------------------------------------------------------

def is_shared(q: Queue) -> bool:
    """Whether every member of a cluster serves the queue (a quorum queue: its messages are in PostgreSQL)."""
    return queue_type_of(q.arguments).cluster_shared


def figures_of(q: Queue, shared: Snapshot | None) -> Figures:
    """The queue's figures: for a shared queue of a cluster member, as PostgreSQL counts them (``shared``,
    storage/pg/queue_figures.py: the same on every member), else the queue's own."""
    if shared is not None and is_shared(q):
        c = shared.counts(q.vhost.name, q.name)
        return Figures(c.ready, c.unacked, c.ready_bytes, c.unacked_bytes, 0)
    return q.figures()


def queue_type(q: Queue) -> str:
    """The queue's type name as the HTTP API shows it ("classic", "quorum"; broker/queues/queue_types.py)."""
    return q.type_name


def effective_policy_definition(q: Queue) -> dict[str, Any]:
    """The queue's policy definition with its operator policy's merged in (RabbitMQ's
    ``effective_policy_definition``): where both give a number the lower wins, else the operator policy's."""
    vh = q.vhost
    policy = vh.policies.get(q.settings.policy) if q.settings.policy is not None else None
    operator = vh.operator_policies.get(q.settings.operator_policy) if q.settings.operator_policy is not None \
        else None
    out = dict(policy.definition) if policy is not None else {}
    for key, value in (operator.definition.items() if operator is not None else ()):
        current = out.get(key)
        numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (current, value))
        out[key] = min(current, value) if numbers else value
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


def format_timestamp(seconds: float) -> str:
    """A time as RabbitMQ's HTTP API writes ``idle_since`` (rabbit_mgmt_format: ISO 8601, UTC, in
    milliseconds): ``2024-01-01T12:00:00.000+00:00``."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


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


class ClusterView(NamedTuple):
    """What a cluster member's listings add to its own queues' figures (cluster_view)."""

    shared: Snapshot | None  # the shared queues as PostgreSQL counts them
    others: list[OtherMemberQueue]  # the other members' node-local queues, as they answered


async def cluster_view(node: Node, vhost: str | None = None) -> ClusterView | None:
    """None on a single node; on a cluster member, the count of the shared queues (at most a second old) and
    the other members' node-local queues (of ``vhost``, or of every vhost) that are not this member's."""
    cluster = node.cluster
    if cluster is None:
        return None
    shared = await cluster.shared_figures()
    others = []
    for vhost_name, name, member, answer in await cluster.other_members_queues(vhost):
        vh = node.vhosts.get(vhost_name)
        if vh is not None and vh.queues.get(name) is None:
            others.append(OtherMemberQueue(vhost_name, name, member, answer))
    return ClusterView(shared, others)


class OtherMemberQueue:
    """A node-local queue of another cluster member, as that member answered for it (broker/clustering/cluster_forwarding.py
    ``queue_answer``; ``{"state": "down"}`` when it did not answer): what a listing sorts and shows."""

    def __init__(self, vhost: str, name: str, member: str, answer: dict[str, Any]) -> None:
        self.name = name
        self.vhost = _Named(vhost)
        self.member = member
        self.answer = answer
        self.durable = bool(answer.get("durable", True))
        self.consumers = _Count(int(answer.get("consumers", 0)))

    def rates(self) -> dict[str, float]:
        """The rates its member's sampler has of it (:data:`QUEUE_SAMPLED`; none from a member that did not
        answer, or one without the HTTP API)."""
        rates = self.answer.get("rates")
        return rates if isinstance(rates, dict) else {}

    def figures(self) -> Figures:
        a = self.answer
        return Figures(int(a.get("ready", 0)), int(a.get("unacked", 0)), int(a.get("ready_bytes", 0)),
                       int(a.get("unacked_bytes", 0)), int(a.get("paged_out", 0)))


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


class _Count:
    def __init__(self, count: int) -> None:
        self.count = count


def other_member_queue_info(q: OtherMemberQueue) -> dict[str, Any]:
    """The HTTP API object of another member's node-local queue: ``node`` is that member; the figures, the
    message counters and their rates are its answer (rates are sampled where the queue lives), so every
    member shows what the owner shows."""
    a, f = q.answer, q.figures()
    try:
        arguments = json_safe(untable(base64.b64decode(a["args"]))) if "args" in a else {}
    except (ValueError, TypeError):
        arguments = {}
    info: dict[str, Any] = {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": bool(a.get("auto_delete", False)),
        "exclusive": bool(a.get("exclusive", False)),
        "arguments": arguments,
        "node": q.member,
        "type": a.get("type", "classic"),
        "state": a.get("state", "running"),
        "consumers": q.consumers.count,
        "publishers": int(a.get("publishers", 0)),
        "policy": a.get("policy"),
        "message_bytes": f.bytes,
        "message_bytes_ready": f.ready_bytes,
        "message_bytes_unacknowledged": f.unacked_bytes,
        "messages_paged_out": f.paged_out,
        "message_stats": {},
    }
    rates = q.rates()
    stats = a.get("stats")
    if isinstance(stats, dict):
        for name, value in stats.items():
            info["message_stats"][name] = value
            info["message_stats"][name + "_details"] = {"rate": float(rates.get(name, 0.0))}
    for name, value in (("messages", f.messages), ("messages_ready", f.ready),
                        ("messages_unacknowledged", f.unacked)):
        info[name] = value
        info[name + "_details"] = {"rate": float(rates.get(name, 0.0))}
    return info


# -- exchanges and bindings ------------------------------------------------------------------------------------

def exchange_info(node: Node, vh: VHost, ex: Exchange, sampler: RateSampler | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": ex.name,
        "vhost": vh.name,
        "type": ex.type_name,
        "durable": ex.durable,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": json_safe(ex.arguments),
        "user_who_performed_action": "rmq-internal",  # exchanges do not record who declared them
        "policy": None,  # policies apply to queues only (broker/policies/policy.py)
        "message_stats": with_details(exchange_message_counts(ex), sampler, id(ex)),
    }
    if isinstance(ex, DeduplicationExchange) and ex.cache is not None:
        info["cache_info"] = ex.cache.info()  # the plugin's exchange info item
    if isinstance(ex, DelayedExchange):
        stats = ex.delayed_stats()
        nxt = None if stats is None else stats.next_due_ms
        info["delayed_pending"] = 0 if stats is None else stats.count
        info["delayed_bytes"] = 0 if stats is None else stats.nbytes
        info["delayed_next_due"] = None if nxt is None else iso_ms(nxt)
        info["delayed_next_due_ms"] = nxt
    return info


def iso_ms(ms: int) -> str:
    """An epoch time in ms as ISO 8601 UTC with milliseconds (``2025-01-31T12:00:00.250Z``)."""
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def all_exchanges(vh: VHost) -> list[Exchange]:
    """The default exchange first (as RabbitMQ lists it, name ""), then the others by name."""
    return [vh.default_exchange, *sorted(vh.exchanges.values(), key=lambda e: e.name)]


def lookup_exchange(vh: VHost, path_name: str) -> Exchange | None:
    if path_name in (DEFAULT_EXCHANGE_PATH, ""):
        return vh.default_exchange
    return vh.exchanges.get(path_name)


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding key in URLs: the routing key (``~`` when empty), plus ``~`` and a hash of the
    arguments when there are any."""
    rk = urllib.parse.quote(routing_key, safe="") if routing_key else ""
    if not arguments:
        return rk or "~"
    digest = hashlib.sha1(json.dumps(json_safe(arguments), sort_keys=True).encode()).digest()
    return f"{rk}~{base64.urlsafe_b64encode(digest[:12]).decode().rstrip('=')}"


def binding_info(vh: VHost, b: Binding) -> dict[str, Any]:
    return {
        "source": b.source,
        "vhost": vh.name,
        "destination": b.destination,
        "destination_type": "queue" if b.kind == QUEUE else "exchange",
        "routing_key": b.routing_key,
        "arguments": json_safe(b.arguments),
        "properties_key": properties_key(b.routing_key, b.arguments),
    }


def default_binding_info(vh: VHost, queue_name: str) -> dict[str, Any]:
    """The implicit binding of every queue to the default exchange, which RabbitMQ lists too."""
    return {"source": "", "vhost": vh.name, "destination": queue_name, "destination_type": "queue",
            "routing_key": queue_name, "arguments": {}, "properties_key": properties_key(queue_name, {})}


def vhost_bindings(vh: VHost, with_default: bool = True) -> list[dict[str, Any]]:
    out = [default_binding_info(vh, q.name) for q in vh.queues] if with_default else []
    out.extend(binding_info(vh, b) for b in sorted(vh.bindings(), key=lambda b: (b.source, b.destination,
                                                                                   b.routing_key)))
    return out


def kind_of(destination_type: str) -> str:
    return QUEUE if destination_type in ("q", "queue") else EXCHANGE


# -- connections, channels, consumers -----------------------------------------------------------------------

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


def queue_consumer_details(node: Node, q: Queue) -> list[dict[str, Any]]:
    """The consumers of one queue (RabbitMQ's ``consumer_details`` of ``GET /api/queues/{vhost}/{name}``)."""
    return [consumer_info(node, conn, ch, c) for conn, ch, c in iter_consumers(node) if c.queue is q]


def iter_channels(node: Node) -> Iterator[tuple[Reader, Channel]]:
    for conn in open_connections(node):
        for ch in list(conn.channels.values()):
            yield conn, ch


def iter_consumers(node: Node) -> Iterator[tuple[Reader, Channel, Consumer]]:
    for conn, ch in iter_channels(node):
        for consumer in list(ch.consumers.values()):
            yield conn, ch, consumer


# -- vhosts, users, permissions, policies ---------------------------------------------------------------------

def vhost_info(node: Node, vh: VHost, sampler: RateSampler | None = None,
               view: ClusterView | None = None) -> dict[str, Any]:
    totals = vhost_message_totals(vh, view)
    rates = vhost_message_rates(vh, sampler, view)
    description = vh.description
    tags = list(vh.tags)
    dqt = vh.default_queue_type
    return {
        "name": vh.name,
        "description": description,
        "tags": tags,
        "default_queue_type": dqt,
        "metadata": {"description": description, "tags": tags, "default_queue_type": dqt},
        "tracing": vh.tracing is not None,
        "cluster_state": {node.name: "running"},
        **{field: value for name, count in totals.items()
           for field, value in ((name, count), (name + "_details", {"rate": rates[name]}))},
    }


def user_info(user: User) -> dict[str, Any]:
    return {"name": user.name, "password_hash": user.password_hash, "hashing_algorithm": user.hashing_algorithm,
            "tags": list(user.tags), "limits": dict(user.limits)}


def permission_info(user: User, vhost: str) -> dict[str, Any]:
    p = user.permissions[vhost]
    return {"user": user.name, "vhost": vhost, **p.as_dict()}
