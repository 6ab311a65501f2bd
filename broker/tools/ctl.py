"""``leveret ctl VERB ...``: rabbitmqctl's verbs and info columns, over the broker's HTTP API.

    leveret ctl list_queues name messages_ready messages_unacknowledged consumers
    leveret ctl -p /orders set_permissions app '^app\\.' '^app\\.' '^app\\.'
    leveret ctl --formatter json list_exchanges name type
    leveret ctl -p /orders list_stream_groups stream group committed_offset lag members
    leveret ctl -p /orders list_delayed reminders id due routing_key properties.message_id

``list_stream_groups`` (Leveret's, also as ``list_stream_consumer_groups``, the name of rabbitmq-streams'
verb) lists the consumer groups of the vhost's stream queues; its columns: ``stream``, ``group`` (or
``reference``), ``committed_offset`` (or ``committed``), ``cursor``, ``outstanding``, ``lag``, ``members``
(or ``consumers``) and ``next_offset``. ``list_queues`` shows a stream's ``type`` (stream), ``first_offset``,
``last_offset``, ``next_offset``, ``segments`` and ``stream_bytes`` when asked for those columns.

``list_delayed EXCHANGE [COLUMN ...]`` lists the pending messages of an ``x-delayed-message`` exchange by
due time (columns: ``id``, ``due``, ``due_ms``, ``delay_ms``, ``routing_key``, ``size``, ``payload_bytes``,
``persistent``, ``properties`` or ``properties.NAME``); ``cancel_delayed EXCHANGE ID`` cancels one (the id
as listed), ``purge_delayed EXCHANGE`` all of them.

The API is found at ``--url``, by default ``$LEVERET_CTL_URL``, else where the broker's own configuration puts
it: ctl reads the settings ``leveret serve`` reads (``--config FILE`` or ``$LEVERET_CONFIG_FILE``, then the
``LEVERET_*`` variables: ``management.tcp.port`` / ``.ip``, HTTPS on ``management.ssl.port`` when only
``management.ssl.*`` is set), so in the shell that configured a broker, ctl talks to that broker and not to
whatever answers on 15672. ``--username`` / ``--password`` default to ``$LEVERET_CTL_USERNAME`` /
``$LEVERET_CTL_PASSWORD``, else the configuration's ``default_user`` / ``default_pass`` (guest / guest). When
the API cannot be reached, the one-line error names the URL and where it came from (exit 69). Over HTTPS (an ``https://`` URL: ``management.ssl.*``), the server's certificate is checked
against ``--cacert FILE`` (``$LEVERET_CTL_CACERT``; else the system's CAs), ``--cert`` / ``--key`` give a
client certificate (for ``management.ssl.verify = verify_peer``), ``--insecure`` checks nothing (as curl's
``-k`` and rabbitmqadmin's ``--ssl-insecure``). ``-p`` names the vhost as in rabbitmqctl. Output is an aligned table, or JSON with
``--formatter json``. Exit codes, rabbitmqctl's (sysexits): 0 done, 1 refused by the broker, 64 (EX_USAGE) a
usage error (a missing argument, an unknown option, an info column the verb does not have: the error names
the ones it has), 65 (EX_DATAERR) a bad argument (a vhost that does not exist, given with ``-p`` or as an
argument; a fraction out of range), 67 (EX_NOUSER) no such user, 69 (EX_UNAVAILABLE) broker unreachable (or,
for ``await_startup``, not up in time; for ``rotate_logs``, no on-demand log rotation in Leveret), 78
(EX_CONFIG) the broker's configuration, read for the defaults, has an error.

The verbs operators type daily, with rabbitmqctl's argument shapes: ``list_user_permissions USER``,
``list_topic_permissions [-p VHOST]``, ``list_user_topic_permissions USER``, ``list_vhost_limits [-p VHOST]
[--global]``, ``list_user_limits [USER]``, ``list_parameters [-p VHOST]``, ``environment`` (the settings in
force), ``cluster_status`` (the node and its cluster's other members), ``set_cluster_name NAME`` (the
cluster's, kept in its database), ``forget_cluster_node NODE``, ``await_startup [-t SECONDS]``, ``close_all_connections [-p VHOST]
[--global] [--per-connection-delay MS] [--limit N] EXPLANATION``, ``close_all_user_connections USER
EXPLANATION``, ``set_vm_memory_high_watermark FRACTION | absolute SIZE``, ``set_disk_free_limit SIZE |
mem_relative MULTIPLE``. rabbitmq-diagnostics' health checks are ``leveret diagnostics ...``
(``leveret diagnostics --help``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn

from broker.config import ConfigError, Settings, env_name, load_settings, management_url
from broker.tools import migrate_rabbitmq

EX_DATAERR = 65
EX_NOUSER = 67
EX_UNAVAILABLE = 69
EX_CONFIG = 78  # sysexits' EX_CONFIG: the configuration read for the defaults has an error


class CtlError(Exception):
    """One line for the operator and the exit code; ``status``: the HTTP status the broker answered, if any."""

    def __init__(self, message: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class Api:
    def __init__(self, url: str, username: str, password: str, timeout: float = 30.0,
                 context: ssl.SSLContext | None = None, origin: str = "--url") -> None:
        self.url = url.rstrip("/")
        self.origin = origin  # where the URL came from, named when it cannot be reached
        self.context = context  # HTTPS: how the server's certificate is checked (None: the system's CAs)
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                ok_missing: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={**self.headers, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and ok_missing:
                return None
            try:
                detail = json.loads(exc.read()).get("reason", "")
            except (ValueError, AttributeError):
                detail = ""
            raise CtlError(f"{method} {path}: {exc.code} {exc.reason}" + (f": {detail}" if detail else ""),
                           status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self.unreachable(exc) from None
        return json.loads(raw) if raw.strip() else None

    def unreachable(self, exc: OSError) -> CtlError:
        """One line naming the URL and where it came from (a user once listed another broker's queues on
        15672 without noticing which one ctl had talked to)."""
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return CtlError(f"cannot reach the broker's HTTP API at {self.url} (from {self.origin}): {reason}",
                        EX_UNAVAILABLE)

    def get(self, path: str, ok_missing: bool = False) -> Any:
        return self.request("GET", path, ok_missing=ok_missing)

    def call(self, path: str, timeout: float | None = None) -> tuple[int, Any]:
        """GET ``path`` and answer (HTTP status, parsed body) whatever the status (health checks answer 503
        with a reason); an unreachable API is still a CtlError (69)."""
        req = urllib.request.Request(self.url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout, context=self.context) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise self.unreachable(exc) from None
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw.decode(errors="replace")


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


# -- info columns: rabbitmqctl's names → the API's fields -------------------------------------------------------

def _field(row: dict[str, Any], column: str, aliases: dict[str, Any]) -> Any:
    alias = aliases.get(column, column)
    if callable(alias):
        return alias(row)
    cur: Any = row
    for part in alias.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


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

EX_USAGE = 64  # rabbitmqctl's exit code for a usage error such as an unknown info column (sysexits' EX_USAGE)


def check_columns(verb: str, columns: list[str], allowed: list[str]) -> None:
    """An info column the verb does not have is an error naming the ones it has (as rabbitmqctl answers
    ``Info key(s) ... are not supported``), never an empty column. ``a.b`` reads field ``b`` of column
    ``a`` (e.g. ``client_properties.connection_name``)."""
    known = set(allowed)
    bad = [c for c in columns if c not in known and c.split(".", 1)[0] not in known]
    if bad:
        raise CtlError(f"Info key(s) {', '.join(bad)} are not supported by {verb}. Allowed: {', '.join(allowed)}",
                       EX_USAGE)


def allowed_columns(spec: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys([*spec["default"], *spec["aliases"], *spec["columns"]]))


def _cell(value: Any) -> str:
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
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def do_list(api: Api, args: argparse.Namespace) -> str:
    spec = LISTS[args.verb]
    columns = args.columns or spec["default"]
    check_columns(args.verb, columns, allowed_columns(spec))
    path = spec["path"].format(vhost=q(args.vhost))
    data = api.get(path) or []
    if spec["path"].startswith("/api/connections") or spec["path"].startswith("/api/channels"):
        data = [r for r in data if r.get("vhost") in (None, args.vhost)] if args.vhost_given else data
    rows = [[_field(r, c, spec["aliases"]) for c in columns] for r in data]
    if args.formatter == "json":
        return json.dumps([dict(zip(columns, r)) for r in rows], indent=1)
    table = render_table(columns, rows)
    if args.quiet:
        return "\n".join(table.splitlines()[1:])
    where = f" for vhost {args.vhost}" if "{vhost}" in spec["path"] else ""
    return f"Listing {spec['title']}{where} ...\n{table}"


# -- verbs that change things --------------------------------------------------------------------------------------

def _need(args: argparse.Namespace, n: int, usage: str) -> list[str]:
    if len(args.columns) != n:
        raise CtlError(f"usage: leveret ctl {args.verb} {usage}", 2)
    return list(args.columns)


def _user(api: Api, name: str) -> dict[str, Any]:
    user: dict[str, Any] | None = api.get(f"/api/users/{q(name)}", ok_missing=True)
    if user is None:
        raise CtlError(f"user '{name}' does not exist")
    return user


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not JSON: {exc}", 2) from None


def do_limits(api: Api, args: argparse.Namespace) -> str:
    """rabbitmqctl's limit and topic-permission verbs, over /api/vhost-limits, /api/user-limits and
    /api/topic-permissions (set_vhost_limits replaces the vhost's limits; set_user_limits adds to the user's)."""
    verb, vhost = args.verb, args.vhost
    if verb == "set_vhost_limits":
        (definition,) = _need(args, 1, "[-p VHOST] DEFINITION (e.g. '{\"max-connections\": 64}')")
        api.request("PUT", f"/api/parameters/vhost-limits/{q(vhost)}/limits",
                    {"value": _json_arg(definition, "definition")})
        return f"Setting vhost limits to \"{definition}\" for vhost \"{vhost}\" ..."
    if verb == "clear_vhost_limits":
        _need(args, 0, "[-p VHOST]")
        for name in (api.get(f"/api/vhost-limits/{q(vhost)}") or [{}])[0].get("value", {}):
            api.request("DELETE", f"/api/vhost-limits/{q(vhost)}/{q(name)}")
        return f"Clearing vhost \"{vhost}\" limits ..."
    if verb == "set_user_limits":
        name, definition = _need(args, 2, "USERNAME DEFINITION (e.g. '{\"max-channels\": 16}')")
        parsed = _json_arg(definition, "definition")
        if not isinstance(parsed, dict):
            raise CtlError("definition must be a JSON object", 2)
        _user(api, name)
        for limit, value in parsed.items():
            api.request("PUT", f"/api/user-limits/{q(name)}/{q(limit)}", {"value": value})
        return f"Setting user limits to \"{definition}\" for user \"{name}\" ..."
    if verb == "clear_user_limits":
        name, limit = _need(args, 2, "USERNAME LIMIT_NAME|all")
        api.request("DELETE", f"/api/user-limits/{q(name)}/{q(limit)}")
        return f"Clearing all limits for user \"{name}\" ..." if limit == "all" else \
            f"Clearing \"{limit}\" limit for user \"{name}\" ..."
    if verb == "set_topic_permissions":
        name, exchange, write, read = _need(args, 4, "[-p VHOST] USERNAME EXCHANGE WRITE READ")
        api.request("PUT", f"/api/topic-permissions/{q(vhost)}/{q(name)}",
                    {"exchange": exchange, "write": write, "read": read})
        return f"Setting topic permissions on \"{exchange}\" for user \"{name}\" in vhost \"{vhost}\" ..."
    (name,) = _need(args, 1, "[-p VHOST] USERNAME")  # clear_topic_permissions
    api.request("DELETE", f"/api/topic-permissions/{q(vhost)}/{q(name)}")
    return f"Clearing topic permissions for user \"{name}\" in vhost \"{vhost}\" ..."


LIMIT_VERBS = ("set_vhost_limits", "clear_vhost_limits", "set_user_limits", "clear_user_limits",
               "set_topic_permissions", "clear_topic_permissions")


def do_action(api: Api, args: argparse.Namespace) -> str:
    verb, vhost = args.verb, args.vhost
    if verb in LIMIT_VERBS:
        return do_limits(api, args)
    if verb == "add_user":
        name, password = _need(args, 2, "USERNAME PASSWORD")
        if api.get(f"/api/users/{q(name)}", ok_missing=True) is not None:
            raise CtlError(f"user '{name}' already exists")
        api.request("PUT", f"/api/users/{q(name)}", {"password": password, "tags": []})
        return f"Adding user \"{name}\" ..."
    if verb == "delete_user":
        (name,) = _need(args, 1, "USERNAME")
        _user(api, name)
        api.request("DELETE", f"/api/users/{q(name)}")
        return f"Deleting user \"{name}\" ..."
    if verb == "change_password":
        name, password = _need(args, 2, "USERNAME NEW_PASSWORD")
        user = _user(api, name)
        api.request("PUT", f"/api/users/{q(name)}", {"password": password, "tags": user.get("tags", [])})
        return f"Changing password for user \"{name}\" ..."
    if verb == "set_user_tags":
        if not args.columns:
            raise CtlError("usage: leveret ctl set_user_tags USERNAME [TAG ...]", 2)
        name, *tags = args.columns
        user = _user(api, name)
        api.request("PUT", f"/api/users/{q(name)}", {"password_hash": user["password_hash"], "tags": tags,
                                                       "hashing_algorithm": user.get("hashing_algorithm")})
        return f"Setting tags for user \"{name}\" to [{', '.join(tags)}] ..."
    if verb == "set_permissions":
        name, conf, write, read = _need(args, 4, "[-p VHOST] USERNAME CONF WRITE READ")
        api.request("PUT", f"/api/permissions/{q(vhost)}/{q(name)}",
                    {"configure": conf, "write": write, "read": read})
        return f"Setting permissions for user \"{name}\" in vhost \"{vhost}\" ..."
    if verb == "clear_permissions":
        (name,) = _need(args, 1, "[-p VHOST] USERNAME")
        api.request("DELETE", f"/api/permissions/{q(vhost)}/{q(name)}")
        return f"Clearing permissions for user \"{name}\" in vhost \"{vhost}\" ..."
    if verb == "add_vhost":
        (name,) = _need(args, 1, "VHOST")
        api.request("PUT", f"/api/vhosts/{q(name)}", {"description": args.description or "",
                                                      "tags": args.tags or ""})
        return f"Adding vhost \"{name}\" ..."
    if verb in ("trace_on", "trace_off"):
        _need(args, 0, "[-p VHOST]")
        # rabbitmqctl answers "enabled" even for a vhost that does not exist; a PUT would create it here.
        if api.get(f"/api/vhosts/{q(vhost)}", ok_missing=True) is None:
            raise CtlError(f"vhost '{vhost}' does not exist")
        on = verb == "trace_on"
        api.request("PUT", f"/api/vhosts/{q(vhost)}", {"tracing": on})
        return (f"Starting tracing for vhost \"{vhost}\" ...\nTrace enabled for vhost {vhost}" if on else
                f"Stopping tracing for vhost \"{vhost}\" ...\nTrace disabled for vhost {vhost}")
    if verb == "delete_vhost":
        (name,) = _need(args, 1, "VHOST")
        api.request("DELETE", f"/api/vhosts/{q(name)}")
        return f"Deleting vhost \"{name}\" ..."
    if verb == "set_policy":
        name, pattern, definition = _need(args, 3, "[-p VHOST] [--priority N] [--apply-to X] NAME PATTERN "
                                                   "DEFINITION")
        try:
            parsed = json.loads(definition)
        except ValueError as exc:
            raise CtlError(f"definition is not JSON: {exc}", 2) from None
        api.request("PUT", f"/api/policies/{q(vhost)}/{q(name)}",
                    {"pattern": pattern, "definition": parsed, "priority": args.priority,
                     "apply-to": args.apply_to})
        return f"Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" with priority " \
               f"\"{args.priority}\" for vhost \"{vhost}\" ..."
    if verb == "clear_policy":
        (name,) = _need(args, 1, "[-p VHOST] NAME")
        api.request("DELETE", f"/api/policies/{q(vhost)}/{q(name)}")
        return f"Clearing policy \"{name}\" on vhost \"{vhost}\" ..."
    if verb == "purge_queue":
        (name,) = _need(args, 1, "[-p VHOST] QUEUE")
        api.request("DELETE", f"/api/queues/{q(vhost)}/{q(name)}/contents")
        return f"Purging queue '{name}' in vhost '{vhost}' ..."
    if verb == "delete_queue":
        (name,) = _need(args, 1, "[-p VHOST] [--if-empty] [--if-unused] QUEUE")
        queue = api.get(f"/api/queues/{q(vhost)}/{q(name)}")
        params = urllib.parse.urlencode({k: "true" for k, on in (("if-empty", args.if_empty),
                                                                 ("if-unused", args.if_unused)) if on})
        api.request("DELETE", f"/api/queues/{q(vhost)}/{q(name)}" + (f"?{params}" if params else ""))
        return f"Deleting queue '{name}' on vhost '{vhost}' ...\nQueue was successfully deleted with " \
               f"{queue.get('messages', 0)} ready messages"
    if verb == "close_connection":
        name, reason = _need(args, 2, "CONNECTION_NAME EXPLANATION")
        api.request("DELETE", f"/api/connections/{q(name)}", headers={"X-Reason": reason})
        return f"Closing connection {name}, reason: {reason}..."
    if verb == "export_definitions":
        (path,) = _need(args, 1, "PATH (- for stdout)")
        data = api.get("/api/definitions")
        text = json.dumps(data, indent=2)
        if path == "-":
            return text
        with open(path, "w") as f:
            f.write(text + "\n")
        return f"Exporting definitions in JSON to a file at \"{path}\" ..."
    if verb == "import_definitions":
        (path,) = _need(args, 1, "PATH (- for stdin)")
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path) as f:
                    text = f.read()
            data = json.loads(text)
        except OSError as exc:
            raise CtlError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CtlError(f"{path} is not JSON: {exc}") from None
        api.request("POST", "/api/definitions", data)
        return f"Importing definitions in JSON from a file at \"{path}\" ...\nSuccessfully started definition import."
    if verb == "set_disk_free_limit":
        usage = "BYTES (e.g. 50000000, 2GB) | mem_relative MULTIPLE (of the RAM, e.g. 1.5)"
        if len(args.columns) == 2 and args.columns[0] == "mem_relative":
            multiple = _number_arg(args.columns[1], "mem_relative", 0.0, None)
            api.request("PUT", "/api/leveret/resource-limits", {"disk_free_limit_relative": multiple})
            return f"Setting disk free limit to {args.columns[1]} times the total RAM ..."
        (limit,) = _need(args, 1, usage)
        api.request("PUT", "/api/leveret/resource-limits", {"disk_free_limit": _bytes_arg(limit)})
        return f"Setting disk free limit to {limit} bytes ..."
    if verb == "set_vm_memory_high_watermark":
        # rabbitmqctl's two forms: a fraction of the RAM (0.4), or "absolute" and a size (2GB).
        if len(args.columns) == 1:
            fraction = _number_arg(args.columns[0], "the fraction", 0.0, 1.0)
            api.request("PUT", "/api/leveret/resource-limits", {"vm_memory_high_watermark_relative": fraction})
            return f"Setting memory threshold on this node to {args.columns[0]} of the total RAM ..."
        parts = _need(args, 2, "FRACTION (e.g. 0.4) | absolute BYTES (e.g. 2GB)")
        if parts[0] != "absolute":
            raise CtlError("usage: leveret ctl set_vm_memory_high_watermark FRACTION | absolute BYTES", 2)
        api.request("PUT", "/api/leveret/resource-limits", {"vm_memory_high_watermark": _bytes_arg(parts[1])})
        return f"Setting memory threshold on this node to {parts[1]} bytes ..."
    if verb in DELAYED_VERBS:
        return do_delayed(api, args)
    if verb == "status":
        return status_text(api, args)
    raise CtlError(f"unknown verb {verb}", 2)


def status_info(api: Api) -> dict[str, Any]:
    overview = api.get("/api/overview")
    node = (api.get("/api/nodes") or [{}])[0]
    return {
        "node": overview.get("node"),
        "product_name": overview.get("product_name"),
        "product_version": overview.get("product_version"),
        "rabbitmq_version": overview.get("rabbitmq_version"),
        "runtime": overview.get("erlang_full_version"),
        "os_pid": node.get("os_pid"),
        "uptime_seconds": int(node.get("uptime", 0) / 1000),
        "data_directory": node.get("db_dir"),
        "log_files": node.get("log_files", []),
        "memory_used": node.get("mem_used"),
        "memory_limit": node.get("mem_limit"),
        "disk_free": node.get("disk_free"),
        "disk_free_limit": node.get("disk_free_limit"),
        "file_descriptors_used": node.get("fd_used"),
        "file_descriptors_limit": node.get("fd_total"),
        "alarms": [a for a, on in (("memory", node.get("mem_alarm")), ("disk", node.get("disk_free_alarm")))
                   if on],
        "listeners": [f"{lst['protocol']} {lst['ip_address']}:{lst['port']}"
                      for lst in overview.get("listeners", [])],
        "totals": overview.get("object_totals", {}),
    }


def status_text(api: Api, args: argparse.Namespace) -> str:
    """``status`` (rabbitmqctl's and rabbitmq-diagnostics'): the limits in force are read from /api/nodes, so a
    ``set_vm_memory_high_watermark`` / ``set_disk_free_limit`` shows here at once."""
    info = status_info(api)
    if args.formatter == "json":
        return json.dumps(info, indent=1)
    lines = [f"Status of node {info['node']} ..."]
    lines += [f"{k}: {_cell(v)}" for k, v in info.items() if k != "node"]
    return "\n".join(lines)


DELAYED_VERBS = ("list_delayed", "cancel_delayed", "purge_delayed")
DELAYED_COLUMNS = ["id", "due", "routing_key", "payload_bytes"]
DELAYED_ALLOWED = ["id", "due", "due_ms", "delay_ms", "routing_key", "size", "payload_bytes", "persistent",
                   "properties", "payload", "payload_encoding"]
DELAYED_PAGE = 500


def do_delayed(api: Api, args: argparse.Namespace) -> str:
    """The pending messages of an x-delayed-message exchange (/api/exchanges/{vhost}/{name}/delayed:
    broker/management/delayed.py): ``list_delayed EXCHANGE [COLUMN ...]`` walks every page by due time;
    ``cancel_delayed EXCHANGE ID``; ``purge_delayed EXCHANGE``."""
    verb, vhost = args.verb, args.vhost
    if verb == "list_delayed":
        if not args.columns:
            raise CtlError("usage: leveret ctl list_delayed [-p VHOST] EXCHANGE [COLUMN ...]", 2)
        name, *columns = args.columns
        columns = columns or DELAYED_COLUMNS
        check_columns(verb, columns, DELAYED_ALLOWED)
        base = f"/api/exchanges/{q(vhost)}/{q(name)}/delayed?page_size={DELAYED_PAGE}"
        rows: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = api.get(base + (f"&after={q(cursor)}" if cursor else ""))
            rows += page["items"]
            cursor = page.get("next")
            if not cursor:
                break
        cells = [[_field(r, c, {}) for c in columns] for r in rows]
        if args.formatter == "json":
            return json.dumps([dict(zip(columns, r)) for r in cells], indent=1)
        table = render_table(columns, cells)
        if args.quiet:
            return "\n".join(table.splitlines()[1:])
        return f"Listing delayed messages of exchange '{name}' in vhost '{vhost}' ...\n{table}"
    if verb == "cancel_delayed":
        name, ident = _need(args, 2, "[-p VHOST] EXCHANGE ID")
        api.request("DELETE", f"/api/exchanges/{q(vhost)}/{q(name)}/delayed/{q(ident)}")
        return f"Cancelling delayed message {ident} of exchange '{name}' in vhost '{vhost}' ..."
    (name,) = _need(args, 1, "[-p VHOST] EXCHANGE")  # purge_delayed
    before = api.get(f"/api/exchanges/{q(vhost)}/{q(name)}").get("delayed_pending", 0)
    api.request("DELETE", f"/api/exchanges/{q(vhost)}/{q(name)}/delayed")
    return f"Purging delayed messages of exchange '{name}' in vhost '{vhost}' ...\n{before} pending before"


ACTIONS = ("add_user", "delete_user", "change_password", "set_user_tags", "set_permissions", "clear_permissions",
           "add_vhost", "delete_vhost", "trace_on", "trace_off", "set_policy", "clear_policy", "purge_queue", "delete_queue",
           "close_connection", "export_definitions", "import_definitions", "status", "set_disk_free_limit",
           "set_vm_memory_high_watermark", *LIMIT_VERBS, *DELAYED_VERBS)


def _bytes_arg(text: str) -> int:
    from broker.config import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise CtlError(f"bad size {text!r}: {exc}", 2) from None


def _number_arg(text: str, what: str, above: float, at_most: float | None) -> float:
    """A number ``above < n <= at_most`` (rabbitmqctl refuses others as a bad argument: EX_DATAERR, 65)."""
    try:
        n = float(text)
    except ValueError:
        n = float("nan")
    if not (n > above and (at_most is None or n <= at_most)):
        bound = f" and at most {at_most}" if at_most is not None else ""
        raise CtlError(f"{what} must be a number above {above}{bound}, got {text!r}", EX_DATAERR)
    return n


# -- the verbs operators type daily (docs/decisions/operator-surface.md): permissions, limits, parameters, node state ------------------------

def rows_out(args: argparse.Namespace, columns: list[str], rows: list[dict[str, Any]], banner: str,
             aliases: dict[str, Any] | None = None) -> str:
    """A listing as the list_* verbs print it: banner line, header, one row per item (``-q``: rows only;
    ``--formatter json``: a JSON array of objects)."""
    cells = [[_field(r, c, aliases or {}) for c in columns] for r in rows]
    if args.formatter == "json":
        return json.dumps([dict(zip(columns, r)) for r in cells], indent=1)
    table = render_table(columns, cells)
    if args.quiet:
        return "\n".join(table.splitlines()[1:])
    return f"{banner}\n{table}"


def _vhost_exists(api: Api, vhost: str) -> None:
    if api.get(f"/api/vhosts/{q(vhost)}", ok_missing=True) is None:
        raise CtlError(f"Virtual host '{vhost}' does not exist", EX_DATAERR)


def _user_exists(api: Api, name: str) -> None:
    if api.get(f"/api/users/{q(name)}", ok_missing=True) is None:
        raise CtlError(f"User '{name}' does not exist", EX_NOUSER)


def _node_name(api: Api) -> str:
    return str((api.get("/api/overview") or {}).get("node", "?"))


def list_user_permissions(api: Api, args: argparse.Namespace) -> str:
    (name,) = _need(args, 1, "USERNAME")
    _user_exists(api, name)
    rows = api.get(f"/api/users/{q(name)}/permissions") or []
    return rows_out(args, ["vhost", "configure", "write", "read"], rows, f'Listing permissions for user "{name}" ...')


def list_topic_permissions(api: Api, args: argparse.Namespace) -> str:
    _need(args, 0, "[-p VHOST]")
    _vhost_exists(api, args.vhost)
    rows = [r for r in api.get("/api/topic-permissions") or [] if r.get("vhost") == args.vhost]
    return rows_out(args, ["user", "exchange", "write", "read"], rows,
                    f'Listing topic permissions for vhost "{args.vhost}" ...')


def list_user_topic_permissions(api: Api, args: argparse.Namespace) -> str:
    (name,) = _need(args, 1, "USERNAME")
    _user_exists(api, name)
    rows = [r for r in api.get("/api/topic-permissions") or [] if r.get("user") == name]
    return rows_out(args, ["vhost", "exchange", "write", "read"], rows,
                    f'Listing topic permissions for user "{name}" ...')


def list_vhost_limits(api: Api, args: argparse.Namespace) -> str:
    """``list_vhost_limits [-p VHOST] [--global]``: one vhost's limits as a JSON object (as rabbitmqctl prints
    them), or with ``--global`` a ``vhost``/``limits`` row per vhost that has any."""
    _need(args, 0, "[-p VHOST] [--global]")
    if args.global_:
        rows = [{"vhost": r["vhost"], "limits": r.get("value", {})} for r in api.get("/api/vhost-limits") or []]
        return rows_out(args, ["vhost", "limits"], rows, "Getting limits for all vhosts ...")
    _vhost_exists(api, args.vhost)
    found = api.get(f"/api/vhost-limits/{q(args.vhost)}") or []
    limits = found[0].get("value", {}) if found else {}
    if args.formatter == "json":
        return json.dumps(limits)
    text = json.dumps(limits, separators=(",", ":")) if limits else ""
    if args.quiet:
        return text
    return f'Listing limits for vhost "{args.vhost}" ...' + (f"\n{text}" if text else "")


def list_user_limits(api: Api, args: argparse.Namespace) -> str:
    """``list_user_limits [USERNAME]``: one user's limits as a JSON object, or a ``user``/``limits`` row per user
    that has any (rabbitmqctl's ``--user`` / ``--all``; ``--user`` is taken here by the API's credentials)."""
    if len(args.columns) > 1:
        raise CtlError("usage: leveret ctl list_user_limits [USERNAME]", 2)
    if not args.columns:
        rows = [{"user": r["user"], "limits": r.get("value", {})} for r in api.get("/api/user-limits") or []]
        return rows_out(args, ["user", "limits"], rows, "Getting limits for all users ...")
    name = args.columns[0]
    _user_exists(api, name)
    found = api.get(f"/api/user-limits/{q(name)}") or []
    limits = found[0].get("value", {}) if found else {}
    if args.formatter == "json":
        return json.dumps(limits)
    text = json.dumps(limits, separators=(",", ":")) if limits else ""
    return text if args.quiet else f'Listing limits for user "{name}" ...' + (f"\n{text}" if text else "")


def list_parameters(api: Api, args: argparse.Namespace) -> str:
    _need(args, 0, "[-p VHOST]")
    _vhost_exists(api, args.vhost)
    rows = [r for r in api.get("/api/parameters") or [] if r.get("vhost") == args.vhost]
    return rows_out(args, ["component", "name", "value"], rows,
                    f'Listing runtime parameters for vhost "{args.vhost}" ...')


def set_parameter(api: Api, args: argparse.Namespace) -> str:
    """``set_parameter [-p VHOST] COMPONENT NAME JSON`` (rabbitmqctl's): a runtime parameter such as a
    shovel; the node validates it (400 with RabbitMQ's reason). A value that is not JSON, or one the node
    refuses, exits 69 with RabbitMQ's words, as rabbitmqctl 3.10.8 does (measured: its ``{error_string, _}``
    ends as ``{:error, _}``, which its ExitCodes map to EX_UNAVAILABLE), so scripts written for it still
    tell a refusal from success the same way."""
    component, name, text = _need(args, 3, "[-p VHOST] COMPONENT NAME JSON")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"JSON decoding error. Reason: {exc}", EX_UNAVAILABLE) from None
    try:
        api.request("PUT", f"/api/parameters/{q(component)}/{q(args.vhost)}/{q(name)}", {"value": value})
    except CtlError as exc:
        if exc.status == 400:
            reason = str(exc).split(": ", 2)[-1] if ": 400 " in str(exc) else str(exc)
            raise CtlError(reason.rstrip("\n"), EX_UNAVAILABLE, status=400) from None
        raise
    return "" if args.quiet else (f'Setting runtime parameter "{name}" for component "{component}" to '
                                  f'"{text}" in vhost "{args.vhost}" ...')


def clear_parameter(api: Api, args: argparse.Namespace) -> str:
    """``clear_parameter [-p VHOST] COMPONENT NAME``; one that does not exist exits 69 with "Parameter does
    not exist", as rabbitmqctl 3.10.8 does (a script that clears a shovel learns that it was not there)."""
    component, name = _need(args, 2, "[-p VHOST] COMPONENT NAME")
    try:
        api.request("DELETE", f"/api/parameters/{q(component)}/{q(args.vhost)}/{q(name)}")
    except CtlError as exc:
        if exc.status == 404:
            raise CtlError("Parameter does not exist", EX_UNAVAILABLE, status=404) from None
        raise
    return "" if args.quiet else (f'Clearing runtime parameter "{name}" for component "{component}" on vhost '
                                  f'"{args.vhost}" ...')


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
    _need(args, 0, "")
    rows = [{col: s[key] for key, col in SHOVEL_STATUS_COLUMNS.items() if s.get(key) is not None}
            for s in api.get("/api/shovels") or []]
    columns = sorted(set(SHOVEL_STATUS_ALWAYS).union(*(r.keys() for r in rows)))
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    return rows_out(args, columns, rows, f"Shovel status on node {_node_name(api)}")


def restart_shovel(api: Api, args: argparse.Namespace) -> str:
    (name,) = _need(args, 1, "[-p VHOST] NAME")
    try:
        api.request("DELETE", f"/api/shovels/vhost/{q(args.vhost)}/{q(name)}/restart")
    except CtlError as exc:
        if exc.status == 404:  # rabbitmqctl's words
            raise CtlError("Shovel with the given name was not found on the target node "
                           f"'{_node_name(api)}' and / or virtual host '{args.vhost}'", EX_UNAVAILABLE) from None
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
    _need(args, 0, "")
    rows = [{col: s[col] for col in FEDERATION_STATUS_COLUMNS if s.get(col) is not None}
            for s in api.get("/api/federation-links") or []]
    columns = sorted(set(FEDERATION_STATUS_ALWAYS).union(*(r.keys() for r in rows)))
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    return rows_out(args, columns, rows, f"Listing federation links on node {_node_name(api)} ...")


def environment(api: Api, args: argparse.Namespace) -> str:
    """The settings in force (/api/leveret/environment): Leveret's counterpart of the application environment
    ``rabbitmqctl environment`` prints. Every setting, not only the ones a config file set."""
    _need(args, 0, "")
    env = api.get("/api/leveret/environment") or {}
    if args.formatter == "json":
        return json.dumps(env, indent=1, sort_keys=True)
    lines = [] if args.quiet else [f"Application environment of node {_node_name(api)} ..."]
    lines += [f"{k}: {_cell(v)}" for k, v in sorted(env.items())]
    return "\n".join(lines)


def cluster_status_info(api: Api) -> dict[str, Any]:
    """rabbitmqctl cluster_status's sections: the node asked first (its figures, versions and listeners are
    its own), then the other members of its cluster (broker/clustering/cluster.py), running or not, by name."""
    overview = api.get("/api/overview") or {}
    nodes = api.get("/api/nodes") or [{}]
    node = nodes[0]
    name = node.get("name", overview.get("node"))
    names = [name] + [n["name"] for n in nodes[1:]]
    running = [name] + [n["name"] for n in nodes[1:] if n.get("running")]
    alarms = [{"node": name, "resource": a} for a, on in (("memory", node.get("mem_alarm")),
                                                          ("disk", node.get("disk_free_alarm"))) if on]
    return {
        "cluster_name": overview.get("cluster_name"),
        "disk_nodes": names,
        "ram_nodes": [],
        "running_nodes": running,
        "versions": {name: {"product_name": overview.get("product_name"),
                            "product_version": overview.get("product_version"),
                            "rabbitmq_version": overview.get("rabbitmq_version"),
                            "runtime": overview.get("erlang_full_version")}},
        "cpu_cores": {name: node.get("processors")},
        "maintenance_status": {n: "not under maintenance" for n in running},
        "alarms": alarms,
        "partitions": {},
        "listeners": {name: [{"interface": lst["ip_address"], "port": lst["port"], "protocol": lst["protocol"]}
                             for lst in overview.get("listeners", [])]},
    }


def cluster_status(api: Api, args: argparse.Namespace) -> str:
    """The node asked and, in a cluster, the other members: disc nodes are every member that joined, running
    nodes those holding their lease now (rabbitmqctl cluster_status's sections); no partitions (PostgreSQL is
    the one arbiter)."""
    _need(args, 0, "")
    info = cluster_status_info(api)
    if args.formatter == "json":
        return json.dumps(info, indent=1)
    name = info["running_nodes"][0]
    version = info["versions"][name]
    sections = [
        ("Basics", [f"Cluster name: {info['cluster_name']}",
                    f"Total CPU cores available cluster-wide: {info['cpu_cores'][name]}"]),
        ("Disk Nodes", info["disk_nodes"]),
        ("Running Nodes", info["running_nodes"]),
        ("Versions", [(f"{name}: {version['product_name']} {version['product_version']} "
                       f"(RabbitMQ {version['rabbitmq_version']} compatible) on {version['runtime']}")]),
        ("CPU Cores", [f"Node: {name}, available CPU cores: {info['cpu_cores'][name]}"]),
        ("Maintenance status", [f"Node: {n}, status: not under maintenance" for n in info["running_nodes"]]),
        ("Alarms", [f"{a['resource']} alarm on node {a['node']}" for a in info["alarms"]] or ["(none)"]),
        ("Network Partitions", ["(none)"]),
        ("Listeners", [f"Node: {name}, interface: {lst['interface']}, port: {lst['port']}, protocol: "
                       f"{lst['protocol']}, purpose: {listener_purpose(lst['protocol'])}"
                       for lst in info["listeners"][name]]),
    ]
    out = [] if args.quiet else [f"Cluster status of node {name} ..."]
    for title, lines in sections:
        out += [title, "", *lines, ""]
    return "\n".join(out).rstrip()


def set_cluster_name(api: Api, args: argparse.Namespace) -> str:
    """rabbitmqctl set_cluster_name: one name for the whole cluster. In a cluster of Leveret members it is kept
    in the shared database (PUT /api/cluster-name writes it there), so every member reports it at once."""
    (name,) = _need(args, 1, "NAME")
    api.request("PUT", "/api/cluster-name", {"name": name})
    return "" if args.quiet else f"Setting cluster name to {name} ..."


def forget_cluster_node(api: Api, args: argparse.Namespace) -> str:
    """Remove a member that is not running from the cluster, with its node-local queues and the messages
    forwarded to them (rabbitmqctl forget_cluster_node; asked of any running member)."""
    (name,) = _need(args, 1, "NODE")
    gone = api.request("DELETE", f"/api/leveret/nodes/{q(name)}") or {}
    if args.quiet:
        return ""
    return (f"Removing node {name} from the cluster\n{gone.get('queues', 0)} of its queue(s) removed, "
            f"{gone.get('forwarded_messages_dropped', 0)} message(s) forwarded to it dropped")


def listener_purpose(protocol: str) -> str:
    return {"amqp": "AMQP 0-9-1", "amqp/ssl": "AMQP 0-9-1 over TLS", "http": "HTTP API",
            "https": "HTTP API over TLS (HTTPS)", "http/prometheus": "Prometheus exporter API over HTTP",
            "https/prometheus": "Prometheus exporter API over TLS (HTTPS)"}.get(protocol, protocol)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the broker is and who logs in (ctl and diagnostics): resolved after parsing by
    :func:`resolve_target`, since the defaults come from the configuration ``--config`` names."""
    parser.add_argument("--url", default=None,
                        help="the broker's HTTP API (default $LEVERET_CTL_URL, else where the broker's "
                             "configuration puts it: management.tcp.port and .ip, or https on management.ssl.port)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="the broker's configuration file, read with the LEVERET_* variables as leveret serve "
                             "reads them, for the defaults of --url, --username and --password (default "
                             "$LEVERET_CONFIG_FILE)")
    parser.add_argument("--username", "-u", default=None,
                        help="default $LEVERET_CTL_USERNAME, else the configuration's default_user (guest)")
    parser.add_argument("--password", default=None,
                        help="default $LEVERET_CTL_PASSWORD, else the configuration's default_pass (guest)")


def _configuration_origin(settings: Settings) -> str:
    """How a URL derived from ``settings`` came to be, for the error that names it."""
    env_keys = ("management.tcp.port", "management.tcp.ip", "management.listener.port", "management.listener.ip",
                "management.ssl.port", "management.ssl.ip", "listeners.tcp.default")
    names = [env_name(key) for key in env_keys if env_name(key) in os.environ]
    parts = [str(path) for path in settings.config_files] + names
    return "the broker's configuration: " + (", ".join(parts) if parts else "its defaults")


def resolve_target(args: argparse.Namespace) -> None:
    """Fill in ``args.url``, ``args.username``, ``args.password`` (and, over HTTPS, ``args.cacert``) that were
    not given: the LEVERET_CTL_* variables, else the broker's own settings (the file of ``--config`` or
    LEVERET_CONFIG_FILE, then the LEVERET_* variables), read only when something is missing. Sets
    ``args.origin``, where the URL came from."""
    env = os.environ
    loaded: list[Settings] = []

    def settings() -> Settings:
        if not loaded:
            try:
                loaded.append(load_settings(args.config))
            except ConfigError as exc:
                raise CtlError(f"the broker's configuration, read for the defaults of --url, --username and "
                               f"--password, has an error (or give them): {exc}", EX_CONFIG) from None
        return loaded[0]

    if args.url:
        args.origin = "--url"
    elif env.get("LEVERET_CTL_URL"):
        args.url, args.origin = env["LEVERET_CTL_URL"], "LEVERET_CTL_URL"
    else:
        url = management_url(settings())
        if url is None:
            raise CtlError("the broker's configuration turns its HTTP API off (management.tcp.port = 0 and no "
                           "management.ssl.*), which ctl talks to: give --url", EX_UNAVAILABLE)
        args.url, args.origin = url, _configuration_origin(settings())
        if url.startswith("https:") and args.cacert is None and settings().management_ssl.cacertfile:
            args.cacert = str(settings().management_ssl.cacertfile)
    if args.username is None:
        args.username = env.get("LEVERET_CTL_USERNAME") or settings().default_user
    if args.password is None:
        args.password = env.get("LEVERET_CTL_PASSWORD")
        if args.password is None:
            args.password = settings().default_pass


class _UsageParser(argparse.ArgumentParser):
    """rabbitmqctl and rabbitmq-diagnostics exit 64 (EX_USAGE) on a usage error, not argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EX_USAGE)


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of an ``https://`` --url (ctl and diagnostics)."""
    parser.add_argument("--cacert", default=os.environ.get("LEVERET_CTL_CACERT"), metavar="FILE",
                        help="HTTPS: the CA certificates (PEM) the server's certificate is checked against")
    parser.add_argument("--cert", default=None, metavar="FILE", help="HTTPS: a client certificate (PEM)")
    parser.add_argument("--key", default=None, metavar="FILE", help="HTTPS: the client certificate's key")
    parser.add_argument("--insecure", action="store_true",
                        help="HTTPS: do not check the server's certificate or name")


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The client context of an ``https://`` --url (None for http://); a file that cannot be used is a usage
    error (exit 2) naming it."""
    if not args.url.lower().startswith("https:"):
        return None
    try:
        ctx = ssl.create_default_context(cafile=args.cacert)
        if args.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if args.cert:
            ctx.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as exc:
        raise CtlError(f"cannot use the TLS files given (--cacert / --cert / --key): {exc}", 2) from None
    return ctx


def await_startup(api: Api, args: argparse.Namespace) -> str:
    """Wait until the node serves clients (/api/health/checks/ready-to-serve-clients answers 200), at most
    ``--timeout`` seconds (rabbitmqctl's default, 300): 0 once it does, 69 if it does not in time."""
    _need(args, 0, "[--timeout SECONDS]")
    timeout = args.timeout if args.timeout is not None else 300.0
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        remaining = deadline - time.monotonic()
        try:
            status, body = api.call("/api/health/checks/ready-to-serve-clients", timeout=max(0.5, min(5.0,
                                                                                               remaining)))
            if status == 200:
                return "" if args.quiet else "The node is up and serving clients."
            if status in (401, 403):
                raise CtlError(f"the broker refused the credentials: {status}")
            last = (body or {}).get("reason", f"HTTP {status}") if isinstance(body, dict) else f"HTTP {status}"
        except CtlError as exc:
            if exc.code != EX_UNAVAILABLE:
                raise
            last = str(exc)
        if remaining <= 0:
            raise CtlError(f"the node did not start within {timeout:g} seconds ({last})", EX_UNAVAILABLE)
        time.sleep(min(0.2, max(0.0, remaining)))


def rotate_logs(api: Api, args: argparse.Namespace) -> str:
    """Leveret cannot be asked to rotate its log now: say so (exit 69) rather than pretend, and name the way
    that works. The log file is opened in append mode, so logrotate's ``copytruncate`` rotates it safely."""
    _need(args, 0, "")
    node = (api.get("/api/nodes") or [{}])[0]
    files = [f for f in node.get("log_files", []) if f != "<stderr>"]
    how = (f"the log file ({', '.join(files)}) is written in append mode, so logrotate's copytruncate "
           "rotates it safely" if files else "this broker logs to stderr only (no log.file), so there is no "
           "file to rotate")
    raise CtlError(f"Leveret has no on-demand log rotation, so rotate_logs does nothing; {how}", EX_UNAVAILABLE)


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
    (reason,) = _need(args, 1, "[-p VHOST] [--global] [--per-connection-delay MS] [--limit N] EXPLANATION")
    rows = api.get("/api/connections") or []
    if not args.global_:
        _vhost_exists(api, args.vhost)
        rows = [r for r in rows if r.get("vhost") == args.vhost]
    closed = _close_connections(api, args, rows, reason)
    if args.quiet:
        return ""
    node = _node_name(api)
    where = f"to node {node} (across all vhosts)" if args.global_ else f"in vhost {args.vhost} on node {node}"
    return (f"Closing all connections {where}, reason: {reason} (per-connection delay "
            f"{args.per_connection_delay} ms, limit {args.limit}) ...\nClosed {closed} connection(s)")


def close_all_user_connections(api: Api, args: argparse.Namespace) -> str:
    name, reason = _need(args, 2, "USERNAME EXPLANATION")
    rows = [r for r in api.get("/api/connections") or [] if r.get("user") == name]
    closed = _close_connections(api, args, rows, reason)
    return "" if args.quiet else f"Closing connections of user {name}, reason: {reason} ...\nClosed {closed} " \
                                 "connection(s)"


OPERATOR_VERBS: dict[str, Callable[[Api, argparse.Namespace], str]] = {
    "list_user_permissions": list_user_permissions,
    "list_topic_permissions": list_topic_permissions,
    "list_user_topic_permissions": list_user_topic_permissions,
    "list_vhost_limits": list_vhost_limits,
    "list_user_limits": list_user_limits,
    "list_parameters": list_parameters,
    "set_parameter": set_parameter,
    "clear_parameter": clear_parameter,
    "shovel_status": shovel_status,
    "restart_shovel": restart_shovel,
    "federation_status": federation_status,
    "environment": environment,
    "cluster_status": cluster_status,
    "set_cluster_name": set_cluster_name,
    "forget_cluster_node": forget_cluster_node,
    "await_startup": await_startup,
    "rotate_logs": rotate_logs,
    "close_all_connections": close_all_connections,
    "close_all_user_connections": close_all_user_connections,
    migrate_rabbitmq.VERB: migrate_rabbitmq.verb(CtlError),
}

VERBS = tuple(LISTS) + ACTIONS + tuple(OPERATOR_VERBS)


def _ctl_parser() -> argparse.ArgumentParser:
    ctl = _UsageParser(prog="leveret ctl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(ctl)
    add_tls_arguments(ctl)
    ctl.add_argument("-p", "--vhost", default=None, help="virtual host (default /)")
    ctl.add_argument("--formatter", choices=("table", "json"), default="table")
    ctl.add_argument("-q", "--quiet", action="store_true", help="no informational header line")
    ctl.add_argument("--priority", type=int, default=0, help="set_policy: priority")
    ctl.add_argument("--apply-to", default="all", help="set_policy: all, queues, exchanges, ...")
    ctl.add_argument("--description", help="add_vhost: description")
    ctl.add_argument("--tags", help="add_vhost: comma-separated tags")
    ctl.add_argument("--if-empty", action="store_true", help="delete_queue: only if empty")
    ctl.add_argument("--if-unused", action="store_true", help="delete_queue: only if it has no consumers")
    ctl.add_argument("--global", dest="global_", action="store_true",
                     help="close_all_connections: every vhost; list_vhost_limits: every vhost's limits")
    ctl.add_argument("--per-connection-delay", type=int, default=0, metavar="MS",
                     help="close_all_connections: pause between two connections")
    ctl.add_argument("--limit", type=int, default=0, help="close_all_connections: at most N (0: all)")
    ctl.add_argument("-t", "--timeout", type=float, default=None, metavar="SECONDS",
                     help="await_startup: how long to wait (default 300)")
    migrate_rabbitmq.add_arguments(ctl)
    ctl.add_argument("verb", choices=VERBS, metavar="VERB", help=", ".join(VERBS))
    ctl.add_argument("columns", nargs="*", metavar="ARG", help="info columns of list_* verbs, or the verb's "
                     "arguments")
    return ctl


def add_parser(sub: Any) -> None:
    """``leveret ctl``: options may come before or after the verb, as with rabbitmqctl."""
    ctl = sub.add_parser("ctl", help="operate a running broker (rabbitmqctl's verbs) over its HTTP API",
                         add_help=False)
    ctl.add_argument("argv", nargs=argparse.REMAINDER)
    ctl.set_defaults(func=lambda ns: run(ns.argv))


def run(argv: list[str]) -> int:
    return main(_ctl_parser().parse_intermixed_args(argv))


def _missing_vhost(api: Api, args: argparse.Namespace, exc: CtlError) -> CtlError:
    """A 404 for a request in the ``-p`` vhost: rabbitmqctl's answer when that vhost does not exist (65,
    naming it) rather than the raw HTTP error; any other 404 stays as it was."""
    if exc.status != 404 or not args.vhost_given:
        return exc
    try:
        _vhost_exists(api, args.vhost)
    except CtlError as missing:
        return missing
    return exc


def main(args: argparse.Namespace) -> int:
    args.vhost_given = args.vhost is not None
    if args.vhost is None:
        args.vhost = "/"
    api: Api | None = None
    try:
        resolve_target(args)
        api = Api(args.url, args.username, args.password, context=tls_context(args), origin=args.origin)
        if args.verb in LISTS:
            out = do_list(api, args)
        elif args.verb in OPERATOR_VERBS:
            out = OPERATOR_VERBS[args.verb](api, args)  # these leave out what -q leaves out themselves
        else:
            out = do_action(api, args)
    except CtlError as exc:
        if api is not None:
            try:
                exc = _missing_vhost(api, args, exc)
            except CtlError:
                pass  # the check itself failed: the first error is the one to show
        print(f"Error: {exc}", file=sys.stderr)
        return EX_USAGE if exc.code == 2 else exc.code
    if out and not (args.quiet and args.verb in ACTIONS and args.verb not in ("status", "export_definitions", "list_delayed")):
        print(out)
    return 0



# -- leveret diagnostics: rabbitmq-diagnostics' health checks (cli.py's ``diagnostics`` sub-command) ---------------
# Here rather than in a module of its own: the same API client, status and verbs as ctl, over the same HTTP API.

DIAGNOSTICS_DOC = """``leveret diagnostics COMMAND``: rabbitmq-diagnostics' health checks and node reports, over the broker's
HTTP API (as ``leveret ctl``, whose ``--url`` / ``--username`` / ``--password`` / ``--config`` it takes, with the
same defaults: the broker's own configuration).

    leveret diagnostics ping
    leveret diagnostics check_running
    leveret diagnostics check_local_alarms
    leveret diagnostics check_port_connectivity
    leveret diagnostics -q check_port_listener 5672
    leveret diagnostics --formatter json listeners
    leveret diagnostics memory_breakdown --unit mb

Commands: ``ping`` (the HTTP API answers, authenticated), ``status``, ``check_running`` (the node serves
clients), ``check_local_alarms`` / ``check_alarms`` (no memory or disk alarm), ``check_port_connectivity``
(a TCP connection to every listener succeeds, from where this command runs: a wildcard listener is tried
at the host of ``--url``), ``check_port_listener PORT``, ``check_protocol_listener PROTOCOL``, ``listeners``,
``memory_breakdown [--unit b|kb|mb|gb|kib|mib|gib]``, ``environment``, ``cluster_status``.

``memory_breakdown`` reports what Leveret can attribute: ``queue_procs`` / ``stream_queue_procs`` (the sum of
the queues' ``memory``, the estimate paging works with: messages in RAM with their bookkeeping) and
``other`` (the rest of the resident memory: interpreter, code, connections, buffers); ``total`` is the
process's resident memory, not a sum of measured parts.

Exit codes, as rabbitmq-diagnostics' (its ExitCodes: sysexits): 0 the check passed, 69 (EX_UNAVAILABLE) it
failed or the broker could not be reached, 64 (EX_USAGE) a usage error, 65 (EX_DATAERR) a bad argument.
"""

DIAG_UNITS = {"b": 1, "bytes": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "kib": 1024, "mib": 1024 ** 2,
              "gib": 1024 ** 3}


class CheckFailed(CtlError):
    """A health check that ran and failed: rabbitmq-diagnostics exits 69 for it (``{:error, _}``)."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message, EX_UNAVAILABLE)
        self.data = data


def _diag_node(api: Api) -> str:
    return str((api.get("/api/overview") or {}).get("node", "?"))


def _diag_check(api: Api, path: str) -> tuple[bool, dict[str, Any]]:
    """A /api/health/checks endpoint: (passed, body). 401/403 are errors, not failed checks."""
    status, body = api.call(path)
    if status in (401, 403):
        raise CtlError(f"the broker refused the credentials: HTTP {status}", EX_UNAVAILABLE)
    return status == 200, body if isinstance(body, dict) else {}


def _diag_no_args(args: argparse.Namespace) -> None:
    if args.args:
        raise CtlError(f"usage: leveret diagnostics {args.command} (takes no arguments)", EX_USAGE)


def diag_ping(api: Api, args: argparse.Namespace) -> str:
    _diag_no_args(args)
    timeout_ms = int(api.timeout * 1000)
    try:
        node = _diag_node(api)
    except CtlError as exc:
        raise CtlError(f"Failed to connect and authenticate to the broker at {api.url} in {timeout_ms} ms: {exc}",
                       EX_UNAVAILABLE) from None
    if args.formatter == "json":
        return json.dumps({"result": "ok", "node": node})
    banner = f"Will ping {node}. This only checks that its HTTP API answers. Timeout: {timeout_ms} ms."
    return "Ping succeeded" if args.quiet else f"{banner}\nPing succeeded"


def diag_status(api: Api, args: argparse.Namespace) -> str:
    _diag_no_args(args)
    return status_text(api, args)


def diag_check_running(api: Api, args: argparse.Namespace) -> str:
    _diag_no_args(args)
    node = _diag_node(api)
    ok, body = _diag_check(api, "/api/health/checks/is-in-service")
    if not ok:
        raise CheckFailed(f"RabbitMQ on node {node} is not running or has not fully booted yet: "
                          f"{body.get('reason', 'not in service')}", {"result": "error", "node": node})
    if args.formatter == "json":
        return json.dumps({"result": "ok", "node": node})
    text = f"RabbitMQ on node {node} is fully booted and running"
    return text if args.quiet else f"Checking if RabbitMQ is running on node {node} ...\n{text}"


def _diag_alarms(path: str, scope: str) -> Callable[[Api, argparse.Namespace], str]:
    def run(api: Api, args: argparse.Namespace) -> str:
        _diag_no_args(args)
        node = _diag_node(api)
        ok, body = _diag_check(api, path)
        if not ok:
            alarms = body.get("alarms", [])
            lines = [f"Node {a.get('node', node)} reported an alarm: {a.get('resource')}" for a in alarms]
            raise CheckFailed("\n".join(lines) or body.get("reason", "alarms in effect"),
                              {"result": "error", scope: [{"node": a.get("node", node), "resource":
                                                           a.get("resource")} for a in alarms],
                               "message": f"Node {node} reported {scope} alarms"})
        if args.formatter == "json":
            return json.dumps({"result": "ok"})
        text = f"Node {node} reported no {scope} alarms"
        return text if args.quiet else f"Asking node {node} to report any {scope} resource alarms ...\n{text}"
    return run


def _diag_listeners(api: Api) -> tuple[str, list[dict[str, Any]]]:
    overview = api.get("/api/overview") or {}
    return str(overview.get("node", "?")), list(overview.get("listeners", []))


def _diag_listener_line(lst: dict[str, Any]) -> str:
    return (f"Interface: {lst['ip_address']}, port: {lst['port']}, protocol: {lst['protocol']}, "
            f"purpose: {listener_purpose(lst['protocol'])}")


def _diag_listener_map(node: str, lst: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "interface": lst["ip_address"], "port": lst["port"], "protocol": lst["protocol"],
            "purpose": listener_purpose(lst["protocol"])}


def diag_listeners(api: Api, args: argparse.Namespace) -> str:
    _diag_no_args(args)
    node, found = _diag_listeners(api)
    if args.formatter == "json":
        return json.dumps([_diag_listener_map(node, lst) for lst in found], indent=1)
    lines = [] if args.quiet else [f"Asking node {node} to report its protocol listeners ..."]
    return "\n".join(lines + [_diag_listener_line(lst) for lst in found])


def _diag_connect(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def diag_check_port_connectivity(api: Api, args: argparse.Namespace) -> str:
    """Open (and close at once) a TCP connection to every listener the node reports, as rabbitmq-diagnostics
    does; a listener on a wildcard address is tried at the host of ``--url``."""
    _diag_no_args(args)
    node, found = _diag_listeners(api)
    url_host = urllib.parse.urlsplit(api.url).hostname or "127.0.0.1"
    per_listener = max(1.0, (args.timeout or 30.0) / (len(found) + 1))
    failures = []
    for lst in found:
        host = lst["ip_address"]
        if host in ("0.0.0.0", "::", "", None):
            host = url_host
        if not _diag_connect(host, int(lst["port"]), per_listener):
            failures.append(lst)
    if failures:
        raise CheckFailed("\n".join([f"Connection to ports of the following listeners on node {node} failed: ",
                                     *(_diag_listener_line(lst) for lst in failures)]),
                          {"result": "error", "node": node, "failures": [_diag_listener_map(node, lst)
                                                                          for lst in failures]})
    if args.formatter == "json":
        return json.dumps({"result": "ok", "node": node, "listeners": [_diag_listener_map(node, lst) for lst in found]})
    ports = ", ".join(str(p) for p in sorted({lst["port"] for lst in found}))
    text = f"Successfully connected to ports {ports} on node {node}."
    return text if args.quiet else f"Testing TCP connections to all active listeners on node {node} ...\n{text}"


def diag_check_port_listener(api: Api, args: argparse.Namespace) -> str:
    if len(args.args) != 1 or not args.args[0].isdigit():
        raise CtlError("usage: leveret diagnostics check_port_listener PORT", EX_USAGE)
    port = int(args.args[0])
    node = _diag_node(api)
    ok, body = _diag_check(api, f"/api/health/checks/port-listener/{port}")
    if not ok:
        ports = ", ".join(str(p) for p in body.get("ports", []))
        raise CheckFailed(f"No listener for port {port} is active on node {node}. Found listeners that use the "
                          f"following ports: {ports}", {"result": "error", "missing": port, "ports":
                                                        body.get("ports", [])})
    if args.formatter == "json":
        return json.dumps({"result": "ok", "node": node, "port": port})
    return f"A listener for port {port} is running on node {node}."


def diag_check_protocol_listener(api: Api, args: argparse.Namespace) -> str:
    if len(args.args) != 1:
        raise CtlError("usage: leveret diagnostics check_protocol_listener PROTOCOL", EX_USAGE)
    protocol = args.args[0]
    node = _diag_node(api)
    ok, body = _diag_check(api, f"/api/health/checks/protocol-listener/{q(protocol)}")
    if not ok:
        found = ", ".join(body.get("protocols", []))
        raise CheckFailed(f"No listener for protocol {protocol} is active on node {node}. Found listeners for "
                          f"the following protocols: {found}", {"result": "error", "missing": protocol,
                                                                 "protocols": body.get("protocols", [])})
    if args.formatter == "json":
        return json.dumps({"result": "ok", "node": node, "protocol": protocol})
    return f"A listener for protocol {protocol} is running on node {node}."


def diag_memory_breakdown(api: Api, args: argparse.Namespace) -> str:
    _diag_no_args(args)
    unit = args.unit.lower()
    if unit not in DIAG_UNITS:
        raise CtlError(f"unit must be one of {', '.join(DIAG_UNITS)}", EX_DATAERR)
    node = (api.get("/api/nodes") or [{}])[0]
    name = node.get("name", "?")
    total = int(node.get("mem_used") or 0)
    parts = {"queue_procs": 0, "stream_queue_procs": 0}
    for queue in api.get("/api/queues") or []:
        key = "stream_queue_procs" if queue.get("type") == "stream" else "queue_procs"
        parts[key] += int(queue.get("memory") or 0)
    parts["other"] = max(0, total - sum(parts.values()))
    if args.formatter == "json":
        return json.dumps({**parts, "total": {"rss": total}}, indent=1)
    whole = max(total, sum(parts.values())) or 1
    lines = [] if args.quiet else [f"Reporting memory breakdown on node {name}..."]
    for key, value in sorted(parts.items(), key=lambda kv: -kv[1]):
        lines.append(f"{key}: {value / DIAG_UNITS[unit]:.4f} {unit} ({100 * value / whole:.2f}%)")
    lines.append(f"total (resident memory): {total / DIAG_UNITS[unit]:.4f} {unit}")
    return "\n".join(lines)


def _diag_ctl_verb(verb: str) -> Callable[[Api, argparse.Namespace], str]:
    def run(api: Api, args: argparse.Namespace) -> str:
        args.columns = args.args
        return OPERATOR_VERBS[verb](api, args)
    return run


DIAG_COMMANDS: dict[str, Callable[[Api, argparse.Namespace], str]] = {
    "ping": diag_ping,
    "status": diag_status,
    "check_running": diag_check_running,
    "check_local_alarms": _diag_alarms("/api/health/checks/local-alarms", "local"),
    "check_alarms": _diag_alarms("/api/health/checks/alarms", "cluster-wide"),
    "check_port_connectivity": diag_check_port_connectivity,
    "check_port_listener": diag_check_port_listener,
    "check_protocol_listener": diag_check_protocol_listener,
    "listeners": diag_listeners,
    "memory_breakdown": diag_memory_breakdown,
    "environment": _diag_ctl_verb("environment"),
    "cluster_status": _diag_ctl_verb("cluster_status"),
}


def _diag_parser() -> argparse.ArgumentParser:
    p = _UsageParser(prog="leveret diagnostics", description=DIAGNOSTICS_DOC,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(p)
    add_tls_arguments(p)
    p.add_argument("--formatter", choices=("table", "json"), default="table")
    p.add_argument("-q", "--quiet", action="store_true", help="no informational banner")
    p.add_argument("-t", "--timeout", type=float, default=None, metavar="SECONDS",
                   help="how long to wait for the broker (default 30)")
    p.add_argument("--unit", default="gb", help="memory_breakdown: b, kb, mb, gb, kib, mib or gib (default gb)")
    p.add_argument("command", choices=tuple(DIAG_COMMANDS), metavar="COMMAND", help=", ".join(DIAG_COMMANDS))
    p.add_argument("args", nargs="*", metavar="ARG")
    return p


def diagnostics_add_parser(sub: Any) -> None:
    """``leveret diagnostics``, listed in ``leveret --help``; options may come before or after the command."""
    diag = sub.add_parser("diagnostics", help="health checks and node reports (rabbitmq-diagnostics' commands)",
                          add_help=False)
    diag.add_argument("argv", nargs=argparse.REMAINDER)
    diag.set_defaults(func=lambda ns: diagnostics_run(ns.argv))


def diagnostics_run(argv: list[str]) -> int:
    return diagnostics_main(_diag_parser().parse_intermixed_args(argv))


def diagnostics_main(args: argparse.Namespace) -> int:
    args.vhost, args.vhost_given = "/", False  # what the ctl verbs reused here read
    try:
        resolve_target(args)
        api = Api(args.url, args.username, args.password, timeout=args.timeout or 30.0, context=tls_context(args),
                  origin=args.origin)
        out = DIAG_COMMANDS[args.command](api, args)
    except CheckFailed as exc:
        if args.formatter == "json" and exc.data is not None:
            print(json.dumps(exc.data))
        print(f"Error:\n{exc}", file=sys.stderr)
        return exc.code
    except CtlError as exc:
        print(f"Error:\n{exc}", file=sys.stderr)
        return EX_USAGE if exc.code == 2 else exc.code
    if out:
        print(out)
    return 0
