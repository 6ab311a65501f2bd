"""Links to other brokers: rabbitmqctl's shovel_status and restart_shovel (dynamic shovels, GET /api/shovels)
and federation_status (GET /api/federation-links), with rabbitmqctl 3.10.8's columns in its order."""

from __future__ import annotations

import argparse

from broker.tools.ctl.api import Api, node_name, q
from broker.tools.ctl.arguments import need
from broker.tools.ctl.errors import EX_UNAVAILABLE, CtlError
from broker.tools.ctl.output import rows_out
from broker.tools.ctl.verb import Verb, VerbGroup

# GET /api/shovels' fields → rabbitmqctl shovel_status's columns (src_* → source_*, dest_* → destination_*).
SHOVEL_STATUS_COLUMNS = {"src_uri": "source", "src_protocol": "source_protocol", "src_queue": "source_queue",
                         "src_exchange": "source_exchange", "src_exchange_key": "source_exchange_key",
                         "dest_uri": "destination", "dest_protocol": "destination_protocol",
                         "dest_queue": "destination_queue", "dest_exchange": "destination_exchange",
                         "dest_exchange_key": "destination_exchange_key", "reason": "termination_reason",
                         "timestamp": "last_changed", "name": "name", "vhost": "vhost", "type": "type",
                         "state": "state"}
SHOVEL_STATUS_ALWAYS = ("destination", "last_changed", "name", "source", "state", "termination_reason", "type",
                        "vhost")


def shovel_status(api: Api, args: argparse.Namespace) -> str:
    """``shovel_status``: every shovel of the node (GET /api/shovels) with rabbitmqctl 3.10.8's columns in
    its order (alphabetical, as it prints its maps; measured for a running queue-to-queue shovel:
    destination, destination_protocol, destination_queue, last_changed, name, source, source_protocol,
    source_queue, state, termination_reason, type, vhost). The protocol/queue/exchange columns are those
    the listed shovels have, so scripts that read rabbitmqctl's header read this one."""
    need(args, 0, "")
    rows = [{col: s[key] for key, col in SHOVEL_STATUS_COLUMNS.items() if s.get(key) is not None}
            for s in api.get("/api/shovels") or []]
    columns = sorted(set(SHOVEL_STATUS_ALWAYS).union(*(r.keys() for r in rows)))
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    return rows_out(args, columns, rows, f"Shovel status on node {node_name(api)}")


def restart_shovel(api: Api, args: argparse.Namespace) -> str:
    (name,) = need(args, 1, "[-p VHOST] NAME")
    try:
        api.request("DELETE", f"/api/shovels/vhost/{q(args.vhost)}/{q(name)}/restart")
    except CtlError as exc:
        if exc.status == 404:  # rabbitmqctl's words
            raise CtlError("Shovel with the given name was not found on the target node "
                           f"'{node_name(api)}' and / or virtual host '{args.vhost}'", EX_UNAVAILABLE) from None
        raise
    return "" if args.quiet else f'Restarting dynamic Shovel {name} in virtual host {args.vhost}'


# GET /api/federation-links' fields that rabbitmqctl federation_status shows, in its (alphabetical) order.
FEDERATION_STATUS_COLUMNS = ("error", "exchange", "id", "local_connection", "queue", "status", "timestamp", "type",
                             "upstream", "upstream_exchange", "upstream_queue", "uri", "vhost")
FEDERATION_STATUS_ALWAYS = ("exchange", "id", "local_connection", "status", "timestamp", "type", "upstream",
                            "upstream_exchange", "uri", "vhost")


def federation_status(api: Api, args: argparse.Namespace) -> str:
    """``federation_status``: every federation link of the node (GET /api/federation-links) with rabbitmqctl's
    columns, alphabetical as it prints its maps; ``error`` (and a queue link's ``queue``/``upstream_queue``)
    only when a listed link has one."""
    need(args, 0, "")
    rows = [{col: s[col] for col in FEDERATION_STATUS_COLUMNS if s.get(col) is not None}
            for s in api.get("/api/federation-links") or []]
    columns = sorted(set(FEDERATION_STATUS_ALWAYS).union(*(r.keys() for r in rows)))
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    return rows_out(args, columns, rows, f"Listing federation links on node {node_name(api)} ...")


GROUP = VerbGroup({
    "shovel_status": Verb(shovel_status),
    "restart_shovel": Verb(restart_shovel),
    "federation_status": Verb(federation_status),
})
