"""Policies and runtime parameters of a vhost (in RabbitMQ a policy is itself a runtime parameter):
rabbitmqctl's set_policy / clear_policy over /api/policies, and list_parameters / set_parameter /
clear_parameter over /api/parameters, with rabbitmqctl 3.10.8's exit codes for what the node refuses."""

from __future__ import annotations

import argparse
import json

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import need, vhost_exists
from broker.tools.ctl.errors import EX_UNAVAILABLE, CtlError
from broker.tools.ctl.output import rows_out
from broker.tools.ctl.verb import Verb, VerbGroup


def set_policy(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    name, pattern, definition = need(args, 3, "[-p VHOST] [--priority N] [--apply-to X] NAME PATTERN "
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


def clear_policy(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    (name,) = need(args, 1, "[-p VHOST] NAME")
    api.request("DELETE", f"/api/policies/{q(vhost)}/{q(name)}")
    return f"Clearing policy \"{name}\" on vhost \"{vhost}\" ..."


def list_parameters(api: Api, args: argparse.Namespace) -> str:
    need(args, 0, "[-p VHOST]")
    vhost_exists(api, args.vhost)
    rows = [r for r in api.get("/api/parameters") or [] if r.get("vhost") == args.vhost]
    return rows_out(args, ["component", "name", "value"], rows,
                    f'Listing runtime parameters for vhost "{args.vhost}" ...')


def set_parameter(api: Api, args: argparse.Namespace) -> str:
    """``set_parameter [-p VHOST] COMPONENT NAME JSON`` (rabbitmqctl's): a runtime parameter such as a
    shovel; the node validates it (400 with RabbitMQ's reason). A value that is not JSON, or one the node
    refuses, exits 69 with RabbitMQ's words, as rabbitmqctl 3.10.8 does (measured: its ``{error_string, _}``
    ends as ``{:error, _}``, which its ExitCodes map to EX_UNAVAILABLE), so scripts written for it still
    tell a refusal from success the same way."""
    component, name, text = need(args, 3, "[-p VHOST] COMPONENT NAME JSON")
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
    component, name = need(args, 2, "[-p VHOST] COMPONENT NAME")
    try:
        api.request("DELETE", f"/api/parameters/{q(component)}/{q(args.vhost)}/{q(name)}")
    except CtlError as exc:
        if exc.status == 404:
            raise CtlError("Parameter does not exist", EX_UNAVAILABLE, status=404) from None
        raise
    return "" if args.quiet else (f'Clearing runtime parameter "{name}" for component "{component}" on vhost '
                                  f'"{args.vhost}" ...')


POLICIES = VerbGroup({
    "set_policy": Verb(set_policy, only_banner=True),
    "clear_policy": Verb(clear_policy, only_banner=True),
})
PARAMETERS = VerbGroup({
    "list_parameters": Verb(list_parameters),
    "set_parameter": Verb(set_parameter),
    "clear_parameter": Verb(clear_parameter),
})
