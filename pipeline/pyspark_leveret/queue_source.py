"""``spark.readStream.format("leveret").option("queue", q)`` when ``q`` is a classic or quorum queue (the
connector asks the HTTP API for the queue's ``type``): a destructive read that acks only after the
micro-batch that holds a message has committed.

How (AMQP acks belong to the channel that received the delivery, so the channel must outlive the batch's
tasks): the query's driver-side reader (one long-lived Python process per query) holds one consumer
connection. ``latestOffset`` takes up to a batch of messages off the queue (manual acks, prefetch = the
batch) and numbers them; offsets are those numbers. ``partitions`` hands each task its messages inside the
partition (so a task that fails, or an executor that is killed, is retried with the very same rows), and
the messages are acked when Spark asks for the next batch (``latestOffset(start)`` / ``commit(end)``: by then
the batches before ``start`` are in the sink's commit log). If the driver dies, its connection closes and the
broker requeues every unacked message: they are read again by the restarted query.

The guarantee: a committed batch is never read again while the driver lives, and a failed task or executor
loses and repeats nothing (exactly-once into a file sink). A driver killed after a batch's sink commit but
before its ack (between the commit log write and the next batch's planning) gets that batch back after its
restart: at-least-once, every such row arriving again with the same ``properties.message_id`` (when the
publisher set one), so a sink keyed by message id stays exact; a non-idempotent sink sees those rows twice.
Messages pass through the driver (one consumer per query), so this source reads at one consumer's rate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_leveret.amqp_read import HEADERS_INDEX, PROPERTY_NAMES, Delivery
from pyspark_leveret.tls import pika_parameters

log = logging.getLogger("pyspark_leveret")

DEFAULT_BATCH = 10_000  # messages per micro-batch when maxRecordsPerTrigger is not set (they sit on the driver)
IDLE_SECONDS = 2.0  # a fetch waits this long for messages the queue reported ready before taking fewer


@dataclass
class QueuePartition(InputPartition):
    """One task's messages, carried to the executor inside the partition (a retry gets the same rows)."""

    rows: list[Delivery] = field(default_factory=list)


def _delivery(seq: int, method: Any, props: Any, body: bytes, header_keys: frozenset[str] | None) -> Delivery:
    values = [getattr(props, name, None) for name in PROPERTY_NAMES]
    headers = values[HEADERS_INDEX]
    if header_keys is not None and headers:
        values[HEADERS_INDEX] = {k: v for k, v in headers.items() if k in header_keys}
    return (seq, method.exchange, method.routing_key, bytes(body), tuple(values))


class LeveretQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches taken off one classic or quorum queue; offsets ``{queue: n}`` number the messages this
    query has taken (batch ``[start, end)`` is messages ``start..end-1``)."""

    def __init__(self, options: dict[str, str], schema: StructType, config: Any) -> None:
        self.options = dict(options)
        self.schema = schema
        self.config = config
        if len(config.queues) != 1:
            raise ValueError("the queue source reads one classic or quorum queue (option queue)")
        if config.starting is not None and config.starting.strip().lower() not in ("", "latest"):
            raise ValueError("option startingOffsets does not apply to a classic or quorum queue: a destructive "
                             "read starts at the queue's head")
        self.queue = config.queues[0]
        self.batch = config.max_records_per_trigger or DEFAULT_BATCH
        # Driver-side state (never used in the executors' unpickled copies).
        self._conn: Any = None
        self._channel: Any = None
        self._held: list[tuple[int, int, Delivery]] = []  # (seq, delivery tag, delivery), unacked
        self._next = 0
        self._budget: int | None = None  # availableNow: messages left to take in this run

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_conn=None, _channel=None, _held=[])
        return state

    # -- driver ----------------------------------------------------------------------------------------------
    def _open(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            import pika

            params = pika_parameters(self.options.get("uri") or _uri(self.options), self.config.endpoint.tls_files)
            params.heartbeat = 0  # the driver is idle between batches; a closed connection would requeue
            self._conn = pika.BlockingConnection(params)
            self._channel = self._conn.channel()
        return self._channel

    def _ready(self) -> int:
        ok = self._open().queue_declare(self.queue, passive=True)
        return int(ok.method.message_count)

    def initialOffset(self) -> dict[str, int]:
        return {self.queue: 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._budget = self._ready()

    def _ack_below(self, seq: int) -> None:
        """Ack every held message numbered below ``seq`` (their batches are committed), in one multiple-ack."""
        done = [h for h in self._held if h[0] < seq]
        if not done:
            return
        self._open().basic_ack(delivery_tag=max(h[1] for h in done), multiple=True)
        self._held = [h for h in self._held if h[0] >= seq]

    def _fetch(self, want: int) -> None:
        """Take up to ``want`` ready messages off the queue, numbering them from ``self._next``."""
        if self._budget is not None:
            want = min(want, self._budget)
        want = min(want, self._ready())
        if want <= 0:
            return
        ch = self._open()
        ch.basic_qos(prefetch_count=want)
        got = 0
        for method, props, body in ch.consume(self.queue, inactivity_timeout=IDLE_SECONDS):
            if method is None:
                break
            self._held.append((self._next, method.delivery_tag, _delivery(self._next, method, props, body, self.config.header_keys)))
            self._next += 1
            got += 1
            if got >= want:
                break
        ch.cancel()  # messages delivered but not yet handed out go back (pika nacks them with requeue)
        if self._budget is not None:
            self._budget -= got

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = int((start or {}).get(self.queue, 0))
        self._ack_below(begin)
        self._next = max(self._next, begin)
        if any(h[0] >= begin for h in self._held):
            return {self.queue: self._next}
        cap = self.batch
        if isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            cap = max(cap, DEFAULT_BATCH)
        self._fetch(cap)
        return {self.queue: self._next}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        lo, hi = int(start.get(self.queue, 0)), int(end.get(self.queue, 0))
        if hi <= lo:
            return []
        self._next = max(self._next, lo)
        if not any(lo <= h[0] < hi for h in self._held):
            # A batch planned by a driver that died: its messages were requeued when its connection closed;
            # take the same number again (the file sink's commit log never saw that batch).
            self._fetch(hi - lo)
        rows = [h[2] for h in self._held if lo <= h[0] < hi]
        n = max(1, min(self.config.min_partitions or 1, len(rows)))
        return [QueuePartition(rows[i * len(rows) // n:(i + 1) * len(rows) // n]) for i in range(n)]

    def commit(self, end: dict[str, int]) -> None:
        self._ack_below(int(end.get(self.queue, 0)))

    def stop(self) -> None:
        """Close the consumer connection: what was not acked (not committed) goes back to the queue."""
        conn, self._conn, self._channel = self._conn, None, None
        self._held = []
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception as exc:  # noqa: BLE001 (closing: the broker requeues either way)
                log.warning("closing the queue source's connection: %s", exc)

    # -- executor ----------------------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueuePartition) or not partition.rows:
            return iter(())
        from pyspark_leveret.arrow_rows import RowBuilder

        return iter([RowBuilder(self.schema, self.config.json_body).batch(partition.rows)])


def _uri(options: dict[str, str]) -> str:
    for key, value in options.items():
        if key.lower() == "uri":
            return value
    raise ValueError("option uri is required")
