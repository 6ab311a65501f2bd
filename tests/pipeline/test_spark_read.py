"""The read side end to end in Spark (one local[2] session for the run): a batch read, a streaming query
stopped and resumed from its checkpoint, a crash between a batch's write and its commit, and retention
removing offsets a checkpoint still needs. Every query is ``trigger(availableNow=True)`` and is stopped in
``finally``; none calls ``spark.dataSource.register``: format("leveret") is found through the installed
``pyspark_leveret`` module (Spark's auto-registration), which these tests therefore cover too.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark_leveret.progress import offsets_behind_latest
from pyspark_leveret.schema import READ_STRUCT
from read_helpers import declare_stream, fill, instant_between, read_options, stream_info

pytestmark = [pytest.mark.spark, pytest.mark.leveret_only, pytest.mark.timeout(180)]


def run_stream(spark, options: dict[str, str], out: Path, checkpoint: Path):
    """One availableNow run of a leveret → parquet query; returns it (terminated)."""
    query = (spark.readStream.format("leveret").options(**options).load()
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(90)
    finally:
        query.stop()
    return query


def sink_offsets(spark, out: Path) -> list[int]:
    """The offsets in the parquet sink, as Spark reads it (through the sink's _spark_metadata log)."""
    return sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())


def test_batch_read_with_offsets_and_auto_registration(spark, broker, uid):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 120)
    df = spark.read.format("leveret").options(**read_options(broker, queue=q)).load()
    assert df.schema == READ_STRUCT
    assert df.count() == 120
    ranged = (spark.read.format("leveret")
              .options(**read_options(broker, queue=q, startingOffsets=15, endingOffsets=f'{{"{q}": 60}}',
                                      maxRecordsPerPartition=20, bodyAs="string"))
              .load())
    assert ranged.rdd.getNumPartitions() == 3
    rows = ranged.select("offset", "body", "routing_key").orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(15, 60))
    assert rows[0].body == "m15" and rows[-1].routing_key == q
    # Nothing to read: no partitions (Spark then reads one placeholder partition).
    assert spark.read.format("leveret").options(**read_options(broker, queue=q, startingOffsets="latest")) \
        .load().count() == 0


def test_stream_stop_and_resume_from_checkpoint(spark, broker, uid, tmp_path):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 30)
    opts = read_options(broker, queue=q, startingOffsets="earliest", maxRecordsPerTrigger=12,
                        consumerGroup="spark-test")
    out, ck = tmp_path / "out", tmp_path / "ck"
    first = run_stream(spark, opts, out, ck)
    assert first.exception() is None
    # 12 + 12 + 6: the read limit holds under availableNow (SupportsTriggerAvailableNow).
    assert sorted(f for f in os.listdir(ck / "commits") if not f.startswith(".")) == ["0", "1", "2"]
    assert sink_offsets(spark, out) == list(range(30))
    fill(broker, q, 20, start=30)
    second = run_stream(spark, opts, out, ck)
    assert second.exception() is None
    assert sink_offsets(spark, out) == list(range(50))  # no duplicate, no gap
    # The query's progress shows as the group's lag. Spark hands a source the end of a batch when it plans
    # the next one, so the group trails by a batch: run 2 read 30..41 and 42..49, its last commit was 42.
    groups = {g["name"]: g for g in stream_info(broker, q)["consumer_groups"]}
    assert groups["spark-test"]["committed_offset"] == 42 and groups["spark-test"]["lag"] == 8


def test_crash_before_commit_replays_the_batch_once(spark, broker, uid, tmp_path):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 25)
    opts = read_options(broker, queue=q, startingOffsets="earliest", maxRecordsPerTrigger=10)
    out, ck = tmp_path / "out", tmp_path / "ck"
    assert run_stream(spark, opts, out, ck).exception() is None
    # The crash: batch 2 (offsets 20..24) reached the sink, its commit did not.
    assert (ck / "commits" / "2").exists()
    (ck / "commits" / "2").unlink()
    (ck / "commits" / ".2.crc").unlink()
    fill(broker, q, 15, start=25)
    assert run_stream(spark, opts, out, ck).exception() is None
    assert sink_offsets(spark, out) == list(range(40))
    assert (ck / "commits" / "2").exists()


def test_retention_data_loss_fails_the_query_unless_allowed(spark, broker, uid, tmp_path):
    q = declare_stream(broker, f"{uid}-s", **{"x-stream-max-segment-size-bytes": 4000,
                                              "x-max-length-bytes": 12000})
    fill(broker, q, 10, size=500)
    opts = read_options(broker, queue=q, startingOffsets="earliest")
    out, ck = tmp_path / "out", tmp_path / "ck"
    assert run_stream(spark, opts, out, ck).exception() is None
    assert sink_offsets(spark, out) == list(range(10))
    fill(broker, q, 200, start=10, size=500)  # retention now removes the segments holding 10 and after
    deadline = time.monotonic() + 10
    while stream_info(broker, q)["first_offset"] <= 10:
        assert time.monotonic() < deadline, "retention removed nothing"
        time.sleep(0.05)
    first = stream_info(broker, q)["first_offset"]
    # The 30 s retention timer may remove one more segment at any moment (the appends after the last segment
    # roll put the stream over its limit again), so the first offset the queries see is bounded, not fixed:
    # at least ``first`` and at most what the stream reports once both queries are done.
    with pytest.raises(StreamingQueryException) as failed:
        run_stream(spark, opts, out, ck)
    lost = re.search(r"offsets 10\.\.(\d+) are no longer in the stream", str(failed.value))
    assert lost, str(failed.value)
    lenient = run_stream(spark, {**opts, "failOnDataLoss": "false"}, out, ck)
    assert lenient.exception() is None
    last_first = stream_info(broker, q)["first_offset"]
    assert first <= int(lost.group(1)) + 1 <= last_first
    got = sink_offsets(spark, out)
    resumed = got[10] if len(got) > 10 else 210
    assert first <= resumed <= last_first, (first, resumed, last_first)
    assert got == list(range(10)) + list(range(resumed, 210))


def test_stream_starts_at_a_timestamp(spark, broker, uid, tmp_path):
    """startingTimestamp through Spark: the driver's reader asks the broker which offset the instant names
    (test_reader_timestamps.py has the forms and the edge cases)."""
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 15)
    at = instant_between()
    fill(broker, q, 10, start=15)
    opts = read_options(broker, queue=q, startingTimestamp=at)
    out, ck = tmp_path / "out", tmp_path / "ck"
    assert run_stream(spark, opts, out, ck).exception() is None
    assert sink_offsets(spark, out) == list(range(15, 25))


def test_lag_metrics_from_the_progress(spark, broker, uid, tmp_path):
    """Kafka's min/max/avgOffsetsBehindLatest of each micro-batch, from its progress report: two queues of 20
    and 10 messages, 15 records per trigger (shared 10 : 5), so batch 0 ends 10 and 5 behind and batch 1
    catches up. Spark leaves a Python source's own ``metrics`` empty (progress.py says why)."""
    a, b = declare_stream(broker, f"{uid}-a"), declare_stream(broker, f"{uid}-b")
    fill(broker, a, 20)
    fill(broker, b, 10)
    opts = read_options(broker, queues=f"{a},{b}", startingOffsets="earliest", maxRecordsPerTrigger=15)
    query = run_stream(spark, opts, tmp_path / "out", tmp_path / "ck")
    assert query.exception() is None
    sources = [p.sources[0] for p in query.recentProgress if p.numInputRows > 0]
    assert [json.loads(s.latestOffset) for s in sources] == [{a: 20, b: 10}] * 2  # reportLatestOffset
    assert [offsets_behind_latest(s) for s in sources] == [
        {"minOffsetsBehindLatest": "5", "maxOffsetsBehindLatest": "10", "avgOffsetsBehindLatest": "7.5"},
        {"minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "0.0"},
    ]
    assert all(s.metrics == {} for s in sources)
    assert offsets_behind_latest(json.loads(sources[0].json)) == offsets_behind_latest(sources[0])
    assert offsets_behind_latest({"endOffset": None, "latestOffset": None}) == {}
