"""``/api/bindings``: list (all, per vhost, between two objects), create (POST, answered with the new
binding's ``properties_key`` in ``Location``), get and delete one by its properties key. Binding goes through
``vhost.bind`` / ``vhost.unbind`` with queue.bind's and exchange.bind's permission checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from broker.exchanges.exchange import QUEUE, Binding
from broker.management.common import (
    bad_request,
    body_of,
    not_found,
    respond,
    respond_list,
    user_of,
    vhost_for,
    vhost_for_write,
    visible_vhosts,
)
from broker.management.presenters.bindings import (
    binding_info,
    default_binding_info,
    kind_of,
    properties_key,
    vhost_bindings,
)
from broker.management.presenters.exchanges import lookup_exchange
from broker.security import permissions, topic_permissions
from broker.topology import answered_call

if TYPE_CHECKING:
    from broker.vhost import VHost


async def list_bindings(request: web.Request) -> web.Response:
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    return respond_list(request, (b for vh in vhs for b in vhost_bindings(vh)))


def _endpoints(request: web.Request, vh: VHost) -> tuple[str, str, str]:
    """(source, destination, kind) from the path; 404 if either end does not exist."""
    source = request.match_info["source"]
    destination = request.match_info["destination"]
    kind = kind_of(request.match_info["dtype"])
    if source == "amq.default":
        source = ""
    if lookup_exchange(vh, source) is None:
        raise not_found()
    if kind == QUEUE:
        if vh.queues.get(destination) is None and not _other_members(vh, destination):
            raise not_found()
    elif lookup_exchange(vh, destination) is None:
        raise not_found()
    return source, destination, kind


def _other_members(vh: VHost, queue: str) -> bool:
    """Whether ``queue`` is another cluster member's node-local queue (as the directory was last read)."""
    return vh.queues.get(queue) is None and vh.remote.has_queue(queue)


def _between(vh: VHost, source: str, destination: str, kind: str) -> list[Binding]:
    ex = lookup_exchange(vh, source)
    if ex is None:
        return []
    found = [b for b in ex.bindings.values() if b.kind == kind and b.destination == destination]
    if kind == QUEUE and _other_members(vh, destination):  # its bindings, as its member made them
        found += vh.remote.bindings_to(source, destination)
    return found


async def list_between(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    source, destination, kind = _endpoints(request, vh)
    if source == "":
        rows = [default_binding_info(vh, destination)] if kind == QUEUE else []
    else:
        rows = [binding_info(vh, b) for b in _between(vh, source, destination, kind)]
    return respond_list(request, rows)


async def create_binding(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    source, destination, kind = _endpoints(request, vh)
    body = await body_of(request)
    routing_key = body.get("routing_key", "")
    arguments = body.get("arguments") or {}
    if not isinstance(routing_key, str) or not isinstance(arguments, dict):
        raise bad_request("routing_key must be a string and arguments an object")
    user = user_of(request)
    if kind == QUEUE:
        permissions.queue_bind(user, vh.name, destination, source)
    else:
        permissions.exchange_bind(user, vh.name, destination, source)
    topic_permissions.check_bind(user, vh, source, routing_key)
    # (In a cluster, what the bind asks of PostgreSQL is awaited: broker/topology.py answered_call.)
    await answered_call(lambda: vh.bind(source, destination, kind, routing_key, arguments))
    key = properties_key(routing_key, arguments)
    return web.Response(status=201, headers={"Location": key})


def _find(request: web.Request, vh: VHost) -> Binding:
    source, destination, kind = _endpoints(request, vh)
    props = request.match_info["props"]
    for b in _between(vh, source, destination, kind):
        if properties_key(b.routing_key, b.arguments) == props:
            return b
    raise not_found()


async def get_binding(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    return respond(binding_info(vh, _find(request, vh)))


async def delete_binding(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    b = _find(request, vh)
    user = user_of(request)
    if b.kind == QUEUE:
        permissions.queue_bind(user, vh.name, b.destination, b.source)
    else:
        permissions.exchange_bind(user, vh.name, b.destination, b.source)
    topic_permissions.check_bind(user, vh, b.source, b.routing_key)
    unbinding = await answered_call(lambda: vh.unbind(b.source, b.destination, b.kind, b.routing_key, b.arguments))
    if unbinding is not None:
        # Another cluster member's queue: answered once that member has carried the unbind out, as unbind-ok
        # is (broker/clustering/cluster_forwarding.py VHostLink.unbind_remote); the event loop serves others meanwhile.
        await unbinding
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    between = "/api/bindings/{vhost}/e/{source}/{dtype:q|e}/{destination}"
    router.add_get("/api/bindings", list_bindings)
    router.add_get("/api/bindings/{vhost}", list_bindings)
    router.add_get(between, list_between)
    router.add_post(between, create_binding)
    router.add_get(between + "/{props}", get_binding)
    router.add_delete(between + "/{props}", delete_binding)

