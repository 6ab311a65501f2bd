"""``df.write`` / ``writeStream`` ``.format("leveret")``: each Spark task publishes its rows to an exchange with
publisher confirms (publisher.py), mapping columns to messages as rows_to_messages.py describes.

Options (Spark lower-cases option names; any case works):

* ``uri`` (required): ``amqp://user:pass@host:port/vhost``, parsed by ``pika.URLParameters``.
* ``exchange`` (default ``""``, the default exchange) and ``routingKey`` (default ``""``): for rows without
  ``exchange`` / ``routing_key`` columns or with nulls there.
* ``deliveryMode`` (1 or 2, default 2: persistent) and ``contentType``: property defaults.
* ``mandatory`` (``true``/``false``, default false): an unroutable row then fails the task.
* ``maxInFlight`` (default 1000): unconfirmed publishes per task.
* ``confirmTimeout`` (seconds, default 120): a task with publishes outstanding and no confirm for this long
  fails.
* ``messageIdColumn``: the column whose value is the message's idempotency key.
* ``caFile``, ``certFile``, ``keyFile``: TLS for an ``amqps://`` uri, as the reader takes them (tls.py).

Delivery is at-least-once per task (a task returns only when the broker confirmed all its messages; anything
less raises, and Spark retries the task), and exactly-once into a queue that de-duplicates: every row's key
is stable across attempts of its task. For a batch write the key is ``<job>:<partition>:<seq>``, ``<job>``
being a uuid drawn when Spark builds the writer on the driver; the writer object is pickled into every task,
so all attempts of a task share it, and a second ``save()`` is a new job with new keys. For a streaming
write it is ``<queryId>:<batchId>:<partition>:<seq>`` from the task's local properties, so a micro-batch
that Spark replays after a restart (same batch id, same offsets) repeats its keys too. Either way the key
holds only while a partition's rows arrive in the same order on every attempt; after a non-deterministic
shuffle use ``messageIdColumn``. The queue drops a repeated key only while it still remembers it: its
``x-cache-size`` (and ``x-cache-ttl``) must cover the rows a retry can repeat.

Batch writes need ``mode("append")``: Spark offers Python data sources only append and overwrite, and refuses
its default (``errorifexists``) before the writer is built; ``mode("overwrite")`` is refused here, since an
exchange has nothing to overwrite.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pyspark_leveret.publisher import PublishSettings, publish_confirmed
from pyspark_leveret.rows_to_messages import MessageDefaults, WriteOptionError, check_schema, message_batches
from pyspark_leveret.tls import TLSFiles

__all__ = ["LeveretBatchWriter", "LeveretCommitMessage", "LeveretStreamWriter", "TaskIdentity",
           "WriteOptionError", "parse_write_options"]


@dataclass
class LeveretCommitMessage(WriterCommitMessage):
    """What one task reports to the driver: how many rows it published, confirmed, under which key prefix."""

    partition_id: int
    attempt: int
    messages: int
    id_prefix: str


@dataclass(frozen=True)
class TaskIdentity:
    """The running task as Spark names it; ``query_id`` / ``batch_id`` exist only in streaming tasks."""

    partition_id: int
    attempt: int = 0
    query_id: str | None = None
    batch_id: str | None = None

    @classmethod
    def current(cls) -> TaskIdentity:
        """The task this code runs in; partition 0, attempt 0 when called outside Spark (a test driving the
        writer by hand stands for a single task)."""
        ctx = TaskContext.get()
        if ctx is None:
            return cls(partition_id=0)
        return cls(partition_id=ctx.partitionId(), attempt=ctx.attemptNumber(),
                   query_id=ctx.getLocalProperty("sql.streaming.queryId"),
                   batch_id=ctx.getLocalProperty("streaming.sql.batchId"))


def parse_write_options(options: Mapping[str, str]) -> tuple[PublishSettings, MessageDefaults]:
    """Spark's string options → typed settings, refusing bad values on the driver with the option named."""
    opts = {k.lower(): v for k, v in options.items()}
    uri = opts.get("uri")
    if not uri:
        raise WriteOptionError('option "uri" is required, e.g. amqp://guest:guest@127.0.0.1:5672/%2F')
    delivery_mode = _int(opts, "deliverymode", 2)
    if delivery_mode not in (1, 2):
        raise WriteOptionError(f"option deliveryMode must be 1 (transient) or 2 (persistent), not {delivery_mode}")
    max_in_flight = _int(opts, "maxinflight", 1000)
    if max_in_flight < 1:
        raise WriteOptionError(f"option maxInFlight must be at least 1, not {max_in_flight}")
    try:
        confirm_timeout = float(opts.get("confirmtimeout", "120"))
    except ValueError:
        raise WriteOptionError(f"option confirmTimeout must be seconds, not {opts['confirmtimeout']!r}") from None
    try:
        tls_files = TLSFiles.from_options(options)
    except ValueError as exc:
        raise WriteOptionError(str(exc)) from None
    settings = PublishSettings(uri=uri, max_in_flight=max_in_flight, mandatory=_bool(opts, "mandatory", False),
                               confirm_timeout=confirm_timeout, tls_files=tls_files)
    defaults = MessageDefaults(exchange=opts.get("exchange", ""), routing_key=opts.get("routingkey", ""),
                               delivery_mode=delivery_mode, content_type=opts.get("contenttype") or None,
                               message_id_column=opts.get("messageidcolumn") or None)
    return settings, defaults


def _int(opts: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(opts.get(key, default))
    except ValueError:
        raise WriteOptionError(f"option {key} must be an integer, not {opts[key]!r}") from None


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    value = opts.get(key)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise WriteOptionError(f"option {key} must be true or false, not {value!r}")


class _Publishing:
    """What both writers share: options checked on the driver, then one confirmed publish run per task.
    Only plain data lives here; the connection is opened inside :meth:`publish_task`, on the executor."""

    def __init__(self, options: dict[str, str], schema: StructType | pa.Schema | None, overwrite: bool) -> None:
        if overwrite:
            raise WriteOptionError('format("leveret") cannot overwrite: an exchange has no contents to replace. '
                                   'Use mode("append") (or no mode).')
        self.settings, self.defaults = parse_write_options(options)
        if schema is not None:
            check_schema(_arrow_schema(schema), self.defaults)

    def publish_task(self, batches: Iterator[pa.RecordBatch], task: TaskIdentity) -> LeveretCommitMessage:
        prefix = self.id_prefix(task)
        count = publish_confirmed(self.settings, message_batches(batches, self.defaults, prefix))
        return LeveretCommitMessage(partition_id=task.partition_id, attempt=task.attempt, messages=count,
                                    id_prefix=prefix)

    def id_prefix(self, task: TaskIdentity) -> str:
        raise NotImplementedError


class LeveretBatchWriter(_Publishing, DataSourceArrowWriter):
    """``df.write.format("leveret")``: message keys ``<job uuid>:<partition>:<seq>``."""

    def __init__(self, options: dict[str, str], schema: StructType | pa.Schema | None, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.job_id = uuid.uuid4().hex  # drawn once on the driver; every attempt of every task unpickles it

    def id_prefix(self, task: TaskIdentity) -> str:
        return f"{self.job_id}:{task.partition_id}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LeveretCommitMessage:
        return self.publish_task(iterator, TaskIdentity.current())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to finish: every task's messages were confirmed before it reported."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: AMQP cannot take back confirmed messages across tasks. What finished tasks published
        stays; re-running the job publishes under a new job id."""


class LeveretStreamWriter(_Publishing, DataSourceStreamArrowWriter):
    """``writeStream.format("leveret")``: message keys ``<queryId>:<batchId>:<partition>:<seq>``."""

    def id_prefix(self, task: TaskIdentity) -> str:
        if task.query_id is None or task.batch_id is None:
            raise RuntimeError("a streaming write needs the task's query and batch ids "
                               "(Spark sets them as local properties of micro-batch tasks)")
        return f"{task.query_id}:{task.batch_id}:{task.partition_id}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LeveretCommitMessage:
        return self.publish_task(iterator, TaskIdentity.current())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to finish: the micro-batch's messages were all confirmed by its tasks."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo; the batch's replay republishes the same keys, which a de-duplicating queue drops."""


def _arrow_schema(schema: StructType | pa.Schema) -> pa.Schema:
    if isinstance(schema, pa.Schema):
        return schema
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")  # the zone only labels timestamp columns; types are what is checked
