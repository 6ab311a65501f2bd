"""Which offset an instant names: the first offset of a stream appended at or after a time (epoch
milliseconds), asked of the broker over AMQP, for ``startingTimestamp``, ``startingOffsetsByTimestamp`` and
``endingOffsetsByTimestamp`` (offsets.py says what the options mean; the management API has no such call).

A stream consumer's ``x-stream-offset`` may be an AMQP timestamp: the broker starts it at the first retained
offset whose append time is at or after that instant, or at the stream's end when there is none. A probe
opens such a consumer (prefetch 1) and reads the ``x-stream-offset`` header of its first delivery.

"No such message" must not be told from "not delivered yet" by waiting on a timer. So a second consumer,
opened after the first on the same channel, starts at the stream's last message. The broker's delivery turn
serves every consumer with credit, and the first consumer's start is at or below the last message whenever
a message matches; so once the second consumer's delivery is in, the first one's was sent in the same turn
or before. Cancelling the first consumer and reading up to its cancel-ok collects it (a channel's frames
keep their order): nothing came means no retained message is that recent.

Precision: AMQP's timestamp counts seconds, which is what RabbitMQ reads. Leveret reads a value above 2**32
as milliseconds (pamqp's rule, and no date in seconds is that far off), so an instant on a whole second is
sent in seconds and any other in milliseconds: the answer is exact to the millisecond from Leveret, and a
RabbitMQ broker, given whole seconds, answers those exactly too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

from pamqp import commands
from pamqp.header import ContentHeader

from pyspark_leveret.amqp_read import FRAME_END, FRAME_METHOD, OFFSET_HEADER, AMQPReadError, StreamConnection
from pyspark_leveret.client import Endpoint, StreamStats

AT_TAG, LAST_TAG = "leveret-offset-at-time", "leveret-last-offset"
_MS_FROM = 0xFFFFFFFF  # a timestamp above this is milliseconds to Leveret (and to pamqp)


def timestamp_value(at_ms: int) -> int:
    """The AMQP timestamp sent for ``at_ms``: seconds when the instant is a whole second (or too early to
    be told from seconds: before 1970-02-19, when no stream was written), else milliseconds."""
    if at_ms % 1000 == 0 or at_ms <= _MS_FROM:
        return at_ms // 1000
    return at_ms


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">B", len(raw)) + raw


def consume_at_time_frame(queue: str, consumer_tag: str, at_ms: int, channel: int = 1) -> bytes:
    """basic.consume (manual acks) with ``x-stream-offset`` the timestamp of :func:`timestamp_value`, encoded
    here: pamqp encodes a datetime in whole seconds."""
    table = _shortstr("x-stream-offset") + b"T" + struct.pack(">Q", timestamp_value(at_ms))
    payload = (struct.pack(">HHH", 60, 20, 0) + _shortstr(queue) + _shortstr(consumer_tag) + b"\x00"
               + struct.pack(">I", len(table)) + table)
    return struct.pack(">BHI", FRAME_METHOD, channel, len(payload)) + payload + bytes([FRAME_END])


def offsets_at_times(endpoint: Endpoint, timeout: float, wanted: Iterable[tuple[str, int]],
                     stats: Mapping[str, StreamStats]) -> dict[tuple[str, int], int | None]:
    """For each ``(queue, epoch ms)``, the first offset appended at or after it, or None when no retained
    message is that recent (an empty stream has none). One connection for all of them."""
    wanted = sorted(set(wanted))
    out: dict[tuple[str, int], int | None] = {}
    asked = [(q, ms) for q, ms in wanted if stats[q].messages > 0]
    out.update({(q, ms): None for q, ms in wanted if stats[q].messages <= 0})
    if not asked:
        return out
    conn = StreamConnection(endpoint, timeout)
    try:
        conn.open()
        conn.send(commands.Basic.Qos(prefetch_count=1, global_=False), 1)
        conn.expect(commands.Basic.QosOk)
        for q, ms in asked:
            out[(q, ms)] = _probe(conn, q, ms, stats[q].next_offset - 1)
    finally:
        conn.close()
    return out


def _probe(conn: StreamConnection, queue: str, at_ms: int, last: int) -> int | None:
    # Both consumes at once: the channel handles them in order, and deliveries may come before either ok.
    conn.send_raw(consume_at_time_frame(queue, AT_TAG, at_ms))
    conn.send(commands.Basic.Consume(queue=queue, consumer_tag=LAST_TAG, arguments={"x-stream-offset": last}), 1)
    found: int | None = None
    tag = ""
    cancelling = False
    cancel_oks: set[str] = set()
    while len(cancel_oks) < 2:
        frame = conn.read_frame(f"a delivery from '{queue}'")
        if isinstance(frame, commands.Basic.Deliver):
            tag = frame.consumer_tag or ""
        elif isinstance(frame, commands.Basic.ConsumeOk):
            continue
        elif isinstance(frame, commands.Basic.CancelOk):
            cancel_oks.add(frame.consumer_tag or "")
        elif isinstance(frame, commands.Basic.Cancel):
            raise AMQPReadError(f"the broker cancelled the consumers of '{queue}': was the queue deleted?")
        elif isinstance(frame, ContentHeader):
            offset = (frame.properties.headers or {}).get(OFFSET_HEADER)
            if not isinstance(offset, int):
                raise AMQPReadError(f"a delivery from '{queue}' has no x-stream-offset header: is it a stream?")
            if tag == AT_TAG and found is None:
                found = offset
            if not cancelling:
                # Either answer is in: the first consumer delivered, or the turn that served the last message
                # has passed (what the first consumer got by then comes before its cancel-ok).
                cancelling = True
                for t in (AT_TAG, LAST_TAG):
                    conn.send(commands.Basic.Cancel(consumer_tag=t), 1)
    return found
