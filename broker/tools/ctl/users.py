"""Users and what they may do: rabbitmqctl's verbs for users (add, delete, password, tags), their permissions
and topic permissions, and the listings of both, over /api/users, /api/permissions and
/api/topic-permissions."""

from __future__ import annotations

import argparse

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import existing_user, need, user_exists, vhost_exists
from broker.tools.ctl.errors import CtlError
from broker.tools.ctl.output import rows_out
from broker.tools.ctl.verb import Verb, VerbGroup


def add_user(api: Api, args: argparse.Namespace) -> str:
    name, password = need(args, 2, "USERNAME PASSWORD")
    if api.get(f"/api/users/{q(name)}", ok_missing=True) is not None:
        raise CtlError(f"user '{name}' already exists")
    api.request("PUT", f"/api/users/{q(name)}", {"password": password, "tags": []})
    return f"Adding user \"{name}\" ..."


def delete_user(api: Api, args: argparse.Namespace) -> str:
    (name,) = need(args, 1, "USERNAME")
    existing_user(api, name)
    api.request("DELETE", f"/api/users/{q(name)}")
    return f"Deleting user \"{name}\" ..."


def change_password(api: Api, args: argparse.Namespace) -> str:
    name, password = need(args, 2, "USERNAME NEW_PASSWORD")
    user = existing_user(api, name)
    api.request("PUT", f"/api/users/{q(name)}", {"password": password, "tags": user.get("tags", [])})
    return f"Changing password for user \"{name}\" ..."


def set_user_tags(api: Api, args: argparse.Namespace) -> str:
    """Replaces the user's tags, keeping the password: the user is written back with its hash."""
    if not args.columns:
        raise CtlError("usage: leveret ctl set_user_tags USERNAME [TAG ...]", 2)
    name, *tags = args.columns
    user = existing_user(api, name)
    api.request("PUT", f"/api/users/{q(name)}", {"password_hash": user["password_hash"], "tags": tags,
                                                   "hashing_algorithm": user.get("hashing_algorithm")})
    return f"Setting tags for user \"{name}\" to [{', '.join(tags)}] ..."


def set_permissions(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    name, conf, write, read = need(args, 4, "[-p VHOST] USERNAME CONF WRITE READ")
    api.request("PUT", f"/api/permissions/{q(vhost)}/{q(name)}",
                {"configure": conf, "write": write, "read": read})
    return f"Setting permissions for user \"{name}\" in vhost \"{vhost}\" ..."


def clear_permissions(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    (name,) = need(args, 1, "[-p VHOST] USERNAME")
    api.request("DELETE", f"/api/permissions/{q(vhost)}/{q(name)}")
    return f"Clearing permissions for user \"{name}\" in vhost \"{vhost}\" ..."


def set_topic_permissions(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    name, exchange, write, read = need(args, 4, "[-p VHOST] USERNAME EXCHANGE WRITE READ")
    api.request("PUT", f"/api/topic-permissions/{q(vhost)}/{q(name)}",
                {"exchange": exchange, "write": write, "read": read})
    return f"Setting topic permissions on \"{exchange}\" for user \"{name}\" in vhost \"{vhost}\" ..."


def clear_topic_permissions(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    (name,) = need(args, 1, "[-p VHOST] USERNAME")
    api.request("DELETE", f"/api/topic-permissions/{q(vhost)}/{q(name)}")
    return f"Clearing topic permissions for user \"{name}\" in vhost \"{vhost}\" ..."


def list_user_permissions(api: Api, args: argparse.Namespace) -> str:
    (name,) = need(args, 1, "USERNAME")
    user_exists(api, name)
    rows = api.get(f"/api/users/{q(name)}/permissions") or []
    return rows_out(args, ["vhost", "configure", "write", "read"], rows, f'Listing permissions for user "{name}" ...')


def list_topic_permissions(api: Api, args: argparse.Namespace) -> str:
    need(args, 0, "[-p VHOST]")
    vhost_exists(api, args.vhost)
    rows = [r for r in api.get("/api/topic-permissions") or [] if r.get("vhost") == args.vhost]
    return rows_out(args, ["user", "exchange", "write", "read"], rows,
                    f'Listing topic permissions for vhost "{args.vhost}" ...')


def list_user_topic_permissions(api: Api, args: argparse.Namespace) -> str:
    (name,) = need(args, 1, "USERNAME")
    user_exists(api, name)
    rows = [r for r in api.get("/api/topic-permissions") or [] if r.get("user") == name]
    return rows_out(args, ["vhost", "exchange", "write", "read"], rows,
                    f'Listing topic permissions for user "{name}" ...')


USERS = VerbGroup({
    "add_user": Verb(add_user, only_banner=True),
    "delete_user": Verb(delete_user, only_banner=True),
    "change_password": Verb(change_password, only_banner=True),
    "set_user_tags": Verb(set_user_tags, only_banner=True),
    "set_permissions": Verb(set_permissions, only_banner=True),
    "clear_permissions": Verb(clear_permissions, only_banner=True),
})
TOPIC_PERMISSIONS = VerbGroup({
    "set_topic_permissions": Verb(set_topic_permissions, only_banner=True),
    "clear_topic_permissions": Verb(clear_topic_permissions, only_banner=True),
})
PERMISSION_LISTS = VerbGroup({
    "list_user_permissions": Verb(list_user_permissions),
    "list_topic_permissions": Verb(list_topic_permissions),
    "list_user_topic_permissions": Verb(list_user_topic_permissions),
})
