"""Time positions of the Spark source (Kafka's ``startingTimestamp``, ``startingOffsetsByTimestamp``,
``endingTimestamp``, ``endingOffsetsByTimestamp``, ``startingOffsetsByTimestampStrategy``): the options'
forms (pure), and the broker's answer to "the first offset appended at or after this millisecond" through a
stream consumer's ``x-stream-offset`` timestamp (pyspark_leveret/time_offsets.py), against a real broker.
The Spark read with a time position is in test_spark_read.py.
"""

from __future__ import annotations

import json
import struct
import time

import pytest
from pyspark_leveret.client import StreamStats
from pyspark_leveret.offsets import AtTime, parse_positions, resolve, times_in
from pyspark_leveret.reader import LeveretBatchReader, LeveretStreamReader, StreamPartition
from pyspark_leveret.schema import READ_STRUCT
from pyspark_leveret.time_offsets import consume_at_time_frame, offsets_at_times, timestamp_value
from read_helpers import declare_stream, fill, instant_between, now_ms, read_options, read_partitions

pytestmark = pytest.mark.leveret_only  # a timestamp above 2**32 read as milliseconds is Leveret's (and pamqp's)


def test_time_options_forms_and_precedence():
    qs = ["a", "b"]
    assert parse_positions(None, None, None, qs, "earliest", "starting") == {"a": "earliest", "b": "earliest"}
    assert parse_positions("latest", " 1700000000123 ", '{"a": 5}', qs, "earliest", "starting") == \
        {"a": AtTime(1700000000123), "b": AtTime(1700000000123)}  # the single time wins, as in Kafka
    # The JSON form wins over startingOffsets for the queues it names; the others keep their offsets.
    assert parse_positions('{"a": 3, "b": 4}', None, '{"b": "1700000000000"}', qs, "earliest", "starting") == \
        {"a": 3, "b": AtTime(1700000000000)}
    for bad, match in (("soon", "startingTimestamp"), ("-5", "startingTimestamp"), ("1.5", "startingTimestamp")):
        with pytest.raises(ValueError, match=match):
            parse_positions(None, bad, None, qs, "earliest", "starting")
    for bad in ('{"c": 1}', '{"a": -1}', '{"a": true}', "[1]", "{nope"):
        with pytest.raises(ValueError, match="option endingOffsetsByTimestamp"):
            parse_positions(None, None, bad, qs, "latest", "ending")
    specs = {"a": AtTime(10), "b": "latest"}
    assert times_in(specs) == [("a", 10)]
    st = {"a": StreamStats("a", 5, 50, 0), "b": StreamStats("b", 0, 0, 0)}
    assert resolve(specs, st, {("a", 10): 17}) == {"a": 17, "b": 0}
    assert resolve(specs, st, {("a", 10): 60}) == {"a": 50, "b": 0}  # appended after the plan's view: its end
    assert resolve(specs, st, {("a", 10): None}) == {"a": 50, "b": 0}  # no match, latest: the end
    with pytest.raises(ValueError, match=r"no message of queue 'a' was appended at or after 10 "
                                         r"\(1970-01-01T00:00:00.010\+00:00\); it holds offsets 5\.\.49\. "
                                         r"Set option startingOffsetsByTimestampStrategy=latest"):
        resolve(specs, st, {("a", 10): None}, "error")


def test_timestamp_sent_in_seconds_when_whole_else_in_milliseconds():
    assert timestamp_value(1_700_000_000_000) == 1_700_000_000  # RabbitMQ's reading, exact
    assert timestamp_value(1_700_000_000_123) == 1_700_000_000_123  # above 2**32: Leveret reads milliseconds
    assert timestamp_value(1_500) == 1  # January 1970: seconds (milliseconds this small would read as seconds)
    frame = consume_at_time_frame("orders", "tag", 1_700_000_000_123)
    assert frame.endswith(b"\x0fx-stream-offsetT" + struct.pack(">Q", 1_700_000_000_123) + b"\xce")
    assert frame[:3] == b"\x01\x00\x01" and struct.unpack_from(">HH", frame, 7) == (60, 20)


def test_times_resolve_to_the_first_offset_appended_at_or_after(broker, uid):
    """Three batches of ten, with an instant between each: the probe answers 0, 10, 20 or none, to the
    millisecond (the batches are a few milliseconds apart, and in runs here all within one second: a
    broker answering in seconds would say 0 for every instant)."""
    q = declare_stream(broker, f"{uid}-s")
    empty = declare_stream(broker, f"{uid}-empty")
    while now_ms() % 1000 > 300:  # a fresh second: the three batches then usually share it
        time.sleep(0.01)
    before = instant_between()
    fill(broker, q, 10)
    t1 = instant_between()
    fill(broker, q, 10, start=10)
    t2 = instant_between()
    fill(broker, q, 10, start=20)
    after = instant_between()
    stats = {q: StreamStats(q, 0, 30, 0), empty: StreamStats(empty, 0, 0, 0)}
    opts = read_options(broker, queue=q)
    endpoint = LeveretBatchReader(opts, READ_STRUCT).config.endpoint
    whole = before // 1000 * 1000  # sent in seconds
    found = offsets_at_times(endpoint, 10.0, [(q, before), (q, t1), (q, t2), (q, after), (empty, t1), (q, whole)],
                             stats)
    assert found == {(q, before): 0, (q, t1): 10, (q, t2): 20, (q, after): None, (empty, t1): None, (q, whole): 0}

    def batch(**extra: object) -> list[int]:
        reader = LeveretBatchReader(read_options(broker, queue=q, **extra), READ_STRUCT)
        return read_partitions(reader, reader.partitions()).column("offset").to_pylist()

    assert batch(startingTimestamp=t1) == list(range(10, 30))
    assert batch(startingOffsetsByTimestamp=json.dumps({q: t1}), endingOffsetsByTimestamp=json.dumps({q: t2})) \
        == list(range(10, 20))
    assert batch(endingTimestamp=t2, startingOffsets=5) == list(range(5, 20))
    assert batch(startingTimestamp=before, endingTimestamp=after) == list(range(30))  # an ending time past all
    # A starting time past every message: the read fails naming the queue (Kafka's default), or starts at
    # the end with startingOffsetsByTimestampStrategy=latest.
    with pytest.raises(ValueError, match=f"option startingTimestamp: no message of queue '{q}' was appended "
                                         f"at or after {after} .*; it holds offsets 0..29"):
        LeveretBatchReader(read_options(broker, queue=q, startingTimestamp=after), READ_STRUCT).partitions()
    assert LeveretBatchReader(read_options(broker, queue=q, startingTimestamp=after,
                                           startingOffsetsByTimestampStrategy="LATEST"), READ_STRUCT
                              ).partitions() == []
    with pytest.raises(ValueError, match="must be error or latest"):
        LeveretBatchReader(read_options(broker, queue=q, startingOffsetsByTimestampStrategy="earliest"),
                           READ_STRUCT)

    # A stream starts at the time's offset; queues the JSON leaves out keep startingOffsets.
    stream = LeveretStreamReader(read_options(broker, queues=f"{q},{empty}", startingOffsets="earliest",
                                              startingOffsetsByTimestamp=json.dumps({q: t2})), READ_STRUCT)
    start = stream.initialOffset()
    assert start == {q: 20, empty: 0}
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    assert stream.partitions(start, end) == [StreamPartition(q, 20, 30)]
    with pytest.raises(ValueError, match=f"no message of queue '{empty}'.*it holds no message"):
        LeveretStreamReader(read_options(broker, queue=empty, startingTimestamp=t1), READ_STRUCT).initialOffset()
    with pytest.raises(ValueError, match="batch reads only"):
        LeveretStreamReader(read_options(broker, queue=q, endingTimestamp=t1), READ_STRUCT)
