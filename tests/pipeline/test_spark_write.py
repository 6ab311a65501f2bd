"""df.write / writeStream .format("leveret") end to end: a real SparkSession (local[2, 4], so a failed task is
retried), a real broker, the rows read back with pika. Few tests, each a few seconds once Spark is warm; the
column mapping and the failure paths are covered without a JVM in test_writer_mapping.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

DEDUP_HEADER = "x-deduplication-header"


@pytest.fixture(autouse=True)
def registered(spark):
    """Spark's own discovery of ``pyspark_leveret`` (pkgutil.iter_modules) misses a setuptools editable
    install, whose import hook it cannot list; registering by hand is the documented other way."""
    from pyspark_leveret import DefaultSource

    spark.dataSource.register(DefaultSource)


@pytest.fixture
def channel(broker):
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def read_stream(broker, queue: str, quiet: float = 1.0, timeout: float = 30.0) -> list[tuple[pika.BasicProperties, bytes]]:
    """A stream queue from its first offset until nothing new arrives for ``quiet`` seconds."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        out = []
        deadline = time.monotonic() + timeout
        for method, props, body in ch.consume(queue, arguments={"x-stream-offset": "first"},
                                              inactivity_timeout=quiet):
            if method is None or time.monotonic() > deadline:
                break
            out.append((props, body))
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
        return out
    finally:
        conn.close()


def queue_depth(broker, queue: str) -> int:
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def test_batch_write_into_a_stream(spark, broker, channel, uid):
    channel.queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    df = spark.range(0, 1000, numPartitions=2).selectExpr(
        "CAST(id AS STRING) AS body", "map('n', CAST(id AS STRING)) AS headers",
        "CAST(id % 10 AS INT) AS priority")
    df.write.format("leveret").option("uri", broker.url).option("routingKey", uid) \
        .option("contentType", "text/plain").mode("append").save()
    got = read_stream(broker, uid)
    assert sorted(int(body) for _, body in got) == list(range(1000))
    ids = set()
    for props, body in got:
        assert props.headers["n"] == body.decode()
        assert (props.priority, props.content_type, props.delivery_mode) == (int(body) % 10, "text/plain", 2)
        assert props.headers[DEDUP_HEADER] == props.message_id
        job, partition, seq = props.message_id.split(":")
        assert len(job) == 32 and partition in ("0", "1") and 0 <= int(seq) < 1000
        ids.add(props.message_id)
    assert len(ids) == 1000
    assert len({p.message_id.split(":")[0] for p, _ in got}) == 1  # one job id for all tasks

    with pytest.raises(Exception, match="cannot overwrite"):
        df.write.format("leveret").option("uri", broker.url).mode("overwrite").save()
    # Spark itself allows Python data sources only append and overwrite; the default mode is refused
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("leveret").option("uri", broker.url).save()


def test_stream_write_from_files_with_available_now(spark, broker, channel, uid, tmp_path: Path):
    """Two availableNow runs from one checkpoint: the second publishes only the new file, under batch id 1."""
    channel.queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.json").write_text("".join(json.dumps({"body": f"a{i}", "key": uid}) + "\n" for i in range(50)))

    def run() -> str:
        q = (spark.readStream.schema("body STRING, key STRING").json(str(src))
             .selectExpr("body", "key AS routing_key")
             .writeStream.format("leveret").option("uri", broker.url)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
        try:
            assert q.awaitTermination(120), "the availableNow run did not finish"
            assert q.exception() is None
            return q.id
        finally:
            q.stop()

    query_id = run()
    (src / "b.json").write_text("".join(json.dumps({"body": f"b{i}", "key": uid}) + "\n" for i in range(30)))
    assert run() == query_id  # same checkpoint, same query
    got = read_stream(broker, uid)
    assert sorted(b.decode() for _, b in got) == sorted([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(30)])
    for props, body in got:
        qid, batch, _partition, _seq = props.message_id.split(":")
        assert qid == query_id
        assert batch == ("0" if body.startswith(b"a") else "1")
    assert len({p.message_id for p, _ in got}) == 80


def test_a_retried_task_adds_no_duplicate(spark, broker, channel, uid):
    """Partition 0's first attempt fails after the writer has published (and the broker holds) its first
    rows; Spark runs the task again, which republishes them under the same keys. Into a fanout: a stream
    declared with x-message-deduplication (the target) and a plain queue (the witness, which keeps every
    copy and so shows that the retry really repeated rows)."""
    from pyspark import TaskContext

    exchange, target, witness, witness0 = f"{uid}-x", f"{uid}-target", f"{uid}-witness", f"{uid}-witness-p0"
    channel.exchange_declare(exchange, "topic")
    channel.queue_declare(target, durable=True, arguments={
        "x-queue-type": "stream", "x-message-deduplication": True, "x-cache-size": 10_000})
    for q, pattern in ((target, "#"), (witness, "#"), (witness0, "p0")):
        if q != target:
            channel.queue_declare(q)
        channel.queue_bind(q, exchange, pattern)
    url, first_batch = broker.url, 50

    def fail_once_after_publishing(batches):
        import pyarrow as pa

        ctx = TaskContext.get()
        ids = [n for batch in batches for n in batch.column("id").to_pylist()]
        key = f"p{ctx.partitionId()}"
        fail = ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        # Spark cuts the writer's input into batches of maxRecordsPerBatch rows and hands one over only once
        # it sees a row beyond it, through 64 KiB buffers: so the first output batch is a bit longer than the
        # writer's batch, and carries a 20 KB column the writer ignores, to push it through the buffers
        head, tail = ids[:first_batch + 10], ids[first_batch + 10:]
        yield pa.RecordBatch.from_pydict({"body": [f"row-{n}" for n in head], "routing_key": [key] * len(head),
                                          "pad": ["x" * 20_000] * len(head)})
        if fail:
            # wait (bounded) until the writer downstream has put its first batch into the broker, then fail
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and queue_depth_at(url, witness0) < first_batch:
                time.sleep(0.1)
            raise RuntimeError("injected failure after a partial write")
        yield pa.RecordBatch.from_pydict({"body": [f"row-{n}" for n in tail], "routing_key": [key] * len(tail),
                                          "pad": [""] * len(tail)})

    def queue_depth_at(amqp_url: str, queue: str) -> int:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            return conn.channel().queue_declare(queue, passive=True).method.message_count
        finally:
            conn.close()

    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, str(first_batch))
    try:
        df = spark.range(0, 400, numPartitions=2).mapInArrow(fail_once_after_publishing,
                                                               "body STRING, routing_key STRING, pad STRING")
        df.write.format("leveret").option("uri", url).option("exchange", exchange).mode("append").save()
    finally:
        spark.conf.set(key, before)

    assert queue_depth(broker, witness0) == 200 + first_batch, "partition 0's retry did not repeat its first rows"
    copies = queue_depth(broker, witness)
    assert copies == 400 + first_batch
    got = read_stream(broker, target)
    assert sorted(b.decode() for _, b in got) == sorted(f"row-{n}" for n in range(400)), \
        f"{len(got)} messages in the de-duplicating stream for 400 rows ({copies} publishes)"
