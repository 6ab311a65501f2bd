"""The exporter's per-queue families written as text (broker/prometheus/queue_series.py): what Prometheus's own
parser reads back is every queue's values under its escaped labels, the sums on /metrics, and the scrape turns
the event loop while it reads 100,000 queues."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from broker.observability import chunked
from broker.prometheus import queue_series
from broker.prometheus.queue_series import FAMILIES, NAMES, QueueRow, aggregated_text, per_object_text, scan
from broker.queues.queue_info import CLASSIC, QUORUM
from storage.backing_queue import Figures

ODD_NAMES = ['plain', 'with "quotes"', "back\\slash", "new\nline", "ünïcödé ✓", "{braces}=,"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _row(i: int, name: str, reported: bool = True) -> QueueRow:
    return QueueRow("/v" if i % 2 else "/", name, tuple(1000 * i + k for k in range(len(FAMILIES))), reported)


def test_per_object_text_reads_back_every_value_under_escaped_labels():
    rows = [_row(i, name) for i, name in enumerate(ODD_NAMES)]
    samples = _samples("".join(asyncio.run(per_object_text(rows))))
    assert len(samples) == len(rows) * len(FAMILIES)
    for row in rows:
        for k, name in enumerate(NAMES):
            assert samples[(name, (("queue", row.name), ("vhost", row.vhost)))] == row.values[k]


def test_types_and_help_are_what_prometheus_client_writes():
    text = "".join(asyncio.run(per_object_text([_row(1, "q")])))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    published = families["rabbitmq_queue_messages_published"]  # the parser strips a counter's _total
    assert published.type == "counter"
    assert published.documentation == "Total number of messages published to queues"
    assert families["rabbitmq_queue_messages_ready"].type == "gauge"


def test_a_queue_another_member_reports_counts_only_its_local_consumers_and_publishers():
    rows = [_row(1, "mine"), _row(2, "shared", reported=False)]
    per_object = _samples("".join(asyncio.run(per_object_text(rows))))
    assert {labels for _name, labels in per_object if ("queue", "shared") in labels}
    shared_names = {name for name, labels in per_object if ("queue", "shared") in labels}
    assert shared_names == {"rabbitmq_queue_consumers", "leveret_queue_publishers"}
    sums = _samples(aggregated_text(rows))
    for k, name in enumerate(NAMES):
        local = name in ("rabbitmq_queue_consumers", "leveret_queue_publishers")
        assert sums[(name, ())] == rows[0].values[k] + (rows[1].values[k] if local else 0), name


def test_aggregated_text_of_no_queue_is_zeros():
    assert set(_samples(aggregated_text([])).values()) == {0}


class _Queue:
    """What the scan reads of a queue (hashable by identity, as the broker's queues are)."""

    def __init__(self, i: int) -> None:
        self.name, self.vhost = f"q{i}", SimpleNamespace(name="/")
        self.capabilities = QUORUM if i == 7 else CLASSIC
        self.stats = SimpleNamespace(published=10, delivered=9, redelivered=1, acked=8, get=2)
        self.consumers = SimpleNamespace(count=1)
        self.publisher_channels = {1, 2}

    def figures(self) -> Figures:
        return Figures(3, 2, 30, 20, 1)

    def ram_bytes(self) -> int:
        return 5


def test_scan_reads_every_queue_and_lets_the_loop_turn_between_chunks():
    queues = [_Queue(i) for i in range(chunked.CHUNK * 3 + 5)]
    turns = 0

    async def other_client() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def scrape() -> queue_series.QueueScan:
        ticker = asyncio.create_task(other_client())
        await asyncio.sleep(0)
        turns_before = turns
        read = await scan(queues, None, "node", set(queues[:-1]))  # type: ignore[arg-type]
        ticker.cancel()
        assert turns - turns_before >= 3  # one turn after each full chunk at least
        return read

    read = asyncio.run(scrape())
    assert len(read.rows) == len(queues)
    assert read.ram_bytes == 5 * (len(queues) - 1)  # the last one is not occupied: no figures, no RAM read
    assert [q.name for q in read.raft] == ["q7"]
    assert len(read.rows[0].values) == len(FAMILIES)  # one value per family, in their order
    assert read.rows[0].values == (3, 2, 5, 30, 20, 50, 1, 2, 1, 10, 9, 1, 8, 2)
    assert read.rows[-1].values == (0, 0, 0, 0, 0, 0, 1, 2, 0, 10, 9, 1, 8, 2)
