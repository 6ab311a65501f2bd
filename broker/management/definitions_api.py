"""``/api/definitions`` (administrator only): GET exports, POST imports (a JSON body, or the RabbitMQ UI's
multipart upload with a ``file`` field); ``/api/definitions/{vhost}`` for one vhost.

A POST may carry megabytes: the JSON is parsed in a worker thread and applied in slices that yield to the
event loop (broker/definitions.py), so AMQP clients keep being served meanwhile. A body that is not JSON,
or nests deeper than the decoder can follow, is a 400 like any other bad document."""

from __future__ import annotations

import asyncio

from aiohttp import web

from broker import definitions
from broker.management.common import bad_request, node_of, require_admin, respond, vhost_for


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
    if request.content_type.startswith("multipart/"):
        form = await request.post()
        upload = form.get("file")
        raw = upload.file.read() if isinstance(upload, web.FileField) else str(upload or "").encode()
    else:
        raw = await request.read()
    try:
        data = await asyncio.to_thread(definitions.parse, raw)
    except definitions.DefinitionsError as exc:
        raise bad_request(f"failed to decode JSON: {exc}") from None
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
