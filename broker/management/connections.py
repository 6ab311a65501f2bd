"""``/api/connections`` (list, get, close with 320 CONNECTION_FORCED), ``/api/channels`` and
``/api/consumers``. Users without the monitoring or administrator tag see their own connections only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from broker.amqp.reader import open_connections
from broker.management.common import (
    node_of,
    not_found,
    respond,
    respond_list,
    sees_all,
    user_of,
    vhost_for,
)
from broker.management.presenters.connections import (
    channel_info,
    channel_name,
    connection_info,
    consumer_info,
    iter_channels,
    iter_consumers,
)

if TYPE_CHECKING:
    from broker.amqp.reader import Reader

CLOSE_REASON = "Closed via management plugin"


def _visible_connections(request: web.Request) -> list[Reader]:
    node, user = node_of(request), user_of(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        vhost_for(request)
    out = []
    for conn in sorted(open_connections(node), key=lambda c: c.connected_at):
        if not sees_all(user) and conn.user.name != user.name:
            continue
        if vhost is not None and (conn.vhost is None or conn.vhost.name != vhost):
            continue
        out.append(conn)
    return out


def _connection(request: web.Request) -> Reader:
    name = request.match_info["name"]
    for conn in _visible_connections(request):
        if conn.name == name:
            return conn
    raise not_found()


async def list_connections(request: web.Request) -> web.Response:
    node = node_of(request)
    sampler = request.app["sampler"]
    return respond_list(request, (connection_info(node, c, sampler) for c in _visible_connections(request)))


async def get_connection(request: web.Request) -> web.Response:
    return respond(connection_info(node_of(request), _connection(request), request.app["sampler"]))


async def delete_connection(request: web.Request) -> web.Response:
    conn = _connection(request)
    conn.force_close(request.headers.get("X-Reason") or CLOSE_REASON)
    return web.Response(status=204)


async def connection_channels(request: web.Request) -> web.Response:
    node = node_of(request)
    conn = _connection(request)
    sampler = request.app["sampler"]
    return respond_list(request, (channel_info(node, conn, ch, sampler) for ch in list(conn.channels.values())))


async def list_channels(request: web.Request) -> web.Response:
    node = node_of(request)
    visible = set(_visible_connections(request))
    sampler = request.app["sampler"]
    return respond_list(request, (channel_info(node, conn, ch, sampler) for conn, ch in iter_channels(node)
                                  if conn in visible))


async def get_channel(request: web.Request) -> web.Response:
    node = node_of(request)
    visible = set(_visible_connections(request))
    for conn, ch in iter_channels(node):
        if conn in visible and channel_name(conn, ch) == request.match_info["name"]:
            info = channel_info(node, conn, ch, request.app["sampler"])
            info["consumer_details"] = [consumer_info(node, conn, ch, c) for c in list(ch.consumers.values())]
            return respond(info)
    raise not_found()


async def list_consumers(request: web.Request) -> web.Response:
    node = node_of(request)
    visible = set(_visible_connections(request))
    return respond_list(request, (consumer_info(node, conn, ch, c) for conn, ch, c in iter_consumers(node)
                                  if conn in visible))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/connections", list_connections)
    router.add_get("/api/connections/{name}", get_connection)
    router.add_delete("/api/connections/{name}", delete_connection)
    router.add_get("/api/connections/{name}/channels", connection_channels)
    router.add_get("/api/vhosts/{vhost}/connections", list_connections)
    router.add_get("/api/channels", list_channels)
    router.add_get("/api/channels/{name}", get_channel)
    router.add_get("/api/vhosts/{vhost}/channels", list_channels)
    router.add_get("/api/consumers", list_consumers)
    router.add_get("/api/consumers/{vhost}", list_consumers)
