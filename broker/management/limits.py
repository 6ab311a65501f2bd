"""``/api/vhost-limits`` and ``/api/user-limits`` (RabbitMQ's rabbit_mgmt_wm_limit(s) and
rabbit_mgmt_wm_user_limit(s)): list, set one limit (``PUT .../{name}`` with ``{"value": N}``, 204), clear one
(``DELETE .../{name}``, 204; for a user ``all`` clears every limit). Setting and clearing need the
administrator tag; the lists are shown to every API user (vhost limits only for the vhosts it may see).

The limits are validated and enforced by broker/policies/limits.py; a change is written to the node's metadata store
at once (a write that fails is a 500 and changes nothing), and takes effect for the next connection, channel or queue (open ones are not closed, as in
RabbitMQ)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker.management.common import (
    bad_request,
    body_of,
    node_of,
    not_found,
    require_admin,
    respond_list,
    vhost_for,
    visible_vhosts,
)
from broker.policies import limits
from broker.security.auth import User


async def _value(request: web.Request) -> Any:
    body = await body_of(request)
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")  # rabbit_mgmt_util:with_decode's reason
    return body["value"]


# -- vhost limits -------------------------------------------------------------------------------------------------

async def list_vhost_limits(request: web.Request) -> web.Response:
    vhosts = [vhost_for(request)] if "vhost" in request.match_info else \
        sorted(visible_vhosts(request), key=lambda v: v.name)
    return respond_list(request, ({"vhost": vh.name, "value": dict(limits.vhost_limits(vh))} for vh in vhosts
                                  if limits.vhost_limits(vh)))


async def put_vhost_limit(request: web.Request) -> web.Response:
    require_admin(request)
    vh = vhost_for(request)
    value = await _value(request)
    merged = {**limits.vhost_limits(vh), request.match_info["name"]: value}
    try:
        limits.set_vhost_limits(vh, limits.validate_vhost_limits(merged))
    except limits.LimitError as exc:
        raise bad_request(f"Validation failed\n\n{exc}\n") from None  # a runtime parameter's error
    return web.Response(status=204)


async def delete_vhost_limit(request: web.Request) -> web.Response:
    require_admin(request)
    vh = vhost_for(request)
    remaining = {k: v for k, v in limits.vhost_limits(vh).items() if k != request.match_info["name"]}
    limits.set_vhost_limits(vh, remaining)
    return web.Response(status=204)


# -- user limits --------------------------------------------------------------------------------------------------

def _user(request: web.Request) -> User:
    user = node_of(request).users.users.get(request.match_info["user"])
    if user is None:
        raise not_found()
    return user


async def list_user_limits(request: web.Request) -> web.Response:
    users = [_user(request)] if "user" in request.match_info else \
        sorted(node_of(request).users.users.values(), key=lambda u: u.name)
    return respond_list(request, ({"user": u.name, "value": dict(u.limits)} for u in users if u.limits))


async def put_user_limit(request: web.Request) -> web.Response:
    require_admin(request)
    user = _user(request)
    value = await _value(request)
    try:
        new = limits.validate_user_limits({request.match_info["name"]: value})
    except limits.LimitError as exc:
        raise bad_request(str(exc)) from None
    node_of(request).set_user_limits(user.name, {**user.limits, **new})
    return web.Response(status=204)


async def delete_user_limit(request: web.Request) -> web.Response:
    require_admin(request)
    user = _user(request)
    name = request.match_info["name"]
    remaining = {} if name == "all" else {k: v for k, v in user.limits.items() if k != name}
    node_of(request).set_user_limits(user.name, remaining)
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/vhost-limits", list_vhost_limits)
    router.add_get("/api/vhost-limits/{vhost}", list_vhost_limits)
    router.add_put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    router.add_delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
    router.add_get("/api/user-limits", list_user_limits)
    router.add_get("/api/user-limits/{user}", list_user_limits)
    router.add_put("/api/user-limits/{user}/{name}", put_user_limit)
    router.add_delete("/api/user-limits/{user}/{name}", delete_user_limit)
