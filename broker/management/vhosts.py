"""``/api/vhosts``: list, get, create or update (PUT), delete, and a vhost's permissions.

A vhost's ``tracing`` (the firehose, broker/observability/trace.py) is shown in its object and set by a PUT
with ``{"tracing": true|false}``, as in RabbitMQ's management API (a PUT without it leaves tracing as it is).
"""

from __future__ import annotations

import asyncio

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
    vhost_for,
    visible_vhosts,
)
from broker.management.presenters.cluster import cluster_view
from broker.management.presenters.users import permission_info
from broker.management.presenters.vhosts import vhost_info
from broker.observability.trace import start as start_tracing
from broker.observability.trace import stop as stop_tracing

QUEUE_TYPES = ("classic", "quorum", "stream")


async def list_vhosts(request: web.Request) -> web.Response:
    node, sampler = node_of(request), request.app["sampler"]
    view = await cluster_view(node)  # a cluster member's totals: the cluster's (presenters/cluster.py)
    return respond_list(request, (vhost_info(node, vh, sampler, view) for vh in sorted(visible_vhosts(request),
                                                                                       key=lambda v: v.name)))


async def get_vhost(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    view = await cluster_view(node_of(request), vh.name)
    return respond(vhost_info(node_of(request), vh, request.app["sampler"], view))


async def put_vhost(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    name = request.match_info["vhost"]
    if not name:
        raise bad_request("vhost name must not be empty")
    body = await body_of(request)
    description = body.get("description", "")
    if not isinstance(description, str):
        raise bad_request("description must be a string")
    dqt = body.get("default_queue_type", node.settings.default_queue_type)
    if dqt not in QUEUE_TYPES:
        raise bad_request(f"default_queue_type must be one of {', '.join(QUEUE_TYPES)}")
    tracing = body.get("tracing")
    tracing = {"true": True, "false": False}.get(tracing, tracing) if isinstance(tracing, str) else tracing
    if tracing is not None and not isinstance(tracing, bool):
        raise bad_request("tracing must be true or false")
    existed = name in node.vhosts
    vh = node.add_vhost(name, description, as_tags(body.get("tags")) if "tags" in body else None, dqt)
    if tracing is True:
        start_tracing(vh, node.name, asyncio.get_running_loop().call_soon)
    elif tracing is False:
        stop_tracing(vh)
    return web.Response(status=204 if existed else 201)


async def delete_vhost(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    if not node.delete_vhost(request.match_info["vhost"]):
        raise not_found()
    return web.Response(status=204)


async def vhost_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    vh = vhost_for(request)
    node = node_of(request)
    return respond_list(request, (permission_info(u, vh.name) for u in node.users.users.values()
                                  if vh.name in u.permissions))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/vhosts", list_vhosts)
    router.add_get("/api/vhosts/{vhost}", get_vhost)
    router.add_put("/api/vhosts/{vhost}", put_vhost)
    router.add_delete("/api/vhosts/{vhost}", delete_vhost)
    router.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
