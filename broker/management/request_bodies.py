"""Request bodies, bounded before they are read (docs/decisions/http-api-limits.md: four parallel 100 MiB bodies sent to
``POST /api/login`` without credentials took ~850 MB that never came back, and raised the memory alarm).

Who may send how much is decided before a byte of the body is read: a request nobody has authenticated yet
(``/api/login``, ``/api/auth``) may send ``PUBLIC_BODY_LIMIT`` bytes; an authenticated one
``management.http.max_body_size`` (RabbitMQ's key and default, 20 MB; the definitions import included). The
auth middleware sets the request's limit (:func:`allow_body`) and a declared ``Content-Length`` above it is
answered 413 at once. :func:`read_body` reads ``request.content`` into one buffer and stops at the limit, so a
chunked body that lies about nothing but never ends is cut off there too; nothing else in the HTTP API reads a
body. :func:`close_unread_bodies` closes the connection after an answer given to a request nobody has
authenticated while it was still sending (a refusal, a 401, a 413): aiohttp would otherwise read and discard
the rest of its body for up to 10 s to keep the connection alive. An authenticated client still sending gets
that read-and-discard (nothing is kept), so a client that sends its whole body before reading sees its 413.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from broker import definitions

log = structlog.get_logger("leveret.management")

PUBLIC_BODY_LIMIT = 8 * 1024  # a login is ~60 bytes; a few KiB leaves room for long names and passwords
_LIMIT_KEY = "leveret.body_limit"
_THREAD_PARSE_ABOVE = 256 * 1024  # json.loads takes ~20 ms per MB: bigger bodies are parsed off the loop


def too_large(limit: int) -> web.HTTPException:
    return web.HTTPRequestEntityTooLarge(
        max_size=limit, actual_size=0,
        text=json.dumps({"error": "payload_too_large", "reason": f"request body larger than {limit} bytes"}),
        content_type="application/json")


def allow_body(request: web.Request, limit: int) -> None:
    """The most this request may send; 413 now if its ``Content-Length`` already says more."""
    request[_LIMIT_KEY] = limit
    declared = request.content_length
    if declared is not None and declared > limit:
        log.warning("HTTP request body refused: too large", peer=request.remote, path=request.path,
                    declared=declared, limit=limit)
        raise too_large(limit)


async def read_body(request: web.Request) -> bytearray:
    """The whole body, at most the request's limit (the public one when no middleware set one): 413 as soon as
    more arrives. One buffer, never the chunks and a joined copy besides."""
    limit: int = request.get(_LIMIT_KEY, PUBLIC_BODY_LIMIT)
    allow_body(request, limit)
    body = bytearray()
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return body
        if len(body) + len(chunk) > limit:
            log.warning("HTTP request body refused: too large", peer=request.remote, path=request.path,
                        limit=limit)
            raise too_large(limit)
        body += chunk


def parse_json(raw: bytes | bytearray) -> Any:
    """JSON text as Python values; 400 with a one-line reason for invalid JSON or nesting deeper than the
    definitions' limit (100 levels: a 100,000-deep body made the decoder raise RecursionError, a 500)."""
    try:
        return definitions.parse(raw)
    except definitions.DefinitionsError as exc:
        raise web.HTTPBadRequest(text=json.dumps({"error": "bad_request", "reason": f"failed to decode JSON: {exc}"}),
                                 content_type="application/json") from None


async def read_json(request: web.Request) -> Any:
    """The body as JSON (None when there is none); a big one is parsed in a thread, its text dropped at once."""
    raw = await read_body(request)
    if not raw.strip():
        return None
    if len(raw) > _THREAD_PARSE_ABOVE:
        return await asyncio.to_thread(parse_json, raw)
    return parse_json(raw)


@web.middleware
async def close_unread_bodies(request: web.Request,
                              handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                              ) -> web.StreamResponse:
    """The outermost middleware: an answer to an unauthenticated request whose body has not all arrived ends
    the connection once it is written, instead of aiohttp's lingering read of whatever the client still sends."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if _authenticated_or_complete(request):
            raise
        await _answer_and_close(request, exc)
        raise
    if not _authenticated_or_complete(request) and not response.prepared:
        await _answer_and_close(request, response)
    return response


def _authenticated_or_complete(request: web.Request) -> bool:
    return request.content.is_eof() or request.get("user") is not None


async def _answer_and_close(request: web.Request, response: web.StreamResponse) -> None:
    response.force_close()  # Connection: close
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # the transport closes once the answer is written; the rest is never read
