"""AMQP field values as JSON, for everything that shows them to people or files: the HTTP API and
definitions export (message headers, queue and exchange arguments). Below both, so neither imports the other."""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import Any


def json_safe(value: Any) -> Any:
    """AMQP field values (pamqp's decoding) as JSON: bytes as text, decimals as numbers, times as seconds."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.replace(tzinfo=value.tzinfo or datetime.UTC).timestamp())
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
