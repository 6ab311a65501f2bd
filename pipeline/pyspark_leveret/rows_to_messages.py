"""Rows → AMQP messages: how the columns of a DataFrame written with ``format("leveret")`` become publishes.

Kept apart from the Spark writer classes so the mapping is tested with plain ``pyarrow`` batches and no JVM.

Columns (by name; any other column is ignored):

* ``body`` (required): binary, or string (encoded as UTF-8). A null body is an error, not an empty message.
* ``exchange`` / ``routing_key``: per row; a null falls back to the options ``exchange`` / ``routingKey``
  (an empty string is a value: the default exchange, or the empty routing key).
* ``headers``: a map (string keys) merged into the message's header table.
* the basic properties, as flat columns or as fields of a ``properties`` struct (the read schema's shape, so a
  DataFrame read from a stream writes back as is): ``content_type, content_encoding, delivery_mode, priority,
  correlation_id, reply_to, expiration, message_id, timestamp, type, user_id, app_id`` (and ``cluster_id``,
  which the read schema carries). A non-null flat column wins over the struct field; a null in both falls
  back to the options ``deliveryMode`` (default 2) and ``contentType``.

Every message gets an idempotency key, so a retried Spark task publishes the same ids again and a queue
declared with ``x-message-deduplication: true`` drops the second copies. The key is, in this order: the
value of the column named by option ``messageIdColumn`` (a null there is an error: such a row could not be
de-duplicated), the row's own ``message_id`` (unless null or empty), or ``<task prefix>:<seq>``, where
``seq`` counts the task's rows from 0 and the prefix names the job or micro-batch and the partition (see
writer.py). The key becomes the
``message_id`` property (unless the row has one) and the ``x-deduplication-header`` header (unless the row's
headers set it).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pika.spec import BasicProperties

DEDUP_HEADER = "x-deduplication-header"

STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                     "message_id", "type", "user_id", "app_id", "cluster_id")
INT_PROPERTIES = ("delivery_mode", "priority")
PROPERTY_NAMES = (*STRING_PROPERTIES, *INT_PROPERTIES, "timestamp")


class WriteOptionError(ValueError):
    """An option or the DataFrame's schema does not fit a write to Leveret (raised on the driver)."""


@dataclass(frozen=True)
class MessageDefaults:
    """What the options say for rows that do not say it themselves. Plain data: pickled to every task."""

    exchange: str = ""
    routing_key: str = ""
    delivery_mode: int | None = 2
    content_type: str | None = None
    message_id_column: str | None = None


class Message(NamedTuple):
    """One publish: where to, what, and with which properties."""

    exchange: str
    routing_key: str
    body: bytes
    properties: BasicProperties


def check_schema(schema: pa.Schema, defaults: MessageDefaults) -> None:
    """Refuse a schema that cannot be published, with the column at fault named (before any task runs)."""
    names = set(schema.names)
    if "body" not in names:
        raise WriteOptionError("a DataFrame written to Leveret needs a `body` column (binary or string)")
    _expect(schema.field("body"), _is_text_or_binary, "binary or string")
    for name in ("exchange", "routing_key"):
        if name in names:
            _expect(schema.field(name), _is_text, "a string")
    for name in PROPERTY_NAMES:
        if name in names:
            _check_property(schema.field(name))
    if "headers" in names:
        headers = schema.field("headers")
        if not pa.types.is_map(headers.type) or not _is_text(headers.type.key_type):
            raise WriteOptionError(f"column `headers` must be a map with string keys, not {headers.type}")
    if "properties" in names:
        props = schema.field("properties")
        if not pa.types.is_struct(props.type):
            raise WriteOptionError(f"column `properties` must be a struct, not {props.type}")
        unknown = [f.name for f in props.type if f.name not in PROPERTY_NAMES]
        if unknown:
            raise WriteOptionError(f"`properties` has fields that are not basic properties: {unknown}; "
                                   f"known: {list(PROPERTY_NAMES)}")
        for f in props.type:
            _check_property(f)
    if defaults.message_id_column and defaults.message_id_column not in names:
        raise WriteOptionError(f"option messageIdColumn names `{defaults.message_id_column}`, "
                               f"which is not a column (columns: {schema.names})")


def _check_property(field: pa.Field) -> None:
    if field.name in INT_PROPERTIES:
        _expect(field, pa.types.is_integer, "an integer")
    elif field.name == "timestamp":
        _expect(field, _is_time, "a timestamp or integer seconds")
    else:
        _expect(field, _is_text, "a string")


def _expect(field: pa.Field, test: Any, wanted: str) -> None:
    if not test(field.type):
        raise WriteOptionError(f"column `{field.name}` must be {wanted}, not {field.type}")


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_text_or_binary(t: pa.DataType) -> bool:
    return _is_text(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _is_time(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_integer(t)


def message_batches(batches: Iterable[pa.RecordBatch], defaults: MessageDefaults,
                    id_prefix: str) -> Iterator[list[Message]]:
    """The task's messages, one list per Arrow batch, lazily (the publisher lets its socket drain at each
    batch's end, before it waits for the next). ``seq`` runs on across batches, so the keys of a partition
    depend only on its rows' order, which a retried task repeats."""
    seq = 0
    checked: pa.Schema | None = None
    for batch in batches:
        if checked is None or not batch.schema.equals(checked):
            check_schema(batch.schema, defaults)
            checked = batch.schema
        yield _batch_messages(batch, defaults, id_prefix, seq)
        seq += batch.num_rows


def _batch_messages(batch: pa.RecordBatch, d: MessageDefaults, id_prefix: str, seq0: int) -> list[Message]:
    """Column-wise first (fallbacks resolved with Arrow's coalesce, one Python list per column in use), then
    one cheap pass over the rows: on 2 cores every microsecond per row here is one the broker does not get."""
    n = batch.num_rows
    body = batch.column("body")
    if body.null_count:
        first_null = body.is_null().to_pylist().index(True)
        raise ValueError(f"row {seq0 + first_null} of the task has a null `body`")
    bodies = body.cast(pa.binary()).to_pylist() if _is_text(body.type) else body.to_pylist()
    exchanges = _resolved(batch, None, "exchange", pa.string(), d.exchange)
    routing_keys = _resolved(batch, None, "routing_key", pa.string(), d.routing_key)
    assert exchanges is not None and routing_keys is not None
    struct = _struct_fields(batch)
    props: dict[str, list[Any]] = {}
    for name in PROPERTY_NAMES:
        default = d.delivery_mode if name == "delivery_mode" else d.content_type if name == "content_type" else None
        target = pa.string() if name in STRING_PROPERTIES else pa.int64()
        values = _resolved(batch, struct, name, target, default)
        if values is not None:
            props[name] = values
    own_ids = props.pop("message_id", None)
    keys = _keys(batch, d, id_prefix, seq0, own_ids)
    i_headers = batch.schema.get_field_index("headers")
    headers = batch.column(i_headers).to_pylist() if i_headers >= 0 else None
    prop_columns = list(props.items())
    out = []
    for i in range(n):
        key = keys[i]
        p = BasicProperties()
        for name, values in prop_columns:
            setattr(p, name, values[i])
        p.message_id = (own_ids[i] if own_ids is not None else None) or key
        table = _header_table(headers[i]) if headers is not None else {}
        table.setdefault(DEDUP_HEADER, key)
        p.headers = table
        out.append(Message(exchanges[i], routing_keys[i], bodies[i], p))
    return out


def _struct_fields(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """The ``properties`` struct's fields as arrays; ``flatten`` makes a field null where the struct is."""
    i = batch.schema.get_field_index("properties")
    if i < 0:
        return {}
    column = batch.column(i)
    return {field.name: arr for field, arr in zip(column.type, column.flatten(), strict=True)}


def _resolved(batch: pa.RecordBatch, struct: dict[str, pa.Array] | None, name: str, target: pa.DataType,
              default: Any) -> list[Any] | None:
    """One value per row: the flat column, else the struct field, else ``default``; None when all three are
    absent (the property is left unset)."""
    sources = []
    i = batch.schema.get_field_index(name)
    if i >= 0:
        sources.append(batch.column(i))
    if struct and name in struct:
        sources.append(struct[name])
    if not sources:
        return None if default is None else [default] * batch.num_rows
    arrays = [_normalised(a, target) for a in sources]
    if default is not None:
        arrays.append(pa.scalar(default, target))
    merged = arrays[0] if len(arrays) == 1 else pc.coalesce(*arrays)
    return merged.to_pylist()


def _normalised(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Same type for every source of one property. Timestamps become whole POSIX seconds (what AMQP carries;
    the stored value of an Arrow timestamp is UTC whatever its zone label, and a naive one is taken as UTC)."""
    if pa.types.is_timestamp(arr.type):
        arr = pc.floor_temporal(arr, unit="second").cast(pa.timestamp("s", arr.type.tz)).cast(pa.int64())
    return arr.cast(target) if arr.type != target else arr


def _keys(batch: pa.RecordBatch, d: MessageDefaults, id_prefix: str, seq0: int,
          own_ids: list[str | None] | None) -> list[str]:
    if d.message_id_column:
        column = batch.column(d.message_id_column)
        if column.null_count:
            first_null = column.is_null().to_pylist().index(True)
            raise ValueError(f"row {seq0 + first_null} of the task has a null `{d.message_id_column}` "
                             "(option messageIdColumn): it could not be de-duplicated")
        return [str(v) for v in column.to_pylist()]
    generated = [f"{id_prefix}:{seq}" for seq in range(seq0, seq0 + batch.num_rows)]
    if own_ids is None:
        return generated
    return [own or key for own, key in zip(own_ids, generated, strict=True)]


def _header_table(entries: list[tuple[str, Any]] | dict[str, Any] | None) -> dict[str, Any]:
    """Arrow gives a map as (key, value) pairs. Values become AMQP field values; the types the AMQP field
    table cannot hold (pika has no float) are written as their text, so nothing is dropped silently."""
    if not entries:
        return {}
    items = entries.items() if isinstance(entries, dict) else entries
    return {k: _field_value(v) for k, v in items}


def _field_value(v: Any) -> Any:
    if v is None or isinstance(v, (str, bytes, bool, int, decimal.Decimal, dt.datetime)):
        return v
    if isinstance(v, dt.date):
        return dt.datetime(v.year, v.month, v.day, tzinfo=dt.UTC)
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, dict):
        return {str(k): _field_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_field_value(x) for x in v]
    return str(v)
