"""What the clients print: rabbitmqctl's info columns read from the API's JSON (``a.b`` for a nested field,
an alias for a column the API names otherwise), an aligned table or a JSON array, the banner line that ``-q``
leaves out, the error for a column a verb does not have, and what each listener is for."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from broker.tools.ctl.errors import EX_USAGE, CtlError


def field(row: dict[str, Any], column: str, aliases: Mapping[str, Any]) -> Any:
    """Column ``column`` of one API object: its alias (a dotted path, or a function of the row) or itself."""
    alias = aliases.get(column, column)
    if callable(alias):
        return alias(row)
    cur: Any = row
    for part in alias.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def check_columns(verb: str, columns: list[str], allowed: list[str]) -> None:
    """An info column the verb does not have is an error naming the ones it has (as rabbitmqctl answers
    ``Info key(s) ... are not supported``), never an empty column. ``a.b`` reads field ``b`` of column
    ``a`` (e.g. ``client_properties.connection_name``)."""
    known = set(allowed)
    bad = [c for c in columns if c not in known and c.split(".", 1)[0] not in known]
    if bad:
        raise CtlError(f"Info key(s) {', '.join(bad)} are not supported by {verb}. Allowed: {', '.join(allowed)}",
                       EX_USAGE)


def cell(value: Any) -> str:
    """One value as rabbitmqctl prints it in a table: booleans in lower case, lists of names bracketed, other
    structures as compact JSON, nothing for a missing value."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return "[" + ", ".join(value) + "]"
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def render_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A header and the rows, each column as wide as its widest cell, trailing spaces stripped."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def rows_out(args: argparse.Namespace, columns: list[str], rows: list[dict[str, Any]], banner: str,
             aliases: Mapping[str, Any] | None = None) -> str:
    """A listing as the list_* verbs print it: banner line, header, one row per item (``-q``: rows only;
    ``--formatter json``: a JSON array of objects)."""
    cells = [[field(r, c, aliases or {}) for c in columns] for r in rows]
    if args.formatter == "json":
        return json.dumps([dict(zip(columns, r)) for r in cells], indent=1)
    table = render_table(columns, cells)
    if args.quiet:
        return "\n".join(table.splitlines()[1:])
    return f"{banner}\n{table}"


def listener_purpose(protocol: str) -> str:
    """What a listener is for, in the words rabbitmqctl and rabbitmq-diagnostics print beside it."""
    return {"amqp": "AMQP 0-9-1", "amqp/ssl": "AMQP 0-9-1 over TLS", "http": "HTTP API",
            "https": "HTTP API over TLS (HTTPS)", "http/prometheus": "Prometheus exporter API over HTTP",
            "https/prometheus": "Prometheus exporter API over TLS (HTTPS)"}.get(protocol, protocol)
