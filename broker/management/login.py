"""Who is asking: HTTP Basic credentials (rabbitmqadmin, scripts, as RabbitMQ) or a web UI session cookie
(``POST /api/login`` with the credentials once; ``GET /api/login`` tells the page who it is and its CSRF
token after a reload; ``DELETE /api/login`` logs out). Both paths apply the same checks: the password,
``loopback_users`` and one of the management tags. A request authenticated by cookie that changes
something must carry the session's CSRF token in ``X-CSRF-Token`` and, if it names an Origin, our own."""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from broker.management import login_delay
from broker.management.common import API_TAGS, bad_request, not_authorised, respond, unauthenticated
from broker.management.request_bodies import read_json
from broker.management.sessions import COOKIE, CSRF_HEADER, Session, SessionTable
from broker.security.auth import User, is_loopback

if TYPE_CHECKING:
    from broker.node import Node

log = structlog.get_logger("leveret.management")

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
UI_HEADER = "X-Leveret-UI"  # sent by the web UI on every request (broker/management/ui/static/api.js)


def basic_credentials(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep else None


def admit(request: web.Request, user: User | None, challenge: bool = True) -> User:
    """The checks every way in shares: a known user, loopback-only users from loopback, a management tag.
    ``challenge=False`` leaves out ``WWW-Authenticate`` on a refusal: a browser answered 401 with it
    asks for Basic credentials itself (or, headless, waits for them) instead of showing our form."""
    node: Node = request.app["node"]
    if user is None:
        raise unauthenticated() if challenge else not_authorised("Login failed")
    if user.name in node.settings.loopback_users and not is_loopback(request.remote):
        # loopback_users holds over HTTP as over AMQP (RabbitMQ's answer and text): guest can't
        # administer a broker bound to 0.0.0.0 from another host.
        log.warning("HTTP API login refused: loopback-only user from elsewhere", user=user.name,
                    peer=request.remote)
        raise not_authorised("User can only log in via localhost")
    if not user.has_tag(*API_TAGS):
        raise not_authorised("Not management user")
    return user


def _forbidden(reason: str) -> web.HTTPException:
    return web.HTTPForbidden(text=json.dumps({"error": "forbidden", "reason": reason}),
                             content_type="application/json")


def session_user(request: web.Request) -> tuple[User, Session] | None:
    """The user of the request's session cookie, with the CSRF and Origin checks on changes; None when
    the request has no live session."""
    node: Node = request.app["node"]
    table: SessionTable = request.app["sessions"]
    session = table.get(request.cookies.get(COOKIE))
    if session is None:
        return None
    user = node.users.users.get(session.user)
    if user is None or user.password_hash != session.password_hash:
        return None
    if request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not secrets.compare_digest(sent.encode(), session.csrf.encode()):
            raise _forbidden("missing or wrong CSRF token")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            raise _forbidden("cross-origin request refused")
    return user, session


def _set_cookie(response: web.Response, request: web.Request, token: str, max_age: int | None) -> None:
    """``max_age=None``: a cookie of the browser's session. The idle timeout is the server's to judge
    (SessionTable slides it on every use); a Max-Age fixed at login would end a busy session that long after
    login instead of after that long idle."""
    response.set_cookie(COOKIE, token, max_age=max_age, path="/", httponly=True, samesite="Strict",
                        secure=request.secure)


async def post_login(request: web.Request) -> web.Response:
    """Credentials as JSON (a body of at most a few KiB: nobody is known yet), checked after the address's
    login delay; answered with the session cookie and the CSRF token."""
    door = login_delay.UI if request.headers.get(UI_HEADER) else login_delay.LOGIN_FORM
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    name, password = body.get("username"), body.get("password")
    if not isinstance(name, str) or not isinstance(password, str):
        raise bad_request("username and password are required")
    user = admit(request, await login_delay.check_login(request, name, password, door), challenge=False)
    table: SessionTable = request.app["sessions"]
    token, session = table.create(user.name, user.password_hash)
    response = respond({"name": user.name, "tags": list(user.tags), "csrf_token": session.csrf})
    _set_cookie(response, request, token, None)
    log.info("HTTP UI login", user=user.name, peer=request.remote)
    return response


async def get_login(request: web.Request) -> web.Response:
    """The session's user and CSRF token (the page lost them on reload; the cookie is still good)."""
    found = session_user(request)
    if found is None:
        raise not_authorised("no session")
    user, session = found
    return respond({"name": user.name, "tags": list(user.tags), "csrf_token": session.csrf})


async def delete_login(request: web.Request) -> web.Response:
    found = session_user(request)  # a logout is a change: it needs the CSRF token too
    table: SessionTable = request.app["sessions"]
    if found is not None:
        table.delete(request.cookies.get(COOKIE))
    response = web.Response(status=204)
    _set_cookie(response, request, "", 0)
    return response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/api/login", post_login)
    router.add_get("/api/login", get_login)
    router.add_delete("/api/login", delete_login)
