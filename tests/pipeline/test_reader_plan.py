"""The Spark source's read side without a JVM: offset planning and range splitting (pure), Arrow conversion,
and a tiny "driver" that calls the readers' initialOffset / latestOffset / partitions / read / commit the
way Spark does, against a real broker process (the ``broker`` fixture), with real AMQP and HTTP clients.
"""

from __future__ import annotations

import datetime
import importlib
import itertools
import json
import logging
import pickle
import pkgutil
import time

import pika
import pytest
from pyspark.sql.datasource import DataSource, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark_leveret import LeveretDataSource
from pyspark_leveret.amqp_read import PROPERTY_NAMES
from pyspark_leveret.arrow_rows import RowBuilder, header_text
from pyspark_leveret.client import ManagementError, StreamStats, parse_uri
from pyspark_leveret.offsets import (
    DataLossError,
    Range,
    cap_end,
    missing_offsets,
    parse_offsets_option,
    resolve,
    split_ranges,
)
from pyspark_leveret.reader import LeveretBatchReader, LeveretStreamReader, StreamPartition
from pyspark_leveret.schema import READ_STRUCT, schema_for, top_level_names
from read_helpers import declare_stream, fill, publish, read_options, read_partitions, stream_info

pytestmark = pytest.mark.leveret_only  # the management API's stream fields are Leveret's


def stats(q: str, first: int, nxt: int, size: int = 0) -> StreamStats:
    return StreamStats(queue=q, first_offset=first, next_offset=nxt, stream_bytes=size)


# -- options and offsets (pure) -----------------------------------------------------------------------------------

def test_parse_uri_defaults_and_management_uri():
    ep = parse_uri("amqp://bob:s%2Fcret@broker.example:5673/prod%2Fa")
    assert (ep.host, ep.port, ep.user, ep.password, ep.vhost, ep.tls) == \
        ("broker.example", 5673, "bob", "s/cret", "prod/a", False)
    assert ep.management_uri == "http://broker.example:15672"
    ep = parse_uri("amqps://h", "https://admin.example/api-root/")
    assert (ep.port, ep.vhost, ep.user, ep.tls, ep.management_uri) == \
        (5671, "/", "guest", True, "https://admin.example/api-root")
    assert parse_uri("amqp://h/").vhost == "/" and parse_uri("amqp://h/%2F").vhost == "/"
    with pytest.raises(ValueError, match="amqp://"):
        parse_uri("http://h")


def test_offsets_option_forms():
    qs = ["a", "b"]
    assert parse_offsets_option(None, qs, "earliest", "startingOffsets") == {"a": "earliest", "b": "earliest"}
    assert parse_offsets_option("LATEST", qs, "earliest", "x") == {"a": "latest", "b": "latest"}
    assert parse_offsets_option(" 42 ", qs, "earliest", "x") == {"a": 42, "b": 42}
    assert parse_offsets_option('{"b": 7}', qs, "latest", "x") == {"a": "latest", "b": 7}
    assert parse_offsets_option('{"a": "earliest", "b": "12"}', qs, "latest", "x") == {"a": "earliest", "b": 12}
    for bad in ("-1", "soon", '{"c": 1}', '{"a": true}', "[1]", "{nope"):
        with pytest.raises(ValueError, match="option x"):
            parse_offsets_option(bad, qs, "earliest", "x")
    st = {"a": stats("a", 10, 20), "b": stats("b", 0, 5)}
    assert resolve({"a": "earliest", "b": "latest"}, st) == {"a": 10, "b": 5}
    assert resolve({"a": 3, "b": "earliest"}, st) == {"a": 3, "b": 0}


def test_missing_offsets_is_what_retention_removed():
    st = {"a": stats("a", 100, 200), "b": stats("b", 0, 10)}
    assert missing_offsets({"a": 40, "b": 0}, st) == {"a": (40, 100)}
    assert missing_offsets({"a": 40}, st, end={"a": 60}) == {"a": (40, 60)}
    assert missing_offsets({"a": 100, "b": 3}, st) == {}


def test_cap_end_records_shared_in_proportion_and_deterministic():
    st = {"a": stats("a", 0, 1000), "b": stats("b", 0, 1000)}
    start = {"a": 0, "b": 700}
    target = {"a": 1000, "b": 1000}  # a has 1000 available, b 300
    assert cap_end(start, target, st) == target
    end = cap_end(start, target, st, max_records=130)
    assert end == {"a": 100, "b": 730}  # 130 split 1000:300
    assert cap_end(start, target, st, max_records=130) == end
    # Small budgets still make progress, one record at least, and never go backwards.
    end = cap_end(start, target, st, max_records=1)
    assert sum(end[q] - start[q] for q in end) == 1 and all(end[q] >= start[q] for q in end)
    assert cap_end({"a": 1000, "b": 1000}, target, st, max_records=10) == {"a": 1000, "b": 1000}


def test_cap_end_bytes_estimated_from_stream_size():
    st = {"a": stats("a", 0, 1000, size=1000 * 1024)}  # 1 KiB a message
    assert cap_end({"a": 0}, {"a": 1000}, st, max_bytes=100 * 1024) == {"a": 100}
    assert cap_end({"a": 0}, {"a": 1000}, st, max_bytes=10) == {"a": 1}  # one message is bigger: still 1
    assert cap_end({"a": 0}, {"a": 1000}, st, max_records=50, max_bytes=100 * 1024) == {"a": 50}
    # Offsets removed by retention cost nothing: the batch runs from the first retained offset.
    st = {"a": stats("a", 500, 1000, size=500 * 1024)}
    assert cap_end({"a": 0}, {"a": 1000}, st, max_records=100) == {"a": 600}
    assert cap_end({"a": 0}, {"a": 500}, stats_map := {"a": stats("a", 500, 500)}, max_records=5) == {"a": 0}
    assert stats_map["a"].bytes_per_message == 0.0


def test_split_ranges_cover_exactly_and_respect_limits():
    start, end = {"a": 0, "b": 10, "c": 5}, {"a": 1000, "b": 13, "c": 5}
    ranges = split_ranges(start, end)
    assert ranges == [Range("a", 0, 1000), Range("b", 10, 13)]  # one per queue; empty ones dropped
    ranges = split_ranges(start, end, max_per_partition=300)
    assert [len(r) for r in ranges] == [250, 250, 250, 250, 3]
    ranges = split_ranges(start, end, min_partitions=6)
    assert len(ranges) == 6 and max(len(r) for r in ranges) <= 250
    for opts in ({}, {"max_per_partition": 7}, {"min_partitions": 9}, {"max_per_partition": 400, "min_partitions": 5}):
        ranges = split_ranges(start, end, **opts)
        for q in ("a", "b"):
            mine = sorted((r.start, r.end) for r in ranges if r.queue == q)
            assert mine[0][0] == start[q] and mine[-1][1] == end[q]
            assert all(x[1] == y[0] for x, y in itertools.pairwise(mine))  # contiguous, disjoint
    assert split_ranges({"a": 0}, {"a": 1}, min_partitions=4) == [Range("a", 0, 1)]
    assert split_ranges({}, {"new": 50}) == []  # a queue new to the query starts at its end


# -- schema and Arrow conversion ----------------------------------------------------------------------------------

def test_spark_can_find_the_module_by_itself():
    """Spark's auto-registration lists top-level ``pyspark_*`` modules with pkgutil.iter_modules (sys.path
    entries only): a setuptools "strict" editable install hides the package behind an import hook, and
    format("leveret") then fails with DATA_SOURCE_NOT_FOUND unless the session registers it."""
    found = {m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")}
    assert "pyspark_leveret" in found, "install with: pip install -e pipeline --config-settings editable_mode=compat"
    module = importlib.import_module("pyspark_leveret")
    assert issubclass(module.DefaultSource, DataSource) and module.DefaultSource.name() == "leveret"


def test_schema_follows_body_options():
    assert "body BINARY" in schema_for({})
    assert "body STRING" in schema_for({"bodyas": "string"})
    ddl = schema_for({"bodyFormat": "json", "bodySchema": "user STRING, amount DOUBLE, tags ARRAY<STRING>"})
    assert "user STRING, amount DOUBLE, tags ARRAY<STRING>" in ddl and "body " not in ddl
    assert LeveretDataSource({"bodyAs": "string"}).schema() == schema_for({"bodyAs": "string"})
    with pytest.raises(ValueError, match="clash"):
        schema_for({"bodyFormat": "json", "bodySchema": "user STRING, `offset` BIGINT"})
    with pytest.raises(ValueError, match="bodySchema"):
        schema_for({"bodyFormat": "json"})
    with pytest.raises(ValueError, match="bodyAs"):
        schema_for({"bodyAs": "hex"})
    assert top_level_names("a INT, b STRUCT<x: INT, y: MAP<STRING, INT>>, `c d` DECIMAL(10, 2)") == \
        ["a", "b", "c d"]


def _props(**given: object) -> tuple:
    return tuple(given.get(name) for name in PROPERTY_NAMES)


def test_arrow_batch_matches_spark_arrow_schema_and_values():
    deliveries = [
        (7, "ex", "rk.1", b"hello", _props(content_type="text/plain", delivery_mode=2, priority=5,
                                           timestamp=1_700_000_000, message_id="m-7",
                                           headers={"n": 3, "ok": True, "raw": b"bytes", "t": {"x": [1, "a"]}})),
        (8, "", "q", b"\xff\xfe", _props()),
    ]
    batch = RowBuilder(READ_STRUCT).batch(deliveries)
    assert batch.schema.equals(to_arrow_schema(READ_STRUCT, timezone="UTC"))  # what Spark checks
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [7, 8]
    assert rows[0]["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert rows[1]["timestamp"] is None
    assert (rows[0]["exchange"], rows[0]["routing_key"], rows[0]["body"]) == ("ex", "rk.1", b"hello")
    assert dict(rows[0]["headers"]) == {"n": "3", "ok": "true", "raw": "bytes", "t": '{"x":[1,"a"]}'}
    assert rows[1]["headers"] == []
    p = rows[0]["properties"]
    assert (p["content_type"], p["delivery_mode"], p["priority"], p["message_id"], p["app_id"]) == \
        ("text/plain", 2, 5, "m-7", None)
    # bodyAs=string: a STRING body column; invalid UTF-8 is replaced, not an error.
    as_text = StructType([f if f.name != "body" else StructField("body", StringType()) for f in READ_STRUCT])
    assert RowBuilder(as_text).batch(deliveries).column("body").to_pylist() == ["hello", "\ufffd\ufffd"]
    assert header_text(datetime.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05"


def test_json_body_columns_are_permissive():
    schema = StructType([
        StructField("offset", LongType()),
        StructField("user", StringType()),
        StructField("amount", DoubleType()),
        StructField("n", IntegerType()),
        StructField("at", TimestampType()),
        StructField("tags", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), LongType())),
        StructField("nested", StructType([StructField("k", StringType())])),
    ])
    bodies = [
        {"user": "ann", "amount": 2, "n": 5, "at": "2024-05-01T10:00:00Z", "tags": ["x"], "attrs": {"a": 1},
         "nested": {"k": "v"}},
        {"user": 12, "amount": "lots", "n": 2**40, "at": 0, "tags": "no", "nested": None},
    ]
    deliveries = [(i, "", "q", json.dumps(b).encode(), _props()) for i, b in enumerate(bodies)]
    deliveries.append((2, "", "q", b"not json", _props()))
    deliveries.append((3, "", "q", b"[1, 2]", _props()))
    with pytest.raises(ValueError, match="bodyFormat=json"):
        RowBuilder(schema)  # columns that are not metadata need the option
    batch = RowBuilder(schema, json_body=True).batch(deliveries)
    assert batch.schema.equals(to_arrow_schema(schema, timezone="UTC"))
    rows = batch.to_pylist()
    assert rows[0]["user"] == "ann" and rows[0]["amount"] == 2.0 and rows[0]["n"] == 5
    assert rows[0]["at"] == datetime.datetime(2024, 5, 1, 10, tzinfo=datetime.UTC)
    assert rows[0]["tags"] == ["x"] and rows[0]["attrs"] == [("a", 1)] and rows[0]["nested"] == {"k": "v"}
    # Wrong types are nulls (a JSON number in a STRING column keeps its JSON text, as Spark does).
    assert rows[1]["user"] == "12" and rows[1]["amount"] is None and rows[1]["n"] is None
    assert rows[1]["at"] == datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) and rows[1]["tags"] is None
    for bad in rows[2:]:
        assert bad["user"] is None and bad["offset"] in (2, 3)


# -- against the broker: the batch reader ---------------------------------------------------------------------------

def test_batch_read_offsets_options_and_metadata(broker, uid):
    q = declare_stream(broker, f"{uid}-s")
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2, priority=3,
                                 correlation_id="c1", message_id="id-1", timestamp=1_700_000_123,
                                 type="evt", app_id="tests", headers={"tenant": "acme", "n": 7})
    publish(broker, q, [b'{"i": %d}' % i for i in range(5)], props)
    fill(broker, q, 95, start=5)
    reader = LeveretBatchReader(read_options(broker, queue=q), READ_STRUCT)
    parts = reader.partitions()
    assert parts == [StreamPartition(q, 0, 100)]
    table = read_partitions(reader, parts)
    assert table.column("offset").to_pylist() == list(range(100))
    assert table.column("body").to_pylist()[:2] == [b'{"i": 0}', b'{"i": 1}']
    assert table.column("body").to_pylist()[99] == b"m99"
    first = table.slice(0, 1).to_pylist()[0]
    assert first["routing_key"] == q and first["exchange"] == ""
    assert dict(first["headers"]) == {"tenant": "acme", "n": "7"}  # x-stream-offset is the offset column
    assert first["timestamp"] == datetime.datetime.fromtimestamp(1_700_000_123, datetime.UTC)
    p = first["properties"]
    assert (p["content_type"], p["delivery_mode"], p["priority"], p["correlation_id"], p["message_id"],
            p["type"], p["app_id"], p["reply_to"]) == ("application/json", 2, 3, "c1", "id-1", "evt", "tests", None)

    ranged = LeveretBatchReader(read_options(broker, queue=q, startingOffsets=10, endingOffsets=f'{{"{q}": 25}}',
                                             maxRecordsPerPartition=4), READ_STRUCT)
    parts = ranged.partitions()
    assert len(parts) == 4 and parts[0].start == 10 and parts[-1].end == 25
    assert read_partitions(ranged, parts).column("offset").to_pylist() == list(range(10, 25))
    # An end beyond the stream reads up to its next offset; latest..latest is empty.
    assert LeveretBatchReader(read_options(broker, queue=q, startingOffsets=95, endingOffsets=10_000),
                              READ_STRUCT).partitions() == [StreamPartition(q, 95, 100)]
    empty = LeveretBatchReader(read_options(broker, queue=q, startingOffsets="latest"), READ_STRUCT)
    assert empty.partitions() == []
    assert list(empty.read(InputPartition(None))) == []  # what Spark reads when there are no partitions
    with pytest.raises(ValueError, match="after endingOffsets"):
        LeveretBatchReader(read_options(broker, queue=q, startingOffsets=50, endingOffsets=20),
                           READ_STRUCT).partitions()


def test_bodies_empty_and_larger_than_a_frame(broker, uid):
    """The reader's own frame decoding: a body split over several frames (frame_max 128 KiB), an empty body
    (no body frame at all), a multi-entry headers table, among ordinary ones."""
    q = declare_stream(broker, f"{uid}-s")
    big = bytes(range(256)) * 1200  # 300 KiB
    bodies = [b"a", big, b"", b"z" * 131_000, b"end"]
    publish(broker, q, bodies, pika.BasicProperties(headers={"k": "v", "list": [1, "x"]}, user_id="guest"))
    reader = LeveretBatchReader(read_options(broker, queue=q, prefetch=2), READ_STRUCT)
    table = read_partitions(reader, reader.partitions())
    assert table.column("body").to_pylist() == bodies
    assert table.column("offset").to_pylist() == list(range(5))
    assert all(dict(h) == {"k": "v", "list": '[1,"x"]'} for h in table.column("headers").to_pylist())
    assert {p["user_id"] for p in table.column("properties").to_pylist()} == {"guest"}


def test_header_keys_reads_only_those_headers(broker, uid):
    """Option headerKeys: the headers column holds just the named headers (the others stepped over unread,
    a nested table among them), the offset is still each delivery's; an empty list is refused at load()."""
    q = declare_stream(broker, f"{uid}-s")
    headers = {"vhost": "/", "routed_queues": ["a", "b"], "properties": {"headers": {"x": 1}, "delivery_mode": 2},
               "x-leveret-event-time": 1_764_496_800_123, "node": "n@h"}
    publish(broker, q, [b"x%d" % i for i in range(20)], pika.BasicProperties(headers=headers))
    reader = LeveretBatchReader(read_options(broker, queue=q, headerKeys="routed_queues, x-leveret-event-time,absent"),
                                READ_STRUCT)
    table = read_partitions(reader, reader.partitions())
    assert table.column("offset").to_pylist() == list(range(20))
    assert {tuple(sorted(dict(h).items())) for h in table.column("headers").to_pylist()} == \
        {(("routed_queues", '["a","b"]'), ("x-leveret-event-time", "1764496800123"))}
    everything = LeveretBatchReader(read_options(broker, queue=q), READ_STRUCT)
    assert dict(read_partitions(everything, everything.partitions()).column("headers")[0].as_py())["properties"] == \
        '{"headers":{"x":1},"delivery_mode":2}'
    for bad in ("", " , "):
        with pytest.raises(ValueError, match="headerKeys must name at least one header"):
            LeveretBatchReader(read_options(broker, queue=q, headerKeys=bad), READ_STRUCT)


def test_several_queues_one_offset_each_and_json_body(broker, uid):
    a, b = declare_stream(broker, f"{uid}-a"), declare_stream(broker, f"{uid}-b")
    publish(broker, a, [json.dumps({"user": f"u{i}", "amount": i / 2}).encode() for i in range(30)])
    publish(broker, b, [json.dumps({"user": f"v{i}"}).encode() for i in range(10)])
    schema = StructType([StructField("offset", LongType()), StructField("routing_key", StringType()),
                         StructField("user", StringType()), StructField("amount", DoubleType())])
    opts = read_options(broker, queues=f"{a}, {b}", startingOffsets=json.dumps({a: 20, b: "earliest"}),
                        bodyFormat="json", bodySchema="user STRING, amount DOUBLE")
    reader = LeveretBatchReader(opts, schema)
    parts = reader.partitions()
    assert sorted((p.queue, p.start, p.end) for p in parts) == [(a, 20, 30), (b, 0, 10)]
    rows = read_partitions(reader, parts).to_pylist()
    assert [(r["routing_key"], r["offset"], r["user"]) for r in rows] == \
        [(a, i, f"u{i}") for i in range(20, 30)] + [(b, i, f"v{i}") for i in range(10)]
    assert rows[0]["amount"] == 10.0 and rows[-1]["amount"] is None


def test_reads_are_deterministic_and_readers_pickle(broker, uid):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 300, size=200)
    reader = LeveretBatchReader(read_options(broker, queue=q, startingOffsets=37, endingOffsets=251,
                                             minPartitions=3), READ_STRUCT)
    parts = reader.partitions()
    assert len(parts) == 3
    # Spark pickles the reader into every task and each partition on its own: only plain data inside.
    copy = pickle.loads(pickle.dumps(reader))
    parts2 = [pickle.loads(pickle.dumps(p)) for p in parts]
    one, two = read_partitions(reader, parts), read_partitions(copy, parts2)
    assert one.equals(two)
    assert one.column("offset").to_pylist() == list(range(37, 251))
    stream = LeveretStreamReader(read_options(broker, queue=q, startingOffsets="earliest",
                                              maxRecordsPerTrigger=10), READ_STRUCT)
    stream.prepareForTriggerAvailableNow()
    stream.latestOffset(stream.initialOffset(), stream.getDefaultReadLimit())
    assert pickle.loads(pickle.dumps(stream)).config == stream.config


# -- against the broker: the stream reader, driven like Spark drives it ------------------------------------------------

def drive(reader: LeveretStreamReader, start: dict[str, int], limit=None, batches: int = 100
          ) -> tuple[list[tuple[dict, dict]], list[int]]:
    """Micro-batches until latestOffset stops moving: the (start, end) pairs and every offset read."""
    limit = reader.getDefaultReadLimit() if limit is None else limit
    plan, offsets = [], []
    for _ in range(batches):
        end = reader.latestOffset(start, limit)
        if end == start:
            break
        plan.append((start, end))
        offsets += read_partitions(reader, reader.partitions(start, end)).column("offset").to_pylist()
        reader.commit(end)
        start = json.loads(json.dumps(end))  # as the checkpoint hands it back
    return plan, offsets


def test_stream_micro_batches_capped_by_read_limit(broker, uid):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 50)
    reader = LeveretStreamReader(read_options(broker, queue=q, maxRecordsPerTrigger=20), READ_STRUCT)
    assert reader.initialOffset() == {q: 50}  # a stream starts at latest by default
    reader = LeveretStreamReader(read_options(broker, queue=q, startingOffsets="earliest",
                                              maxRecordsPerTrigger=20, maxRecordsPerPartition=8), READ_STRUCT)
    assert reader.getDefaultReadLimit() == ReadMaxRows(20)
    start = reader.initialOffset()
    assert start == {q: 0}
    assert reader.partitions(start, {q: 20}) == [StreamPartition(q, 0, 6), StreamPartition(q, 6, 13),
                                                StreamPartition(q, 13, 20)]
    plan, offsets = drive(reader, start)
    assert [(s[q], e[q]) for s, e in plan] == [(0, 20), (20, 40), (40, 50)]
    assert offsets == list(range(50))
    assert reader.reportLatestOffset() == {q: 50}
    # Trigger.Once passes ReadAllAvailable: no cap. A byte limit is turned into records.
    assert reader.latestOffset({q: 0}, ReadAllAvailable()) == {q: 50}
    by_bytes = LeveretStreamReader(read_options(broker, queue=q, maxBytesPerTrigger=10), READ_STRUCT)
    assert by_bytes.getDefaultReadLimit() == ReadMaxBytes(10)
    size = stream_info(broker, q)["stream_bytes"] / 50
    assert by_bytes.latestOffset({q: 0}, ReadMaxBytes(int(size * 12.5))) == {q: 12}


def test_available_now_freezes_the_target(broker, uid):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 30)
    reader = LeveretStreamReader(read_options(broker, queue=q, startingOffsets="earliest",
                                              maxRecordsPerTrigger=12), READ_STRUCT)
    reader.prepareForTriggerAvailableNow()
    fill(broker, q, 30, start=30)  # arrives after the run started: not for this run
    plan, offsets = drive(reader, reader.initialOffset())
    assert [e[q] for _, e in plan] == [12, 24, 30] and offsets == list(range(30))
    # The next run (a new reader, as after a restart) picks up from the checkpoint's end.
    again = LeveretStreamReader(read_options(broker, queue=q, maxRecordsPerTrigger=100), READ_STRUCT)
    again.prepareForTriggerAvailableNow()
    plan, offsets = drive(again, {q: 30})
    assert offsets == list(range(30, 60))


def test_queue_added_to_a_running_query_starts_without_gap(broker, uid):
    a, b = declare_stream(broker, f"{uid}-a"), declare_stream(broker, f"{uid}-b")
    fill(broker, a, 5)
    fill(broker, b, 7)
    reader = LeveretStreamReader(read_options(broker, queues=f"{a},{b}", startingOffsets="earliest"), READ_STRUCT)
    first = reader.latestOffset({a: 5}, ReadAllAvailable())  # the checkpoint only knew queue a
    assert first == {a: 5, b: 0}
    assert reader.partitions({a: 5}, first) == []
    assert reader.latestOffset(first, ReadAllAvailable()) == {a: 5, b: 7}


def test_commit_records_progress_as_a_consumer_group(broker, uid, caplog):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 40)
    reader = LeveretStreamReader(read_options(broker, queue=q, startingOffsets="earliest",
                                              maxRecordsPerTrigger=25, consumerGroup="spark-etl"), READ_STRUCT)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    read_partitions(reader, reader.partitions(start, end))
    reader.commit(end)
    groups = {g["name"]: g for g in stream_info(broker, q)["consumer_groups"]}
    assert groups["spark-etl"]["committed_offset"] == 25 and groups["spark-etl"]["lag"] == 15
    reader.commit({q: 10})  # a replayed, older commit never moves the group back
    groups = {g["name"]: g for g in stream_info(broker, q)["consumer_groups"]}
    assert groups["spark-etl"]["committed_offset"] == 25
    # Without the option nothing is created on the broker.
    plain = LeveretStreamReader(read_options(broker, queue=q), READ_STRUCT)
    plain.commit({q: 40})
    assert [g["name"] for g in stream_info(broker, q)["consumer_groups"]] == ["spark-etl"]
    # A group with live AMQP members refuses (409): logged, and the query goes on (monitoring only).
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(q, lambda *a: None, arguments={"x-stream-group": "spark-etl"})
        with caplog.at_level(logging.WARNING, logger="pyspark_leveret"):
            reader.commit({q: 40})
        assert "has live AMQP consumers" in caplog.text and "409" in caplog.text
    finally:
        conn.close()


# -- failures: data loss, a range that never arrives, a queue that is no stream -------------------------------------

def test_data_loss_is_named_or_skipped(broker, uid):
    q = declare_stream(broker, f"{uid}-s", **{"x-stream-max-segment-size-bytes": 4000,
                                              "x-max-length-bytes": 12000})
    fill(broker, q, 200, size=500)
    deadline = time.monotonic() + 10
    while stream_info(broker, q)["first_offset"] == 0:
        assert time.monotonic() < deadline, "retention removed no segment"
        time.sleep(0.05)
    first = stream_info(broker, q)["first_offset"]
    assert 0 < first < 200

    batch = LeveretBatchReader(read_options(broker, queue=q, startingOffsets=0), READ_STRUCT)
    with pytest.raises(DataLossError, match=f"offsets 0..{first - 1} are no longer in the stream"):
        batch.partitions()
    # The executor's own check (retention may strike between planning and reading).
    with pytest.raises(DataLossError, match=f"offsets 3..{first - 1}"):
        list(batch.read(StreamPartition(q, 3, 200)))
    stream = LeveretStreamReader(read_options(broker, queue=q), READ_STRUCT)
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        stream.latestOffset({q: 1}, ReadAllAvailable())

    lenient = LeveretBatchReader(read_options(broker, queue=q, startingOffsets=0, failOnDataLoss="false",
                                              minPartitions=2), READ_STRUCT)
    parts = lenient.partitions()
    assert parts[0].start == 0 and parts[-1].end == 200
    assert read_partitions(lenient, parts).column("offset").to_pylist() == list(range(first, 200))
    # A range made only of removed offsets is empty, not a hang.
    assert list(lenient.read(StreamPartition(q, 0, first))) == []
    stream = LeveretStreamReader(read_options(broker, queue=q, failOnDataLoss="false", maxRecordsPerTrigger=10),
                                 READ_STRUCT)
    assert stream.latestOffset({q: 0}, stream.getDefaultReadLimit()) == {q: first + 10}


def test_range_that_never_arrives_times_out_clearly(broker, uid):
    q = declare_stream(broker, f"{uid}-s")
    fill(broker, q, 5)
    reader = LeveretBatchReader(read_options(broker, queue=q, readTimeout=1), READ_STRUCT)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"offsets 3\.\.9: no delivery for 1 s while waiting for offset 5; "
                                           r"the stream now holds offsets 0\.\.4"):
        list(reader.read(StreamPartition(q, 3, 10)))
    assert time.monotonic() - started < 5


def test_queue_that_is_no_stream_or_missing_is_refused(broker, uid):
    conn = pika.BlockingConnection(broker.pika_params())
    conn.channel().queue_declare(f"{uid}-classic", auto_delete=True)
    try:
        with pytest.raises(ValueError, match="not a stream queue"):
            LeveretBatchReader(read_options(broker, queue=f"{uid}-classic"), READ_STRUCT).partitions()
        with pytest.raises(ManagementError, match="no queue"):
            LeveretBatchReader(read_options(broker, queue=f"{uid}-none"), READ_STRUCT).partitions()
    finally:
        conn.close()
    with pytest.raises(ValueError, match="option uri"):
        LeveretBatchReader({"queue": "x"}, READ_STRUCT)
    with pytest.raises(ValueError, match="queue"):
        LeveretBatchReader({"uri": broker.url}, READ_STRUCT)
    with pytest.raises(ValueError, match="batch reads only"):
        LeveretStreamReader(read_options(broker, queue="x", endingOffsets=5), READ_STRUCT)
    with pytest.raises(ValueError, match="maxRecordsPerTrigger"):
        LeveretStreamReader(read_options(broker, queue="x", maxRecordsPerTrigger=0), READ_STRUCT)
