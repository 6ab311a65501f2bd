"""The rows a read yields (a DDL string Spark parses; the reader builds Arrow batches in this order).

``offset`` is the stream offset; ``timestamp`` is the message's AMQP timestamp property (POSIX seconds; null
when the publisher set none: a delivery says nothing of when the broker stored it); ``exchange`` /
``routing_key`` as delivered; ``body`` binary; ``headers`` with every value rendered as a string (the
``x-stream-offset`` header is the ``offset`` column, not repeated here); ``properties`` the 14 basic
properties minus ``headers`` and ``timestamp`` (which have columns of their own), typed.

Two options change the schema, so ``DataSource.schema()`` asks :func:`schema_for` (Spark calls it on the
driver, before any reader exists):

- ``bodyAs=string``: ``body`` is a STRING column (UTF-8; invalid bytes become U+FFFD).
- ``bodyFormat=json`` with ``bodySchema`` (a DDL column list, ``"user STRING, amount DOUBLE"``): the body
  is parsed as a JSON object and those columns take ``body``'s place. A body that is no JSON object, or a
  value of the wrong type, gives nulls (Spark's PERMISSIVE JSON mode) rather than failing the query. The
  names must not repeat a metadata column's.

The reader itself never parses DDL (that needs the JVM): it gets the final StructType from Spark and fills
each column by name, so a user ``.schema(...)`` naming a subset of the columns works as well.
"""

from __future__ import annotations

from collections.abc import Mapping

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

PROPERTIES_STRUCT = (
    "STRUCT<content_type: STRING, content_encoding: STRING, delivery_mode: INT, priority: INT, "
    "correlation_id: STRING, reply_to: STRING, expiration: STRING, message_id: STRING, type: STRING, "
    "user_id: STRING, app_id: STRING, cluster_id: STRING>"
)

READ_SCHEMA = (
    "offset BIGINT, timestamp TIMESTAMP, exchange STRING, routing_key STRING, body BINARY, "
    f"headers MAP<STRING, STRING>, properties {PROPERTIES_STRUCT}"
)

# The basic properties of the ``properties`` struct, in order, and which of them are integers.
PROPERTY_FIELDS = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                   "reply_to", "expiration", "message_id", "type", "user_id", "app_id", "cluster_id")
INT_PROPERTIES = frozenset({"delivery_mode", "priority"})
METADATA_COLUMNS = ("offset", "timestamp", "exchange", "routing_key", "body", "headers", "properties")

# READ_SCHEMA as a StructType, for code that must not start a JVM to parse DDL (tests drive the readers with
# it; a Spark test checks it equals what Spark makes of READ_SCHEMA).
READ_STRUCT = StructType([
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("exchange", StringType()),
    StructField("routing_key", StringType()),
    StructField("body", BinaryType()),
    StructField("headers", MapType(StringType(), StringType())),
    StructField("properties", StructType([
        StructField(name, IntegerType() if name in INT_PROPERTIES else StringType()) for name in PROPERTY_FIELDS
    ])),
])


def _option(options: Mapping[str, str], name: str) -> str | None:
    """Spark's options are case-insensitive; a plain dict copy of them is not."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def top_level_names(ddl: str) -> list[str]:
    """The column names of a DDL column list, split at top-level commas (``a INT, b STRUCT<x: INT, y: INT>``
    → ``["a", "b"]``); backquoted names keep their spelling. Enough to check collisions, not a parser."""
    names: list[str] = []
    depth, quoted = 0, False
    current: list[str] = []
    for ch in ddl + ",":
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "<(":
            depth += 1
        elif not quoted and ch in ">)":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            column = "".join(current).strip()
            if column:
                head = column[1:column.index("`", 1)] if column.startswith("`") else \
                    column.replace(":", " ").split()[0]
                names.append(head)
            current = []
            continue
        current.append(ch)
    return names


def schema_for(options: Mapping[str, str]) -> str:
    """READ_SCHEMA as the options shape it (``bodyAs``, ``bodyFormat`` + ``bodySchema``), as DDL."""
    body_as = (_option(options, "bodyAs") or "binary").lower()
    body_format = (_option(options, "bodyFormat") or "").lower()
    if body_as not in ("binary", "string"):
        raise ValueError(f"option bodyAs must be binary or string, got {body_as!r}")
    if body_format not in ("", "json"):
        raise ValueError(f"option bodyFormat must be json (or absent), got {body_format!r}")
    body = "body STRING" if body_as == "string" else "body BINARY"
    if body_format == "json":
        ddl = (_option(options, "bodySchema") or "").strip()
        if not ddl:
            raise ValueError("option bodyFormat=json needs bodySchema, a DDL column list such as "
                             "'user STRING, amount DOUBLE'")
        clash = sorted({n.lower() for n in top_level_names(ddl)} & set(METADATA_COLUMNS))
        if clash:
            raise ValueError(f"bodySchema columns {clash} clash with the metadata columns {list(METADATA_COLUMNS)}")
        body = ddl
    return (f"offset BIGINT, timestamp TIMESTAMP, exchange STRING, routing_key STRING, {body}, "
            f"headers MAP<STRING, STRING>, properties {PROPERTIES_STRUCT}")
