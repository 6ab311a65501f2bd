"""No state change from another site (docs/decisions/http-api-limits.md: a page on another origin, with the operator's HTTP Basic
credentials cached by the browser, auto-submitted a form that created an administrator).

A request that changes state (POST, PUT, DELETE, PATCH) is refused 403 when the browser says it comes from
another site, whatever its credentials (cookie or Basic): an ``Origin`` that is not ours (``null`` included),
or ``Sec-Fetch-Site: cross-site`` / ``same-site`` (another port or subdomain is another origin). Tools that are
not browsers (rabbitmqadmin, ``leveret ctl``, curl, Python clients) send neither header and are not affected.

Such a request with a body, or naming a content type, must send ``Content-Type: application/json`` (else 415):
an HTML form can only send form encodings and ``text/plain``, and ``fetch`` from another origin cannot send
JSON without a CORS preflight, which this server never grants. RabbitMQ accepts any content type; this is
stricter on purpose. Bodiless changes (``DELETE``, the UI's logout, rabbitmqadmin's deletes) need no header.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

log = structlog.get_logger("leveret.management")

CHANGES = frozenset({"POST", "PUT", "DELETE", "PATCH"})
_OTHER_SITE = frozenset({"cross-site", "same-site"})


def own_origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}".lower()


def other_site(request: web.Request) -> str | None:
    """Why the browser's own headers say this request comes from another site, or None."""
    fetch_site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
    if fetch_site in _OTHER_SITE:
        return f"Sec-Fetch-Site: {fetch_site}"
    origin = request.headers.get("Origin")
    if origin is not None and origin.strip().lower() != own_origin(request):
        return f"Origin {origin[:200]!r}"
    return None


def _refusal(cls: type[web.HTTPException], error: str, reason: str) -> web.HTTPException:
    return cls(text=json.dumps({"error": error, "reason": reason}), content_type="application/json")


@web.middleware
async def same_site_changes(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                            ) -> web.StreamResponse:
    """Before credentials are looked at: a cross-site refusal gives a guesser nothing to learn."""
    if request.method in CHANGES and request.path.startswith("/api/"):
        why = other_site(request)
        if why is not None:
            log.warning("HTTP API change from another site refused", peer=request.remote, method=request.method,
                        path=request.path, why=why)
            raise _refusal(web.HTTPForbidden, "forbidden", "cross-site request refused")
        if (request.body_exists or "Content-Type" in request.headers) and request.content_type != "application/json":
            raise _refusal(web.HTTPUnsupportedMediaType, "unsupported_media_type",
                           "a request that changes state must send Content-Type: application/json")
    return await handler(request)
