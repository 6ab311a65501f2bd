"""Vhost and user limits (max-connections, max-queues, max-channels): rabbitmqctl's verbs that set, clear and
list them, over /api/vhost-limits, /api/user-limits and the vhost-limits runtime parameter. set_vhost_limits
replaces the vhost's limits; set_user_limits adds to the user's."""

from __future__ import annotations

import argparse
import json

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import existing_user, json_arg, need, user_exists, vhost_exists
from broker.tools.ctl.errors import CtlError
from broker.tools.ctl.output import rows_out
from broker.tools.ctl.verb import Verb, VerbGroup


def set_vhost_limits(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    (definition,) = need(args, 1, "[-p VHOST] DEFINITION (e.g. '{\"max-connections\": 64}')")
    api.request("PUT", f"/api/parameters/vhost-limits/{q(vhost)}/limits",
                {"value": json_arg(definition, "definition")})
    return f"Setting vhost limits to \"{definition}\" for vhost \"{vhost}\" ..."


def clear_vhost_limits(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    need(args, 0, "[-p VHOST]")
    for name in (api.get(f"/api/vhost-limits/{q(vhost)}") or [{}])[0].get("value", {}):
        api.request("DELETE", f"/api/vhost-limits/{q(vhost)}/{q(name)}")
    return f"Clearing vhost \"{vhost}\" limits ..."


def set_user_limits(api: Api, args: argparse.Namespace) -> str:
    name, definition = need(args, 2, "USERNAME DEFINITION (e.g. '{\"max-channels\": 16}')")
    parsed = json_arg(definition, "definition")
    if not isinstance(parsed, dict):
        raise CtlError("definition must be a JSON object", 2)
    existing_user(api, name)
    for limit, value in parsed.items():
        api.request("PUT", f"/api/user-limits/{q(name)}/{q(limit)}", {"value": value})
    return f"Setting user limits to \"{definition}\" for user \"{name}\" ..."


def clear_user_limits(api: Api, args: argparse.Namespace) -> str:
    name, limit = need(args, 2, "USERNAME LIMIT_NAME|all")
    api.request("DELETE", f"/api/user-limits/{q(name)}/{q(limit)}")
    return f"Clearing all limits for user \"{name}\" ..." if limit == "all" else \
        f"Clearing \"{limit}\" limit for user \"{name}\" ..."


def list_vhost_limits(api: Api, args: argparse.Namespace) -> str:
    """``list_vhost_limits [-p VHOST] [--global]``: one vhost's limits as a JSON object (as rabbitmqctl prints
    them), or with ``--global`` a ``vhost``/``limits`` row per vhost that has any."""
    need(args, 0, "[-p VHOST] [--global]")
    if args.global_:
        rows = [{"vhost": r["vhost"], "limits": r.get("value", {})} for r in api.get("/api/vhost-limits") or []]
        return rows_out(args, ["vhost", "limits"], rows, "Getting limits for all vhosts ...")
    vhost_exists(api, args.vhost)
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
    user_exists(api, name)
    found = api.get(f"/api/user-limits/{q(name)}") or []
    limits = found[0].get("value", {}) if found else {}
    if args.formatter == "json":
        return json.dumps(limits)
    text = json.dumps(limits, separators=(",", ":")) if limits else ""
    return text if args.quiet else f'Listing limits for user "{name}" ...' + (f"\n{text}" if text else "")


SET_LIMITS = VerbGroup({
    "set_vhost_limits": Verb(set_vhost_limits, only_banner=True),
    "clear_vhost_limits": Verb(clear_vhost_limits, only_banner=True),
    "set_user_limits": Verb(set_user_limits, only_banner=True),
    "clear_user_limits": Verb(clear_user_limits, only_banner=True),
})
LIMIT_LISTS = VerbGroup({
    "list_vhost_limits": Verb(list_vhost_limits),
    "list_user_limits": Verb(list_user_limits),
})
