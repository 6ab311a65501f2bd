"""The ``leveret`` command: ``leveret serve [--config FILE] [--bind ADDR] [--port N] [--data-dir DIR]``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from broker.config import ConfigError, Settings, load_env, load_file
from broker.logs import configure_logging


def _serve(args: argparse.Namespace) -> int:
    settings = Settings()
    try:
        if args.config:
            load_file(settings, Path(args.config))
        load_env(settings)
    except ConfigError as exc:
        print(f"leveret: {exc}", file=sys.stderr)
        return 2
    if args.bind:
        settings.bind = args.bind
    if args.port is not None:
        settings.port = args.port
    if args.data_dir:
        settings.data_dir = Path(args.data_dir)
    configure_logging(settings.log_level, settings.log_format)
    from broker.node import Node

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        uvloop = None
    node = Node(settings)
    if uvloop is not None:
        uvloop.run(node.run_until_signalled())
    else:
        asyncio.run(node.run_until_signalled())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="leveret", description="Leveret, an AMQP 0-9-1 message broker")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the broker")
    serve.add_argument("--config", help="configuration file in rabbitmq.conf format")
    serve.add_argument("--bind", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="AMQP port (default 5672)")
    serve.add_argument("--data-dir", help="data directory (default ./leveret-data)")
    serve.set_defaults(func=_serve)
    args = parser.parse_args(argv)
    return args.func(args)
