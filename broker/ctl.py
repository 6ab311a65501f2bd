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

The API is found at ``--url`` (default ``$LEVERET_CTL_URL`` or ``http://127.0.0.1:15672``), with
``--username`` / ``--password`` (default ``$LEVERET_CTL_USERNAME`` / ``$LEVERET_CTL_PASSWORD`` or
guest / guest). ``-p`` names the vhost as in rabbitmqctl. Output is an aligned table, or JSON with
``--formatter json``. Exit codes: 0 done, 1 refused by the broker, 2 usage, 69 broker unreachable.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

EX_UNAVAILABLE = 69


class CtlError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Api:
    def __init__(self, url: str, username: str, password: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                ok_missing: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={**self.headers, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and ok_missing:
                return None
            try:
                detail = json.loads(exc.read()).get("reason", "")
            except (ValueError, AttributeError):
                detail = ""
            raise CtlError(f"{method} {path}: {exc.code} {exc.reason}" + (f": {detail}" if detail else "")) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(f"cannot reach the broker's HTTP API at {self.url}: {reason}", EX_UNAVAILABLE) from None
        return json.loads(raw) if raw.strip() else None

    def get(self, path: str, ok_missing: bool = False) -> Any:
        return self.request("GET", path, ok_missing=ok_missing)


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
    "title": "stream consumer groups",
    "aliases": {"group": "name", "reference": "name", "committed": "committed_offset", "members": "consumers",
                "queue": "stream"},
}

LISTS: dict[str, dict[str, Any]] = {
    "list_queues": {"path": "/api/queues/{vhost}", "default": ["name", "messages"], "title": "queues",
                    "aliases": {"pid": "node", "owner_pid": "owner_pid_details.name"}},
    "list_exchanges": {"path": "/api/exchanges/{vhost}", "default": ["name", "type"], "title": "exchanges",
                       "aliases": {}},
    "list_bindings": {"path": "/api/bindings/{vhost}",
                      "default": ["source_name", "source_kind", "destination_name", "destination_kind",
                                  "routing_key", "arguments"], "title": "bindings",
                      "aliases": {"source_name": "source", "source_kind": lambda r: "exchange",
                                  "destination_name": "destination", "destination_kind": "destination_type"}},
    "list_connections": {"path": "/api/connections", "default": ["user", "peer_host", "peer_port", "state"],
                         "title": "connections", "aliases": {"pid": "name", "timeout": "timeout"}},
    "list_channels": {"path": "/api/channels", "default": ["pid", "user", "consumer_count",
                                                           "messages_unacknowledged"],
                      "title": "channels", "aliases": {"pid": "name", "connection": "connection_details.name"}},
    "list_consumers": {"path": "/api/consumers/{vhost}",
                       "default": ["queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                                   "active", "arguments"], "title": "consumers",
                       "aliases": {"queue_name": "queue.name", "channel_pid": "channel_details.name"}},
    "list_users": {"path": "/api/users", "default": ["user", "tags"], "title": "users",
                   "aliases": {"user": "name"}},
    "list_vhosts": {"path": "/api/vhosts", "default": ["name"], "title": "vhosts", "aliases": {}},
    "list_permissions": {"path": "/api/vhosts/{vhost}/permissions",
                         "default": ["user", "configure", "write", "read"], "title": "permissions",
                         "aliases": {}},
    "list_policies": {"path": "/api/policies/{vhost}",
                      "default": ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                      "title": "policies", "aliases": {}},
    "list_stream_groups": STREAM_GROUPS,
    "list_stream_consumer_groups": STREAM_GROUPS,
}


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
    user = api.get(f"/api/users/{q(name)}", ok_missing=True)
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
        (limit,) = _need(args, 1, "BYTES (e.g. 50000000, 2GB)")
        api.request("PUT", "/api/leveret/resource-limits", {"disk_free_limit": _bytes_arg(limit)})
        return f"Setting disk free limit to {limit} bytes ..."
    if verb == "set_vm_memory_high_watermark":
        parts = _need(args, 2, "absolute BYTES")
        if parts[0] != "absolute":
            raise CtlError("only 'set_vm_memory_high_watermark absolute BYTES' is supported", 2)
        api.request("PUT", "/api/leveret/resource-limits", {"vm_memory_high_watermark": _bytes_arg(parts[1])})
        return f"Setting memory threshold on this node to {parts[1]} bytes ..."
    if verb in DELAYED_VERBS:
        return do_delayed(api, args)
    if verb == "status":
        overview = api.get("/api/overview")
        node = (api.get("/api/nodes") or [{}])[0]
        info = {
            "node": overview.get("node"),
            "product_name": overview.get("product_name"),
            "product_version": overview.get("product_version"),
            "rabbitmq_version": overview.get("rabbitmq_version"),
            "uptime_seconds": int(node.get("uptime", 0) / 1000),
            "memory_used": node.get("mem_used"),
            "memory_limit": node.get("mem_limit"),
            "disk_free": node.get("disk_free"),
            "disk_free_limit": node.get("disk_free_limit"),
            "alarms": [a for a, on in (("memory", node.get("mem_alarm")), ("disk", node.get("disk_free_alarm")))
                       if on],
            "listeners": [f"{lst['protocol']} {lst['ip_address']}:{lst['port']}"
                          for lst in overview.get("listeners", [])],
            "totals": overview.get("object_totals", {}),
        }
        if args.formatter == "json":
            return json.dumps(info, indent=1)
        lines = [f"Status of node {info['node']} ..."]
        lines += [f"{k}: {_cell(v)}" for k, v in info.items() if k != "node"]
        return "\n".join(lines)
    raise CtlError(f"unknown verb {verb}", 2)


DELAYED_VERBS = ("list_delayed", "cancel_delayed", "purge_delayed")
DELAYED_COLUMNS = ["id", "due", "routing_key", "payload_bytes"]
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
VERBS = tuple(LISTS) + ACTIONS


def _ctl_parser() -> argparse.ArgumentParser:
    ctl = argparse.ArgumentParser(prog="leveret ctl", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    ctl.add_argument("--url", default=os.environ.get("LEVERET_CTL_URL", "http://127.0.0.1:15672"),
                     help="the broker's HTTP API (default %(default)s)")
    ctl.add_argument("--username", "-u", default=os.environ.get("LEVERET_CTL_USERNAME", "guest"))
    ctl.add_argument("--password", default=os.environ.get("LEVERET_CTL_PASSWORD", "guest"))
    ctl.add_argument("-p", "--vhost", default=None, help="virtual host (default /)")
    ctl.add_argument("--formatter", choices=("table", "json"), default="table")
    ctl.add_argument("-q", "--quiet", action="store_true", help="no informational header line")
    ctl.add_argument("--priority", type=int, default=0, help="set_policy: priority")
    ctl.add_argument("--apply-to", default="all", help="set_policy: all, queues, exchanges, ...")
    ctl.add_argument("--description", help="add_vhost: description")
    ctl.add_argument("--tags", help="add_vhost: comma-separated tags")
    ctl.add_argument("--if-empty", action="store_true", help="delete_queue: only if empty")
    ctl.add_argument("--if-unused", action="store_true", help="delete_queue: only if it has no consumers")
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


def main(args: argparse.Namespace) -> int:
    args.vhost_given = args.vhost is not None
    if args.vhost is None:
        args.vhost = "/"
    api = Api(args.url, args.username, args.password)
    try:
        out = do_list(api, args) if args.verb in LISTS else do_action(api, args)
    except CtlError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.code
    if out and not (args.quiet and args.verb in ACTIONS and args.verb not in ("status", "export_definitions", "list_delayed")):
        print(out)
    return 0
