"""``leveret perf``'s stream offsets (broker/tools/amqp_client.py ``Connection._mark_offset``, broker/tools/
perf.py ``_stream_part`` and ``_stream_summary``): each worker's consumers record the x-stream-offset of every
delivery, the workers' records are merged into distinct offsets, duplicates and gaps. A consumer group hands a
closing member's unsettled offsets to another member, redelivered; when that member is in another worker
process the offset was received by two workers, and that is no duplicate (test_perf_consumer_group_gets_each_
offset_once once failed so: 1 duplicate, 2 redelivered)."""

from __future__ import annotations

import asyncio
import struct

from broker.tools.amqp_client import Connection
from broker.tools.perf import _stream_part, _stream_summary


def _header_with_offset(offset: int) -> bytearray:
    """The bytes of a content header's headers table holding x-stream-offset (what _mark_offset looks for)."""
    return bytearray(b"\x0fx-stream-offset" + b"l" + struct.pack(">q", offset))


async def _worker(deliveries: list[tuple[int, bool]]) -> dict:
    """A perf worker with one consumer that received ``deliveries`` ((offset, redelivered) each)."""
    seen, again = bytearray(), bytearray()
    consumer = Connection()
    consumer.seen, consumer.again = seen, again
    for offset, redelivered in deliveries:
        consumer._redeliv = int(redelivered)
        buf = _header_with_offset(offset)
        consumer._mark_offset(buf, 0, len(buf))
    return _stream_part(seen, again, [consumer])


def summary(*workers: list[tuple[int, bool]]) -> dict:
    async def parts() -> list[dict]:
        return [await _worker(w) for w in workers]
    return _stream_summary(asyncio.run(parts()))


def fresh(*offsets: int) -> list[tuple[int, bool]]:
    return [(o, False) for o in offsets]


def test_an_offset_redelivered_to_another_worker_is_no_duplicate() -> None:
    st = summary(fresh(0, 1, 2, 3), [*fresh(4, 5), (3, True)])
    assert (st["distinct_offsets"], st["duplicates"], st["redelivered"], st["deliveries"], st["gaps"]) == \
        (6, 0, 1, 7, 0)


def test_an_offset_two_workers_both_received_first_is_a_duplicate() -> None:
    st = summary(fresh(0, 1, 2, 3), fresh(3, 4, 5))
    assert (st["distinct_offsets"], st["duplicates"], st["deliveries"]) == (6, 1, 7)


def test_an_offset_one_worker_received_twice_first_is_a_duplicate() -> None:
    st = summary(fresh(0, 1, 1, 2))
    assert (st["distinct_offsets"], st["duplicates"], st["deliveries"]) == (3, 1, 4)


def test_an_offset_received_only_redelivered_is_no_gap() -> None:
    st = summary(fresh(0, 1), [(3, False), (2, True)])
    assert (st["distinct_offsets"], st["gaps"], st["duplicates"], st["redelivered"]) == (4, 0, 0, 1)
