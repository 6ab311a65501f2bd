"""The node itself: ``status`` (rabbitmqctl's and rabbitmq-diagnostics'), ``environment`` (the settings in
force), the resource limits set at run time (``set_disk_free_limit``, ``set_vm_memory_high_watermark``),
``await_startup`` and ``rotate_logs``."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from broker.tools.ctl.api import Api, node_name
from broker.tools.ctl.arguments import bytes_arg, need, number_arg
from broker.tools.ctl.errors import EX_UNAVAILABLE, CtlError
from broker.tools.ctl.output import cell
from broker.tools.ctl.verb import Verb, VerbGroup


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
    lines += [f"{k}: {cell(v)}" for k, v in info.items() if k != "node"]
    return "\n".join(lines)


def set_disk_free_limit(api: Api, args: argparse.Namespace) -> str:
    usage = "BYTES (e.g. 50000000, 2GB) | mem_relative MULTIPLE (of the RAM, e.g. 1.5)"
    if len(args.columns) == 2 and args.columns[0] == "mem_relative":
        multiple = number_arg(args.columns[1], "mem_relative", 0.0, None)
        api.request("PUT", "/api/leveret/resource-limits", {"disk_free_limit_relative": multiple})
        return f"Setting disk free limit to {args.columns[1]} times the total RAM ..."
    (limit,) = need(args, 1, usage)
    api.request("PUT", "/api/leveret/resource-limits", {"disk_free_limit": bytes_arg(limit)})
    return f"Setting disk free limit to {limit} bytes ..."


def set_vm_memory_high_watermark(api: Api, args: argparse.Namespace) -> str:
    # rabbitmqctl's two forms: a fraction of the RAM (0.4), or "absolute" and a size (2GB).
    if len(args.columns) == 1:
        fraction = number_arg(args.columns[0], "the fraction", 0.0, 1.0)
        api.request("PUT", "/api/leveret/resource-limits", {"vm_memory_high_watermark_relative": fraction})
        return f"Setting memory threshold on this node to {args.columns[0]} of the total RAM ..."
    parts = need(args, 2, "FRACTION (e.g. 0.4) | absolute BYTES (e.g. 2GB)")
    if parts[0] != "absolute":
        raise CtlError("usage: leveret ctl set_vm_memory_high_watermark FRACTION | absolute BYTES", 2)
    api.request("PUT", "/api/leveret/resource-limits", {"vm_memory_high_watermark": bytes_arg(parts[1])})
    return f"Setting memory threshold on this node to {parts[1]} bytes ..."


def environment(api: Api, args: argparse.Namespace) -> str:
    """The settings in force (/api/leveret/environment): Leveret's counterpart of the application environment
    ``rabbitmqctl environment`` prints. Every setting, not only the ones a config file set."""
    need(args, 0, "")
    env = api.get("/api/leveret/environment") or {}
    if args.formatter == "json":
        return json.dumps(env, indent=1, sort_keys=True)
    lines = [] if args.quiet else [f"Application environment of node {node_name(api)} ..."]
    lines += [f"{k}: {cell(v)}" for k, v in sorted(env.items())]
    return "\n".join(lines)


def await_startup(api: Api, args: argparse.Namespace) -> str:
    """Wait until the node serves clients (/api/health/checks/ready-to-serve-clients answers 200), at most
    ``--timeout`` seconds (rabbitmqctl's default, 300): 0 once it does, 69 if it does not in time. A command
    line tool of its own process, so it may sleep between two asks."""
    need(args, 0, "[--timeout SECONDS]")
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
    need(args, 0, "")
    node = (api.get("/api/nodes") or [{}])[0]
    files = [f for f in node.get("log_files", []) if f != "<stderr>"]
    how = (f"the log file ({', '.join(files)}) is written in append mode, so logrotate's copytruncate "
           "rotates it safely" if files else "this broker logs to stderr only (no log.file), so there is no "
           "file to rotate")
    raise CtlError(f"Leveret has no on-demand log rotation, so rotate_logs does nothing; {how}", EX_UNAVAILABLE)


STATUS = VerbGroup({
    "status": Verb(status_text),
    "set_disk_free_limit": Verb(set_disk_free_limit, only_banner=True),
    "set_vm_memory_high_watermark": Verb(set_vm_memory_high_watermark, only_banner=True),
})
ENVIRONMENT = VerbGroup({"environment": Verb(environment)})
STARTUP_AND_LOGS = VerbGroup({
    "await_startup": Verb(await_startup),
    "rotate_logs": Verb(rotate_logs),
})
