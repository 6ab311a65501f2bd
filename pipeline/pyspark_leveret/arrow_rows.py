"""Deliveries → ``pyarrow.RecordBatch`` in the schema Spark asked for.

Why Arrow: Spark takes a Python data source's rows as Arrow batches either way; yielding tuples makes its
worker convert them one value at a time (measured while designing it, docs/decisions/spark-pipeline.md: about twice the time of handing it
batches). The batch's Arrow schema must equal ``to_arrow_schema(schema, timezone="UTC")`` exactly (Spark
checks), so it is derived from the Spark schema, never written by hand.

Each column is filled by name (schema.py's METADATA_COLUMNS); with ``bodyFormat=json`` every other column is
a field of the body parsed as a JSON object, converted to the column's type, null where it does not fit
(Spark's PERMISSIVE JSON mode). A delivery is amqp_read.py's tuple ``(offset, exchange, routing_key, body,
properties)``.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_leveret.amqp_read import PROPERTY_NAMES, Delivery
from pyspark_leveret.schema import METADATA_COLUMNS

_PROP_INDEX = {name: i for i, name in enumerate(PROPERTY_NAMES)}
_HEADERS = _PROP_INDEX["headers"]
_TIMESTAMP = _PROP_INDEX["timestamp"]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_INT_RANGES = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}

Converter = Callable[[Any], Any]


def header_text(value: Any) -> str | None:
    """An AMQP field value as the string the ``headers`` map holds: text as is, bytes as UTF-8, booleans
    as ``true`` / ``false``, tables and arrays as JSON, timestamps in ISO 8601."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (dict, list, tuple)):
        return _HEADER_JSON.encode(value)
    return str(value)


# One encoder for every table and array value: ``json.dumps`` with arguments builds a new JSONEncoder per call,
# which cost more than encoding a trace event's small arrays (its headers' texts: 17 → 14 µs, measured).
_HEADER_JSON = json.JSONEncoder(default=header_text, separators=(",", ":"))


# -- JSON bodies -------------------------------------------------------------------------------------------------

def json_converter(dtype: DataType) -> Converter:
    """A function taking a decoded JSON value to what Arrow takes for ``dtype``, or None when it does not fit."""
    if isinstance(dtype, StringType):
        return lambda v: v if isinstance(v, str) or v is None else json.dumps(v, separators=(",", ":"))
    if isinstance(dtype, BooleanType):
        return lambda v: v if isinstance(v, bool) else None
    for kind, bits in _INT_RANGES.items():
        if isinstance(dtype, kind):
            return _int_in_range(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if isinstance(dtype, (DoubleType, FloatType)):
        return lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if isinstance(dtype, DecimalType):
        return _to_decimal
    if isinstance(dtype, (TimestampType, TimestampNTZType)):
        return _to_timestamp
    if isinstance(dtype, DateType):
        return _to_date
    if isinstance(dtype, BinaryType):
        return _to_binary
    if isinstance(dtype, ArrayType):
        elem = json_converter(dtype.elementType)
        return lambda v: [elem(x) for x in v] if isinstance(v, list) else None
    if isinstance(dtype, MapType):
        value = json_converter(dtype.valueType)
        return lambda v: [(k, value(x)) for k, x in v.items()] if isinstance(v, dict) else None
    if isinstance(dtype, StructType):
        fields = [(f.name, json_converter(f.dataType)) for f in dtype.fields]
        return lambda v: {n: c(v.get(n)) for n, c in fields} if isinstance(v, dict) else None
    raise ValueError(f"bodyFormat=json cannot fill a column of type {dtype.simpleString()}")


def _int_in_range(lo: int, hi: int) -> Converter:
    def convert(v: Any) -> int | None:
        return v if type(v) is int and lo <= v <= hi else None

    return convert


def _to_decimal(v: Any) -> decimal.Decimal | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        return decimal.Decimal(str(v))
    except decimal.InvalidOperation:
        return None


def _to_timestamp(v: Any) -> datetime.datetime | None:
    """ISO 8601 text (no zone: UTC) or POSIX seconds."""
    try:
        if isinstance(v, str):
            ts = datetime.datetime.fromisoformat(v)
            return ts if ts.tzinfo else ts.replace(tzinfo=datetime.UTC)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return _EPOCH + datetime.timedelta(seconds=v)
    except (ValueError, OverflowError):
        pass
    return None


def _to_date(v: Any) -> datetime.date | None:
    if isinstance(v, str):
        try:
            return datetime.date.fromisoformat(v[:10])
        except ValueError:
            return None
    return None


def _to_binary(v: Any) -> bytes | None:
    """Base64 text, as Spark's JSON reader takes binary columns."""
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except ValueError:
            return None
    return None


def _parse_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


# -- the builder ---------------------------------------------------------------------------------------------------

class RowBuilder:
    """Builds RecordBatches for one Spark schema; made once per partition read."""

    def __init__(self, schema: StructType, json_body: bool = False) -> None:
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.json_body = json_body
        unknown = [f.name for f in schema.fields if f.name not in METADATA_COLUMNS]
        if unknown and not json_body:
            raise ValueError(f"columns {unknown} are not read from a stream (its columns: "
                             f"{list(METADATA_COLUMNS)}; others need bodyFormat=json)")
        self._json_fields = {name: json_converter(schema[name].dataType) for name in unknown}

    def batch(self, deliveries: Sequence[Delivery]) -> pa.RecordBatch:
        # Columns by transposition (zip in C), not one comprehension per column over the rows.
        columns = list(zip(*deliveries, strict=True)) if deliveries else [()] * 5
        properties = list(zip(*columns[4], strict=True)) if deliveries else [()] * len(PROPERTY_NAMES)
        parsed = [_parse_object(b) for b in columns[3]] if self._json_fields else None
        arrays = []
        for field, afield in zip(self.schema.fields, self.arrow_schema, strict=True):
            if field.name in self._json_fields:
                convert = self._json_fields[field.name]
                name = field.name
                values = [None if obj is None else convert(obj.get(name)) for obj in parsed or ()]
                arrays.append(_typed(values, afield.type))
            else:
                arrays.append(_metadata(field.name, afield.type, columns, properties))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


_COLUMN_OF = {"offset": 0, "exchange": 1, "routing_key": 2}


def _metadata(name: str, atype: pa.DataType, columns: list[tuple[Any, ...]],
              properties: list[tuple[Any, ...]]) -> pa.Array:
    """A metadata column from the transposed deliveries (``columns``) and properties (``properties``)."""
    if name in _COLUMN_OF:
        return _typed(columns[_COLUMN_OF[name]], atype)
    if name == "body":
        return _body(columns[3], atype)
    if name == "timestamp":
        values = [None if v is None else v * 1_000_000 for v in properties[_TIMESTAMP]]
        return pa.array(values, type=pa.int64()).cast(pa.timestamp("us", tz="UTC")).cast(atype)
    if name == "headers":
        return _headers(properties[_HEADERS], atype)
    if name == "properties":
        return _properties(properties, atype)
    raise AssertionError(name)


def _headers(tables: Sequence[dict[str, Any] | None], atype: pa.DataType) -> pa.Array:
    """The headers map column from its flat keys, texts and row offsets (one Arrow array each), not from a list
    of lists of pairs, which Arrow converts value by value (measured: a third of the column's time)."""
    if not pa.types.is_map(atype):
        return pa.array([[(k, header_text(v)) for k, v in t.items()] if t else [] for t in tables], type=atype)
    offsets = [0]
    keys: list[str] = []
    texts: list[str | None] = []
    for table in tables:
        if table:
            keys += table
            texts += [v if type(v) is str else header_text(v) for v in table.values()]
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, atype.key_type),
                                   pa.array(texts, atype.item_type), type=atype)


def _typed(values: Sequence[Any], atype: pa.DataType) -> pa.Array:
    """Values of their natural type, cast when the user's schema asked for another."""
    try:
        return pa.array(values, type=atype)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(values).cast(atype)


def _body(bodies: Sequence[bytes], atype: pa.DataType) -> pa.Array:
    raw = pa.array(bodies, type=pa.binary())
    if atype == pa.binary():
        return raw
    if pa.types.is_string(atype):
        try:
            return raw.cast(pa.string())  # validates UTF-8 in C
        except pa.ArrowInvalid:
            return pa.array([b.decode("utf-8", "replace") for b in bodies], type=atype)
    return raw.cast(atype)


def _properties(properties: list[tuple[Any, ...]], atype: pa.DataType) -> pa.Array:
    """The struct column, child by child (one Arrow array per property instead of a dict per row)."""
    if not pa.types.is_struct(atype):
        raise ValueError(f"column properties must be a struct, got {atype}")
    children = []
    fields = [atype.field(i) for i in range(atype.num_fields)]
    for f in fields:
        if f.name not in _PROP_INDEX or f.name in ("headers", "timestamp"):
            raise ValueError(f"properties has no field {f.name!r}")
        children.append(_typed(properties[_PROP_INDEX[f.name]], f.type))
    return pa.StructArray.from_arrays(children, fields=fields)
