"""The traffic job: the trace stream in (``format("leveret")``), per vhost, queue and minute traffic and
latency out, as parquet, exactly once across restarts.

Why ``foreachBatch`` and not Spark's file sink with a watermark: a minute's row must change as more of that
minute arrives — the current minute in every micro-batch, an earlier one when an event comes late — and a
``--once`` run (trigger availableNow) must write the minutes it has seen, the last one included. The file sink
only appends: it would hold every minute back until a watermark passes it, and an availableNow run, whose
watermark never moves past its own last events, would never write its last minutes. So each micro-batch:

1. turns its trace rows into *events* (one row per event and queue: a publish counts for every queue it
   reached, its ``routed_queues``) and pairs them on (vhost, queue, ``x-leveret-message-id``) for the
   publish→deliver and deliver→ack latencies: inside the batch, and with the *state* the batch before left —
   the starts not yet paired (at most ``lookback`` old) and the deliveries and acks still waiting for a start
   traced after them (the "latency" comment below). The lookback is this job's watermark: a latency longer
   than it is not measured (the events still count);
2. sums what it saw per (vhost, minute, queue) into *parts* — counters and an exact histogram of the latency
   samples — one file per (vhost, minute) it touched, named by the batch (minute_parts.py), and writes the
   state it leaves (``_state/batch=N/``);
3. merges every (vhost, minute) it touched from all that minute's parts (a few files: one per batch that
   saw it), and replaces the rows of those minutes in ``traffic/vhost=V/date=D/part-0.parquet`` (written
   beside it, then renamed: a reader sees the old file or the new one, never half of one).

With ``keep_events`` (``--keep-events``) it also writes every event with its latency to
``events/date=D/hour=H/batch=N/`` (dynamic partition overwrite: a replay of batch N replaces exactly its files).

Exactly-once: Spark writes ``offsets/N`` before batch N and ``commits/N`` after this function returns; a batch
that did not commit is run again with the same offsets, so the same rows, and from the same state (the latest
one written by a batch before N: no batch after N has run). Its parts, its state and its events are named by
its id and replace their earlier attempt, and step 3 is a function of the parts, so running a batch twice
leaves what running it once leaves, and nothing is counted twice. A checkpoint that is not the one ``OUT`` was
built with (deleted, or another one) would number its batches from 0 again and count the stream twice: the
job refuses to start on it (``_query.json``). The state is the messages in flight, bounded by the lookback; the
parts and the traffic table are the job's history, and their retention is the operator's (delete old
``parts/…/date=…`` dirs once their day is complete). ``OUT`` is a local directory.

Why the state and the parts (2026-11-30, issue 36): the job paired each batch with the kept events of the
whole lookback (4.5 M events at 5,000 messages/s) and recomputed each touched minute from its events (up to
900,000), both read again every 10 s; a batch's work now follows its own events.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from leveret_pipeline.minute_parts import (
    REASONS,
    TRAFFIC_SCHEMA,
    escape_partition,
    merge,
    read_minute,
    read_minutes,
    traffic_table,
    write_atomically,
    write_parts,
)

EVENT_TIME = "x-leveret-event-time"
MESSAGE_ID = "x-leveret-message-id"
KINDS = ("publish", "deliver", "ack", "deadletter")
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
# The trace headers trace_events reads: the connector decodes only these (option headerKeys), stepping over the
# rest of each event's headers (its exchange, routing keys, the message's properties as a nested table, node,
# connection, channel, user), which were most of the read's CPU.
TRACE_HEADERS = ("vhost", "routed_queues", EVENT_TIME, MESSAGE_ID, "reason", "redelivered")

# The kept events' table (--keep-events; the partition columns date and batch included: a read should state
# them, so that Spark does not infer ``date`` as a DATE and compare it to strings).
EVENT_SCHEMA = (
    "vhost STRING, queue STRING, kind STRING, message_id STRING, t BIGINT, minute BIGINT, reason STRING, "
    "redelivered BOOLEAN, bytes BIGINT, offset BIGINT, publish_to_deliver_ms BIGINT, deliver_to_ack_ms BIGINT, "
    "date STRING, hour INT, batch BIGINT"
)

# -- trace rows → events ---------------------------------------------------------------------------------------

def string_array(rendered: Any) -> Any:
    """An AMQP array header (``routing_keys``, ``routed_queues``) as the connector renders it into its
    string map: a JSON array."""
    return F.from_json(rendered, "array<string>")


def _minute_and_date(t: str) -> list[Any]:
    """The UTC date (text) and minute start (ms) of the time column ``t``."""
    return [F.expr(f"cast(date_from_unix_date(cast(floor({t} / {DAY_MS}) as int)) as string)").alias("date"),
            (F.col(t) - F.pmod(t, F.lit(MINUTE_MS))).alias("minute")]


def trace_events(trace: DataFrame) -> DataFrame:
    """The connector's rows of a trace stream → one row per event and queue (no latency yet).

    The queue of a publish is each queue it reached (``routed_queues``; a publish that reached none has no
    row); of the other kinds, the routing key after its first dot (queue names may hold dots). The time is
    the broker's ``x-leveret-event-time``, else the message timestamp. Columns: vhost, queue, kind,
    message_id, t, reason, redelivered, bytes, offset — the minute, date and hour (UTC) are derived where
    they are used (:func:`with_time_columns`): the batch's events are cached, and without those three
    columns (the date a text) a batch costs 9–22 % less Spark CPU (bench/RESULTS.md, 2026-12-01).
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
        "reason", "redelivered", "bytes", "offset",
    )


def with_time_columns(events: DataFrame) -> DataFrame:
    """trace_events' rows with their UTC ``minute`` (ms), ``date`` (text) and ``hour`` (0–23)."""
    return events.select("*", *_minute_and_date("t"),
                         F.pmod(F.floor(F.col("t") / HOUR_MS), F.lit(24)).cast("int").alias("hour"))


# -- latency ---------------------------------------------------------------------------------------------------
#
# A latency is a pair of events of one message in one queue: (publish, its first delivery) and (a delivery,
# the ack after it). The sample is recorded on the pair's member that arrived *second* in the stream, in
# the batch where it arrived, so each pair is counted once however the batches cut the stream. Usually that
# is the delivery (or the ack); but Leveret hands a message to a waiting consumer inside the publish call and
# traces the publish after it (the trace needs ``routed_queues``), so the delivery of such a message comes
# first in the stream, up to a few ms earlier in event time, and its publish event carries the sample.
#
# What a batch needs of the batches before it is small, and kept as the job's *state* (``_state/batch=N``,
# written by batch N from the state before it and its own events): the *open starts* — the latest publish
# and delivery of each (vhost, queue, message) not yet paired, for at most ``lookback`` — and the *waiting
# targets*, deliveries and acks not yet paired, for ``SLACK_MS``, in case their start was traced after them.
# A start ends one interval: once paired it is closed (a message's first delivery in a queue closes its
# publish there; an ack closes the delivery it follows; within a batch, the first target in the stream wins).
# In steady traffic the state is the messages in flight, not the lookback's events: the batch joins its events
# with that, not with minutes of history.

LATENCY_OF = {"publish": "publish_to_deliver", "deliver": "deliver_to_ack"}  # a LATENCIES name, by the start's kind
SLACK_MS = 1_000  # how much later than its delivery a publish may be traced (same call: ms)
STATE_SCHEMA = ("role STRING, vhost STRING, queue STRING, message_id STRING, after STRING, t BIGINT, "
                "offset BIGINT")  # role: "start" (after = its own kind) or "target" (after = the kind it needs)


def _items(events: DataFrame) -> DataFrame:
    """The batch's events that start or end an interval, as (vhost, queue, message_id, start, target): a
    publish or any delivery starts one; a first delivery (after its publish: a redelivery's wait includes
    the failed attempt, so it is not a queueing latency) or an ack (after the latest delivery of that message
    from that queue) ends one. A first delivery does both."""
    kind = F.col("kind")

    def item(after: Any) -> Any:  # (t, offset) first: array_max picks the latest start, ties the later offset
        return F.struct(F.col("t"), F.col("offset"), after.alias("after"), F.lit(True).alias("new"))

    ends = ((kind == "deliver") & ~F.col("redelivered")) | (kind == "ack")
    return events.where(F.col("message_id").isNotNull()).select(
        "vhost", "queue", "message_id",
        F.when(kind.isin(*LATENCY_OF), item(kind)).alias("start"),
        F.when(ends, item(F.when(kind == "deliver", "publish").otherwise("deliver"))).alias("target"))


def _state_items(state: DataFrame) -> DataFrame:
    def item(role: str) -> Any:
        return F.when(F.col("role") == role, F.struct("t", "offset", "after", F.lit(False).alias("new")))

    return state.select("vhost", "queue", "message_id", item("start").alias("start"), item("target").alias("target"))


def pair(events: DataFrame, state: DataFrame | None, lookback_ms: int) -> DataFrame:
    """The batch's pairs and what it leaves open, per (vhost, queue, message): one shuffle of the batch's
    starts and targets with the state's, then array functions inside each message's group (a few events).

    Columns: vhost, queue, message_id; ``samples`` (array of (on_t, on, after, latency): the offset and time
    of the row that carries the sample — the member that came second — the start's kind, the latency, never
    below 0); ``open`` (the latest unpaired start of each kind); ``waiting`` (the unpaired targets).

    A target pairs with the latest start of the same message, queue and kind at most ``lookback_ms`` before
    it (or ``SLACK_MS`` after it: traced late) — a redelivered message's ack pairs with its last delivery. A
    new target looks among the new and the open starts; a waiting target, already compared with everything
    before, among the new starts only. A start pairs with at most one target, the first in the stream, and
    is then closed.
    """
    items = _items(events)
    if state is not None:
        items = items.unionByName(_state_items(state))
    grouped = items.groupBy("vhost", "queue", "message_id").agg(
        F.collect_list("start").alias("S"), F.collect_list("target").alias("X"))
    within = (f"s.after = x.after AND s.t <= x.t + {SLACK_MS} AND s.t >= x.t - {lookback_ms}")
    found = (f"filter(transform(filter(X, x -> x.new), x -> named_struct('x', x, 'best', "
             f"array_max(filter(S, s -> {within})))), p -> p.best IS NOT NULL)")
    late = (f"filter(transform(filter(X, x -> NOT x.new), x -> named_struct('x', x, 'best', "
            f"array_max(filter(S, s -> s.new AND {within})))), p -> p.best IS NOT NULL)")
    sample = ("named_struct('on_t', {on}.t, 'on', {on}.offset, 'after', p.x.after, "
              "'latency', greatest(p.x.t - p.best.t, 0), 'start', p.best.offset, 'target', p.x.offset)")
    # A start pairs with one target: the first of its candidates in the stream (a message's first delivery
    # from a queue; a stream's second consumer's is not a first one) — the same whether or not the batches cut
    # between them, as a start closes once paired.
    candidates = (f"concat(transform({late}, p -> {sample.format(on='p.best')}), "
                  f"transform({found}, p -> {sample.format(on='p.x')}))")
    # (SQL names are case-blind: a column named like a lambda's variable would be shadowed inside it.)
    paired = grouped.select("vhost", "queue", "message_id", "S", "X", F.expr(candidates).alias("candidates")).select(
        "vhost", "queue", "message_id", "S", "X",
        F.expr("filter(candidates, q -> NOT exists(candidates, r -> r.start = q.start AND r.target < q.target))"
               ).alias("samples"))
    open_starts = "filter(S, s -> NOT array_contains(transform(samples, p -> p.start), s.offset))"
    latest = ", ".join(f"array_max(filter({open_starts}, s -> s.after = '{kind}'))" for kind in LATENCY_OF)
    return paired.select(
        "vhost", "queue", "message_id",
        F.expr("transform(samples, p -> named_struct('on_t', p.on_t, 'on', p.on, 'after', p.after, "
               "'latency', p.latency))").alias("samples"),
        F.expr(f"filter(array({latest}), s -> s IS NOT NULL)").alias("open"),
        F.expr("filter(X, x -> NOT array_contains(transform(samples, p -> p.target), x.offset))").alias("waiting"))


def next_state(paired: DataFrame, earliest_t: int, lookback_ms: int) -> DataFrame:
    """The state after a batch (``earliest_t``: its earliest event time): the open starts a later target may
    still reach (at most the lookback before the batch's events), the waiting targets a start traced after
    them may still reach (at most ``SLACK_MS`` before them). From the earliest time, not the latest: one
    event stamped ahead by a skewed clock must not evict what every other message still waits for."""
    def rows(column: str, role: str, since: int) -> DataFrame:
        return paired.select("vhost", "queue", "message_id", F.explode(column).alias("i")).where(
            F.col("i.t") >= F.lit(since)).select(
            F.lit(role).alias("role"), "vhost", "queue", "message_id", "i.after", "i.t", "i.offset")

    return rows("open", "start", earliest_t - lookback_ms).unionByName(
        rows("waiting", "target", earliest_t - SLACK_MS))


def samples(paired: DataFrame) -> DataFrame:
    """One row per sample: (vhost, queue, on_t, on, after, latency)."""
    return paired.select("vhost", "queue", F.explode("samples").alias("p")).select(
        "vhost", "queue", "p.on_t", "p.on", "p.after", "p.latency")


def timed_events(events: DataFrame, paired: DataFrame) -> DataFrame:
    """The batch's events with ``publish_to_deliver_ms`` and ``deliver_to_ack_ms`` (null where the row
    carries no sample): the kept events' rows (--keep-events)."""
    per_row = samples(paired).groupBy(F.col("on").alias("offset"), "queue").agg(
        *[F.max(F.when(F.col("after") == after, F.col("latency"))).alias(f"{name}_ms")
          for after, name in LATENCY_OF.items()])
    return with_time_columns(events).join(per_row, ["offset", "queue"], "left")


# -- a batch's minute parts (minute_parts.py) --------------------------------------------------------------------

PART_KEYS = ("vhost", "date", "minute", "queue")


def batch_parts(events: DataFrame, paired: DataFrame) -> DataFrame:
    """A batch's parts, long: (vhost, date, minute, queue, measure, latency_ms, n) — a COUNTERS row per
    counter (latency_ms null) and a histogram bin per distinct latency of each LATENCIES measure, on the
    minute of the row that carries the sample — with the rows' earliest event time and greatest offset (lo,
    top: the batch's figures). One aggregation: each event contributes its counters."""
    kind, one = F.col("kind"), F.lit(1).cast("bigint")

    def counter(cond: Any, name: Any, value: Any = one) -> Any:
        measure = F.lit(name) if isinstance(name, str) else name
        return F.when(cond, F.struct(measure.alias("measure"), value.alias("v")))

    contributions = F.array(
        counter(kind == "publish", "published"), counter(kind == "publish", "published_bytes", F.col("bytes")),
        counter(kind == "deliver", "delivered"), counter(kind == "deliver", "delivered_bytes", F.col("bytes")),
        counter((kind == "deliver") & F.col("redelivered"), "redelivered"),
        counter(kind == "ack", "acked"), counter(kind == "deadletter", "dead_lettered"),
        counter((kind == "deadletter") & F.col("reason").isin(*REASONS),
                F.concat(F.lit("dead_lettered_"), F.col("reason"))),
    )
    counted = events.select("vhost", *_minute_and_date("t"), "queue", "t", "offset",
                            F.explode(contributions).alias("c")).where(F.col("c").isNotNull()).select(
        *PART_KEYS, "c.measure", F.lit(None).cast("bigint").alias("latency_ms"), "c.v", "t", "offset")
    bins = samples(paired).select(
        "vhost", *_minute_and_date("on_t"), "queue",
        F.create_map(*[F.lit(x) for kv in LATENCY_OF.items() for x in kv])[F.col("after")].alias("measure"),
        F.col("latency").alias("latency_ms"), one.alias("v"), F.col("on_t").alias("t"), F.col("on").alias("offset"))
    return counted.unionByName(bins).groupBy(*PART_KEYS, "measure", "latency_ms").agg(
        F.sum("v").alias("n"), F.min("t").alias("lo"), F.max("offset").alias("top"))


# -- the sink --------------------------------------------------------------------------------------------------

@dataclass
class TrafficSink:
    """The ``foreachBatch`` function (see the module docstring): ``sink(batch_df, batch_id)``."""

    out: Path
    lookback_ms: int = 5 * MINUTE_MS
    checkpoint: Path | None = None  # checked against OUT/_query.json on the first batch
    on_batch: Callable[[dict[str, Any]], None] | None = None
    keep_events: bool = False  # also write every event, with its latency, to OUT/events (one more Spark job)
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

    @property
    def parts_dir(self) -> Path:
        return self.out / "parts"

    @property
    def state_dir(self) -> Path:
        return self.out / "_state"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        self._claim()
        spark = batch.sparkSession
        events = trace_events(batch).persist()
        before = self._state_before(batch_id)
        paired = pair(events, self._read_state(spark, before), self.lookback_ms).persist()
        try:
            parts = batch_parts(events, paired).toArrow()
            if parts.num_rows == 0:
                return
            read = time.time()
            figure = _figures(parts)
            if self.keep_events:
                self._write_events(timed_events(events, paired).withColumn("batch", F.lit(batch_id).cast("bigint")))
            self._write_state(next_state(paired, figure["lo"], self.lookback_ms), batch_id, before)
            kept = time.time()
            write_parts(self.parts_dir, parts, batch_id)
            touched = sorted(figure["touched"])
            self._replace_minutes(touched)
        finally:
            paired.unpersist()
            events.unpersist()
        minutes = [m for _, _, m in touched]
        n = figure["events"]
        self.batches += 1
        self.events += n
        self.first_minute = min(minutes + ([self.first_minute] if self.first_minute is not None else []))
        self.last_minute = max(minutes + ([self.last_minute] if self.last_minute is not None else []))
        done = time.time()
        record = {"batch": batch_id, "events": n, "top_offset": figure["top"], "minutes": len(set(minutes)),
                  "started_ms": int(started * 1000),
                  "done_ms": int(done * 1000), "read_s": round(read - started, 3),
                  "events_s": round(kept - read, 3), "minutes_s": round(done - kept, 3)}
        with open(self.out / "_batches.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.on_batch is not None:
            self.on_batch(record)

    # -- the state between batches -----------------------------------------------------------------------------
    def _state_before(self, batch_id: int) -> int | None:
        """The batch whose state this one starts from: the latest before it that wrote one (a batch without
        trace events writes none). A batch run again finds the same one: no later batch has run."""
        ids = [int(p.name.partition("=")[2]) for p in self.state_dir.glob("batch=*")] if self.state_dir.is_dir() else []
        earlier = [i for i in ids if i < batch_id]
        return max(earlier) if earlier else None

    def _read_state(self, spark: SparkSession, before: int | None) -> DataFrame | None:
        if before is None:
            return None
        return spark.read.schema(STATE_SCHEMA).parquet(str(self.state_dir / f"batch={before}"))

    def _write_state(self, state: DataFrame, batch_id: int, before: int | None) -> None:
        """State N written (Spark replaces the directory when batch N runs again); the states before the one
        N started from are no longer needed by any run of any batch."""
        state.coalesce(1).write.mode("overwrite").parquet(str(self.state_dir / f"batch={batch_id}"))
        if before is not None:
            for old in self.state_dir.glob("batch=*"):
                if int(old.name.partition("=")[2]) < before:
                    shutil.rmtree(old, ignore_errors=True)

    # -- the kept events (--keep-events) -----------------------------------------------------------------------
    def _write_events(self, timed: DataFrame) -> None:
        """One file per (date, hour, batch); a batch run again replaces its own partitions and no other."""
        (timed.repartition("date").write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
         .partitionBy("date", "hour", "batch").parquet(str(self.events_dir)))

    # -- the traffic table -------------------------------------------------------------------------------------
    def partition_file(self, vhost: str, date: str) -> Path:
        return self.traffic_dir / f"vhost={escape_partition(vhost)}" / f"date={date}" / "part-0.parquet"

    def _replace_minutes(self, touched: list[tuple[str, str, int]]) -> None:
        """Each touched minute merged from all its parts, its rows replacing that minute's in its file."""
        by_file: dict[tuple[str, str], set[int]] = {}
        for vhost, date, minute in touched:
            by_file.setdefault((vhost, date), set()).add(minute)
        for (vhost, date), minutes in sorted(by_file.items()):
            parts = [traffic_table(merge(read_minute(self.parts_dir, vhost, date, m), ["queue"]), m)
                     for m in sorted(minutes)]
            path = self.partition_file(vhost, date)
            if path.exists():
                old = pq.ParquetFile(path).read().cast(TRAFFIC_SCHEMA)
                kept = pc.invert(pc.is_in(pc.cast(old["minute"], pa.int64()), pa.array(sorted(minutes))))
                parts.insert(0, old.filter(kept))
            table = pa.concat_tables(parts).sort_by([("queue", "ascending"), ("minute", "ascending")])
            write_atomically(table, path)

    # -- one OUT, one checkpoint -------------------------------------------------------------------------------
    def _claim(self) -> None:
        """Refuse an OUT that another checkpoint built (its batch ids would repeat ours: double counts)."""
        if self._claimed or self.checkpoint is None:
            return
        meta = self.checkpoint / "metadata"
        query_id = json.loads(meta.read_text().splitlines()[0])["id"]
        mine = self.out / "_query.json"
        if self.traffic_dir.exists() and not self.parts_dir.exists():
            # Written before the parts (an earlier leveret-pipeline): its minutes would be rebuilt from the new
            # batches' parts alone, forgetting what the earlier batches counted.
            raise RuntimeError(f"{self.out} was written by an earlier leveret-pipeline (no parts/): use a new "
                               f"--out (and a new checkpoint)")
        if mine.exists():
            owner = json.loads(mine.read_text())["checkpoint_id"]
            if owner != query_id:
                raise RuntimeError(f"{self.out} was written by the query of another checkpoint ({owner}); "
                                   f"use that checkpoint, or a new --out")
        elif any(d.exists() and any(d.iterdir()) for d in (self.parts_dir, self.events_dir)):
            raise RuntimeError(f"{self.out} holds a job's output but no _query.json: use a new --out")
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            mine.write_text(json.dumps({"checkpoint_id": query_id, "checkpoint": str(self.checkpoint)}) + "\n")
        self._claimed = True


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
    keep_events: bool = False  # also write every event with its latency to OUT/events

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
    sink = TrafficSink(job.out, int(job.lookback_seconds * 1000), job.checkpoint_dir, on_batch,
                       keep_events=job.keep_events)
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


def summarize(out: Path, first_minute: int, last_minute: int) -> pa.Table:
    """Per (vhost, queue), over the minutes ``first_minute``..``last_minute`` (a run's): the counters and
    the latency quantiles of all those minutes' samples together (their parts' histograms merged, not
    quantiles of per-minute quantiles)."""
    rows = merge(read_minutes(out / "parts", first_minute, last_minute), ["vhost", "queue"])
    return pa.Table.from_pylist(rows) if rows else pa.table({})


def _figures(parts: pa.Table) -> dict[str, Any]:
    """A batch's parts (batch_parts) → its events, earliest event time, greatest offset and touched
    (vhost, date, minute)s."""
    kinds = pc.is_in(parts["measure"], pa.array(["published", "delivered", "acked", "dead_lettered"]))
    return {"events": pc.sum(parts.filter(kinds)["n"]).as_py(), "lo": pc.min(parts["lo"]).as_py(),
            "top": pc.max(parts["top"]).as_py(),
            "touched": set(zip(*(parts[c].to_pylist() for c in ("vhost", "date", "minute")), strict=True))}
