"""Shovel status (rabbitmq_shovel_management's endpoints): ``GET /api/shovels``, ``GET /api/shovels/{vhost}``
and ``DELETE /api/shovels/vhost/{vhost}/{name}/restart``. The shovels themselves are ``shovel`` runtime
parameters (``/api/parameters/shovel/...``, broker/management/policies.py); this is what the node's
supervisor (broker/shovel/supervisor.py) reports of them."""

from __future__ import annotations

from aiohttp import web

from broker.management.common import (
    node_of,
    not_found,
    require_tags,
    respond_list,
    vhost_for,
    visible_vhosts,
)

# RabbitMQ: the status is for monitoring users and up; restart needs policymaker (the parameter's rights).
MONITOR_TAGS = ("administrator", "monitoring", "policymaker", "management")
RESTART_TAGS = ("administrator", "policymaker")


async def list_shovels(request: web.Request) -> web.Response:
    require_tags(request, MONITOR_TAGS, "management")
    node = node_of(request)
    if "vhost" in request.match_info:
        names = {vhost_for(request).name}
    else:
        names = {vh.name for vh in visible_vhosts(request)}
    # Every member's shovels (in a cluster, the others' as they reported them within seconds).
    return respond_list(request, (s for s in await node.shovels.cluster_status() if s["vhost"] in names))


async def restart_shovel(request: web.Request) -> web.Response:
    require_tags(request, RESTART_TAGS, "policymaker")
    vh = vhost_for(request)
    if not node_of(request).shovels.restart(vh.name, request.match_info["name"]):
        raise not_found()
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/shovels", list_shovels)
    router.add_get("/api/shovels/{vhost}", list_shovels)
    router.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", restart_shovel)
