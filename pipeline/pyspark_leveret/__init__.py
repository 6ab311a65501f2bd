"""Leveret as a Spark data source: ``spark.read`` / ``readStream`` of stream queues and ``df.write`` /
``writeStream`` to an exchange, format ``"leveret"``.

Spark 4 imports a top-level module named ``pyspark_<name>`` found on the workers' path and registers its
``DefaultSource`` on first use, so ``format("leveret")`` works with no ``register()`` call;
``spark.dataSource.register(DefaultSource)`` works too. Spark imports every ``pyspark_*`` module it finds
when it looks data sources up, so this module stays cheap to import: the reader and writer modules (pika,
pyarrow) load only when Spark asks for a reader or a writer.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from pyspark_leveret.schema import schema_for


class LeveretDataSource(DataSource):
    """Format ``leveret``: stream queues in (offsets are stream offsets), an exchange out."""

    @classmethod
    def name(cls) -> str:
        return "leveret"

    def schema(self) -> str:
        # The read schema depends on the options (bodyAs, bodyFormat + bodySchema): see schema.py.
        return schema_for(self.options)

    def reader(self, schema: Any) -> Any:
        from pyspark_leveret.reader import LeveretBatchReader

        return LeveretBatchReader(dict(self.options), schema)

    def streamReader(self, schema: Any) -> Any:
        from pyspark_leveret.reader import LeveretStreamReader, ReadConfig, queue_type

        options = dict(self.options)
        config = ReadConfig.from_options(options)
        if len(config.queues) == 1 and queue_type(config) in ("classic", "quorum"):
            # A classic or quorum queue: a destructive read, acked after its batch commits (queue_source.py).
            from pyspark_leveret.queue_source import LeveretQueueStreamReader

            return LeveretQueueStreamReader(options, schema, config)
        return LeveretStreamReader(options, schema)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from pyspark_leveret.writer import LeveretBatchWriter

        return LeveretBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from pyspark_leveret.writer import LeveretStreamWriter

        return LeveretStreamWriter(dict(self.options), schema, overwrite)


DefaultSource = LeveretDataSource

__all__ = ["DefaultSource", "LeveretDataSource"]
