"""The read side of format ``leveret``: ``spark.read`` (LeveretBatchReader) and ``spark.readStream``
(LeveretStreamReader) of stream queues, by stream offset.

Where each piece runs (as PySpark's Python data source runs them): the driver-side calls (``initialOffset``,
``latestOffset``, ``partitions``, ``commit``) run in one long-lived Python process per query; ``read`` runs
on executors in *another*, unpickled, copy of the reader. So readers hold only plain data (the options, the
schema, a frozen :class:`ReadConfig`), everything a task needs travels in its :class:`StreamPartition`, and
connections are opened inside ``read`` and the driver-side calls, never in ``__init__``.

Options (strings, case-insensitive):

- ``uri`` (``amqp://user:pass@host:5672/vhost``; the vhost comes from here), ``managementUri`` (default
  ``http://<host>:15672``), ``queue`` or ``queues`` (comma-separated; ``load("events")`` works too).
- ``startingOffsets``: ``earliest`` | ``latest`` | an offset | ``{"queue": spec, ...}`` (queues left out
  get the default). Default ``earliest`` for a batch read, ``latest`` for a stream (Kafka's defaults). A
  stream uses it only when its checkpoint has no offsets yet.
- ``endingOffsets`` (batch only): same forms, default ``latest``; an end beyond the stream's next offset is
  read up to the next offset.
- ``startingTimestamp`` (epoch milliseconds, every queue), ``startingOffsetsByTimestamp`` (``{"queue": ms}``),
  and for a batch read ``endingTimestamp``, ``endingOffsetsByTimestamp``: the position is the first offset
  appended at or after that time (Kafka's rule; the broker's append time, asked over AMQP:
  time_offsets.py). They win over ``startingOffsets`` / ``endingOffsets`` (the single time over the JSON;
  queues the JSON leaves out keep their ``...Offsets`` position). A time no retained message reaches:
  an ending one reads to the end; a starting one fails the read, naming the queue, unless
  ``startingOffsetsByTimestampStrategy`` is ``latest`` (default ``error``, as Kafka), which starts that
  queue at its end.
- ``maxRecordsPerTrigger``, ``maxBytesPerTrigger``: caps of one micro-batch over all queues (bytes are
  estimated from the stream's average message size).
- ``maxRecordsPerPartition``, ``minPartitions``: how one batch's ranges split into tasks.
- ``failOnDataLoss`` (default true): offsets the read needs that retention removed fail the query,
  naming them; ``false`` skips to what is left.
- ``consumerGroup`` (stream only, default none): after each micro-batch the query's end offsets are
  committed as that stream consumer group's ``committed_offset``, so the broker shows the query's lag.
  No default name on purpose: a group is a shared, named broker object that only moves forward, so two
  queries sharing one (any default would make them) would report the faster one's progress as both's;
  and Spark's checkpoint, not the group, is what a restarted query resumes from. The group trails the
  query by one micro-batch: Spark calls a source's ``commit(end)`` when it plans the following batch.
- ``caFile``, ``certFile``, ``keyFile``: TLS for an ``amqps://`` uri and an ``https://`` managementUri
  (Kafka's truststore and keystore; tls.py).
- ``prefetch`` (default 2000, the consumer's credit), ``readTimeout`` (seconds, default 60: how long a task
  waits without a delivery for offsets it knows exist before failing), ``bodyAs``, ``bodyFormat``,
  ``bodySchema`` (schema.py).
- ``headerKeys`` (comma-separated, default all): the only headers put in the ``headers`` column; the others
  are stepped over unread (field_table.py), which is most of a read's CPU when messages carry large headers
  a job does not use (a trace event's copy of the message's properties).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_leveret.client import Endpoint, ManagementAPI, ManagementError, StreamStats, parse_uri
from pyspark_leveret.offsets import (
    EARLIEST,
    ERROR,
    LATEST,
    DataLossError,
    OffsetSpec,
    Range,
    cap_end,
    data_loss_message,
    missing_offsets,
    parse_positions,
    resolve,
    split_ranges,
    times_in,
)
from pyspark_leveret.tls import TLSFiles

log = logging.getLogger("pyspark_leveret")

ROWS_PER_BATCH = 10_000
DEFAULT_PREFETCH = 2000
DEFAULT_READ_TIMEOUT = 60.0


def _get(options: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _names(options: Mapping[str, str], name: str) -> frozenset[str] | None:
    """A comma-separated list of names (None when the option is not given)."""
    raw = _get(options, name)
    if raw is None:
        return None
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    if not names:
        raise ValueError(f"option {name} must name at least one header, got {raw!r}")
    return names


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class ReadConfig:
    """The options of a read, checked once on the driver (a bad option fails at ``load()``, not in a task)."""

    endpoint: Endpoint
    queues: tuple[str, ...]
    starting: str | None
    ending: str | None
    starting_timestamp: str | None
    starting_by_timestamp: str | None
    ending_timestamp: str | None
    ending_by_timestamp: str | None
    timestamp_strategy: str
    max_records_per_trigger: int | None
    max_bytes_per_trigger: int | None
    max_records_per_partition: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    consumer_group: str | None
    prefetch: int
    read_timeout: float
    json_body: bool
    header_keys: frozenset[str] | None = None  # option headerKeys: the only headers read (None: all)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReadConfig:
        uri = _get(options, "uri")
        if not uri:
            raise ValueError("option uri is required, e.g. amqp://guest:guest@localhost:5672/%2F")
        names = _get(options, "queues") or _get(options, "queue") or _get(options, "path") or ""
        if _get(options, "queues") and _get(options, "queue"):
            raise ValueError("give option queue or queues, not both")
        queues = tuple(dict.fromkeys(q.strip() for q in names.split(",") if q.strip()))
        if not queues:
            raise ValueError("option queue (a stream queue's name) or queues (comma-separated) is required")
        timeout_raw = _get(options, "readTimeout")
        timeout = float(timeout_raw) if timeout_raw else DEFAULT_READ_TIMEOUT
        if timeout <= 0:
            raise ValueError(f"option readTimeout must be > 0 seconds, got {timeout_raw!r}")
        strategy = (_get(options, "startingOffsetsByTimestampStrategy") or ERROR).strip().lower()
        if strategy not in (ERROR, LATEST):
            raise ValueError(f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}")
        config = cls(
            endpoint=parse_uri(uri, _get(options, "managementUri"), TLSFiles.from_options(options)),
            queues=queues,
            starting=_get(options, "startingOffsets"),
            ending=_get(options, "endingOffsets"),
            starting_timestamp=_get(options, "startingTimestamp"),
            starting_by_timestamp=_get(options, "startingOffsetsByTimestamp"),
            ending_timestamp=_get(options, "endingTimestamp"),
            ending_by_timestamp=_get(options, "endingOffsetsByTimestamp"),
            timestamp_strategy=strategy,
            max_records_per_trigger=_positive_int(options, "maxRecordsPerTrigger"),
            max_bytes_per_trigger=_positive_int(options, "maxBytesPerTrigger"),
            max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
            min_partitions=_positive_int(options, "minPartitions"),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            consumer_group=(_get(options, "consumerGroup") or "").strip() or None,
            prefetch=_positive_int(options, "prefetch") or DEFAULT_PREFETCH,
            read_timeout=timeout,
            json_body=(_get(options, "bodyFormat") or "").strip().lower() == "json",
            header_keys=_names(options, "headerKeys"),
        )
        config.starting_specs(EARLIEST)  # a malformed position fails here, at load()
        config.ending_specs()
        return config

    @property
    def has_ending(self) -> bool:
        return any(v is not None for v in (self.ending, self.ending_timestamp, self.ending_by_timestamp))

    def starting_specs(self, default: str) -> dict[str, OffsetSpec]:
        return parse_positions(self.starting, self.starting_timestamp, self.starting_by_timestamp,
                               list(self.queues), default, "starting")

    def ending_specs(self) -> dict[str, OffsetSpec]:
        return parse_positions(self.ending, self.ending_timestamp, self.ending_by_timestamp, list(self.queues),
                               LATEST, "ending")

    def stats(self) -> dict[str, StreamStats]:
        api = ManagementAPI(self.endpoint)
        return {q: api.stream_stats(q) for q in self.queues}

    def offsets_at_times(self, stats: Mapping[str, StreamStats], *specs: Mapping[str, OffsetSpec]
                         ) -> dict[tuple[str, int], int | None]:
        """The broker's offsets for the time positions of ``specs`` (no connection when there are none)."""
        wanted = [t for spec in specs for t in times_in(spec)]
        if not wanted:
            return {}
        from pyspark_leveret.time_offsets import offsets_at_times

        return offsets_at_times(self.endpoint, self.read_timeout, wanted, stats)

    def resolve_starting(self, specs: Mapping[str, OffsetSpec], stats: Mapping[str, StreamStats],
                         found: Mapping[tuple[str, int], int | None] | None = None) -> dict[str, int]:
        if found is None:
            found = self.offsets_at_times(stats, specs)
        option = "startingTimestamp" if self.starting_timestamp else "startingOffsetsByTimestamp"
        return resolve(specs, stats, found, self.timestamp_strategy, option)


def queue_type(config: ReadConfig) -> str:
    """The ``type`` of the (single) queue read, as the HTTP API's queue object gives it: ``stream``,
    ``classic`` or ``quorum``."""
    name = config.queues[0]
    try:
        return str(ManagementAPI(config.endpoint).queue(name).get("type") or "classic")
    except ManagementError as exc:
        if exc.status == 404:
            raise ManagementError(f"no queue '{name}' in vhost '{config.endpoint.vhost}'", 404) from exc
        raise


@dataclass
class StreamPartition(InputPartition):
    """One task's work: offsets ``[start, end)`` of ``queue``. Plain data (pickled to the executor)."""

    queue: str
    start: int
    end: int


def _partitions(ranges: list[Range]) -> list[StreamPartition]:
    return [StreamPartition(r.queue, r.start, r.end) for r in ranges]


def read_range(config: ReadConfig, schema: StructType, part: StreamPartition) -> Iterator[Any]:
    """The executor's work (imported lazily: the driver-side runner never needs the AMQP client)."""
    from pyspark_leveret.range_read import read_stream_range

    return read_stream_range(config, schema, part.queue, part.start, part.end, ROWS_PER_BATCH)


class LeveretBatchReader(DataSourceReader):
    """``spark.read.format("leveret")``: the offsets between startingOffsets and endingOffsets, planned once
    (at ``partitions()``, on the driver)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.schema = schema
        self.config = ReadConfig.from_options(self.options)

    def plan(self, stats: Mapping[str, StreamStats]) -> list[Range]:
        cfg = self.config
        starting, ending = cfg.starting_specs(EARLIEST), cfg.ending_specs()
        found = cfg.offsets_at_times(stats, starting, ending)
        start = cfg.resolve_starting(starting, stats, found)
        end = resolve(ending, stats, found, LATEST)
        end = {q: min(e, stats[q].next_offset) for q, e in end.items()}
        backwards = {q: (start[q], end[q]) for q in cfg.queues if start[q] > end[q]}
        if backwards:
            raise ValueError(f"startingOffsets is after endingOffsets for {backwards}")
        lost = missing_offsets(start, stats, end)
        if lost and cfg.fail_on_data_loss:
            raise DataLossError(data_loss_message(lost))
        return split_ranges(start, end, cfg.max_records_per_partition, cfg.min_partitions)

    def partitions(self) -> list[InputPartition]:
        return list(_partitions(self.plan(self.config.stats())))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StreamPartition):
            # Spark turns an empty partition list into one InputPartition(None): nothing to read.
            return iter(())
        return read_range(self.config, self.schema, partition)


class LeveretStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("leveret")``: micro-batches of stream offsets, capped by the read limit."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.schema = schema
        self.config = ReadConfig.from_options(self.options)
        if self.config.has_ending:
            raise ValueError("options endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch "
                             "reads only (spark.read)")
        # Driver-side state, set by the calls below (never in the executors' copies): the availableNow target
        # and the streams' extent seen by the last latestOffset (for reportLatestOffset).
        self.frozen: dict[str, int] | None = None
        self.last_seen: dict[str, int] | None = None

    # -- driver ----------------------------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        cfg = self.config
        return cfg.resolve_starting(cfg.starting_specs(LATEST), cfg.stats())

    def getDefaultReadLimit(self) -> ReadLimit:
        cfg = self.config
        if cfg.max_records_per_trigger is not None:
            return ReadMaxRows(cfg.max_records_per_trigger)
        if cfg.max_bytes_per_trigger is not None:
            return ReadMaxBytes(cfg.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the target: this run reads up to the streams' next offsets now, never past them."""
        self.frozen = {q: s.next_offset for q, s in self.config.stats().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        cfg = self.config
        stats = cfg.stats()
        self.last_seen = {q: s.next_offset for q, s in stats.items()}
        begin = {q: int(v) for q, v in (start or {}).items() if q in cfg.queues}
        new = [q for q in cfg.queues if q not in begin]
        if new:
            # Queues added to the query since its checkpoint: their first batch only fixes where they start.
            specs = cfg.starting_specs(LATEST)
            return {**begin, **cfg.resolve_starting({q: specs[q] for q in new}, stats)}
        lost = missing_offsets(begin, stats)
        if lost:
            if cfg.fail_on_data_loss:
                raise DataLossError(data_loss_message(lost))
            log.warning("%s; skipping them (failOnDataLoss=false)", data_loss_message(lost))
        target = dict(self.last_seen)
        if self.frozen is not None:
            target = {q: min(t, self.frozen.get(q, t)) for q, t in target.items()}
        max_records, max_bytes = self._caps(limit)
        readable = sum(max(0, target[q] - max(begin[q], stats[q].first_offset)) for q in target)
        if isinstance(limit, ReadMinRows) and readable < limit.min_rows:
            return begin
        return cap_end(begin, target, stats, max_records, max_bytes)

    def _caps(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """The record and byte caps for ``limit``: everything for ReadAllAvailable (Trigger.Once), else the
        limit's own cap and the other option's, so maxRecordsPerTrigger and maxBytesPerTrigger combine."""
        if isinstance(limit, ReadAllAvailable):
            return None, None
        records, size = self.config.max_records_per_trigger, self.config.max_bytes_per_trigger
        if isinstance(limit, ReadMaxRows):
            records = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            size = limit.max_bytes
        return records, size

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self.last_seen

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        cfg = self.config
        ranges = split_ranges({q: int(v) for q, v in start.items()}, {q: int(v) for q, v in end.items()},
                              cfg.max_records_per_partition, cfg.min_partitions)
        return list(_partitions(ranges))

    def commit(self, end: dict[str, int]) -> None:
        """Record the query's progress as the stream consumer group ``consumerGroup`` (if set). Monitoring
        only: a failure is logged, never fails the query (the checkpoint is what counts)."""
        group = self.config.consumer_group
        if group is None:
            return
        api = ManagementAPI(self.config.endpoint)
        for q, offset in sorted(end.items()):
            try:
                api.commit_group(q, group, int(offset))
            except ManagementError as exc:
                hint = " (the group has live AMQP consumers)" if exc.status == 409 else ""
                log.warning("could not commit offset %s of stream %r as group %r%s: %s", offset, q, group,
                            hint, exc)

    def stop(self) -> None:
        """Nothing to release: the driver side holds no connection between calls."""

    # -- executor ----------------------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StreamPartition):
            return iter(())  # as the batch reader: a placeholder partition reads nothing
        return read_range(self.config, self.schema, partition)
