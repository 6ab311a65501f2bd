"""Closing client connections: rabbitmqctl's close_connection (one, by name), close_all_connections (a
vhost's or every vhost's, with a pause between two and a cap) and close_all_user_connections, each closed
with the operator's explanation as the reason the client sees (DELETE /api/connections/NAME, X-Reason)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from broker.tools.ctl.api import Api, node_name, q
from broker.tools.ctl.arguments import need, vhost_exists
from broker.tools.ctl.verb import Verb, VerbGroup


def close_connection(api: Api, args: argparse.Namespace) -> str:
    name, reason = need(args, 2, "CONNECTION_NAME EXPLANATION")
    api.request("DELETE", f"/api/connections/{q(name)}", headers={"X-Reason": reason})
    return f"Closing connection {name}, reason: {reason}..."


def _close_connections(api: Api, args: argparse.Namespace, rows: list[dict[str, Any]], reason: str) -> int:
    if args.limit:
        rows = rows[:args.limit]
    closed = 0
    for i, row in enumerate(rows):
        if i and args.per_connection_delay:
            time.sleep(args.per_connection_delay / 1000)
        if api.request("DELETE", f"/api/connections/{q(row['name'])}", headers={"X-Reason": reason},
                       ok_missing=True) is None:
            closed += 1  # 204 (gone now) or 404 (gone already): closed either way
    return closed


def close_all_connections(api: Api, args: argparse.Namespace) -> str:
    """``close_all_connections [-p VHOST] [--global] [--per-connection-delay MS] [--limit N] EXPLANATION``:
    the vhost's connections (every vhost's with ``--global``), each closed with the explanation as reason."""
    (reason,) = need(args, 1, "[-p VHOST] [--global] [--per-connection-delay MS] [--limit N] EXPLANATION")
    rows = api.get("/api/connections") or []
    if not args.global_:
        vhost_exists(api, args.vhost)
        rows = [r for r in rows if r.get("vhost") == args.vhost]
    closed = _close_connections(api, args, rows, reason)
    if args.quiet:
        return ""
    node = node_name(api)
    where = f"to node {node} (across all vhosts)" if args.global_ else f"in vhost {args.vhost} on node {node}"
    return (f"Closing all connections {where}, reason: {reason} (per-connection delay "
            f"{args.per_connection_delay} ms, limit {args.limit}) ...\nClosed {closed} connection(s)")


def close_all_user_connections(api: Api, args: argparse.Namespace) -> str:
    name, reason = need(args, 2, "USERNAME EXPLANATION")
    rows = [r for r in api.get("/api/connections") or [] if r.get("user") == name]
    closed = _close_connections(api, args, rows, reason)
    return "" if args.quiet else f"Closing connections of user {name}, reason: {reason} ...\nClosed {closed} " \
                                 "connection(s)"


CLOSE_ONE = VerbGroup({"close_connection": Verb(close_connection, only_banner=True)})
CLOSE_ALL = VerbGroup({
    "close_all_connections": Verb(close_all_connections),
    "close_all_user_connections": Verb(close_all_user_connections),
})
