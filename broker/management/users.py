"""``/api/users``, ``/api/permissions`` and ``/api/topic-permissions`` (administrator only, as in RabbitMQ).

A user is created with ``password`` (hashed here with salted SHA-256) or with ``password_hash`` (and
``hashing_algorithm``) as a definitions file carries it; ``tags`` is a list or a comma-separated string."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from broker.management.common import (
    as_tags,
    bad_request,
    body_of,
    node_of,
    not_found,
    require_admin,
    respond,
    respond_list,
)
from broker.management.presenters.users import permission_info, user_info
from broker.security import topic_permissions
from broker.security.auth import HASHING_ALGORITHMS, SHA256, User, hash_password, valid_password_hash


def _user(request: web.Request, name: str | None = None) -> User:
    user = node_of(request).users.users.get(name or request.match_info["user"])
    if user is None:
        raise not_found()
    return user


async def list_users(request: web.Request) -> web.Response:
    require_admin(request)
    users = sorted(node_of(request).users.users.values(), key=lambda u: u.name)
    if request.path.endswith("/without-permissions"):
        users = [u for u in users if not u.permissions]
    return respond_list(request, (user_info(u) for u in users))


async def get_user(request: web.Request) -> web.Response:
    require_admin(request)
    return respond(user_info(_user(request)))


async def put_user(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    name = request.match_info["user"]
    if not name:
        raise bad_request("user name must not be empty")
    body = await body_of(request)
    tags = as_tags(body.get("tags"))
    existing = node.users.users.get(name)
    algorithm = body.get("hashing_algorithm") or SHA256
    if algorithm not in HASHING_ALGORITHMS:
        raise bad_request(f"unknown hashing_algorithm '{algorithm}'")
    if "password" in body:
        password = body["password"]
        if not isinstance(password, str):
            raise bad_request("password must be a string")
        password_hash, algorithm = hash_password(password), SHA256
    elif "password_hash" in body:
        password_hash = body["password_hash"]
        if not isinstance(password_hash, str) or not valid_password_hash(password_hash):
            raise bad_request("password_hash must be a base64-encoded salted hash, or empty")
    elif existing is not None:
        password_hash, algorithm = existing.password_hash, existing.hashing_algorithm
    else:
        raise bad_request("Either password or password_hash must be set")
    node.put_user(name, password_hash, tags, algorithm)
    return web.Response(status=204 if existing is not None else 201)


async def delete_user(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    if not node.delete_users(request.match_info["user"]):
        raise not_found()
    return web.Response(status=204)


async def bulk_delete(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    body = await body_of(request)
    names = body.get("users")
    if not isinstance(names, list):
        raise bad_request("users must be a list of names")
    node.delete_users(*(str(name) for name in names))
    return web.Response(status=204)


async def user_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    user = _user(request)
    return respond_list(request, (permission_info(user, v) for v in sorted(user.permissions)))


# -- permissions ------------------------------------------------------------------------------------------------

async def list_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    users = sorted(node_of(request).users.users.values(), key=lambda u: u.name)
    return respond_list(request, (permission_info(u, v) for u in users for v in sorted(u.permissions)))


def _vhost_and_user(request: web.Request) -> tuple[str, User]:
    node = node_of(request)
    if request.match_info["vhost"] not in node.vhosts:
        raise not_found()
    return request.match_info["vhost"], _user(request)


async def get_permission(request: web.Request) -> web.Response:
    require_admin(request)
    vhost, user = _vhost_and_user(request)
    if vhost not in user.permissions:
        raise not_found()
    return respond(permission_info(user, vhost))


async def put_permission(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    vhost, user = _vhost_and_user(request)
    body = await body_of(request)
    regexes = []
    for key in ("configure", "write", "read"):
        value = body.get(key)
        if not isinstance(value, str):
            raise bad_request(f"{key} must be a string (a regular expression)")
        regexes.append(value)
    existed = vhost in user.permissions
    try:
        node.set_permissions(user.name, vhost, *regexes)
    except re.error as exc:
        raise bad_request(f"invalid regular expression: {exc}") from None
    return web.Response(status=204 if existed else 201)


async def delete_permission(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    vhost, user = _vhost_and_user(request)
    if not node.clear_permissions(user.name, vhost):
        raise not_found()
    return web.Response(status=204)


# -- topic permissions (enforced by broker/security/topic_permissions.py; a change reaches the user's open channels) -------

def _topic_rows(user: User, vhost: str | None = None) -> Iterator[dict[str, Any]]:
    for v in sorted(user.topic_permissions):
        if vhost is not None and v != vhost:
            continue
        for exchange, (write, read) in sorted(user.topic_permissions[v].items()):
            yield {"user": user.name, "vhost": v, "exchange": exchange, "write": write, "read": read}


async def list_topic_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    users = sorted(node_of(request).users.users.values(), key=lambda u: u.name)
    return respond_list(request, (row for u in users for row in _topic_rows(u)))


async def get_topic_permission(request: web.Request) -> web.Response:
    require_admin(request)
    vhost, user = _vhost_and_user(request)
    rows = list(_topic_rows(user, vhost))
    if not rows:
        raise not_found()
    return respond(rows)


async def put_topic_permission(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    vhost, user = _vhost_and_user(request)
    body = await body_of(request)
    exchange, write, read = body.get("exchange"), body.get("write", ".*"), body.get("read", ".*")
    if not (isinstance(exchange, str) and isinstance(write, str) and isinstance(read, str)):
        raise bad_request("exchange, write and read must be strings")
    for regex in (write, read):
        try:
            re.compile(regex)
        except re.error as exc:
            raise bad_request(f"invalid regular expression: {exc}") from None
    node.set_topic_permission(user.name, vhost, exchange, write, read)
    topic_permissions.permissions_changed(node.connections, user.name)
    return web.Response(status=201)


async def delete_topic_permission(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    vhost, user = _vhost_and_user(request)
    if not node.clear_topic_permissions(user.name, vhost):
        raise not_found()
    topic_permissions.permissions_changed(node.connections, user.name)
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/users", list_users)
    router.add_get("/api/users/without-permissions", list_users)
    router.add_post("/api/users/bulk-delete", bulk_delete)
    router.add_get("/api/users/{user}", get_user)
    router.add_put("/api/users/{user}", put_user)
    router.add_delete("/api/users/{user}", delete_user)
    router.add_get("/api/users/{user}/permissions", user_permissions)
    router.add_get("/api/permissions", list_permissions)
    router.add_get("/api/permissions/{vhost}/{user}", get_permission)
    router.add_put("/api/permissions/{vhost}/{user}", put_permission)
    router.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
    router.add_get("/api/topic-permissions", list_topic_permissions)
    router.add_get("/api/topic-permissions/{vhost}/{user}", get_topic_permission)
    router.add_put("/api/topic-permissions/{vhost}/{user}", put_topic_permission)
    router.add_delete("/api/topic-permissions/{vhost}/{user}", delete_topic_permission)
