"""The aiohttp application of the HTTP API and the web UI: basic authentication against the broker's users,
or the UI's session cookie (broker/management/login.py; a user needs one of the tags administrator,
monitoring, policymaker or management), RabbitMQ's JSON error bodies, security headers on every answer,
the UI's files at ``/`` and ``/ui/`` (broker/management/ui_assets.py) and the routes of each resource module.

Before any handler: changes from another site are refused (broker/management/same_site.py), credentials are
checked (Basic ones after the address's login delay, broker/management/login_delay.py) before a body is read,
and each request may send only as much as who it is allows (broker/management/request_bodies.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from broker.amqp.guarded_reader import LoginGuard
from broker.clock import LoopClock
from broker.errors import AMQPError
from broker.management import (
    bindings,
    connections,
    definitions_api,
    delayed,
    exchanges,
    federation,
    health,
    limits,
    login,
    login_delay,
    move,
    overview,
    policies,
    queues,
    request_bodies,
    same_site,
    shovels,
    streams,
    traffic,
    ui_assets,
    users,
    vhosts,
)
from broker.management.common import amqp_error, not_authorised, unauthenticated
from broker.management.presenters.rates import RateSampler
from broker.management.presenters.sampling import sample
from broker.management.request_bodies import PUBLIC_BODY_LIMIT, allow_body
from broker.management.sessions import SessionTable
from storage.metadata_store import MetadataWriteError

if TYPE_CHECKING:
    from broker.node import Node

log = structlog.get_logger("leveret.management")

MODULES = (overview, health, connections, exchanges, delayed, queues, streams, bindings, vhosts, users, policies,
           limits, definitions_api, login, move, traffic, shovels, federation)
# Paths answered without credentials (RabbitMQ's UI asks /api/auth before logging in; /api/login checks
# what it is given itself).
PUBLIC = ("/api/auth", "/api/login")
UI_HEADER = login.UI_HEADER


@web.middleware
async def auth_middleware(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    if request.path in PUBLIC or not request.path.startswith("/api/"):
        # Nobody is known yet: a small body at most (a login), however the request is sent.
        allow_body(request, PUBLIC_BODY_LIMIT)
        return await handler(request)
    node: Node = request.app["node"]
    creds = login.basic_credentials(request)
    if creds is not None:
        user = login.admit(request, await login_delay.check_login(request, *creds, door=login_delay.BASIC))
    else:
        found = login.session_user(request)
        if found is None:
            if request.headers.get(UI_HEADER):
                # The UI's own requests: no WWW-Authenticate, so the browser shows our login form, not its own.
                raise not_authorised("Login required")
            raise unauthenticated()
        user = login.admit(request, found[0], challenge=False)
    request["user"] = user
    allow_body(request, node.settings.management_max_body_size)
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
    except MetadataWriteError as exc:
        # A definition the store refused (a cluster member whose PostgreSQL is out of reach): nothing was changed,
        # as AMQP's 541; the reason says so.
        raise not_written(exc) from None
    except Exception:
        log.exception("HTTP API handler failed", path=request.path, method=request.method)
        raise web.HTTPInternalServerError(text='{"error":"Internal Server Error","reason":"internal error"}',
                                          content_type="application/json") from None


@web.middleware
async def commit_middleware(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """A change answers once what it wrote is committed (storage/commits.py: a cluster member's PostgreSQL
    table commits after the handler returns; awaited here, the loop serving everyone meanwhile), as RabbitMQ's
    HTTP API answers a Khepri command on commit. A commit not made within the store's timeout: 500."""
    response = await handler(request)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        commit = request.app["node"].commits.committed()
        if commit is not None:
            try:
                await commit
            except MetadataWriteError as exc:
                raise not_written(exc) from None
    return response


def not_written(exc: MetadataWriteError) -> web.HTTPException:
    """500 naming why a definition is not written (the cluster's PostgreSQL refused, or did not answer in time)."""
    return web.HTTPInternalServerError(text=json.dumps({"error": "Internal Server Error", "reason": str(exc)}),
                                       content_type="application/json")


async def _sample_rates(app: web.Application) -> Any:
    node, sampler = app["node"], app["sampler"]

    async def loop() -> None:
        while True:
            try:
                # A cluster member samples the shared queues' figures as PostgreSQL counts them (the API's).
                shared = await node.cluster.shared_figures() if node.cluster is not None else None
                await sample(sampler, node, shared)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("rate sampling failed")
            await asyncio.sleep(sampler.interval)

    task = asyncio.get_running_loop().create_task(loop())
    yield
    task.cancel()


def make_app(node: Node, login_guard: LoginGuard | None = None) -> web.Application:
    """``login_guard``: the node's failed-login table, shared with its AMQP listeners (the server's); one of
    the app's own when none is given."""
    # close_unread_bodies is outermost: it sees every answer, errors and security headers included.
    app = web.Application(middlewares=[request_bodies.close_unread_bodies, ui_assets.security_headers,
                                       error_middleware, same_site.same_site_changes, auth_middleware,
                                       commit_middleware],
                          # aiohttp's own cap, for any read that bypassed request_bodies (none should)
                          client_max_size=node.settings.management_max_body_size)
    app["node"] = node
    app[login_delay.GUARD_KEY] = login_guard or LoginGuard(node.settings, LoopClock())
    app["sessions"] = SessionTable(node.settings.login_session_timeout * 60)
    app["ui_assets"] = ui_assets.load_assets()
    app["sampler"] = RateSampler(node.settings.collect_statistics_interval / 1000)
    node.queue_rates = app["sampler"].queue_rates
    app.cleanup_ctx.append(_sample_rates)
    ui_assets.add_routes(app.router)
    for module in MODULES:
        module.add_routes(app.router)
    return app
