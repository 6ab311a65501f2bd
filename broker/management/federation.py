"""Federation link status (rabbitmq_federation_management's endpoints): ``GET /api/federation-links`` and
``GET /api/federation-links/{vhost}``. The upstreams are ``federation-upstream`` runtime parameters
(``/api/parameters/federation-upstream/...``, broker/management/policies.py); this is what the node's
supervisor (broker/federation/supervisor.py) reports of the links they and the policies make."""

from __future__ import annotations

from aiohttp import web

from broker.management.common import node_of, require_tags, respond_list, vhost_for, visible_vhosts

# As for shovels: monitoring users and up.
MONITOR_TAGS = ("administrator", "monitoring", "policymaker", "management")


async def list_links(request: web.Request) -> web.Response:
    require_tags(request, MONITOR_TAGS, "management")
    node = node_of(request)
    if "vhost" in request.match_info:
        names = {vhost_for(request).name}
    else:
        names = {vh.name for vh in visible_vhosts(request)}
    return respond_list(request, (s for s in node.federation.status() if s["vhost"] in names))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/federation-links", list_links)
    router.add_get("/api/federation-links/{vhost}", list_links)
