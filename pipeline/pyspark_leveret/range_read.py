"""One task's read of offsets ``[start, end)`` of a stream queue, on an executor.

The consumer starts at ``x-stream-offset = start`` with manual acks (on a stream an ack only gives credit
back) and takes each delivery's offset from its ``x-stream-offset`` header:

- offsets below ``start`` are skipped (a chunk-based store may start a consumer at its chunk's head);
- a first offset above ``start``, or any jump, means retention removed what lay between (offsets of a stream
  are dense): a :class:`DataLossError` naming them, or, with ``failOnDataLoss=false``, a warning and a skip;
- the read stops at ``end`` and cancels the consumer, so the same range always gives the same rows.

``end`` was planned below the stream's next offset, so those offsets exist: a read that hears nothing for
``readTimeout`` seconds fails with what it got and what the broker now reports, instead of hanging.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.types import StructType

from pyspark_leveret.amqp_read import AMQPReadError, Delivery, ReadTimeout, StreamConnection
from pyspark_leveret.arrow_rows import RowBuilder
from pyspark_leveret.client import ManagementAPI, ManagementError
from pyspark_leveret.offsets import DataLossError, data_loss_message

if TYPE_CHECKING:
    from pyspark_leveret.reader import ReadConfig

log = logging.getLogger("pyspark_leveret")


def read_stream_range(config: ReadConfig, schema: StructType, queue: str, start: int, end: int,
                      rows_per_batch: int) -> Iterator[pa.RecordBatch]:
    """RecordBatches of about ``rows_per_batch`` rows holding offsets ``[start, end)`` of ``queue``."""
    builder = RowBuilder(schema, config.json_body)  # a schema it cannot fill fails before connecting
    if end <= start:
        return iter(())
    return _read(config, builder, queue, start, end, rows_per_batch)


def _read(config: ReadConfig, builder: RowBuilder, queue: str, start: int, end: int,
          rows_per_batch: int) -> Iterator[pa.RecordBatch]:
    conn = StreamConnection(config.endpoint, config.read_timeout, config.header_keys)
    rows: list[Delivery] = []
    expected = start  # the next offset this range wants
    # The cyclic GC off while deliveries pile up: a batch's ~10k tuples would trigger collections that walk
    # every live object again and again (about a third of the reader's CPU, measured), and nothing here
    # makes cycles. Restored when the read ends, fails or is abandoned (the generator's finally).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        conn.open()
        conn.consume(queue, start, config.prefetch)
        done = False
        for chunk in conn.deliveries():
            for _tag, delivery in chunk:
                offset = delivery[0]
                if offset < expected:
                    if offset < 0:
                        raise AMQPReadError(f"a delivery from '{queue}' has no x-stream-offset header: "
                                            "is it a stream queue?")
                    continue
                if offset > expected:
                    _lost(config, queue, expected, min(offset, end))
                    expected = offset
                if offset >= end:
                    done = True
                    break
                rows.append(delivery)
                expected = offset + 1
                if len(rows) >= rows_per_batch:
                    yield builder.batch(rows)
                    rows = []
                if expected >= end:
                    done = True
                    break
            if done:
                break
            conn.ack(chunk[-1][0])
        if not done:
            raise AMQPReadError(f"the broker cancelled the consumer of '{queue}' at offset {expected} "
                                f"(reading {start}..{end - 1}): was the queue deleted?")
    except ReadTimeout as exc:
        _explain_timeout(config, queue, start, end, expected, exc)
    finally:
        conn.close()
        if gc_was_enabled:
            gc.enable()
    if rows:
        yield builder.batch(rows)


def _lost(config: ReadConfig, queue: str, first_missing: int, upto: int) -> None:
    message = data_loss_message({queue: (first_missing, upto)})
    if config.fail_on_data_loss:
        raise DataLossError(message)
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def _explain_timeout(config: ReadConfig, queue: str, start: int, end: int, expected: int,
                     exc: ReadTimeout) -> None:
    """Nothing came for readTimeout seconds: removed offsets (data loss) or a broker that stopped sending."""
    try:
        stats = ManagementAPI(config.endpoint).stream_stats(queue)
    except (ManagementError, ValueError) as api_exc:
        raise TimeoutError(f"reading '{queue}' offsets {start}..{end - 1}: {exc} while waiting for offset "
                           f"{expected} (and the HTTP API did not answer: {api_exc})") from exc
    if stats.first_offset > expected:
        _lost(config, queue, expected, min(stats.first_offset, end))
        if stats.first_offset >= end:
            return  # failOnDataLoss=false and the rest of the range is gone: done
    raise TimeoutError(f"reading '{queue}' offsets {start}..{end - 1}: {exc} while waiting for offset "
                       f"{expected}; the stream now holds offsets {stats.first_offset}.."
                       f"{stats.next_offset - 1}") from exc
