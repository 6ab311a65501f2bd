"""The Prometheus exporter (RabbitMQ's ``rabbitmq_prometheus`` plugin): metrics under its names, so its stock
Grafana dashboards and alerts work, plus Leveret's own under ``leveret_``.

The hot path only adds to plain integers (``node.counters``, a broker/observability/counters.py record, and
``Queue.stats``); this collector reads them, and the OS probes of broker/resources/os_probes.py, when
Prometheus scrapes. Nothing here runs per message. It sits at the top of the broker's layers, beside the
HTTP API: it reads the node and nothing below imports it.

Endpoints (port ``prometheus.tcp.port``, default 15692): ``/metrics`` sums queue, channel and connection
figures per node as RabbitMQ does by default; ``/metrics/per-object`` gives one series per queue
(labels ``vhost``, ``queue``); ``/metrics/detailed`` is the same as per-object. Both carry the same node
totals, so a Prometheus should scrape ``/metrics`` only, and per-object as a separate job only where per-queue
series are wanted (RabbitMQ's guidance; docker/prometheus.yml). As RabbitMQ's plugin does,
``rabbitmq_identity_info`` names the endpoint in its ``rabbitmq_endpoint`` label (``aggregated``,
``per-object``, ``detailed``): the stock dashboards join every query on it, so a dashboard reads one job's
figures even where both endpoints are scraped.

For the stock "RabbitMQ-Overview" dashboard and its older revisions, there are also
``rabbitmq_erlang_uptime_seconds`` (the broker process's uptime: there is no Erlang VM),
``rabbitmq_process_open_tcp_sockets`` / ``rabbitmq_process_max_tcp_sockets``, and the ``rabbitmq_channel_*``
families, as node totals (one unlabelled series on every endpoint): the counters are the node's global
counters, so they never go down when a channel closes, unlike RabbitMQ's sums over the open channels.
``rabbitmq_message_size_bytes{protocol}`` is the histogram of published body sizes (RabbitMQ's buckets; kept
by broker/observability/counters.py's MessageSizes, observed in the publish path).

For the stock "Erlang-BEAM", "Erlang-Memory-Allocators", "Erlang-Distribution" and
"RabbitMQ-Quorum-Queues-Raft" dashboards, broker/prometheus/metrics_runtime.py builds the ``erlang_vm_*`` families from
the Python process's readings and the ``rabbitmq_raft_*`` families of the quorum queues (its docstring says
what each figure is here, and which families stay empty).

Stream queues (broker/queues/stream_queue.py) add Leveret's series on ``/metrics/per-object``: per stream
``leveret_stream_first_offset``, ``leveret_stream_next_offset``, ``leveret_stream_segments``,
``leveret_stream_bytes`` (labels ``vhost``, ``queue``), and per consumer group
``leveret_stream_group_committed_offset`` and ``leveret_stream_group_lag`` (labels ``vhost``, ``queue``,
``group``). ``/metrics`` sums only what adds up: ``leveret_stream_segments`` and ``leveret_stream_bytes``
over all streams.

Delayed-message exchanges (broker/exchanges/delayed_exchange.py) add, per exchange on ``/metrics/per-object``
(labels ``vhost``, ``exchange``): ``leveret_delayed_messages_pending``, ``leveret_delayed_bytes_pending`` and
``leveret_delayed_next_due_seconds`` (epoch seconds; no sample while nothing is pending). ``/metrics`` has
the first two summed, and the node's ``leveret_delayed_messages_dispatched_total``,
``leveret_delayed_messages_cancelled_total`` (since the broker started) and the histogram
``leveret_delayed_dispatch_lateness_seconds`` (due time to routing, observed by broker/delayed/delayed_dispatch.py).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from broker import PRODUCT, VERSION
from broker.amqp.reader import open_connections
from broker.delayed.delayed_dispatch import DelayDispatcher, Lateness
from broker.exchanges.delayed_exchange import DelayedExchange
from broker.federation.metrics import federation_families
from broker.observability.chunked import in_chunks
from broker.observability.counters import MESSAGE_SIZE_BOUNDS
from broker.prometheus.metrics_runtime import RaftFigures, raft_families, runtime_families
from broker.prometheus.queue_series import QueueScan, aggregated_text, per_object_text, scan
from broker.queues.queue_types import Queue
from broker.resources.os_probes import disk_free, max_fds, open_fds, resident_memory, uptime_seconds
from broker.shovel.metrics import shovel_families
from storage import corruption

if TYPE_CHECKING:
    from broker.amqp.channel import Channel
    from broker.clustering.cluster_figures import Snapshot
    from broker.node import Node

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROTOCOL = "amqp091"
# The rabbitmq_endpoint label of rabbitmq_identity_info, per path (as rabbitmq_prometheus names them).
# Pieces of exposition text encoded between two turns of the event loop (each a family's 10,000 rows at most:
# queue_series.TEXT_CHUNK, under a megabyte).
ENCODE_CHUNK = 4
ENDPOINTS = {"/metrics": "aggregated", "/metrics/per-object": "per-object", "/metrics/detailed": "detailed"}
# rabbitmq_message_size_bytes' upper bounds (RabbitMQ's rabbit_msg_size_metrics), then +Inf.


# GlobalCounters field → help; the metric is rabbitmq_global_<field>_total{protocol="amqp091"}.
GLOBAL_MESSAGE_METRICS = {
    "messages_received": "Total number of messages received from publishers",
    "messages_received_confirm": "Total number of messages received from publishers expecting confirmations",
    "messages_routed": "Total number of messages routed to queues",
    "messages_unroutable_dropped": "Total number of messages published as non-mandatory into an exchange "
                                   "and dropped as unroutable",
    "messages_unroutable_returned": "Total number of messages published as mandatory into an exchange and "
                                    "returned to the publisher as unroutable",
    "messages_confirmed": "Total number of messages confirmed to publishers",
    "messages_delivered": "Total number of messages delivered to consumers",
    "messages_delivered_consume_manual_ack": "Total number of messages delivered to consumers using "
                                             "basic.consume with manual acknowledgment",
    "messages_delivered_consume_auto_ack": "Total number of messages delivered to consumers using "
                                           "basic.consume with automatic acknowledgment",
    "messages_delivered_get_manual_ack": "Total number of messages delivered to consumers using basic.get "
                                         "with manual acknowledgment",
    "messages_delivered_get_auto_ack": "Total number of messages delivered to consumers using basic.get "
                                       "with automatic acknowledgment",
    "messages_get_empty": "Total number of times basic.get operations fetched no message",
    "messages_redelivered": "Total number of messages redelivered to consumers",
    "messages_acknowledged": "Total number of messages acknowledged by consumers",
}
# GlobalCounters field → (metric name, help).
OBJECT_COUNTER_METRICS = {
    "connections_opened": ("rabbitmq_connections_opened_total", "Total number of connections opened"),
    "connections_closed": ("rabbitmq_connections_closed_total",
                           "Total number of connections closed or terminated"),
    "channels_opened": ("rabbitmq_channels_opened_total", "Total number of channels opened"),
    "channels_closed": ("rabbitmq_channels_closed_total", "Total number of channels closed"),
    "queues_declared": ("rabbitmq_queues_declared_total", "Total number of queues declared"),
    "queues_created": ("rabbitmq_queues_created_total", "Total number of queues created"),
    "queues_deleted": ("rabbitmq_queues_deleted_total", "Total number of queues deleted"),
    "auth_attempts": ("rabbitmq_auth_attempts_total", "Total number of authentication attempts"),
    "auth_attempts_succeeded": ("rabbitmq_auth_attempts_succeeded_total",
                                "Total number of successful authentication attempts"),
    "auth_attempts_failed": ("rabbitmq_auth_attempts_failed_total",
                             "Total number of failed authentication attempts"),
}
# The rabbitmq_channel_* counters of RabbitMQ's channel metrics (older stock dashboards read them), as node
# totals: metric → (GlobalCounters field, help).
CHANNEL_COUNTER_METRICS = {
    "rabbitmq_channel_messages_published": ("messages_received",
                                            "Total number of messages published into an exchange on a channel"),
    "rabbitmq_channel_messages_confirmed": ("messages_confirmed", ("Total number of messages published into an "
                                                                   "exchange and confirmed on the channel")),
    "rabbitmq_channel_messages_unroutable_returned": ("messages_unroutable_returned",
                                                      ("Total number of messages published as mandatory into an "
                                                       "exchange and returned to the publisher as unroutable")),
    "rabbitmq_channel_messages_unroutable_dropped": ("messages_unroutable_dropped",
                                                     ("Total number of messages published as non-mandatory into an "
                                                      "exchange and dropped as unroutable")),
    "rabbitmq_channel_messages_delivered_ack": ("messages_delivered_consume_manual_ack",
                                                ("Total number of messages delivered to consumers in manual "
                                                 "acknowledgement mode")),
    "rabbitmq_channel_messages_delivered": ("messages_delivered_consume_auto_ack",
                                            ("Total number of messages delivered to consumers in automatic "
                                             "acknowledgement mode")),
    "rabbitmq_channel_get_ack": ("messages_delivered_get_manual_ack",
                                 "Total number of messages fetched with basic.get in manual acknowledgement mode"),
    "rabbitmq_channel_get": ("messages_delivered_get_auto_ack",
                             "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
    "rabbitmq_channel_get_empty": ("messages_get_empty",
                                   "Total number of times basic.get operations fetched no message"),
    "rabbitmq_channel_messages_redelivered": ("messages_redelivered",
                                              "Total number of messages redelivered to consumers"),
    "rabbitmq_channel_messages_acked": ("messages_acknowledged",
                                        "Total number of messages acknowledged by consumers"),
}
# Per-stream gauges (labels vhost, queue on /metrics/per-object; summed on /metrics where marked True).
STREAM_GAUGES = (
    ("leveret_stream_first_offset", "Oldest offset a stream retains (equals next_offset when it is empty)", False),
    ("leveret_stream_next_offset", "Offset the next message published to a stream gets", False),
    ("leveret_stream_segments", "Segment files of a stream's consume log", True),
    ("leveret_stream_bytes", "Payload bytes a stream retains (what x-max-length-bytes limits)", True),
)
# Per consumer group gauges (labels vhost, queue, group; /metrics/per-object only).
STREAM_GROUP_GAUGES = (
    ("leveret_stream_group_committed_offset", "Offset below which a stream consumer group has acked every message"),
    ("leveret_stream_group_lag", "Messages of a stream its consumer group has not acked (next - committed offset)"),
)


def stream_values(items: dict[str, Any]) -> dict[str, int]:
    """The per-stream metrics of one stream queue, from its info items (StreamQueue.info_items) read now."""
    return {
        "leveret_stream_first_offset": items["first_offset"],
        "leveret_stream_next_offset": items["next_offset"],
        "leveret_stream_segments": items["segments"],
        "leveret_stream_bytes": items["stream_bytes"],
    }


def raft_figures(q: Queue) -> RaftFigures:
    """What broker/prometheus/metrics_runtime.py's Raft families are made of, for one quorum queue, read now."""
    s = q.stats
    return RaftFigures(q.vhost.name, q.name, s.published, s.acked, q.awaiting_confirm(), q.figures().messages)


class RabbitCollector:
    """A prometheus-client collector: builds every family from the node's state at scrape time."""

    def __init__(self, node: Node, per_object: bool, endpoint: str, queues: QueueScan) -> None:
        self.node = node
        self.per_object = per_object
        self.endpoint = endpoint  # rabbitmq_identity_info's rabbitmq_endpoint label
        self.queues = queues  # every queue as this scrape read it (the per-queue families are written apart)

    def collect(self) -> Iterator[Metric]:
        node = self.node
        settings = node.settings
        yield from self._node_info()
        # -- objects ------------------------------------------------------------------------------------------
        connections = open_connections(node)
        channels = [ch for c in connections for ch in list(c.channels.values())]
        consumers = sum(len(ch.consumers) for ch in channels)
        yield _gauge("rabbitmq_connections", "Connections currently open", len(connections))
        yield _gauge("rabbitmq_channels", "Channels currently open", len(channels))
        yield _gauge("rabbitmq_consumers", "Consumers currently connected", consumers)
        yield _gauge("rabbitmq_queues", "Queues available", len(self.queues.rows))
        yield _gauge("rabbitmq_global_consumers", "Current number of consumers", consumers,
                     {"protocol": PROTOCOL})
        yield _gauge("rabbitmq_global_publishers", "Current number of publishers",
                     sum(1 for ch in channels if ch.publishing), {"protocol": PROTOCOL})
        counters = node.counters
        counted = counters.as_dict()  # every declared field: a name missing from it fails here, loudly
        for field, (name, help_) in OBJECT_COUNTER_METRICS.items():
            yield _counter(name[: -len("_total")], help_, counted[field])
        for field, help_ in GLOBAL_MESSAGE_METRICS.items():
            yield _counter(f"rabbitmq_global_{field}", help_, counted[field], {"protocol": PROTOCOL})
        for reason, value in (("expired", counters.messages_dead_lettered_expired),
                              ("rejected", counters.messages_dead_lettered_rejected),
                              ("maxlen", counters.messages_dead_lettered_maxlen)):
            yield _counter("rabbitmq_global_messages_dead_lettered_" + reason,
                           f"Total number of messages dead-lettered due to {reason}", value,
                           {"queue_type": "rabbit_classic_queue", "dead_letter_strategy": "at_most_once"})
        # -- channels (aggregated) ----------------------------------------------------------------------------
        yield _gauge("rabbitmq_channel_messages_unacked",
                     "Delivered but not yet acknowledged messages",
                     sum(len(ch.unacked) for ch in channels))
        yield _gauge("rabbitmq_channel_prefetch", "Total limit of unacknowledged messages for all consumers "
                     "on a channel", sum(ch.global_prefetch for ch in channels))
        yield from self._channels(channels, counted)
        yield from self._message_sizes()
        # -- queues (their per-queue families: queue_series) -----------------------------------------------
        yield from raft_families((raft_figures(q) for q in self.queues.raft), self.per_object)
        yield from self._streams(self.queues.streams)
        yield from self._delayed([ex for vh in list(node.vhosts.values()) for ex in list(vh.exchanges.values())
                                  if isinstance(ex, DelayedExchange)])
        yield from shovel_families(node.shovels.workers.values())
        yield from federation_families(node.federation.links.values(), node.federation.queue_links.values())
        # -- resources --------------------------------------------------------------------------------------
        mem = resident_memory()
        mem_limit = node.memory_limit
        disk = disk_free(settings.data_dir)
        disk_limit = node.disk_free_limit
        yield _gauge("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", mem)
        yield _gauge("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes", mem_limit)
        yield _gauge("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", disk)
        yield _gauge("rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes",
                     disk_limit)
        yield _gauge("rabbitmq_process_open_fds", "Open file descriptors", open_fds())
        fd_limit = max_fds()
        yield _gauge("rabbitmq_process_max_fds", "Open file descriptors limit", fd_limit)
        yield _gauge("rabbitmq_process_open_tcp_sockets", "Open TCP sockets (Leveret: the open AMQP client "
                     "connections)", len(connections))
        yield _gauge("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit (Leveret: the open file "
                     "descriptors limit, which sockets share)", fd_limit)
        alarms = node.alarms()
        yield _gauge("rabbitmq_alarms_memory_used_watermark",
                     "is 1 if VM memory watermark threshold is in effect", int("memory" in alarms))
        yield _gauge("rabbitmq_alarms_free_disk_space_watermark",
                     "is 1 if free disk space watermark threshold is in effect", int("disk" in alarms))
        yield _gauge("rabbitmq_alarms_file_descriptor_limit",
                     "is 1 if file descriptor limit is in effect", 0)
        # -- Leveret's own -----------------------------------------------------------------------------------
        uptime = uptime_seconds(node.started_at)
        yield _gauge("rabbitmq_erlang_uptime_seconds", "Node uptime (Leveret: seconds since the broker process "
                     "started; there is no Erlang VM; the same as leveret_uptime_seconds)", uptime)
        yield _gauge("leveret_uptime_seconds", "Seconds since the broker started", uptime)
        yield from runtime_families(self.queues.ram_bytes)
        yield _corrupt_records()
        yield _gauge("leveret_vhosts", "Virtual hosts", len(node.vhosts))
        yield _gauge("leveret_users", "Users", len(node.users.users))
        yield _gauge("leveret_exchanges", "Exchanges (all vhosts, without the default exchange)",
                     sum(len(vh.exchanges) for vh in node.vhosts.values()))
        yield _gauge("leveret_bindings", "Bindings (all vhosts)",
                     sum(len(ex.bindings) for vh in node.vhosts.values() for ex in vh.exchanges.values()))

    def _node_info(self) -> Iterable[Metric]:
        node = self.node
        identity = GaugeMetricFamily("rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                                     labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id",
                                             "rabbitmq_endpoint"])
        identity.add_metric([node.name, node.cluster_name, node.cluster_name, self.endpoint], 1)
        yield identity
        build = GaugeMetricFamily("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                                  labels=["rabbitmq_version", "prometheus_plugin_version",
                                          "prometheus_client_version", "erlang_version", "product",
                                          "product_version", "python_version"])
        build.add_metric([node.rabbitmq_version, VERSION, _prometheus_client_version(), "none", PRODUCT,
                          VERSION, platform.python_version()], 1)
        yield build

    def _channels(self, channels: list[Channel], counted: dict[str, int]) -> Iterable[Metric]:
        """RabbitMQ's rabbitmq_channel_* families, summed over the node (older stock dashboards read them):
        gauges over the open channels, counters from the node's global counters."""
        yield _gauge("rabbitmq_channel_consumers", "Consumers on a channel (all open channels)",
                     sum(len(ch.consumers) for ch in channels))
        yield _gauge("rabbitmq_channel_messages_unconfirmed", "Published but not yet confirmed messages (all "
                     "open channels)",
                     sum(ch.confirms.messages_unconfirmed for ch in channels if ch.confirms is not None))
        yield _gauge("rabbitmq_channel_messages_uncommitted", "Messages received in a transaction but not yet "
                     "committed (all open channels)",
                     sum(sum(1 for kind, _item in ch.tx.work if kind == "publish")
                         for ch in channels if ch.tx is not None))
        yield _gauge("rabbitmq_channel_acks_uncommitted", "Message acknowledgements in a transaction not yet "
                     "committed (all open channels)",
                     sum(sum(len(pairs) for kind, pairs in ch.tx.work if kind != "publish")
                         for ch in channels if ch.tx is not None))
        for name, (field, help_) in CHANNEL_COUNTER_METRICS.items():
            yield _counter(name, help_ + " (Leveret: the node's total since it started, closed channels "
                           "included)", counted[field])

    def _message_sizes(self) -> Iterable[Metric]:
        """rabbitmq_message_size_bytes{protocol="amqp091"} from the node's ``message_sizes`` (per-bucket counts
        for MESSAGE_SIZE_BOUNDS and +Inf, and the sum of the sizes)."""
        sizes = self.node.counters.message_sizes
        hist = HistogramMetricFamily("rabbitmq_message_size_bytes", "Size of messages received from publishers",
                                     labels=["protocol"])
        cumulative, total = [], 0
        for bound, count in zip([*map(floatToGoString, MESSAGE_SIZE_BOUNDS), "+Inf"], sizes.buckets):
            total += count
            cumulative.append((bound, total))
        hist.add_metric([PROTOCOL], cumulative, sizes.sum)
        yield hist

    def _streams(self, streams: list[Queue]) -> Iterable[Metric]:
        """The leveret_stream_* series, from each stream's info items (broker/queues/queue_info.py)."""
        infos = [(q, q.info_items(self.node.name)) for q in streams]
        if not self.per_object:
            for name, help_, summed in STREAM_GAUGES:
                if summed:
                    yield _gauge(name, help_, sum(stream_values(items)[name] for _q, items in infos))
            return
        gauges = [GaugeMetricFamily(name, help_, labels=["vhost", "queue"]) for name, help_, _s in STREAM_GAUGES]
        groups = [GaugeMetricFamily(name, help_, labels=["vhost", "queue", "group"])
                  for name, help_ in STREAM_GROUP_GAUGES]
        committed, lag = groups
        for q, items in infos:
            values = stream_values(items)
            labels = [q.vhost.name, q.name]
            for g, (name, _h, _s) in zip(gauges, STREAM_GAUGES):
                g.add_metric(labels, values[name])
            for group in items["consumer_groups"]:  # sorted by name; lag = next_offset - committed_offset
                committed.add_metric([*labels, group["name"]], group["committed_offset"])
                lag.add_metric([*labels, group["name"]], group["lag"])
        yield from gauges
        yield from groups


    def _delayed(self, exchanges: list[DelayedExchange]) -> Iterable[Metric]:
        """Per exchange (per-object) or summed: pending messages and bytes; on /metrics, the node's totals
        and dispatch lateness. Every family is there even with no delayed exchange (a dashboard's zero)."""
        labels = ["vhost", "exchange"] if self.per_object else []
        pending = GaugeMetricFamily("leveret_delayed_messages_pending",
                                    "Messages held by a delayed-message exchange, not yet due", labels=labels)
        nbytes = GaugeMetricFamily("leveret_delayed_bytes_pending",
                                   "Bytes the pending messages of a delayed-message exchange take in the delay "
                                   "store", labels=labels)
        next_due = GaugeMetricFamily("leveret_delayed_next_due_seconds",
                                     "When the next pending message of a delayed-message exchange is due (epoch "
                                     "seconds)", labels=labels)
        dispatchers: dict[int, DelayDispatcher] = {}
        count = size = 0
        for ex in exchanges:
            d = ex.dispatcher
            if d is not None:
                dispatchers[id(d)] = d
            stats = ex.delayed_stats()
            if stats is None:
                continue
            if self.per_object:
                lv = [ex.services.vhost, ex.name]
                pending.add_metric(lv, stats.count)
                nbytes.add_metric(lv, stats.nbytes)
                if stats.next_due_ms is not None:
                    next_due.add_metric(lv, stats.next_due_ms / 1000.0)
            count += stats.count
            size += stats.nbytes
        if self.per_object:
            yield pending
            yield nbytes
            yield next_due
            return
        pending.add_metric([], count)
        nbytes.add_metric([], size)
        yield pending
        yield nbytes
        ds = list(dispatchers.values())
        yield _counter("leveret_delayed_messages_dispatched", "Delayed messages let go when due (since the "
                       "broker started)", sum(d.store.dispatched_total for d in ds))
        yield _counter("leveret_delayed_messages_cancelled", "Delayed messages cancelled or purged by operators "
                       "(since the broker started)", sum(d.store.cancelled_total for d in ds))
        lateness = HistogramMetricFamily("leveret_delayed_dispatch_lateness_seconds",
                                         "Seconds from a delayed message's due time to its routing")
        merged = Lateness()
        for d in ds:
            merged.counts = [a + b for a, b in zip(merged.counts, d.lateness.counts)]
            merged.sum += d.lateness.sum
        buckets = merged.cumulative()
        lateness.add_metric([], buckets, merged.sum)
        yield lateness


def _prometheus_client_version() -> str:
    try:
        from importlib.metadata import version

        return version("prometheus-client")
    except Exception:  # noqa: BLE001
        return "unknown"


def _gauge(name: str, help_: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    g = GaugeMetricFamily(name, help_, labels=list(labels or {}))
    g.add_metric(list((labels or {}).values()), value)
    return g


def _counter(name: str, help_: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    c = CounterMetricFamily(name, help_, labels=list(labels or {}))
    c.add_metric(list((labels or {}).values()), value)
    return c


def _corrupt_records() -> Metric:
    """Records found damaged on disk since the start, per store (storage/corruption.py): each was dropped
    and logged with its file and offset. Every store's series is there from the start, at 0, so an alert on
    ``increase(...) > 0`` needs no ``absent()``."""
    c = CounterMetricFamily("leveret_storage_corrupt_records", "Records that failed their check on disk "
                            "(magic, length or CRC) and were dropped, each logged with its file and offset",
                            labels=["store"])
    for store, n in sorted(corruption.counts().items()):
        c.add_metric([store], n)
    return c


async def render(node: Node, per_object: bool, endpoint: str, shared: Snapshot | None = None) -> list[bytes]:
    """The exposition text of one scrape, as the pieces the response writes one after the other: the node-wide
    families through prometheus-client, then the per-queue families written by broker/prometheus/queue_series.py
    (read, written and encoded in chunks, the event loop turning between them: a scrape of 100,000 queues must
    not stall the broker's clients; joining and encoding its 87 MB in one go held the loop ~150 ms)."""
    vhosts = list(node.vhosts.values())
    queues = [q for vh in vhosts for q in vh.queues]
    occupied: set[Queue] = set().union(*(vh.queues.occupied for vh in vhosts))
    read = await scan(queues, shared, node.name, occupied)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RabbitCollector(node, per_object, endpoint, read))
    head = generate_latest(registry)
    tail = await per_object_text(read.rows) if per_object else [aggregated_text(read.rows)]
    pieces = [head]
    async for chunk in in_chunks(tail, ENCODE_CHUNK):
        pieces += [part.encode() for part in chunk]
    return pieces


async def respond_with(request: web.Request, pieces: list[bytes]) -> web.StreamResponse:
    """The scrape's pieces written in turn (its length known up front): the transport's buffer limit, not one
    87 MB body, decides when the loop turns."""
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    response.content_length = sum(len(piece) for piece in pieces)
    await response.prepare(request)
    for piece in pieces:
        await response.write(piece)
    await response.write_eof()
    return response


def make_app(node: Node) -> web.Application:
    """The exporter's HTTP app (``prometheus.tcp.port``): /metrics, and per-object series. On a cluster
    member, the shared (quorum) queues' figures are PostgreSQL's count, and their message counters
    (``rabbitmq_queue_messages_published_total``, ``..._delivered_total``, ``..._redelivered_total``,
    ``..._acked_total``, ``rabbitmq_queue_get_total``) every member's summed (storage/pg/queue_stats.py). One
    member reports them (reports_queue, as RabbitMQ reports a quorum queue on its leader's node); every member
    reports its own consumers and publishers of it, so sums over the members' scrapes are the cluster's."""

    async def shared() -> Snapshot | None:
        return await node.cluster.shared_figures() if node.cluster is not None else None

    async def metrics(request: web.Request) -> web.StreamResponse:
        return await respond_with(request, await render(node, False, ENDPOINTS[request.path], await shared()))

    async def per_object(request: web.Request) -> web.StreamResponse:
        return await respond_with(request, await render(node, True, ENDPOINTS[request.path], await shared()))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/per-object", per_object)
    app.router.add_get("/metrics/detailed", per_object)
    return app
