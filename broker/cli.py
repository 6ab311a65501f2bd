"""The ``leveret`` command.

``leveret serve [--config FILE] [--bind ADDR] [--port N] [--data-dir DIR] [--management-port N]
[--prometheus-port N] [--log-level L] [--load-definitions FILE] [--set KEY=VALUE ...] [--force-reset]`` runs
the broker (``--force-reset``, like ``rabbitmqctl force_reset``, wipes the data directory first: a one-off
operator action, hence a flag and no configuration key);
``leveret ctl VERB ...`` operates a running one over its HTTP API (see broker/tools/ctl/);
``leveret diagnostics COMMAND`` runs rabbitmq-diagnostics' health checks against it (broker/tools/ctl/diagnostics.py);
``leveret perf [PerfTest's flags]`` is the load generator of broker/tools/perf.py (``leveret perf --help``).

Settings come from built-in defaults < the config file < ``LEVERET_…`` environment variables < these flags.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker import VERSION

if TYPE_CHECKING:
    from broker.config import Settings

# The configuration and the logging (structlog, and rich where it is installed) are imported by ``serve`` only:
# ``leveret ctl`` and ``leveret diagnostics`` are HTTP clients that run often (a compose healthcheck every few
# seconds, scripts, the suite's ~180 calls), and those imports were half of their start-up CPU (0.25 s -> 0.12 s).

# Command-line flag → configuration key (so a flag is validated exactly as the same key in a file).
_FLAG_KEYS = {
    "port": "listeners.tcp.default",
    "data_dir": "leveret.data_dir",
    "management_port": "management.tcp.port",
    "prometheus_port": "prometheus.tcp.port",
    "log_level": "log.console.level",
    "load_definitions": "load_definitions",
}


def build_settings(args: argparse.Namespace) -> Settings:
    from broker.config import ConfigError, load_settings

    overrides: list[tuple[str, str]] = []
    for item in args.set or []:
        if "=" not in item:
            raise ConfigError(f"command line: --set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        overrides.append((key.strip(), value))
    for attr, key in _FLAG_KEYS.items():
        value = getattr(args, attr, None)  # reflection over _FLAG_KEYS: the flags this command declares
        if value is not None:
            overrides.append((key, str(value)))
    settings = load_settings(args.config, overrides)
    if args.bind:
        settings.bind = args.bind
    return settings


def _serve(args: argparse.Namespace) -> int:
    import structlog

    from broker.config import ConfigError
    from broker.observability.logs import FileRotation, configure_logging

    try:
        settings = build_settings(args)
    except ConfigError as exc:
        print(f"leveret: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format, console=settings.log_console,
                      file=settings.log_file, file_level=settings.log_file_level,
                      rotation=FileRotation.from_settings(settings))
    for warning in settings.startup_warnings:
        structlog.get_logger("leveret.config").warning(warning)
    from broker.node import Node
    from broker.server import Server, StartupError

    try:
        import uvloop

        have_uvloop = True
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        have_uvloop = False
    server = Server(Node(settings), force_reset=args.force_reset)
    # A broker holds many long-lived objects (every queued message): with CPython's default thresholds the
    # collector rescans them again and again while queues grow, measured at ~35% of publish throughput.
    # Young collections stay frequent; the older generations, where messages end up, are visited rarely.
    gc.set_threshold(100_000, 50, 1000)
    gc.freeze()
    try:
        if have_uvloop:
            uvloop.run(server.run_until_signalled())
        else:
            asyncio.run(server.run_until_signalled())
    except StartupError as exc:
        print(f"leveret: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "ctl":
        from broker.tools import ctl

        return ctl.run(argv[1:])
    if argv and argv[0] == "diagnostics":
        from broker.tools.ctl import diagnostics

        return diagnostics.run(argv[1:])
    if argv and argv[0] == "perf":
        from broker.tools import perf  # the PerfTest-like load generator, any broker by URL

        return perf.main(argv[1:])
    parser = argparse.ArgumentParser(prog="leveret", description="Leveret, an AMQP 0-9-1 message broker")
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the broker")
    serve.add_argument("--config", help="configuration file in rabbitmq.conf format "
                       "(default: $LEVERET_CONFIG_FILE, else none)")
    serve.add_argument("--bind", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", help="AMQP port (default 5672)")
    serve.add_argument("--data-dir", help="data directory (default ./leveret-data)")
    serve.add_argument("--management-port", help="HTTP API port (default 15672; 0 turns it off)")
    serve.add_argument("--prometheus-port", help="Prometheus port (default 15692; 0 turns it off)")
    serve.add_argument("--log-level", help="debug, info, warning, error, critical or none")
    serve.add_argument("--load-definitions", help="definitions file (RabbitMQ JSON) to import at start")
    serve.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="any configuration key, as in the config file (repeatable)")
    serve.add_argument("--force-reset", action="store_true",
                       help="delete everything in the data directory (every message, queue, user and "
                            "definition) and start as a new node, like rabbitmqctl force_reset")
    serve.set_defaults(func=_serve)
    # `leveret perf` is dispatched above, before this parser; listed here so that `leveret --help` shows it.
    sub.add_parser("perf", add_help=False,
                   help="load generator for any AMQP 0-9-1 broker, with PerfTest's flags (leveret perf --help)")
    from broker.tools import ctl
    from broker.tools.ctl import diagnostics

    ctl.add_parser(sub)
    diagnostics.add_parser(sub)
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func  # each subcommand's set_defaults(func=...)
    return func(args)
