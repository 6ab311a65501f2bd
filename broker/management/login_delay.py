"""One login delay for every door (docs/decisions/http-api-limits.md: 1,129 wrong passwords a second got through ``/api/login`` from one
address, and none was logged, while AMQP held the same address to ~7 a second).

HTTP Basic credentials, ``POST /api/login`` (the web UI's and any script's) and AMQP share the node's one
failure table (broker/security/login_throttle.py, through the server's LoginGuard): failures from an address
are counted together, so a guesser cannot switch doors, and each further login from that address waits
``leveret.login_throttle.*`` before its password is checked, as an AMQP login does. The wait is an
``asyncio.sleep`` of this request alone: the event loop, and logins from other addresses, go on. Each failure
is logged with the address, the user name and the door, never the password. Loopback addresses are exempt
unless ``leveret.login_throttle.exempt_loopback = false``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from broker.security.auth import User

if TYPE_CHECKING:
    from broker.amqp.guarded_reader import LoginGuard
    from broker.node import Node

log = structlog.get_logger("leveret.management")

GUARD_KEY = "login_guard"
BASIC = "http basic"
LOGIN_FORM = "http login"  # POST /api/login from a script
UI = "web ui"  # POST /api/login from the web UI (it sends X-Leveret-UI)


async def check_login(request: web.Request, name: str, password: str, door: str) -> User | None:
    """The user whose password this is, after the address's delay; None (and the failure counted and
    logged) if it is not."""
    guard: LoginGuard = request.app[GUARD_KEY]
    source = request.remote or ""
    wait = guard.throttle.wait_before_login(source, guard.clock.monotonic())
    if wait > 0:
        await asyncio.sleep(wait)
    node: Node = request.app["node"]
    user = node.users.check_credentials(name, password)
    if user is None:
        guard.login_failed(source)
        log.warning("HTTP login failed", peer=source, user=name[:200], door=door, delayed_s=round(wait, 3))
    return user
