"""``/api/definitions`` (administrator only): GET exports, POST imports (a JSON body; the web UI reads the
chosen file and sends it as one); ``/api/definitions/{vhost}`` for one vhost.

A POST may carry megabytes, up to ``management.http.max_body_size`` like any authenticated body (RabbitMQ's
rule too; raise the key for a bigger document). It is read into one buffer, parsed in a worker thread, and the
text dropped before the definitions are applied in slices that yield to the event loop (broker/definitions.py),
so AMQP clients keep being served and the document is never held twice. RabbitMQ's UI uploads a multipart
form: an HTML form is what a page on another site can send, so only JSON is taken (broker/management/same_site.py).
A body that is not JSON, or nests deeper than the decoder can follow, is a 400 like any other bad document."""

from __future__ import annotations

import asyncio

from aiohttp import web

from broker import definitions
from broker.management.common import bad_request, node_of, require_admin, respond, vhost_for
from broker.management.request_bodies import read_body


async def get_definitions(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    vhost = vhost_for(request).name if "vhost" in request.match_info else None
    response = respond(definitions.export(node, vhost))
    if request.query.get("download"):
        name = request.query["download"].replace('"', "")
        response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


async def post_definitions(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    vhost = vhost_for(request).name if "vhost" in request.match_info else None
    raw = await read_body(request)
    try:
        data = await asyncio.to_thread(definitions.parse, raw)
    except definitions.DefinitionsError as exc:
        raise bad_request(f"failed to decode JSON: {exc}") from None
    del raw  # the parsed document is what is applied: the text goes now, not after the import
    try:
        await definitions.import_definitions_async(node, data, vhost)
    except definitions.DefinitionsError as exc:
        raise bad_request(str(exc)) from None
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/definitions", get_definitions)
    router.add_post("/api/definitions", post_definitions)
    router.add_get("/api/definitions/{vhost}", get_definitions)
    router.add_post("/api/definitions/{vhost}", post_definitions)
