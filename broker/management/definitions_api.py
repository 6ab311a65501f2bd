"""``/api/definitions`` (administrator only): GET exports, POST imports (a JSON body, or the RabbitMQ UI's
multipart upload with a ``file`` field); ``/api/definitions/{vhost}`` for one vhost."""

from __future__ import annotations

import json

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
        raw = upload.file.read() if hasattr(upload, "file") else str(upload or "").encode()
    else:
        raw = await request.read()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"failed to decode JSON: {exc}") from None
    try:
        definitions.import_definitions(node, data, vhost)
    except definitions.DefinitionsError as exc:
        raise bad_request(str(exc)) from None
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/definitions", get_definitions)
    router.add_post("/api/definitions", post_definitions)
    router.add_get("/api/definitions/{vhost}", get_definitions)
    router.add_post("/api/definitions/{vhost}", post_definitions)
