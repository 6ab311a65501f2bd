"""The traffic job: the trace stream in (``format("leveret")``), per vhost, queue and minute traffic and
latency out, as parquet, exactly once across restarts.

Why ``foreachBatch`` and not Spark's file sink with a watermark: a minute's row must change as more of that
minute arrives — the current minute in every micro-batch, an earlier one when an event comes late — and a
``--once`` run (trigger availableNow) must write the minutes it has seen, the last one included. The file sink
only appends: it would hold every minute back until a watermark passes it, and an availableNow run, whose
watermark never moves past its own last events, would never write its last minutes. So each micro-batch:

1. turns its trace rows into *events* (one row per event and queue: a publish counts for every queue it
   reached, its ``routed_queues``) and pairs them on (vhost, queue, ``x-leveret-message-id``) for the
   publish→deliver and deliver→ack latencies: inside the batch, then with the events already kept, as far
   back as ``lookback``. The lookback is this job's watermark: a latency longer than it is not measured
   (the events still count), and no join reads further back. Each pair's sample is stored on the member
   that arrived second in the stream (the "latency" comment below: Leveret may trace a delivery before
   its publish);
2. writes them to ``events/date=D/hour=H/batch=N/`` (dynamic partition overwrite: a replay of batch N
   replaces exactly batch N's files; the hour level keeps each read's directory listing to the hours it
   needs);
3. recomputes every (vhost, minute) the batch touched from *all* kept events of that minute, and replaces
   the rows of those minutes in ``traffic/vhost=V/date=D/part-0.parquet`` (written beside it, then renamed:
   a reader sees the old file or the new one, never half of one).

Exactly-once: Spark writes ``offsets/N`` before batch N and ``commits/N`` after this function returns; a batch
that did not commit is run again with the same offsets, so the same rows. Step 2 overwrites by batch id, and
step 3 is a function of the kept events, so running a batch twice leaves what running it once leaves, and
nothing is counted twice. A checkpoint that is not the one ``OUT`` was built with (deleted, or another one)
would number its batches from 0 again and count the stream twice: the job refuses to start on it
(``_query.json``). State is bounded by the lookback (the latency joins read at most that far back); the kept
events are the job's history, and their retention is the operator's (delete old ``events/date=…`` dirs).
``OUT`` is a local directory.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

EVENT_TIME = "x-leveret-event-time"
MESSAGE_ID = "x-leveret-message-id"
KINDS = ("publish", "deliver", "ack", "deadletter")
REASONS = ("expired", "rejected", "maxlen", "delivery_limit")  # x-death's reasons, as broker/observability/trace.py sends
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
# The trace headers trace_events reads: the connector decodes only these (option headerKeys), stepping over the
# rest of each event's headers (its exchange, routing keys, the message's properties as a nested table, node,
# connection, channel, user), which were most of the read's CPU.
TRACE_HEADERS = ("vhost", "routed_queues", EVENT_TIME, MESSAGE_ID, "reason", "redelivered")
QUANTILES = (0.5, 0.95, 0.99)
ACCURACY = 10_000  # percentile_approx: rank error at most 1/ACCURACY of a minute's samples

# The events table (the partition columns date and batch included: reads state them, so that Spark does
# not infer ``date`` as a DATE and compare it to strings).
EVENT_SCHEMA = (
    "vhost STRING, queue STRING, kind STRING, message_id STRING, t BIGINT, minute BIGINT, reason STRING, "
    "redelivered BOOLEAN, bytes BIGINT, offset BIGINT, publish_to_deliver_ms BIGINT, deliver_to_ack_ms BIGINT, "
    "date STRING, hour INT, batch BIGINT"
)

# One traffic file's columns (vhost and date are its directory names, as Spark and pyarrow read them).
TRAFFIC_SCHEMA = pa.schema([
    ("queue", pa.string()),
    ("minute", pa.timestamp("ms", tz="UTC")),
    ("published", pa.int64()),
    ("published_bytes", pa.int64()),
    ("delivered", pa.int64()),
    ("delivered_bytes", pa.int64()),
    ("redelivered", pa.int64()),
    ("acked", pa.int64()),
    ("dead_lettered", pa.int64()),
    *[(f"dead_lettered_{r}", pa.int64()) for r in REASONS],
    ("publish_to_deliver_n", pa.int64()),
    *[(f"publish_to_deliver_p{int(q * 100)}_ms", pa.int64()) for q in QUANTILES],
    ("deliver_to_ack_n", pa.int64()),
    *[(f"deliver_to_ack_p{int(q * 100)}_ms", pa.int64()) for q in QUANTILES],
])


# -- trace rows → events ---------------------------------------------------------------------------------------

def string_array(rendered: Any) -> Any:
    """An AMQP array header (``routing_keys``, ``routed_queues``) as the connector renders it into its
    string map: a JSON array."""
    return F.from_json(rendered, "array<string>")


def trace_events(trace: DataFrame) -> DataFrame:
    """The connector's rows of a trace stream → one row per event and queue (no latency yet).

    The queue of a publish is each queue it reached (``routed_queues``; a publish that reached none has no
    row); of the other kinds, the routing key after its first dot (queue names may hold dots). The time is
    the broker's ``x-leveret-event-time``, else the message timestamp; minutes and dates are UTC.
    """
    h = F.col("headers")
    kind = F.substring_index("routing_key", ".", 1)
    named = F.expr("substring(routing_key, instr(routing_key, '.') + 1)")
    routed = F.coalesce(string_array(h.getItem("routed_queues")), F.array().cast("array<string>"))
    t = F.coalesce(h.getItem(EVENT_TIME).cast("bigint"), F.unix_millis("timestamp"))
    base = trace.select(
        F.coalesce(h.getItem("vhost"), F.lit("/")).alias("vhost"),
        kind.alias("kind"),
        F.when(kind == "publish", routed).otherwise(F.array(named)).alias("queues"),
        h.getItem(MESSAGE_ID).alias("message_id"),
        t.alias("t"),
        h.getItem("reason").alias("reason"),
        F.coalesce(h.getItem("redelivered").isin("1", "true", "True"), F.lit(False)).alias("redelivered"),
        F.coalesce(F.length("body").cast("bigint"), F.lit(0)).alias("bytes"),
        F.col("offset"),
    ).where(F.col("kind").isin(*KINDS) & F.col("t").isNotNull())
    return base.select(
        "vhost", F.explode("queues").alias("queue"), "kind", "message_id", "t",
        (F.col("t") - F.pmod("t", F.lit(MINUTE_MS))).alias("minute"),
        "reason", "redelivered", "bytes", "offset",
        F.expr(f"cast(date_from_unix_date(cast(floor(t / {DAY_MS}) as int)) as string)").alias("date"),
        F.pmod(F.floor(F.col("t") / HOUR_MS), F.lit(24)).cast("int").alias("hour"),
    )


# -- latency ---------------------------------------------------------------------------------------------------
#
# A latency is a pair of events of one message in one queue: (publish, its first delivery) and (a delivery,
# the ack after it). The sample is recorded on the pair's member that arrived *second* in the stream, in
# the batch where it arrived, so each pair is counted once however the batches cut the stream. Usually that
# is the delivery (or the ack); but Leveret hands a message to a waiting consumer inside the publish call and
# traces the publish after it (the trace needs ``routed_queues``), so the delivery of such a message comes
# first in the stream, up to a few ms earlier in event time, and its publish event carries the sample.

LATENCY_COLUMNS = {"publish": "publish_to_deliver_ms", "deliver": "deliver_to_ack_ms"}  # by the start's kind
SLACK_MS = 1_000  # how much later than its delivery a publish may be traced (same call: ms)


def _targets(events: DataFrame) -> DataFrame:
    """The events that end a measured interval, with the kind of event that starts it: a first delivery
    (after its publish; a redelivery's wait includes the failed attempt, so it is not a queueing latency)
    and an ack (after the latest delivery of that message from that queue)."""
    kind = F.col("kind")
    return events.where(
        (((kind == "deliver") & ~F.col("redelivered")) | (kind == "ack")) & F.col("message_id").isNotNull()
    ).select("offset", "vhost", "queue", "message_id", "t",
             F.when(kind == "deliver", "publish").otherwise("deliver").alias("after"))


def _starts(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind").isin(*LATENCY_COLUMNS) & F.col("message_id").isNotNull()).select(
        F.col("offset").alias("s_offset"), "vhost", "queue", "message_id", F.col("kind").alias("after"),
        F.col("t").alias("t0"))


def _pairs(targets: DataFrame, starts: DataFrame, lookback_ms: int) -> DataFrame:
    """Per target, its start: the latest one of the same message and queue at most ``lookback_ms`` before
    it (or ``SLACK_MS`` after it: traced late) — a redelivered message's ack pairs with its last delivery.
    (offset, queue, after, latency, s_offset); the latency is never below 0."""
    joined = targets.join(starts, ["vhost", "queue", "message_id", "after"]).where(
        (F.col("t0") <= F.col("t") + F.lit(SLACK_MS)) & (F.col("t0") >= F.col("t") - F.lit(lookback_ms)))
    best = joined.groupBy("offset", "queue", "after").agg(
        F.max_by(F.struct(F.greatest(F.col("t") - F.col("t0"), F.lit(0)).alias("latency"), "s_offset"),
                 "t0").alias("best"))
    return best.select("offset", "queue", "after", "best.latency", "best.s_offset")


def attach_latency(events: DataFrame, history: Callable[[int, int], DataFrame | None], span: tuple[int, int],
                   lookback_ms: int) -> DataFrame:
    """``events`` with ``publish_to_deliver_ms`` and ``deliver_to_ack_ms`` (see above; null where the row
    completes no pair). ``span``: the least and greatest event time of ``events``. ``history(lo, hi)``: the
    kept events of earlier batches with ``lo <= t <= hi`` (None when none is kept).

    This batch's targets look for their start in the batch and in the kept events as far back as the
    lookback; earlier targets still without a sample (their start was traced late, into this batch) look
    just around this batch's time span. One lazy plan, run by the caller's write: on 2 cores each Spark job
    costs a second or so, whatever its size, so no step here runs one.
    """
    lo, hi = span
    targets, starts = _targets(events), _starts(events)
    older = history(lo - lookback_ms, hi)
    candidates = starts if older is None else starts.unionByName(_starts(older))
    found = _pairs(targets, candidates, lookback_ms)
    samples = found.select("offset", "queue", "after", "latency")  # on the target: it came second
    if older is not None:
        recent = older.where(F.col("t") >= lo - SLACK_MS)
        waiting = _targets(recent.where(
            ((F.col("kind") == "deliver") & F.col("publish_to_deliver_ms").isNull())
            | ((F.col("kind") == "ack") & F.col("deliver_to_ack_ms").isNull())))
        late = _pairs(waiting, starts, lookback_ms)  # on the start: it came second
        samples = samples.unionByName(late.select(F.col("s_offset").alias("offset"), "queue", "after", "latency"))
    per_row = samples.groupBy("offset", "queue").agg(
        *[F.max(F.when(F.col("after") == after, F.col("latency"))).alias(column)
          for after, column in LATENCY_COLUMNS.items()])
    return events.join(per_row, ["offset", "queue"], "left")


# -- events → minute rows --------------------------------------------------------------------------------------

MINUTE_KEYS = ("vhost", "date", "queue", "minute")


def minute_rows(events: DataFrame) -> DataFrame:
    """Traffic and latency per (vhost, date, queue, minute) of ``events`` (every event of those minutes)."""
    return traffic_rows(events, MINUTE_KEYS)


def traffic_rows(events: DataFrame, keys: Iterable[str]) -> DataFrame:
    """The counters and latency quantiles of ``events`` per ``keys`` (minute rows, or a run's summary)."""
    keys = list(keys)
    kind = F.col("kind")
    waited, handled = F.col("publish_to_deliver_ms"), F.col("deliver_to_ack_ms")
    delivered, acked = kind == "deliver", kind == "ack"

    def total(cond: Any, column: str) -> Any:
        return F.coalesce(F.sum(F.when(cond, F.col(column))), F.lit(0)).cast("bigint")

    aggs = [
        F.count_if(kind == "publish").alias("published"),
        total(kind == "publish", "bytes").alias("published_bytes"),
        F.count_if(delivered).alias("delivered"),
        total(delivered, "bytes").alias("delivered_bytes"),
        F.count_if(delivered & F.col("redelivered")).alias("redelivered"),
        F.count_if(acked).alias("acked"),
        F.count_if(kind == "deadletter").alias("dead_lettered"),
        *[F.count_if((kind == "deadletter") & (F.col("reason") == r)).alias(f"dead_lettered_{r}")
          for r in REASONS],
        F.count_if(waited.isNotNull()).alias("publish_to_deliver_n"),
        F.percentile_approx(waited, list(QUANTILES), ACCURACY).alias("_pd"),
        F.count_if(handled.isNotNull()).alias("deliver_to_ack_n"),
        F.percentile_approx(handled, list(QUANTILES), ACCURACY).alias("_da"),
    ]
    quantiles = [F.col(src)[i].cast("bigint").alias(f"{name}_p{int(q * 100)}_ms")
                 for src, name in (("_pd", "publish_to_deliver"), ("_da", "deliver_to_ack"))
                 for i, q in enumerate(QUANTILES)]
    grouped = events.groupBy(*keys).agg(*aggs)
    return grouped.select(*keys, *[c for c in grouped.columns if c not in (*keys, "_pd", "_da")], *quantiles)


# -- where things are kept -------------------------------------------------------------------------------------

def escape_partition(value: str) -> str:
    """A partition value as a directory name, as Spark escapes it (and Spark and pyarrow unescape it):
    ``%XX`` for the characters a path or Hive cannot hold; other characters, non-ASCII too, as they are."""
    special = set('"#%\'*/:=?\\[]^{}') | {chr(c) for c in range(32)} | {"\x7f"}
    return "".join(f"%{ord(c):02X}" if c in special else c for c in value)


def _write_atomically(table: pa.Table, path: Path) -> None:
    """Beside the target, then renamed over it: readers (and a crash) see the old file or the new one.
    The leading dot keeps the half-written file out of Spark's and pyarrow's listings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class TrafficSink:
    """The ``foreachBatch`` function (see the module docstring): ``sink(batch_df, batch_id)``."""

    out: Path
    lookback_ms: int = 5 * MINUTE_MS
    checkpoint: Path | None = None  # checked against OUT/_query.json on the first batch
    on_batch: Callable[[dict[str, Any]], None] | None = None
    batches: int = 0
    events: int = 0
    read_to: dict[str, int] = field(default_factory=dict)
    """The stream's next offset after the last committed micro-batch, as the source reported it (run() keeps it):
    the job has read everything once it reaches the stream's ``next_offset``."""
    first_minute: int | None = None
    last_minute: int | None = None
    interrupted: bool = False
    _claimed: bool = field(default=False, repr=False)

    @property
    def events_dir(self) -> Path:
        return self.out / "events"

    @property
    def traffic_dir(self) -> Path:
        return self.out / "traffic"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        self._claim()
        spark = batch.sparkSession
        events = trace_events(batch).persist()
        try:
            counted = events.groupBy("vhost", "date", "minute").agg(
                F.count(F.lit(1)).alias("n"), F.min("t").alias("lo"), F.max("t").alias("hi"),
                F.max("offset").alias("top")).collect()
            if not counted:
                return
            read = time.time()
            touched = [(r.vhost, r.date, r.minute) for r in counted]
            span = (min(r.lo for r in counted), max(r.hi for r in counted))
            timed = attach_latency(events, lambda lo, hi: self.history(spark, lo, hi, before=batch_id), span,
                                   self.lookback_ms)
            self._write_events(timed.withColumn("batch", F.lit(batch_id).cast("bigint")))
            kept = time.time()
            rows = minute_rows(self.events_of(spark, touched)).toArrow()
            self._replace_minutes(rows, touched)
        finally:
            events.unpersist()
        minutes = [m for _, _, m in touched]
        n = sum(r.n for r in counted)
        self.batches += 1
        self.events += n
        top = max(r.top for r in counted)
        self.first_minute = min(minutes + ([self.first_minute] if self.first_minute is not None else []))
        self.last_minute = max(minutes + ([self.last_minute] if self.last_minute is not None else []))
        done = time.time()
        record = {"batch": batch_id, "events": n, "top_offset": top, "minutes": len(set(minutes)),
                  "started_ms": int(started * 1000),
                  "done_ms": int(done * 1000), "read_s": round(read - started, 3),
                  "events_s": round(kept - read, 3), "minutes_s": round(done - kept, 3)}
        with open(self.out / "_batches.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.on_batch is not None:
            self.on_batch(record)

    # -- the kept events ---------------------------------------------------------------------------------------
    def _write_events(self, timed: DataFrame) -> None:
        """One file per (date, hour, batch); a batch run again replaces its own partitions and no other."""
        (timed.repartition("date").write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
         .partitionBy("date", "hour", "batch").parquet(str(self.events_dir)))

    def read_events(self, spark: SparkSession, lo: int, hi: int) -> DataFrame | None:
        """The kept events of the UTC hours from ``lo`` to ``hi`` (ms; None when none is kept)."""
        paths = [str(self.events_dir / f"date={d}" / f"hour={h}") for d, h in _hours(lo, hi)]
        paths = [p for p in paths if os.path.isdir(p)]
        if not paths:
            return None
        return spark.read.schema(EVENT_SCHEMA).option("basePath", str(self.events_dir)).parquet(*paths)

    def history(self, spark: SparkSession, lo: int, hi: int, before: int) -> DataFrame | None:
        """Kept events of batches before ``before`` with ``lo <= t <= hi`` (a replayed batch must not see
        its own earlier attempt: the same answer either way, but this one is plainly deterministic)."""
        kept = self.read_events(spark, lo, hi)
        if kept is None:
            return None
        return kept.where((F.col("batch") < before) & F.col("t").between(lo, hi))

    def events_of(self, spark: SparkSession, touched: list[tuple[str, str, int]]) -> DataFrame:
        """Every kept event of the touched (vhost, minute)s (the batch just written included)."""
        minutes = sorted({m for _, _, m in touched})
        kept = self.read_events(spark, minutes[0], minutes[-1])
        assert kept is not None, "the batch's events were just written"
        keys = spark.createDataFrame([(v, m) for v, _, m in set(touched)], "vhost STRING, minute BIGINT")
        return (kept.where(F.col("minute").isin(minutes))
                .join(F.broadcast(keys), ["vhost", "minute"], "left_semi"))

    # -- the traffic table -------------------------------------------------------------------------------------
    def partition_file(self, vhost: str, date: str) -> Path:
        return self.traffic_dir / f"vhost={escape_partition(vhost)}" / f"date={date}" / "part-0.parquet"

    def _replace_minutes(self, rows: pa.Table, touched: list[tuple[str, str, int]]) -> None:
        by_file: dict[tuple[str, str], set[int]] = {}
        for vhost, date, minute in touched:
            by_file.setdefault((vhost, date), set()).add(minute)
        for (vhost, date), minutes in sorted(by_file.items()):
            mine = rows.filter(pc.and_(pc.equal(rows["vhost"], vhost), pc.equal(rows["date"], date)))
            new = mine.select(TRAFFIC_SCHEMA.names).cast(TRAFFIC_SCHEMA)
            path = self.partition_file(vhost, date)
            parts = [new]
            if path.exists():
                old = pq.ParquetFile(path).read().cast(TRAFFIC_SCHEMA)
                kept = pc.invert(pc.is_in(pc.cast(old["minute"], pa.int64()), pa.array(sorted(minutes))))
                parts.insert(0, old.filter(kept))
            table = pa.concat_tables(parts).sort_by([("queue", "ascending"), ("minute", "ascending")])
            _write_atomically(table, path)

    # -- one OUT, one checkpoint -------------------------------------------------------------------------------
    def _claim(self) -> None:
        """Refuse an OUT that another checkpoint built (its batch ids would repeat ours: double counts)."""
        if self._claimed or self.checkpoint is None:
            return
        meta = self.checkpoint / "metadata"
        query_id = json.loads(meta.read_text().splitlines()[0])["id"]
        mine = self.out / "_query.json"
        if mine.exists():
            owner = json.loads(mine.read_text())["checkpoint_id"]
            if owner != query_id:
                raise RuntimeError(f"{self.out} was written by the query of another checkpoint ({owner}); "
                                   f"use that checkpoint, or a new --out")
        elif self.events_dir.exists() and any(self.events_dir.iterdir()):
            raise RuntimeError(f"{self.out} holds events but no _query.json: use a new --out")
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            mine.write_text(json.dumps({"checkpoint_id": query_id, "checkpoint": str(self.checkpoint)}) + "\n")
        self._claimed = True


def _hours(lo: int, hi: int) -> list[tuple[str, int]]:
    """The (UTC date, hour) of every hour from ``lo`` to ``hi`` (ms)."""
    epoch = dt.datetime(1970, 1, 1)
    return [((epoch + dt.timedelta(hours=h)).date().isoformat(), h % 24)
            for h in range(lo // HOUR_MS, hi // HOUR_MS + 1)]


# -- the streaming query ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrafficJob:
    """What ``leveret-pipeline traffic`` was asked (cli.py)."""

    uri: str
    stream: str
    out: Path
    management_uri: str | None = None  # the connector's default: http://<amqp host>:15672
    source_options: tuple[tuple[str, str], ...] = ()  # more options of format("leveret")
    checkpoint: Path | None = None  # default OUT/_checkpoint
    once: bool = False  # trigger availableNow: what the stream holds now, then stop
    trigger_seconds: float = 10.0
    lookback_seconds: float = 300.0
    duration: float | None = None  # stop a continuous run after this long (None: until interrupted)
    starting_offsets: str = "earliest"

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint or self.out / "_checkpoint"


def run(spark: SparkSession, job: TrafficJob, on_batch: Callable[[dict[str, Any]], None] | None = None,
        until: Callable[[TrafficSink], bool] | None = None) -> TrafficSink:
    """Run the job until the stream is drained (``once``), ``duration`` passes or ``until(sink)`` says so
    (checked every second; the batch then running is let finish), or KeyboardInterrupt (at once: a batch
    cut short is not committed, the next run does it again); returns the sink, which knows what it wrote.
    ``on_batch`` gets each batch's ``_batches.jsonl`` record."""
    from pyspark_leveret import DefaultSource

    spark.dataSource.register(DefaultSource)  # also found by itself when on the workers' path; this is sure
    job.out.mkdir(parents=True, exist_ok=True)
    sink = TrafficSink(job.out, int(job.lookback_seconds * 1000), job.checkpoint_dir, on_batch)
    reader = (spark.readStream.format("leveret").option("uri", job.uri).option("queue", job.stream)
              .option("startingOffsets", job.starting_offsets))
    if job.management_uri:
        reader = reader.option("managementUri", job.management_uri)
    if not any(key.lower() == "minpartitions" for key, _ in job.source_options):
        # one AMQP consumer per core: a Python task reads a stream at some 10k messages/s
        reader = reader.option("minPartitions", str(spark.sparkContext.defaultParallelism))
    if not any(key.lower() == "headerkeys" for key, _ in job.source_options):
        reader = reader.option("headerKeys", ",".join(TRACE_HEADERS))
    for key, value in job.source_options:
        reader = reader.option(key, value)
    source = reader.load()
    writer = source.writeStream.foreachBatch(sink).option("checkpointLocation", str(job.checkpoint_dir))
    if job.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{job.trigger_seconds} seconds")
    query = writer.start()
    try:
        deadline = None if job.duration is None or job.once else time.monotonic() + job.duration
        while query.isActive and (deadline is None or time.monotonic() < deadline):
            query.awaitTermination(1)  # raises the query's failure
            sink.read_to = _end_offsets(query.lastProgress) or sink.read_to
            if until is not None and until(sink):
                break
        _between_batches(query)
    except KeyboardInterrupt:  # a second Ctrl-C (cli.py), or run() called without handlers: stop at once
        sink.interrupted = True
    finally:
        if query.isActive:
            query.stop()
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(f"the traffic query failed: {failure}")
    return sink


def _end_offsets(progress: Any) -> dict[str, int] | None:
    """The source's end offsets in a query progress report (pyspark_leveret's offsets: queue -> next offset)."""
    if not progress:
        return None
    sources = progress["sources"]
    if not sources:
        return None
    end = sources[0]["endOffset"]
    if isinstance(end, str):
        end = json.loads(end)
    return {str(q): int(v) for q, v in end.items()} if isinstance(end, dict) else None


def _between_batches(query: Any, timeout: float = 600.0) -> None:
    """Wait until no micro-batch runs. Stopping one mid-way is safe (it is not committed, so it runs again
    next time) but wasteful, and Spark then logs the interruption at length."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.2)


# -- reading what the job wrote --------------------------------------------------------------------------------

def read_traffic(out: Path) -> pa.Table:
    """The whole traffic table (vhost and date from the directory names), for the picture and the tests."""
    import pyarrow.dataset as ds

    directory = out / "traffic"
    partitioning = ds.partitioning(pa.schema([("vhost", pa.string()), ("date", pa.string())]), flavor="hive")
    if not directory.exists():
        return TRAFFIC_SCHEMA.empty_table().append_column("vhost", pa.array([], pa.string())).append_column(
            "date", pa.array([], pa.string()))
    return ds.dataset(directory, format="parquet", partitioning=partitioning).to_table()


def summarize(spark: SparkSession, out: Path, first_minute: int, last_minute: int) -> pa.Table:
    """Per (vhost, queue), over the minutes ``first_minute``..``last_minute`` (a run's): the counters and
    the latency quantiles of all those minutes' events together (not quantiles of per-minute quantiles)."""
    sink = TrafficSink(out)
    kept = sink.read_events(spark, first_minute, last_minute + MINUTE_MS - 1)
    if kept is None:
        return pa.table({})
    chosen = kept.where(F.col("minute").between(first_minute, last_minute))
    return traffic_rows(chosen, ("vhost", "queue")).orderBy("vhost", "queue").toArrow()
