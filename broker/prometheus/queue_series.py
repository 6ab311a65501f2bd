"""The exporter's per-queue families, read and written without holding the event loop.

At 100,000 queues ``/metrics/per-object`` is 1.4 million samples. Built as prometheus-client metric objects
and rendered by its ``generate_latest`` that took 18 s of the loop thread on a 2-core machine, during which no
client was served (issue 38). Here the queues are read in chunks (broker/observability/chunked.py), the event loop
turning between chunks, into plain rows; then each family is written straight as exposition text (format 0.0.4: the
same names, help, types and labels prometheus-client writes, ``vhost`` and ``queue`` label values escaped as
it escapes them), again a turn of the loop between families. ``/metrics`` sums the same rows.

The rows are read at slightly different moments, as RabbitMQ's plugin reads its queues one by one; a queue
deleted during the scrape may appear once more with the figures it had.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from broker.observability.chunked import in_chunks
from broker.prometheus.queue_values import (
    MEMBER_LOCAL_GAUGES,
    QUEUE_COUNTERS,
    QUEUE_GAUGES,
    queue_values,
    reports_queue,
)
from broker.queues.queue_types import Queue

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot

FAMILIES = tuple((name, help_, "gauge") for name, help_ in QUEUE_GAUGES) + \
    tuple((name, help_, "counter") for name, help_ in QUEUE_COUNTERS)
NAMES = tuple(name for name, _h, _k in FAMILIES)
TEXT_CHUNK = 10_000  # rows written as text between two turns of the event loop (a few ms)
MEMBER_LOCAL = frozenset(i for i, name in enumerate(NAMES) if name in MEMBER_LOCAL_GAUGES)


class QueueRow(NamedTuple):
    vhost: str
    name: str
    values: tuple[int, ...]  # in FAMILIES' order
    reported: bool  # False: a shared queue another member reports; only MEMBER_LOCAL values count here


class QueueScan(NamedTuple):
    """What one scrape reads of every queue: its row, and what the node-wide families need besides."""

    rows: list[QueueRow]
    ram_bytes: int  # summed Queue.ram_bytes (broker/prometheus/metrics_runtime.py's runtime families)
    raft: list[Queue]  # the queues with the raft capability (quorum queues)
    streams: list[Queue]  # the queues with the offsets capability (stream queues)


def _row(q: Queue, shared: Snapshot | None, here: str, occupied: set[Queue]) -> QueueRow:
    reported = shared is None or reports_queue(q, shared, here)
    return QueueRow(q.vhost.name, q.name, queue_values(q, shared, occupied), reported)


async def scan(queues: list[Queue], shared: Snapshot | None, here: str, occupied: set[Queue]) -> QueueScan:
    """Reads every queue, a chunk at a time (broker/observability/chunked.py); ``occupied``: the queues that
    may hold messages (the vhosts' QueueRegistry.occupied), the others' figures and RAM are zeros."""
    rows: list[QueueRow] = []
    raft: list[Queue] = []
    streams: list[Queue] = []
    ram = 0
    async for chunk in in_chunks(queues):
        for q in chunk:
            rows.append(_row(q, shared, here, occupied))
            if q in occupied:
                ram += q.ram_bytes()
            caps = q.capabilities
            if caps.raft:
                raft.append(q)
            if caps.offsets:
                streams.append(q)
    return QueueScan(rows, ram, raft, streams)


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(name: str, help_: str, kind: str) -> str:
    return f"# HELP {name} {_escape_help(help_)}\n# TYPE {name} {kind}\n"


def aggregated_text(rows: list[QueueRow]) -> str:
    """One unlabelled sample per family: the sums over the queues this member reports (and, for a shared
    queue another member reports, only this member's consumers and publishers of it)."""
    reported = [row.values for row in rows if row.reported]
    sums = [sum(column) for column in zip(*reported)] if reported else [0] * len(FAMILIES)
    for row in rows:
        if not row.reported:
            for i in MEMBER_LOCAL:
                sums[i] += row.values[i]
    return "".join(f"{_header(name, help_, kind)}{name} {total}\n"
                   for (name, help_, kind), total in zip(FAMILIES, sums))


async def per_object_text(rows: list[QueueRow]) -> list[str]:
    """One sample per queue and family (labels ``vhost``, ``queue``), written :data:`TEXT_CHUNK` rows at a
    time with a turn of the loop between (broker/observability/chunked.py)."""
    labels: list[str] = []
    async for chunk in in_chunks(rows, TEXT_CHUNK):
        labels += [f'{{vhost="{_escape_label(r.vhost)}",queue="{_escape_label(r.name)}"}} ' for r in chunk]
    parts: list[str] = []
    for i, (name, help_, kind) in enumerate(FAMILIES):
        parts.append(_header(name, help_, kind))
        every = i in MEMBER_LOCAL  # a shared queue another member reports: only its local consumers here
        async for span in in_chunks(range(len(rows)), TEXT_CHUNK):
            parts.append("".join([f"{name}{labels[j]}{rows[j].values[i]}\n" for j in span
                                  if every or rows[j].reported]))
    return parts
