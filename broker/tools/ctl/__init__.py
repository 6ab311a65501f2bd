"""``leveret ctl``'s entry point: parse the command line, find the broker, run the verb, print what it answers
and exit with rabbitmqctl's code.

The package, one job a module: ``commands`` (the parser and the verb table: which module serves each verb;
``leveret ctl --help``'s text), ``verb`` (what a verb and a group of verbs are), the verbs by what they act on
(``listing`` the list_* verbs, ``users``, ``vhosts``, ``policies`` with runtime parameters, ``limits``,
``queues``, ``connections``, ``definitions``, ``delayed``, ``node``, ``cluster``, ``links`` for shovels and
federation), the plumbing they share (``api`` the HTTP client, ``target`` where the broker is and who logs in,
``arguments``, ``output``, ``errors``), and ``diagnostics``, ``leveret diagnostics``, the second client over
the same plumbing."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from broker.tools.ctl.api import Api
from broker.tools.ctl.arguments import vhost_exists
from broker.tools.ctl.commands import VERBS, build_parser
from broker.tools.ctl.errors import EX_USAGE, CtlError
from broker.tools.ctl.target import resolve_target, tls_context


def add_parser(sub: Any) -> None:
    """``leveret ctl``, listed in ``leveret --help``; options may come before or after the verb, as with
    rabbitmqctl."""
    ctl = sub.add_parser("ctl", help="operate a running broker (rabbitmqctl's verbs) over its HTTP API",
                         add_help=False)
    ctl.add_argument("argv", nargs=argparse.REMAINDER)
    ctl.set_defaults(func=lambda ns: run(ns.argv))


def run(argv: list[str]) -> int:
    return main(build_parser().parse_intermixed_args(argv))


def _missing_vhost(api: Api, args: argparse.Namespace, exc: CtlError) -> CtlError:
    """A 404 for a request in the ``-p`` vhost: rabbitmqctl's answer when that vhost does not exist (65,
    naming it) rather than the raw HTTP error; any other 404 stays as it was."""
    if exc.status != 404 or not args.vhost_given:
        return exc
    try:
        vhost_exists(api, args.vhost)
    except CtlError as missing:
        return missing
    return exc


def main(args: argparse.Namespace) -> int:
    args.vhost_given = args.vhost is not None
    if args.vhost is None:
        args.vhost = "/"
    verb = VERBS[args.verb]
    api: Api | None = None
    try:
        resolve_target(args)
        api = Api(args.url, args.username, args.password, context=tls_context(args), origin=args.origin)
        out = verb.run(api, args)
    except CtlError as exc:
        if api is not None:
            try:
                exc = _missing_vhost(api, args, exc)
            except CtlError:
                pass  # the check itself failed: the first error is the one to show
        print(f"Error: {exc}", file=sys.stderr)
        return EX_USAGE if exc.code == 2 else exc.code
    if out and not (args.quiet and verb.only_banner):
        print(out)
    return 0
