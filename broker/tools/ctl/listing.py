"""The ``list_*`` verbs of the broker's objects (queues, exchanges, bindings, connections, channels, consumers,
users, vhosts, permissions, policies, stream consumer groups): each one an API path, its default columns, the
columns it has and rabbitmqctl's names for the API's fields; one function lists them all."""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.output import check_columns, field, render_table
from broker.tools.ctl.verb import Verb, VerbGroup

# -- info columns: rabbitmqctl's names → the API's fields -------------------------------------------------------

# The consumer groups of stream queues (/api/stream-groups: broker/management/streams.py).
STREAM_GROUPS: dict[str, Any] = {
    "path": "/api/stream-groups/{vhost}",
    "default": ["stream", "group", "committed_offset", "cursor", "lag", "members"],
    "columns": ["vhost", "stream", "name", "committed_offset", "cursor", "outstanding", "lag", "consumers",
                "next_offset"],
    "title": "stream consumer groups",
    "aliases": {"group": "name", "reference": "name", "committed": "committed_offset", "members": "consumers",
                "queue": "stream"},
}

LISTS: dict[str, dict[str, Any]] = {
    "list_queues": {"path": "/api/queues/{vhost}", "default": ["name", "messages"], "title": "queues",
                    "aliases": {"pid": "node", "owner_pid": "owner_pid_details.name"},
                    "columns": ["name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "node", "type",
                                "state", "consumers", "publishers", "consumer_capacity", "consumer_utilisation",
                                "exclusive_consumer_tag", "policy", "operator_policy",
                                "effective_policy_definition", "messages", "messages_ready",
                                "messages_unacknowledged", "message_bytes", "message_bytes_ready",
                                "message_bytes_unacknowledged", "messages_paged_out", "memory", "message_stats",
                                "idle_since", "message_deduplication_cache_info",
                                # stream queues (broker/queues/stream_queue.py's info_items)
                                "leader", "members", "online", "readers", "first_offset", "offset", "last_offset",
                                "next_offset", "committed_offset", "segments", "stream_bytes", "consumer_groups"]},
    "list_exchanges": {"path": "/api/exchanges/{vhost}", "default": ["name", "type"], "title": "exchanges",
                       "aliases": {},
                       "columns": ["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments",
                                   "policy", "user_who_performed_action", "cache_info", "delayed_pending",
                                   "delayed_bytes", "delayed_next_due", "delayed_next_due_ms"]},
    "list_bindings": {"path": "/api/bindings/{vhost}",
                      "default": ["source_name", "source_kind", "destination_name", "destination_kind",
                                  "routing_key", "arguments"], "title": "bindings",
                      "aliases": {"source_name": "source", "source_kind": lambda r: "exchange",
                                  "destination_name": "destination", "destination_kind": "destination_type"},
                      "columns": ["vhost", "source", "destination", "destination_type", "routing_key", "arguments",
                                  "properties_key"]},
    "list_connections": {"path": "/api/connections", "default": ["user", "peer_host", "peer_port", "state"],
                         "title": "connections", "aliases": {"pid": "name", "timeout": "timeout"},
                         "columns": ["name", "node", "user", "vhost", "state", "type", "protocol", "host", "port",
                                     "peer_host", "peer_port", "ssl", "auth_mechanism", "timeout", "frame_max",
                                     "channel_max", "channels", "client_properties", "user_provided_name",
                                     "connected_at", "blocked", "recv_oct", "recv_cnt", "send_oct", "send_cnt",
                                     "send_pend", "recv_oct_details", "send_oct_details",
                                     "user_who_performed_action"]},
    "list_channels": {"path": "/api/channels", "default": ["pid", "user", "consumer_count",
                                                           "messages_unacknowledged"],
                      "title": "channels", "aliases": {"pid": "name", "connection": "connection_details.name"},
                      "columns": ["name", "node", "number", "user", "vhost", "state", "transactional", "confirm",
                                  "consumer_count", "messages_unacknowledged", "messages_uncommitted",
                                  "acks_uncommitted", "messages_unconfirmed", "prefetch_count",
                                  "global_prefetch_count", "pending_raft_commands", "connection_details",
                                  "user_who_performed_action"]},
    "list_consumers": {"path": "/api/consumers/{vhost}",
                       "default": ["queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                                   "active", "arguments"], "title": "consumers",
                       "aliases": {"queue_name": "queue.name", "channel_pid": "channel_details.name"},
                       "columns": ["consumer_tag", "ack_required", "prefetch_count", "active", "activity_status",
                                   "arguments", "exclusive", "priority", "queue", "channel_details"]},
    "list_users": {"path": "/api/users", "default": ["user", "tags"], "title": "users",
                   "aliases": {"user": "name"}, "columns": ["name", "tags", "limits", "hashing_algorithm"]},
    "list_vhosts": {"path": "/api/vhosts", "default": ["name"], "title": "vhosts", "aliases": {},
                    "columns": ["name", "description", "tags", "tracing", "default_queue_type", "metadata",
                                "cluster_state", "messages", "messages_ready", "messages_unacknowledged"]},
    "list_permissions": {"path": "/api/vhosts/{vhost}/permissions",
                         "default": ["user", "configure", "write", "read"], "title": "permissions",
                         "aliases": {}, "columns": ["user", "vhost", "configure", "write", "read"]},
    "list_policies": {"path": "/api/policies/{vhost}",
                      "default": ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                      "title": "policies", "aliases": {},
                      "columns": ["vhost", "name", "pattern", "apply-to", "definition", "priority"]},
    "list_stream_groups": STREAM_GROUPS,
    "list_stream_consumer_groups": STREAM_GROUPS,
}


def allowed_columns(spec: dict[str, Any]) -> list[str]:
    """The columns a list verb takes: its defaults, rabbitmqctl's aliases and the API's own fields."""
    return list(dict.fromkeys([*spec["default"], *spec["aliases"], *spec["columns"]]))


def do_list(api: Api, args: argparse.Namespace) -> str:
    """Every list verb: GET its path in the ``-p`` vhost (connections and channels, listed node-wide by the
    API, are filtered to it only when ``-p`` was given), then the chosen columns."""
    spec = LISTS[args.verb]
    columns = args.columns or spec["default"]
    check_columns(args.verb, columns, allowed_columns(spec))
    path = spec["path"].format(vhost=q(args.vhost))
    data = api.get(path) or []
    if spec["path"].startswith("/api/connections") or spec["path"].startswith("/api/channels"):
        data = [r for r in data if r.get("vhost") in (None, args.vhost)] if args.vhost_given else data
    rows = [[field(r, c, spec["aliases"]) for c in columns] for r in data]
    if args.formatter == "json":
        return json.dumps([dict(zip(columns, r)) for r in rows], indent=1)
    table = render_table(columns, rows)
    if args.quiet:
        return "\n".join(table.splitlines()[1:])
    where = f" for vhost {args.vhost}" if "{vhost}" in spec["path"] else ""
    return f"Listing {spec['title']}{where} ...\n{table}"


GROUP = VerbGroup({verb: Verb(do_list) for verb in LISTS})
