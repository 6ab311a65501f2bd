"""``leveret diagnostics``: rabbitmq-diagnostics' health checks and node reports, the second command-line
client over the broker's HTTP API. It shares ctl's plumbing (the API client, where the broker is, the
errors and their exit codes) and reuses ctl's ``status``, ``environment`` and ``cluster_status``; the checks
of its own (ping, alarms, listeners, ports, memory breakdown) are here."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import urllib.parse
from typing import Any

from broker.tools.ctl.api import Api, node_name, q
from broker.tools.ctl.cluster import cluster_status
from broker.tools.ctl.errors import EX_DATAERR, EX_UNAVAILABLE, EX_USAGE, CtlError, UsageParser
from broker.tools.ctl.node import environment, status_text
from broker.tools.ctl.output import listener_purpose
from broker.tools.ctl.target import add_target_arguments, add_tls_arguments, resolve_target, tls_context
from broker.tools.ctl.verb import VerbFunction

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
        node = node_name(api)
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
    node = node_name(api)
    ok, body = _diag_check(api, "/api/health/checks/is-in-service")
    if not ok:
        raise CheckFailed(f"RabbitMQ on node {node} is not running or has not fully booted yet: "
                          f"{body.get('reason', 'not in service')}", {"result": "error", "node": node})
    if args.formatter == "json":
        return json.dumps({"result": "ok", "node": node})
    text = f"RabbitMQ on node {node} is fully booted and running"
    return text if args.quiet else f"Checking if RabbitMQ is running on node {node} ...\n{text}"


def _diag_alarms(path: str, scope: str) -> VerbFunction:
    def run(api: Api, args: argparse.Namespace) -> str:
        _diag_no_args(args)
        node = node_name(api)
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
    node = node_name(api)
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
    node = node_name(api)
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


def _diag_ctl_verb(verb: VerbFunction) -> VerbFunction:
    """A ctl verb as a diagnostics command: the command's arguments are the verb's."""
    def run(api: Api, args: argparse.Namespace) -> str:
        args.columns = args.args
        return verb(api, args)
    return run


DIAG_COMMANDS: dict[str, VerbFunction] = {
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
    "environment": _diag_ctl_verb(environment),
    "cluster_status": _diag_ctl_verb(cluster_status),
}


def _diag_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="leveret diagnostics", description=DIAGNOSTICS_DOC,
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


def add_parser(sub: Any) -> None:
    """``leveret diagnostics``, listed in ``leveret --help``; options may come before or after the command."""
    diag = sub.add_parser("diagnostics", help="health checks and node reports (rabbitmq-diagnostics' commands)",
                          add_help=False)
    diag.add_argument("argv", nargs=argparse.REMAINDER)
    diag.set_defaults(func=lambda ns: run(ns.argv))


def run(argv: list[str]) -> int:
    return main(_diag_parser().parse_intermixed_args(argv))


def main(args: argparse.Namespace) -> int:
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
