"""The web UI's files (broker/management/ui/static/: an HTML page, plain ES modules, one stylesheet; no
build step, no third-party code), served by the same aiohttp app as ``/api``, and the security headers
every answer carries.

The files are read once at start into a table keyed by their URL, so a request can only name a file that
is in the table (no path joins, no traversal). Each has a sha256 ETag and ``Cache-Control: no-cache``:
the browser revalidates, and an upgraded broker's new files are picked up at once."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).resolve().parent / "ui" / "static"
PREFIX = "/ui/"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
         ".png": "image/png", ".ico": "image/x-icon"}
# No inline script or style, nothing from elsewhere, no framing (RabbitMQ's advisories: XSS in object
# names, clickjacking); connect-src 'self' keeps fetch() on our own API.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets(root: Path = STATIC_DIR) -> dict[str, Asset]:
    """Every file under ``root`` by its URL path (``/ui/<relative path>``)."""
    assets: dict[str, Asset] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in TYPES:
            continue
        body = path.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[PREFIX + path.relative_to(root).as_posix()] = Asset(body, TYPES[path.suffix], etag)
    return assets


def _answer(request: web.Request, asset: Asset) -> web.Response:
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache"}
    if request.headers.get("If-None-Match") == asset.etag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=asset.body, content_type=asset.content_type, headers=headers)


async def index(request: web.Request) -> web.Response:
    asset = request.app["ui_assets"].get(PREFIX + "index.html")
    if asset is None:
        raise web.HTTPNotFound(text="the web UI's files are missing from this installation\n")
    return _answer(request, asset)


async def asset(request: web.Request) -> web.Response:
    found = request.app["ui_assets"].get(request.path)
    if found is None:
        raise web.HTTPNotFound(text="no such file\n")
    return _answer(request, found)


@web.middleware
async def security_headers(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Set on every answer, errors included, API answers included (a JSON body opened as a page must not
    be sniffed into HTML either)."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/", index)
    router.add_get(PREFIX + "{path:.+}", asset)
