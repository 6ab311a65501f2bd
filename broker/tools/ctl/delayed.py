"""The pending messages of an ``x-delayed-message`` exchange (/api/exchanges/{vhost}/{name}/delayed:
broker/management/delayed.py), Leveret's verbs: ``list_delayed EXCHANGE [COLUMN ...]`` walks every page by
due time; ``cancel_delayed EXCHANGE ID`` cancels one (the id as listed); ``purge_delayed EXCHANGE`` all."""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import need
from broker.tools.ctl.errors import CtlError
from broker.tools.ctl.output import check_columns, field, render_table
from broker.tools.ctl.verb import Verb, VerbGroup

DELAYED_COLUMNS = ["id", "due", "routing_key", "payload_bytes"]
DELAYED_ALLOWED = ["id", "due", "due_ms", "delay_ms", "routing_key", "size", "payload_bytes", "persistent",
                   "properties", "payload", "payload_encoding"]
DELAYED_PAGE = 500


def list_delayed(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    if not args.columns:
        raise CtlError("usage: leveret ctl list_delayed [-p VHOST] EXCHANGE [COLUMN ...]", 2)
    name, *columns = args.columns
    columns = columns or DELAYED_COLUMNS
    check_columns(args.verb, columns, DELAYED_ALLOWED)
    base = f"/api/exchanges/{q(vhost)}/{q(name)}/delayed?page_size={DELAYED_PAGE}"
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = api.get(base + (f"&after={q(cursor)}" if cursor else ""))
        rows += page["items"]
        cursor = page.get("next")
        if not cursor:
            break
    cells = [[field(r, c, {}) for c in columns] for r in rows]
    if args.formatter == "json":
        return json.dumps([dict(zip(columns, r)) for r in cells], indent=1)
    table = render_table(columns, cells)
    if args.quiet:
        return "\n".join(table.splitlines()[1:])
    return f"Listing delayed messages of exchange '{name}' in vhost '{vhost}' ...\n{table}"


def cancel_delayed(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    name, ident = need(args, 2, "[-p VHOST] EXCHANGE ID")
    api.request("DELETE", f"/api/exchanges/{q(vhost)}/{q(name)}/delayed/{q(ident)}")
    return f"Cancelling delayed message {ident} of exchange '{name}' in vhost '{vhost}' ..."


def purge_delayed(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    (name,) = need(args, 1, "[-p VHOST] EXCHANGE")
    before = api.get(f"/api/exchanges/{q(vhost)}/{q(name)}").get("delayed_pending", 0)
    api.request("DELETE", f"/api/exchanges/{q(vhost)}/{q(name)}/delayed")
    return f"Purging delayed messages of exchange '{name}' in vhost '{vhost}' ...\n{before} pending before"


GROUP = VerbGroup({
    "list_delayed": Verb(list_delayed),
    "cancel_delayed": Verb(cancel_delayed, only_banner=True),
    "purge_delayed": Verb(purge_delayed, only_banner=True),
})
