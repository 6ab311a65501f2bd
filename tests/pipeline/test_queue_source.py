"""The queue source (pyspark_leveret/queue_source.py) without a JVM: ``streamReader``'s dispatch on the queue's
type, and the reader driven as Spark drives it (driver calls on one copy, ``read`` on pickled copies) against
a real broker: a retried task gets the same rows, a batch is acked only when the next one is planned, and a
driver that dies before its batch commits gets the same number of messages back after its restart."""

from __future__ import annotations

import pickle
from typing import Any

import pika
import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark_leveret import LeveretDataSource
from pyspark_leveret.client import ManagementError
from pyspark_leveret.queue_source import LeveretQueueStreamReader
from pyspark_leveret.reader import LeveretStreamReader
from pyspark_leveret.schema import READ_STRUCT
from read_helpers import declare_stream, read_options

pytestmark = [pytest.mark.leveret_only]


def declare(broker: Any, name: str, queue_type: str, n: int = 0) -> str:
    """A classic or quorum queue holding ``n`` messages with message ids ``0..n-1``."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
        for i in range(n):
            ch.basic_publish("", name, f"q{i}".encode(), pika.BasicProperties(message_id=str(i)))
    finally:
        conn.close()
    return name


def counts(broker: Any, name: str) -> tuple[int, int]:
    """(ready, consumers) of a queue."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ok = conn.channel().queue_declare(name, passive=True)
        return int(ok.method.message_count), int(ok.method.consumer_count)
    finally:
        conn.close()


def ids(reader: Any, partitions: list[Any]) -> list[int]:
    """The message ids the tasks of ``partitions`` produce, each task run on its own unpickled reader."""
    out: list[int] = []
    for part in partitions:
        executor = pickle.loads(pickle.dumps(reader))
        task = pickle.loads(pickle.dumps(part))
        for batch in executor.read(task):
            out += [int(p["message_id"]) for p in batch.column("properties").to_pylist()]
    return out


def test_stream_reader_dispatches_on_the_queue_type(broker, uid):
    classic, quorum = declare(broker, f"{uid}-c", "classic"), declare(broker, f"{uid}-q", "quorum")
    stream = declare_stream(broker, f"{uid}-s")
    for name, kind in ((classic, LeveretQueueStreamReader), (quorum, LeveretQueueStreamReader),
                       (stream, LeveretStreamReader)):
        assert type(LeveretDataSource(read_options(broker, queue=name)).streamReader(READ_STRUCT)) is kind, name
    with pytest.raises(ManagementError, match="no queue"):
        LeveretDataSource(read_options(broker, queue=f"{uid}-none")).streamReader(READ_STRUCT)
    with pytest.raises(ValueError, match="startingOffsets does not apply"):
        LeveretDataSource(read_options(broker, queue=classic, startingOffsets="earliest")).streamReader(READ_STRUCT)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_batches_acked_after_commit_and_requeued_for_a_restarted_driver(broker, uid, queue_type):
    q = declare(broker, f"{uid}-{queue_type}", queue_type, 25)
    opts = read_options(broker, queue=q, maxRecordsPerTrigger=10, minPartitions=2)
    driver = LeveretDataSource(opts).streamReader(READ_STRUCT)
    try:
        start = driver.initialOffset()
        end = driver.latestOffset(start, ReadMaxRows(10))
        assert (start, end) == ({q: 0}, {q: 10})
        parts = driver.partitions(start, end)
        assert len(parts) == 2
        assert ids(driver, parts) == list(range(10))
        assert ids(driver, parts[1:]) == list(range(5, 10))  # a retried task: the very same rows
        assert counts(broker, q) == (15, 0)  # taken, not acked, no consumer left between batches
        # Spark plans batch 1 after batch 0's commit: batch 0 is acked then, batch 1 taken.
        end2 = driver.latestOffset(end, ReadMaxRows(10))
        assert end2 == {q: 20}
        assert ids(driver, driver.partitions(end, end2)) == list(range(10, 20))
    finally:
        driver.stop()  # the driver dies with batch 1 planned, not committed: its 10 messages go back
    assert counts(broker, q) == (15, 0)
    restarted = LeveretDataSource(opts).streamReader(READ_STRUCT)
    try:
        # The checkpoint holds batch 1's range: the same number of messages, the requeued ones among them.
        again = ids(restarted, restarted.partitions({q: 10}, {q: 20}))
        assert len(again) == 10 and len(set(again)) == 10 and min(again) >= 10
        last = restarted.latestOffset({q: 20}, ReadMaxRows(10))
        assert last == {q: 25}
        rest = ids(restarted, restarted.partitions({q: 20}, last))
        assert sorted(again + rest) == list(range(10, 25))
        restarted.commit(last)
        assert counts(broker, q) == (0, 0)
    finally:
        restarted.stop()
    assert counts(broker, q) == (0, 0)  # everything committed was acked: nothing comes back


def test_header_keys_applies_to_a_queue_read_too(broker, uid):
    q = f"{uid}-c"
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.basic_publish("", q, b"m", pika.BasicProperties(message_id="0", headers={"keep": "k", "drop": "d"}))
    finally:
        conn.close()
    driver = LeveretDataSource(read_options(broker, queue=q, headerKeys="keep")).streamReader(READ_STRUCT)
    try:
        end = driver.latestOffset({q: 0}, ReadMaxRows(10))
        (part,) = driver.partitions({q: 0}, end)
        (batch,) = list(pickle.loads(pickle.dumps(driver)).read(pickle.loads(pickle.dumps(part))))
        assert [dict(h) for h in batch.column("headers").to_pylist()] == [{"keep": "k"}]
    finally:
        driver.stop()
