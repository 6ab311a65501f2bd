"""The write side of format("leveret") without a JVM: columns → messages, message keys, options, pickling, and
the writer's ``write()`` driven by hand with Arrow batches against a real broker (as a Spark task would call
it), including the failures that must fail a task: a nack, a mandatory return, a missing exchange.
"""

from __future__ import annotations

import datetime as dt
import pickle
import re
import socket
import time
from collections.abc import Iterator

import pika
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark_leveret.publisher import PublishFailed
from pyspark_leveret.rows_to_messages import (
    DEDUP_HEADER,
    Message,
    MessageDefaults,
    WriteOptionError,
    check_schema,
    message_batches,
)
from pyspark_leveret.writer import LeveretBatchWriter, LeveretStreamWriter, TaskIdentity, parse_write_options

UTC = dt.UTC
HEADERS = pa.map_(pa.string(), pa.string())


def mapped(rows: list[dict], schema: pa.Schema, prefix: str = "job:0", **defaults) -> list[Message]:
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    return flat(message_batches(iter([batch]), MessageDefaults(**defaults), prefix))


def flat(lists: Iterator[list[Message]]) -> list[Message]:
    return [m for messages in lists for m in messages]


def batches(n: int, size: int = 10, start: int = 0) -> list[pa.RecordBatch]:
    """n rows with string bodies "row-<i>", cut into Arrow batches of ``size`` rows (as Spark cuts them)."""
    table = pa.table({"body": [f"row-{i}" for i in range(start, start + n)]})
    return table.to_batches(max_chunksize=size)


# -- column → message --------------------------------------------------------------------------------------


def test_string_body_is_utf8_and_binary_body_is_kept():
    [m] = mapped([{"body": "héllo ✓"}], pa.schema([("body", pa.string())]))
    assert m.body == "héllo ✓".encode()
    raw = bytes(range(256))
    [m] = mapped([{"body": raw}], pa.schema([("body", pa.binary())]))
    assert m.body == raw
    [m] = mapped([{"body": "x" * 3}], pa.schema([("body", pa.large_string())]))
    assert m.body == b"xxx"


def test_every_flat_property_column_is_mapped():
    schema = pa.schema([
        ("body", pa.binary()), ("content_type", pa.string()), ("content_encoding", pa.string()),
        ("delivery_mode", pa.int32()), ("priority", pa.int8()), ("correlation_id", pa.string()),
        ("reply_to", pa.string()), ("expiration", pa.string()), ("message_id", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")), ("type", pa.string()), ("user_id", pa.string()),
        ("app_id", pa.string()),
    ])
    row = {"body": b"b", "content_type": "application/json", "content_encoding": "gzip", "delivery_mode": 1,
           "priority": 7, "correlation_id": "corr", "reply_to": "replies", "expiration": "60000",
           "message_id": "mid-1", "timestamp": dt.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=UTC),
           "type": "order.created", "user_id": "guest", "app_id": "spark"}
    [m] = mapped([row], schema)
    p = m.properties
    assert (p.content_type, p.content_encoding, p.delivery_mode, p.priority) == ("application/json", "gzip", 1, 7)
    assert (p.correlation_id, p.reply_to, p.expiration, p.message_id) == ("corr", "replies", "60000", "mid-1")
    assert p.timestamp == int(dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC).timestamp())
    assert (p.type, p.user_id, p.app_id) == ("order.created", "guest", "spark")
    # the row's own message_id is also its de-duplication key
    assert p.headers == {DEDUP_HEADER: "mid-1"}


def test_integer_timestamp_is_posix_seconds_and_naive_datetime_is_utc():
    [m] = mapped([{"body": "x", "timestamp": 1_700_000_000}], pa.schema([("body", pa.string()),
                                                                        ("timestamp", pa.int64())]))
    assert m.properties.timestamp == 1_700_000_000
    [m] = mapped([{"body": "x", "timestamp": dt.datetime(2024, 1, 1)}],
                 pa.schema([("body", pa.string()), ("timestamp", pa.timestamp("s"))]))
    assert m.properties.timestamp == int(dt.datetime(2024, 1, 1, tzinfo=UTC).timestamp())


def test_properties_struct_is_mapped_and_a_flat_column_wins_over_it():
    struct = pa.struct([("content_type", pa.string()), ("priority", pa.int32()), ("app_id", pa.string()),
                        ("delivery_mode", pa.int32()), ("timestamp", pa.timestamp("us", tz="UTC"))])
    schema = pa.schema([("body", pa.string()), ("properties", struct), ("app_id", pa.string())])
    when = dt.datetime(2023, 3, 4, tzinfo=UTC)
    rows = [
        {"body": "a", "properties": {"content_type": "text/plain", "priority": 3, "app_id": "inner",
                                     "delivery_mode": 1, "timestamp": when}, "app_id": "flat"},
        {"body": "b", "properties": {"content_type": None, "priority": None, "app_id": "inner"}, "app_id": None},
        {"body": "c", "properties": None, "app_id": None},
    ]
    a, b, c = mapped(rows, schema, content_type="application/octet-stream")
    assert (a.properties.content_type, a.properties.priority, a.properties.app_id) == ("text/plain", 3, "flat")
    assert (a.properties.delivery_mode, a.properties.timestamp) == (1, int(when.timestamp()))
    # nulls in the struct fall back to the options' defaults; a null flat column to the struct
    assert (b.properties.content_type, b.properties.priority, b.properties.app_id) == \
        ("application/octet-stream", None, "inner")
    assert (b.properties.delivery_mode, c.properties.delivery_mode, c.properties.app_id) == (2, 2, None)


def test_the_read_schemas_properties_struct_is_accepted_as_is():
    """A DataFrame read from a stream (schema.py's properties struct, cluster_id included) writes back as is."""
    from pyspark_leveret.schema import PROPERTIES_STRUCT

    types = {"STRING": pa.string(), "INT": pa.int32()}
    fields = re.findall(r"(\w+): (STRING|INT)", PROPERTIES_STRUCT)
    assert len(fields) == 12
    struct = pa.struct([(name, types[t]) for name, t in fields])
    schema = pa.schema([("body", pa.binary()), ("headers", HEADERS), ("properties", struct)])
    check_schema(schema, MessageDefaults())
    props = {name: (5 if t == "INT" else f"v-{name}") for name, t in fields}
    [m] = mapped([{"body": b"x", "headers": {}, "properties": props}], schema)
    assert (m.properties.cluster_id, m.properties.priority, m.properties.message_id) == \
        ("v-cluster_id", 5, "v-message_id")


def test_headers_map_is_merged_with_the_dedup_header():
    schema = pa.schema([("body", pa.string()), ("headers", HEADERS)])
    a, b, c = mapped([{"body": "a", "headers": {"tenant": "acme", "trace": "t1"}},
                      {"body": "b", "headers": {DEDUP_HEADER: "mine"}},
                      {"body": "c", "headers": None}], schema, prefix="P")
    assert a.properties.headers == {"tenant": "acme", "trace": "t1", DEDUP_HEADER: "P:0"}
    assert b.properties.headers == {DEDUP_HEADER: "mine"}  # a header the row sets itself is kept
    assert b.properties.message_id == "P:1"
    assert c.properties.headers == {DEDUP_HEADER: "P:2"}


def test_typed_header_values_keep_their_amqp_type_and_floats_become_text():
    schema = pa.schema([("body", pa.string()), ("headers", pa.map_(pa.string(), pa.int64()))])
    [m] = mapped([{"body": "a", "headers": {"n": 5, "big": 2**40}}], schema)
    assert m.properties.headers["n"] == 5 and m.properties.headers["big"] == 2**40
    schema = pa.schema([("body", pa.string()), ("headers", pa.map_(pa.string(), pa.float64()))])
    [m] = mapped([{"body": "a", "headers": {"ratio": 0.25}}], schema)
    assert m.properties.headers["ratio"] == "0.25"


def test_defaults_from_options_and_per_row_overrides():
    schema = pa.schema([("body", pa.string()), ("exchange", pa.string()), ("routing_key", pa.string())])
    a, b = mapped([{"body": "a", "exchange": None, "routing_key": None},
                   {"body": "b", "exchange": "other", "routing_key": "rk.b"}], schema,
                  exchange="events", routing_key="rk.default", delivery_mode=1, content_type="text/csv")
    assert (a.exchange, a.routing_key, a.properties.delivery_mode, a.properties.content_type) == \
        ("events", "rk.default", 1, "text/csv")
    assert (b.exchange, b.routing_key) == ("other", "rk.b")
    [m] = mapped([{"body": "x"}], pa.schema([("body", pa.string())]))
    assert (m.exchange, m.routing_key, m.properties.delivery_mode, m.properties.content_type) == ("", "", 2, None)


def test_generated_keys_count_rows_across_batches():
    lists = list(message_batches(iter(batches(25, size=10)), MessageDefaults(), "job:4"))
    assert [len(x) for x in lists] == [10, 10, 5]  # one list per Arrow batch
    msgs = flat(iter(lists))
    assert [m.properties.message_id for m in msgs] == [f"job:4:{i}" for i in range(25)]
    assert all(m.properties.headers[DEDUP_HEADER] == m.properties.message_id for m in msgs)
    assert [m.body for m in msgs] == [f"row-{i}".encode() for i in range(25)]


def test_message_id_column_option_names_the_key():
    schema = pa.schema([("body", pa.string()), ("event_id", pa.int64()), ("message_id", pa.string())])
    a, b = mapped([{"body": "a", "event_id": 17, "message_id": None},
                   {"body": "b", "event_id": 18, "message_id": "own"}], schema, message_id_column="event_id")
    assert (a.properties.message_id, a.properties.headers[DEDUP_HEADER]) == ("17", "17")
    # the key comes from the named column; a message_id of the row's own stays its property
    assert (b.properties.message_id, b.properties.headers[DEDUP_HEADER]) == ("own", "18")
    with pytest.raises(ValueError, match="null `event_id`"):
        mapped([{"body": "a", "event_id": None}], schema, message_id_column="event_id")


def test_null_body_is_an_error():
    with pytest.raises(ValueError, match="null `body`"):
        mapped([{"body": "a"}, {"body": None}], pa.schema([("body", pa.string())]))


@pytest.mark.parametrize(("fields", "error"), [
    ([("value", pa.string())], "needs a `body` column"),
    ([("body", pa.int64())], "`body` must be binary or string"),
    ([("body", pa.string()), ("priority", pa.string())], "`priority` must be an integer"),
    ([("body", pa.string()), ("reply_to", pa.int32())], "`reply_to` must be a string"),
    ([("body", pa.string()), ("timestamp", pa.string())], "`timestamp` must be a timestamp"),
    ([("body", pa.string()), ("headers", pa.string())], "`headers` must be a map"),
    ([("body", pa.string()), ("properties", pa.string())], "`properties` must be a struct"),
    ([("body", pa.string()), ("properties", pa.struct([("conten_type", pa.string())]))], "conten_type"),
    ([("body", pa.string()), ("properties", pa.struct([("priority", pa.string())]))],
     "`priority` must be an integer"),
])
def test_schemas_that_cannot_be_published_are_refused(fields, error):
    with pytest.raises(WriteOptionError, match=error):
        check_schema(pa.schema(fields), MessageDefaults())


def test_message_id_column_must_exist():
    with pytest.raises(WriteOptionError, match="messageIdColumn names `nope`"):
        check_schema(pa.schema([("body", pa.string())]), MessageDefaults(message_id_column="nope"))


# -- options, writers, keys --------------------------------------------------------------------------------

SPARK_SCHEMA = StructType([StructField("body", BinaryType()), StructField("routing_key", StringType()),
                           StructField("headers", MapType(StringType(), StringType())),
                           StructField("priority", IntegerType()), StructField("timestamp", TimestampType())])


def test_options_are_parsed_case_insensitively_with_defaults():
    settings, defaults = parse_write_options({"uri": "amqp://u:p@h:1/v"})
    assert (settings.max_in_flight, settings.mandatory, defaults.delivery_mode) == (1000, False, 2)
    assert (defaults.exchange, defaults.routing_key, defaults.content_type) == ("", "", None)
    # Spark hands the options over lower-cased
    settings, defaults = parse_write_options({"uri": "amqp://h", "maxinflight": "7", "mandatory": "TRUE",
                                              "deliverymode": "1", "routingkey": "rk", "exchange": "x",
                                              "contenttype": "text/plain", "messageidcolumn": "k",
                                              "confirmtimeout": "2.5"})
    assert (settings.max_in_flight, settings.mandatory, settings.confirm_timeout) == (7, True, 2.5)
    assert defaults == MessageDefaults("x", "rk", 1, "text/plain", "k")
    _, defaults = parse_write_options({"uri": "amqp://h", "routingKey": "camel"})
    assert defaults.routing_key == "camel"


@pytest.mark.parametrize(("options", "error"), [
    ({}, '"uri" is required'),
    ({"uri": "amqp://h", "deliveryMode": "3"}, "deliveryMode must be 1"),
    ({"uri": "amqp://h", "maxInFlight": "0"}, "maxInFlight must be at least 1"),
    ({"uri": "amqp://h", "maxInFlight": "many"}, "must be an integer"),
    ({"uri": "amqp://h", "mandatory": "perhaps"}, "must be true or false"),
])
def test_bad_options_are_refused(options, error):
    with pytest.raises(WriteOptionError, match=error):
        parse_write_options(options)


@pytest.mark.parametrize("cls", [LeveretBatchWriter, LeveretStreamWriter])
def test_overwrite_is_refused_clearly(cls):
    with pytest.raises(WriteOptionError, match="cannot overwrite.*append"):
        cls({"uri": "amqp://h"}, SPARK_SCHEMA, True)


def test_spark_schema_is_checked_when_the_writer_is_made():
    with pytest.raises(WriteOptionError, match="`body`"):
        LeveretBatchWriter({"uri": "amqp://h"}, StructType([StructField("value", LongType())]), False)


@pytest.mark.parametrize("cls", [LeveretBatchWriter, LeveretStreamWriter])
def test_writers_pickle_to_plain_data(cls):
    w = cls({"uri": "amqp://guest:guest@127.0.0.1:5672/%2F", "exchange": "x"}, SPARK_SCHEMA, False)
    copy = pickle.loads(pickle.dumps(w))
    assert type(copy) is cls
    assert (copy.settings, copy.defaults) == (w.settings, w.defaults)
    assert getattr(copy, "job_id", None) == getattr(w, "job_id", None)


def test_a_retried_batch_task_repeats_its_keys_and_another_job_does_not():
    """Spark pickles one writer into every task; attempt 0 and attempt 1 of partition 3 unpickle the same
    bytes and so publish the same keys. A new save() builds a new writer: new keys."""
    writer = LeveretBatchWriter({"uri": "amqp://h"}, SPARK_SCHEMA, False)
    shipped = pickle.dumps(writer)

    def keys(w: LeveretBatchWriter, task: TaskIdentity) -> list[str]:
        msgs = flat(message_batches(iter(batches(30, size=7)), w.defaults, w.id_prefix(task)))
        return [m.properties.headers[DEDUP_HEADER] for m in msgs]

    first = keys(pickle.loads(shipped), TaskIdentity(partition_id=3, attempt=0))
    retry = keys(pickle.loads(shipped), TaskIdentity(partition_id=3, attempt=1))
    assert first == retry and len(set(first)) == 30
    assert first[0] == f"{writer.job_id}:3:0"
    assert set(first).isdisjoint(keys(pickle.loads(shipped), TaskIdentity(partition_id=4)))
    other_job = LeveretBatchWriter({"uri": "amqp://h"}, SPARK_SCHEMA, False)
    assert set(first).isdisjoint(keys(other_job, TaskIdentity(partition_id=3)))


def test_stream_keys_name_query_batch_and_partition():
    w = LeveretStreamWriter({"uri": "amqp://h"}, SPARK_SCHEMA, False)
    task = TaskIdentity(partition_id=1, attempt=2, query_id="q-uuid", batch_id="5")
    assert w.id_prefix(task) == "q-uuid:5:1"
    with pytest.raises(RuntimeError, match="query and batch ids"):
        w.id_prefix(TaskIdentity(partition_id=1))


def test_outside_spark_the_task_is_partition_zero():
    assert TaskIdentity.current() == TaskIdentity(partition_id=0, attempt=0)


# -- write() against a real broker ------------------------------------------------------------------------


@pytest.fixture
def channel(broker) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def drain_queue(broker, queue: str, timeout: float = 5.0) -> list[tuple[pika.BasicProperties, bytes]]:
    """Everything in a classic queue, by basic.get, once it stops growing."""
    conn = pika.BlockingConnection(broker.pika_params())
    try:
        ch = conn.channel()
        out = []
        deadline = time.monotonic() + timeout
        idle_since = None
        while time.monotonic() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 0.3:
                    break
                time.sleep(0.02)
                continue
            idle_since = None
            out.append((props, body))
        return out
    finally:
        conn.close()


def read_stream(broker, queue: str, quiet: float = 0.7, timeout: float = 15.0) -> list[tuple[pika.BasicProperties, bytes]]:
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


def test_write_lands_rows_in_a_queue_with_their_properties(broker, channel, uid):
    channel.queue_declare(uid, durable=True)
    writer = LeveretBatchWriter({"uri": broker.url, "routingKey": uid, "maxInFlight": "16"}, SPARK_SCHEMA, False)
    schema = pa.schema([("body", pa.binary()), ("headers", HEADERS), ("priority", pa.int32())])
    rows = [{"body": f"m{i}".encode(), "headers": {"i": str(i)}, "priority": i % 3} for i in range(100)]
    parts = pa.Table.from_pylist(rows, schema=schema).to_batches(max_chunksize=33)
    result = writer.write(iter(parts))
    assert (result.messages, result.partition_id, result.id_prefix) == (100, 0, f"{writer.job_id}:0")
    got = drain_queue(broker, uid)
    assert [body for _, body in got] == [f"m{i}".encode() for i in range(100)]
    for i, (props, _) in enumerate(got):
        assert props.headers == {"i": str(i), DEDUP_HEADER: f"{writer.job_id}:0:{i}"}
        assert (props.message_id, props.delivery_mode, props.priority) == (f"{writer.job_id}:0:{i}", 2, i % 3)


@pytest.mark.parametrize("window", [1, 7, 1000])
def test_every_row_is_confirmed_whatever_the_window(broker, channel, uid, window):
    channel.queue_declare(uid)
    writer = LeveretBatchWriter({"uri": broker.url, "routingKey": uid, "maxInFlight": str(window)}, None, False)
    assert writer.write(iter(batches(250, size=64))).messages == 250
    # the write returned only after the confirms: the rows are all in the queue already
    ok = channel.queue_declare(uid, passive=True)
    assert ok.method.message_count == 250


def test_write_into_a_stream_queue(broker, channel, uid):
    channel.queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    writer = LeveretBatchWriter({"uri": broker.url, "routingKey": uid}, None, False)
    assert writer.write(iter(batches(500, size=100))).messages == 500
    got = read_stream(broker, uid)
    assert [body for _, body in got] == [f"row-{i}".encode() for i in range(500)]


def test_rows_are_routed_by_their_own_exchange_and_routing_key(broker, channel, uid):
    channel.exchange_declare(f"{uid}-x", "direct")
    for key in ("red", "blue"):
        channel.queue_declare(f"{uid}-{key}")
        channel.queue_bind(f"{uid}-{key}", f"{uid}-x", key)
    channel.queue_declare(f"{uid}-direct")
    schema = pa.schema([("body", pa.string()), ("exchange", pa.string()), ("routing_key", pa.string())])
    rows = [{"body": "r1", "exchange": None, "routing_key": "red"},
            {"body": "b1", "exchange": None, "routing_key": "blue"},
            {"body": "d1", "exchange": "", "routing_key": f"{uid}-direct"},
            {"body": "r2", "exchange": None, "routing_key": None}]
    writer = LeveretBatchWriter({"uri": broker.url, "exchange": f"{uid}-x", "routingKey": "red"}, None, False)
    writer.write(iter([pa.RecordBatch.from_pylist(rows, schema=schema)]))
    assert [b for _, b in drain_queue(broker, f"{uid}-red")] == [b"r1", b"r2"]
    assert [b for _, b in drain_queue(broker, f"{uid}-blue")] == [b"b1"]
    # exchange "" in the row is a value, not a null: the default exchange, straight to the queue
    assert [b for _, b in drain_queue(broker, f"{uid}-direct")] == [b"d1"]


def test_mandatory_publish_with_no_route_fails_the_task(broker, channel, uid):
    channel.exchange_declare(f"{uid}-x", "direct")  # no queue bound
    writer = LeveretBatchWriter({"uri": broker.url, "exchange": f"{uid}-x", "mandatory": "true"}, None, False)
    with pytest.raises(PublishFailed, match="mandatory publish.*returned: 312"):
        writer.write(iter(batches(20)))
    # without mandatory the same rows are dropped by the exchange and the task succeeds
    lenient = LeveretBatchWriter({"uri": broker.url, "exchange": f"{uid}-x"}, None, False)
    assert lenient.write(iter(batches(20))).messages == 20


def test_rows_reach_the_broker_while_the_next_batch_is_computed(broker, channel, uid):
    """A slow upstream stage: the writer waits for batch 2 with batch 1 published. Batch 1 must be in the
    broker by then, not sitting in the client's buffer until batch 2 arrives."""
    channel.queue_declare(uid)
    seen_while_blocked = []

    def slow_upstream() -> Iterator[pa.RecordBatch]:
        yield from batches(50, size=50)
        deadline = time.monotonic() + 5
        while (depth := channel.queue_declare(uid, passive=True).method.message_count) < 50 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        seen_while_blocked.append(depth)
        yield from batches(10, size=10, start=50)

    writer = LeveretBatchWriter({"uri": broker.url, "routingKey": uid}, None, False)
    assert writer.write(slow_upstream()).messages == 60
    assert seen_while_blocked == [50]


def test_a_nack_fails_the_task(broker, channel, uid):
    channel.queue_declare(uid, arguments={"x-overflow": "reject-publish", "x-max-length": 0})
    writer = LeveretBatchWriter({"uri": broker.url, "routingKey": uid}, None, False)
    with pytest.raises(PublishFailed, match="nacked"):
        writer.write(iter(batches(10)))


def test_a_missing_exchange_fails_the_task(broker, uid):
    writer = LeveretBatchWriter({"uri": broker.url, "exchange": f"{uid}-absent"}, None, False)
    with pytest.raises(PublishFailed, match="channel closed.*404"):
        writer.write(iter(batches(5)))


def test_an_unreachable_broker_fails_the_task():
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    writer = LeveretBatchWriter({"uri": f"amqp://guest:secret@127.0.0.1:{port}/%2F"}, None, False)
    with pytest.raises(PublishFailed, match="could not connect") as failed:
        writer.write(iter(batches(5)))
    assert "secret" not in str(failed.value)  # the error ends up in Spark's logs


def test_confirms_that_never_come_fail_the_task(start_broker, uid):
    """A broker under a disk alarm stops reading publishing connections: no confirm ever comes. The task
    fails after confirmTimeout (plus the close grace: such a broker never answers connection.close)."""
    b = start_broker("--set", "disk_free_limit.absolute=1000TB")
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare(uid)
    conn.close()
    writer = LeveretBatchWriter({"uri": b.url, "routingKey": uid, "confirmTimeout": "1"}, None, False)
    started = time.monotonic()
    with pytest.raises(PublishFailed, match="no publisher confirm for 1 s"):
        writer.write(iter(batches(100)))
    assert time.monotonic() - started < 15


def test_an_empty_partition_opens_no_connection():
    writer = LeveretBatchWriter({"uri": "amqp://guest:guest@127.0.0.1:1/%2F"}, None, False)
    assert writer.write(iter([])).messages == 0
    empty = pa.table({"body": pa.array([], pa.string())}).to_batches()
    assert writer.write(iter(empty)).messages == 0


def test_an_upstream_failure_propagates_unchanged(broker, channel, uid):
    """Spark's input iterator raising mid-task (an upstream stage failing) fails the task with that error."""
    channel.queue_declare(uid)

    class UpstreamBroke(Exception):
        pass

    def rows() -> Iterator[pa.RecordBatch]:
        yield from batches(30, size=10)
        raise UpstreamBroke("stage failed")

    writer = LeveretBatchWriter({"uri": broker.url, "routingKey": uid}, None, False)
    with pytest.raises(UpstreamBroke):
        writer.write(rows())
    # rows published before the failure stay published (the retry repeats them under the same keys)
    assert len(drain_queue(broker, uid)) == 30


@pytest.mark.parametrize("queue_type", ["classic", "stream"])
def test_a_retried_task_adds_no_duplicate_to_a_deduplicating_queue(broker, channel, uid, queue_type):
    """Attempt 0 publishes 40 of its 100 rows and fails; attempt 1 publishes all 100 with the same keys.
    A queue declared with x-message-deduplication ends with each row once; a plain queue bound alongside
    sees the 140 publishes, which shows the retry really repeated rows."""
    channel.exchange_declare(f"{uid}-x", "fanout")
    channel.queue_declare(f"{uid}-dedup", durable=True, arguments={
        "x-queue-type": queue_type, "x-message-deduplication": True, "x-cache-size": 10_000})
    channel.queue_declare(f"{uid}-plain")
    for q in (f"{uid}-dedup", f"{uid}-plain"):
        channel.queue_bind(q, f"{uid}-x")
    shipped = pickle.dumps(LeveretBatchWriter({"uri": broker.url, "exchange": f"{uid}-x"}, None, False))

    def attempt0() -> Iterator[pa.RecordBatch]:
        yield from batches(40, size=20)
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError, match="executor lost"):
        pickle.loads(shipped).write(attempt0())
    assert pickle.loads(shipped).write(iter(batches(100, size=20))).messages == 100
    assert len(drain_queue(broker, f"{uid}-plain")) == 140
    read = read_stream if queue_type == "stream" else drain_queue
    assert sorted(b for _, b in read(broker, f"{uid}-dedup")) == sorted(f"row-{i}".encode() for i in range(100))
