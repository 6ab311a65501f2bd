"""The job the standalone-cluster tests submit (``spark-submit --master spark://... leveret_job.py ...``), as
a user would. It runs the phases it is given in order, each under a Spark job group of the phase's name (a
streaming query's jobs: the query named after the phase, its name first in their description), so the test
sees in the REST API which phase runs and kills an executor in it, and writes a JSON report of what
each sink holds, read back through Spark (a parquet sink through its ``_spark_metadata`` log, so only
committed files count).

Phases:

- ``read``: a batch read of stream queue ``--stream`` (``--read-partitions`` tasks, by default ``--partitions``)
  into parquet at ``<out>/read``.
- ``stream``: a streaming query from stream queue ``--stream`` to parquet at ``<out>/stream`` with checkpoint
  ``<out>/stream-checkpoint``, ``trigger(availableNow=True)``, ``--per-trigger`` records per micro-batch.
- ``write``: ``--rows`` rows (bodies ``r<i>``) in ``--partitions`` tasks published into ``--dedup`` through
  the default exchange (a de-duplicating stream: a retried task's repeats are dropped there).
- ``queue``: a streaming query from classic or quorum queue ``--queue`` (the queue source) to parquet at
  ``<out>/queue``, as ``stream``; the rows keep each message's ``message_id``.

At start the job writes ``<report>.started`` (JSON: the application's id and its UI's URL as Spark bound it,
so the test reads the REST API of this application and no other, even if the UI port it asked for was taken),
and after every phase the report so far (``<report>``, replaced atomically), so the test sees a phase end.

``--start-after FILE``: once the SparkContext is up (and ``<report>.started`` written), wait (at most 600 s) for
FILE before the first phase: the test submits the job that restarts a query while the query's first driver
still runs, so that this driver's start-up is not on the lane's clock, and lets it start once it has killed
the first driver.

``--stream-trigger processing``: the ``stream`` phase runs with the default trigger and never ends by itself
(its driver is to be killed mid-query); ``availableNow`` (the default) ends once caught up.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def sink_report(spark: SparkSession, path: str, key: str) -> dict[str, Any]:
    sink = spark.read.parquet(path)
    row = sink.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct(key).alias("distinct"),
                   F.min(key).alias("min"), F.max(key).alias("max")).collect()[0]
    return {"rows": row["rows"], "distinct": row["distinct"], "min": row["min"], "max": row["max"]}


def write_json(path: str, value: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def run_stream(spark: SparkSession, name: str, options: dict[str, str], columns: list[str], out: str,
               checkpoint: str, available_now: bool = True) -> int:
    """A streaming query named ``name``: Spark runs its jobs under a job group of the query's run id and a
    description that starts with the query's name (not under the phase's job group)."""
    df = spark.readStream.format("leveret").options(**options).load()
    writer = (df.select(*columns).writeStream.queryName(name).format("parquet").option("path", out)
              .option("checkpointLocation", checkpoint))
    query = (writer.trigger(availableNow=True) if available_now else writer).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return len([f for f in os.listdir(os.path.join(checkpoint, "commits")) if not f.startswith(".")])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("phases", help="comma-separated: read, stream, write, queue")
    p.add_argument("--uri", required=True)
    p.add_argument("--management-uri", required=True)
    p.add_argument("--stream", help="the stream queue that read and stream read")
    p.add_argument("--dedup", help="the de-duplicating stream that write publishes into")
    p.add_argument("--queue", help="the classic or quorum queue that queue reads")
    p.add_argument("--out", required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--read-partitions", type=int, default=0, help="the read phase's (default: --partitions)")
    p.add_argument("--per-trigger", type=int, default=0)
    p.add_argument("--queue-per-trigger", type=int, default=0, help="the queue phase's (default: --per-trigger)")
    p.add_argument("--rows", type=int, default=0)
    p.add_argument("--report", required=True)
    p.add_argument("--start-after")
    p.add_argument("--stream-trigger", choices=("availableNow", "processing"), default="availableNow")
    a = p.parse_args()

    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("WARN")
    from pyspark_leveret import DefaultSource

    # Spark's own discovery (pkgutil) misses an editable install's import hook: register by hand.
    spark.dataSource.register(DefaultSource)
    conn = {"uri": a.uri, "managementUri": a.management_uri}
    write_json(a.report + ".started", {"app_id": sc.applicationId, "ui": sc.uiWebUrl})
    report: dict[str, Any] = {"app_id": sc.applicationId}
    if a.start_after:
        deadline = time.monotonic() + 600
        while not os.path.exists(a.start_after):
            if time.monotonic() > deadline:
                raise SystemExit(f"{a.start_after} did not appear in 600 s")
            time.sleep(0.1)
    per_trigger = {"maxRecordsPerTrigger": str(a.per_trigger)} if a.per_trigger else {}
    for phase in a.phases.split(","):
        sc.setJobGroup(phase, phase)
        t0 = time.monotonic()
        out = os.path.join(a.out, phase)
        if phase == "read":
            df = spark.read.format("leveret").options(**conn, queue=a.stream, startingOffsets="earliest",
                                                      minPartitions=str(a.read_partitions or a.partitions)).load()
            df.select("offset", "body").write.mode("overwrite").parquet(out)
            sc.setJobGroup(phase + "-report", phase + " report")
            result = sink_report(spark, out, "offset")
        elif phase == "stream":
            opts = {**conn, "queue": a.stream, "startingOffsets": "earliest", "minPartitions": str(a.partitions),
                    **per_trigger}
            batches = run_stream(spark, phase, opts, ["offset", "body"], out, out + "-checkpoint",
                                 available_now=a.stream_trigger == "availableNow")
            sc.setJobGroup(phase + "-report", phase + " report")
            result = {**sink_report(spark, out, "offset"), "batches": batches}
        elif phase == "queue":
            queue_limit = a.queue_per_trigger or a.per_trigger
            opts = {**conn, "queue": a.queue, "minPartitions": str(a.partitions),
                    **({"maxRecordsPerTrigger": str(queue_limit)} if queue_limit else {})}
            batches = run_stream(spark, phase, opts, ["offset", "body", "properties.message_id"], out,
                                 out + "-checkpoint")
            sc.setJobGroup(phase + "-report", phase + " report")
            result = {**sink_report(spark, out, "message_id"), "batches": batches}
        elif phase == "write":
            rows = (spark.range(a.rows, numPartitions=a.partitions)
                    .select(F.concat(F.lit("r"), F.col("id").cast("string")).alias("body")))
            rows.write.format("leveret").mode("append").options(uri=a.uri, exchange="",
                                                                  routingKey=a.dedup).save()
            result = {}
        else:
            raise SystemExit(f"unknown phase {phase!r}")
        result["seconds"] = round(time.monotonic() - t0, 2)
        report[phase] = result
        write_json(a.report, report)
    spark.stop()


if __name__ == "__main__":
    main()
