"""The shipped traffic pipeline (pipeline/leveret_pipeline, issue 13).

Two Spark tests: the aggregation on a hand-built trace (every latency case, a late event, a replayed batch),
then the whole job on a real broker's trace — tracing turned on with ``leveret ctl trace_on``, a stream
bound to ``amq.rabbitmq.trace``, traffic made with pika — run through the CLI entry point with ``--once``,
checked against what the test did, then run again after a simulated crash (the batch's commit removed) and
more traffic, with nothing counted twice. And two checks without a JVM.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest
from leveret_pipeline.cli import main
from leveret_pipeline.traffic import TrafficSink, escape_partition, read_traffic

MINUTE = 60_000
T = 1_700_000_040_000  # a minute boundary (UTC 2023-11-14 22:14)
COUNTERS = ("published", "published_bytes", "delivered", "delivered_bytes", "redelivered", "acked",
            "dead_lettered", "dead_lettered_expired", "dead_lettered_rejected")


# -- a hand-built trace, in the connector's read schema --------------------------------------------------------

def _event(offset: int, kind: str, queue: str | list[str], message_id: str | None, t: int, body: bytes = b"",
           vhost: str = "/", **headers: Any) -> tuple:
    h = {"vhost": vhost, "x-leveret-event-time": str(t), **{k: str(v) for k, v in headers.items()}}
    if message_id is not None:
        h["x-leveret-message-id"] = message_id
    if kind == "publish":
        h["routed_queues"] = json.dumps(queue)
        key = "publish."
    else:
        key = f"{kind}.{queue}"
    return (offset, None, "amq.rabbitmq.trace", key, body, h, None)


BATCHES = [
    [  # minute T. m1 goes to q1 and q2; its q1 delivery is traced before its publish (as Leveret does)
        _event(0, "deliver", "q1", "m1", T + 99, b"abc", redelivered=0),
        _event(1, "publish", ["q1", "q2"], "m1", T + 100, b"abc"),
        _event(2, "publish", ["q1"], "m2", T + 200, b"hello"),
        _event(3, "deliver", "q1", None, T + 300, b"x", redelivered=0),  # no identity: counted, not timed
        _event(4, "publish", ["q1"], "o1", T + 10, b"zz", vhost="/other"),
        _event(5, "publish", [], "lost", T + 20, b"nowhere"),  # routed nowhere: no queue's row
    ],
    [
        _event(6, "deliver", "q1", "m2", T + 1200, b"hello", redelivered=0),  # publish in the batch before
        _event(7, "ack", "q1", "m1", T + 1150),  # delivery in the batch before
        _event(8, "ack", "q1", "m2", T + 1500),
        _event(9, "deliver", "q2", "m1", T + 61_000, b"abc", redelivered=0),  # 60.9 s: beyond the first minute
        _event(10, "deadletter", "q2", "m1", T + 61_500, b"abc", reason="rejected"),
        _event(11, "deliver", "q1", "m4", T + 61_999, b"four", redelivered=0),  # its publish: next batch
    ],
    [
        _event(12, "publish", ["q1"], "m4", T + 62_000, b"four"),
        _event(13, "publish", ["q1"], "m5", T + 62_200, b"five!"),
        _event(14, "deliver", "q1", "m5", T + 62_300, b"five!", redelivered=0),
        _event(15, "deliver", "q1", "m5", T + 63_300, b"five!", redelivered=1),
        _event(16, "ack", "q1", "m5", T + 63_800),
        _event(17, "deadletter", "q1", "m3", T + 5_000, b"", reason="expired"),  # late: minute T again
    ],
]


def _rows(out: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    table = read_traffic(out).to_pylist()
    keys = [(r["vhost"], r["queue"], int(r["minute"].timestamp() * 1000)) for r in table]
    assert len(keys) == len(set(keys)), "a (vhost, queue, minute) row written twice"
    return dict(zip(keys, table, strict=True))


@pytest.mark.spark
@pytest.mark.timeout(300)  # the first Spark test of a run pays the JVM's warm-up
def test_minute_rows_of_a_hand_built_trace(spark, tmp_path: Path) -> None:
    from pyspark_leveret.schema import READ_SCHEMA

    sink = TrafficSink(tmp_path)
    frames = [spark.createDataFrame(batch, READ_SCHEMA) for batch in BATCHES]
    for batch_id, frame in enumerate(frames):
        sink(frame, batch_id)
    rows = _rows(tmp_path)
    assert set(rows) == {("/", "q1", T), ("/", "q2", T), ("/other", "q1", T), ("/", "q1", T + MINUTE),
                         ("/", "q2", T + MINUTE)}

    q1 = rows[("/", "q1", T)]
    assert {c: q1[c] for c in COUNTERS} == {
        "published": 2, "published_bytes": 8, "delivered": 3, "delivered_bytes": 9, "redelivered": 0,
        "acked": 2, "dead_lettered": 1, "dead_lettered_expired": 1, "dead_lettered_rejected": 0}
    # publish→deliver: m1 0 ms (traced 1 ms before its publish: never below 0), m2 1000 ms across batches
    assert (q1["publish_to_deliver_n"], q1["publish_to_deliver_p50_ms"], q1["publish_to_deliver_p99_ms"]) == (
        2, 0, 1000)
    # deliver→ack: m1 1051 ms (delivery in the batch before), m2 300 ms
    assert (q1["deliver_to_ack_n"], q1["deliver_to_ack_p50_ms"], q1["deliver_to_ack_p99_ms"]) == (2, 300, 1051)

    q2 = rows[("/", "q2", T + MINUTE)]
    assert (q2["delivered"], q2["dead_lettered_rejected"], q2["publish_to_deliver_n"],
            q2["publish_to_deliver_p50_ms"]) == (1, 1, 1, 60_900)  # its publish: a batch and a minute before
    assert rows[("/", "q2", T)]["published"] == 1
    assert rows[("/other", "q1", T)]["published"] == 1

    later = rows[("/", "q1", T + MINUTE)]
    assert {c: later[c] for c in ("published", "delivered", "redelivered", "acked")} == {
        "published": 2, "delivered": 3, "redelivered": 1, "acked": 1}
    # m4 (its publish traced a batch after its delivery: the publish carries the sample), m5 100 ms
    assert (later["publish_to_deliver_n"], later["publish_to_deliver_p50_ms"],
            later["publish_to_deliver_p99_ms"]) == (2, 0, 100)
    assert (later["deliver_to_ack_n"], later["deliver_to_ack_p50_ms"]) == (1, 500)  # after the redelivery

    # The vhost "/other" has a directory of its own, escaped as Spark escapes it.
    assert (tmp_path / "traffic" / "vhost=%2Fother" / "date=2023-11-14" / "part-0.parquet").exists()

    # The last batch run again (a crash before Spark committed it): from the same state, to the same rows.
    sink(frames[2], 2)
    assert _rows(tmp_path) == rows


def _state(out: Path, batch_id: int) -> set[tuple[str, str, str, int]]:
    table = read_parquet_dir(out / "_state" / f"batch={batch_id}")
    return {(r["role"], r["message_id"], r["after"], r["t"] - T) for r in table.to_pylist()}


def read_parquet_dir(path: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(path)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_state_between_batches_keeps_what_may_still_pair(spark, tmp_path: Path) -> None:
    """Open starts stay for the lookback, unpaired targets for SLACK_MS (both before the batch's earliest
    event); a paired start is closed; a state no run of any batch can start from is deleted."""
    from pyspark_leveret.schema import READ_SCHEMA

    sink = TrafficSink(tmp_path, lookback_ms=10_000)
    batches = [
        [_event(0, "publish", ["q1"], "m1", T), _event(1, "publish", ["q1"], "m2", T + 1),
         _event(2, "deliver", "q1", "m2", T + 5, redelivered=0),  # pairs with its publish: that start closes
         _event(3, "deliver", "q1", "m3", T + 6, redelivered=0)],  # no publish yet: waits
        [_event(4, "deliver", "q1", "m1", T + 20_000, redelivered=0),  # its publish is older than the lookback
         _event(5, "publish", ["q1"], "m9", T + 20_001)],
        [_event(6, "ack", "q1", "m1", T + 22_100)],  # and m1's delivery has waited SLACK_MS for its publish
    ]
    for batch_id, batch in enumerate(batches):
        sink(spark.createDataFrame(batch, READ_SCHEMA), batch_id)
        if batch_id == 0:
            assert _state(tmp_path, 0) == {("start", "m1", "publish", 0), ("start", "m2", "deliver", 5),
                                           ("start", "m3", "deliver", 6), ("target", "m3", "publish", 6)}
        if batch_id == 1:  # everything of batch 0 fell out of the windows (the batch's earliest: T + 20,000)
            assert _state(tmp_path, 1) == {("start", "m1", "deliver", 20_000), ("start", "m9", "publish", 20_001),
                                           ("target", "m1", "publish", 20_000)}
    assert _state(tmp_path, 2) == {("start", "m9", "publish", 20_001)}  # the ack closed m1's delivery
    assert sorted(p.name for p in (tmp_path / "_state").iterdir()) == ["batch=1", "batch=2"]
    [row] = _rows(tmp_path).values()
    assert (row["published"], row["delivered"], row["acked"]) == (3, 3, 1)
    assert (row["publish_to_deliver_n"], row["publish_to_deliver_p50_ms"]) == (1, 4)  # m2 only
    assert (row["deliver_to_ack_n"], row["deliver_to_ack_p50_ms"]) == (1, 2_100)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_start_pairs_once_wherever_the_batches_cut(spark, tmp_path: Path) -> None:
    """Two first deliveries of one message from one queue (a stream's two consumers): its publish pairs with
    the first of them, whether the second comes in the same batch or the next."""
    from pyspark_leveret.schema import READ_SCHEMA

    publish, first, second = (_event(0, "publish", ["s"], "m", T), _event(1, "deliver", "s", "m", T + 10, redelivered=0),
                              _event(2, "deliver", "s", "m", T + 30, redelivered=0))
    for name, cut in (("one", [[publish, first, second]]), ("two", [[publish, first], [second]])):
        sink = TrafficSink(tmp_path / name)
        for batch_id, batch in enumerate(cut):
            sink(spark.createDataFrame(batch, READ_SCHEMA), batch_id)
        [row] = _rows(tmp_path / name).values()
        assert (row["delivered"], row["publish_to_deliver_n"], row["publish_to_deliver_p99_ms"]) == (2, 1, 10), name


# -- the whole job on a real broker ----------------------------------------------------------------------------

def _api(broker: Any, method: str, path: str) -> Any:
    req = urllib.request.Request(f"http://{broker.host}:{broker.management_port}/api/{path}", method=method)
    token = base64.b64encode(f"{broker.user}:{broker.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def _wait_for_trace(broker: Any, events: int, timeout: float = 10.0) -> None:
    """Until the trace stream holds ``events`` events (acks and expiries are traced a moment later)."""
    deadline = time.monotonic() + timeout
    while (n := _api(broker, "GET", "queues/%2F/trace")["next_offset"]) < events:
        assert time.monotonic() < deadline, f"the trace stream holds {n} events, not {events}"
        time.sleep(0.05)
    time.sleep(0.2)
    assert _api(broker, "GET", "queues/%2F/trace")["next_offset"] == events


def _first_round(ch: Any) -> int:
    """10 messages wait 0.5 s in ``work``, then: 6 acked after 0.3 s, 2 rejected, 2 requeued then acked;
    3 messages expire in ``ttl``. Returns the number of trace events this makes. (Confirms: the waits
    start when the broker has the messages, not when pika sent them.)"""
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", "work", bytes(100), pika.BasicProperties(message_id=f"w{i}"))
    for _ in range(3):
        ch.basic_publish("", "ttl", b"soon gone")
    time.sleep(0.5)
    got = [ch.basic_get("work")[0] for _ in range(10)]
    time.sleep(0.3)
    for m in got[:6]:
        ch.basic_ack(m.delivery_tag)
    for m in got[6:8]:
        ch.basic_reject(m.delivery_tag, requeue=False)
    for m in got[8:]:
        ch.basic_nack(m.delivery_tag, requeue=True)
    again = [ch.basic_get("work")[0] for _ in range(2)]
    assert all(m.redelivered for m in again)
    for m in again:
        ch.basic_ack(m.delivery_tag)
    # work: 10 publish, 12 deliver, 8 ack, 2 deadletter; ttl: 3 publish, 3 deadletter
    return 10 + 12 + 8 + 2 + 3 + 3


def _totals(out: Path, queue: str) -> dict[str, int]:
    rows = [r for (vhost, q, _), r in _rows(out).items() if vhost == "/" and q == queue]
    return {c: sum(r[c] for r in rows) for c in (*COUNTERS, "publish_to_deliver_n", "deliver_to_ack_n")}


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_pipeline_on_a_real_trace_counts_each_event_once(spark, start_broker, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    broker = start_broker()
    ctl = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url",
                          f"http://{broker.host}:{broker.management_port}", "trace_on"],
                         check=False, capture_output=True, text=True, timeout=30)
    assert ctl.returncode == 0, ctl.stderr
    assert _api(broker, "GET", "vhosts/%2F")["tracing"] is True
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.queue_declare("trace", durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_bind("trace", "amq.rabbitmq.trace", "#")
    ch.queue_declare("work")
    ch.queue_declare("dead")
    # (with a dead-letter exchange: an expiry without one is not traced — see the report)
    ch.queue_declare("ttl", arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                       "x-dead-letter-routing-key": "dead"})
    events = _first_round(ch)
    _wait_for_trace(broker, events)

    out = tmp_path / "out"
    argv = ["traffic", "--uri", broker.url, "--management-uri",
            f"http://{broker.host}:{broker.management_port}", "--stream", "trace", "--out", str(out), "--once",
            "--keep-events"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "work" in printed and "ttl" in printed and (out / "traffic.png").stat().st_size > 10_000

    work = _totals(out, "work")
    assert work == {"published": 10, "published_bytes": 1000, "delivered": 12, "delivered_bytes": 1200,
                    "redelivered": 2, "acked": 8, "dead_lettered": 2, "dead_lettered_expired": 0,
                    "dead_lettered_rejected": 2, "publish_to_deliver_n": 10, "deliver_to_ack_n": 8}
    ttl = _totals(out, "ttl")
    assert (ttl["published"], ttl["delivered"], ttl["dead_lettered_expired"]) == (3, 0, 3)
    rows = [r for (_, q, _), r in _rows(out).items() if q == "work"]
    # every message waited 0.5 s before its first delivery; 6 of the 8 acks came 0.3 s after the delivery
    assert all(r["publish_to_deliver_p50_ms"] >= 500 for r in rows if r["publish_to_deliver_n"])
    assert max(r["deliver_to_ack_p99_ms"] or 0 for r in rows) >= 300

    # A crash after the batch was written but before Spark committed it; then more traffic. The job again
    # from its checkpoint runs the uncommitted batch again (same offsets), then one of the new events.
    commit = out / "_checkpoint" / "commits" / "0"
    commit.unlink()
    (commit.parent / ".0.crc").unlink(missing_ok=True)
    for i in range(5):
        ch.basic_publish("", "work", bytes(10), pika.BasicProperties(message_id=f"x{i}"))
    for _ in range(5):
        method, _, _ = ch.basic_get("work")
        ch.basic_ack(method.delivery_tag)
    events += 15
    _wait_for_trace(broker, events)
    conn.close()
    assert main([*argv, "--no-picture"]) == 0
    records = [json.loads(line) for line in (out / "_batches.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in records] == [0, 0, 1]
    assert records[-1]["top_offset"] == events - 1  # the stream read to its end (a reader's "caught up")
    work = _totals(out, "work")
    assert (work["published"], work["published_bytes"], work["delivered"], work["acked"],
            work["publish_to_deliver_n"], work["deliver_to_ack_n"]) == (15, 1050, 17, 13, 15, 13)
    assert _totals(out, "ttl") == ttl
    kept = spark.read.parquet(str(out / "events"))
    assert kept.count() == events  # one row per event: every publish here reached exactly one queue
    assert kept.select("offset").distinct().count() == events


# -- without a JVM ---------------------------------------------------------------------------------------------

def test_partition_values_are_escaped_as_spark_does() -> None:
    assert escape_partition("/") == "%2F"
    assert escape_partition("a=b/c%d") == "a%3Db%2Fc%25d"
    assert escape_partition("plain.name-1_é") == "plain.name-1_é"
    assert urllib.parse.unquote(escape_partition("/ops:x?#")) == "/ops:x?#"


def test_an_out_dir_of_an_earlier_pipeline_is_refused(tmp_path: Path) -> None:
    """An OUT written before the minute parts: its minutes would be rebuilt from the new batches alone."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "metadata").write_text(json.dumps({"id": "a"}) + "\n")
    out = tmp_path / "out"
    (out / "traffic" / "vhost=%2F").mkdir(parents=True)
    (out / "_query.json").write_text(json.dumps({"checkpoint_id": "a"}) + "\n")
    with pytest.raises(RuntimeError, match="earlier leveret-pipeline"):
        TrafficSink(out, checkpoint=tmp_path / "ck")._claim()


def test_an_out_dir_built_by_another_checkpoint_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "ck1", tmp_path / "ck2"
    for ck, query_id in ((first, "a"), (second, "b")):
        ck.mkdir()
        (ck / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    out = tmp_path / "out"
    TrafficSink(out, checkpoint=first)._claim()
    TrafficSink(out, checkpoint=first)._claim()  # the same checkpoint again: fine
    with pytest.raises(RuntimeError, match="another checkpoint"):
        TrafficSink(out, checkpoint=second)._claim()
