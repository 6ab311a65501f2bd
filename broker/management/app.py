"""The aiohttp application of the HTTP API: basic authentication against the broker's users (a user needs
one of the tags administrator, monitoring, policymaker or management), RabbitMQ's JSON error bodies, and
the routes of each resource module."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from broker.auth import is_loopback
from broker.errors import AMQPError
from broker.management import (
    bindings,
    connections,
    definitions_api,
    delayed,
    exchanges,
    health,
    limits,
    overview,
    policies,
    queues,
    streams,
    users,
    vhosts,
)
from broker.management.common import API_TAGS, amqp_error, not_authorised, unauthenticated
from broker.management.objects import RateSampler

if TYPE_CHECKING:
    from broker.node import Node

log = structlog.get_logger("leveret.management")

MODULES = (overview, health, connections, exchanges, delayed, queues, streams, bindings, vhosts, users, policies,
           limits, definitions_api)
# Paths answered without credentials (RabbitMQ's UI asks /api/auth before logging in).
PUBLIC = ("/api/auth",)


def _credentials(request: web.Request) -> tuple[str, str] | None:
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


@web.middleware
async def auth_middleware(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    if request.path in PUBLIC or not request.path.startswith("/api/"):
        return await handler(request)
    node: Node = request.app["node"]
    creds = _credentials(request)
    if creds is None:
        raise unauthenticated()
    user = node.users.check_credentials(*creds)
    if user is None:
        raise unauthenticated()
    if user.name in node.settings.loopback_users and not is_loopback(request.remote):
        # loopback_users holds over HTTP as over AMQP (RabbitMQ's answer and text): guest can't
        # administer a broker bound to 0.0.0.0 from another host.
        log.warning("HTTP API login refused: loopback-only user from elsewhere", user=user.name,
                    peer=request.remote)
        raise not_authorised("User can only log in via localhost")
    if not user.has_tag(*API_TAGS):
        raise not_authorised("Not management user")
    request["user"] = user
    try:
        return await handler(request)
    except AMQPError as exc:
        raise amqp_error(exc) from None


@web.middleware
async def error_middleware(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status == 404 and exc.content_type != "application/json":
            raise web.HTTPNotFound(text='{"error":"Object Not Found","reason":"Not Found"}',
                                   content_type="application/json") from None
        if isinstance(exc, web.HTTPMethodNotAllowed) and exc.content_type != "application/json":
            raise web.HTTPMethodNotAllowed(request.method, exc.allowed_methods,
                                           text='{"error":"Method Not Allowed","reason":"Method Not Allowed"}',
                                           content_type="application/json") from None
        raise
    except Exception:
        log.exception("HTTP API handler failed", path=request.path, method=request.method)
        raise web.HTTPInternalServerError(text='{"error":"Internal Server Error","reason":"internal error"}',
                                          content_type="application/json") from None


async def _sample_rates(app: web.Application) -> Any:
    node, sampler = app["node"], app["sampler"]

    async def loop() -> None:
        while True:
            try:
                sampler.sample(node)
            except Exception:
                log.exception("rate sampling failed")
            await asyncio.sleep(sampler.interval)

    task = asyncio.get_running_loop().create_task(loop())
    yield
    task.cancel()


async def _landing(request: web.Request) -> web.Response:
    return web.Response(text="Leveret HTTP API: see /api/overview (RabbitMQ management API paths).\n")


def make_app(node: Node) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware], client_max_size=128 * 1024 * 1024)
    app["node"] = node
    app["sampler"] = RateSampler(node.settings.collect_statistics_interval / 1000)
    app.cleanup_ctx.append(_sample_rates)
    app.router.add_get("/", _landing)
    for module in MODULES:
        module.add_routes(app.router)
    return app
