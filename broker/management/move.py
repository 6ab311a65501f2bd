"""``POST /api/queues/{vhost}/{name}/move`` (Leveret; RabbitMQ's UI does this with a shovel): move up to
``count`` ready messages, in order, to another queue of the vhost, at least once. Each message is taken
with ack required, published to the destination through the default exchange as the user (its write
permission, the destination's limits), and acked on the source only once the destination has it (after its
fsync for a persistent message in a durable queue). If the destination refuses one, it and the rest go back
to the source, unmoved, and the answer says how many moved. Properties, headers and body move unchanged."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.errors import AMQPError
from broker.management.common import (
    bad_request,
    body_of,
    node_of,
    not_found,
    respond,
    user_of,
    vhost_for_write,
)
from broker.management.exchanges import CONFIRM_TIMEOUT, HttpConfirm
from broker.message import Message
from broker.publish import PENDING, REFUSED, ROUTED
from broker.security import permissions
from protocol.fastcodec import shortstr

if TYPE_CHECKING:
    from broker.security.auth import User
    from broker.vhost import VHost

MAX_MOVE = 100_000
BATCH = 100  # messages taken from the source at a time: a bounded number out of the queue at once


async def move_messages(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    src = vh.queues.get(request.match_info["name"])
    if src is None:
        raise not_found()
    body = await body_of(request)
    destination = body.get("destination")
    if not isinstance(destination, str) or not destination:
        raise bad_request("destination must be the name of a queue in the same virtual host")
    count = body.get("count", MAX_MOVE)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_MOVE:
        raise bad_request(f"count must be an integer within 1..{MAX_MOVE}")
    dest = vh.queues.get(destination)
    if dest is None:
        raise not_found(f"no queue '{destination}' in vhost '{vh.name}'")
    if dest is src:
        raise bad_request("destination is the source queue")
    if not src.capabilities.basic_get:
        raise bad_request("a stream's messages are read from an offset, not moved")
    user = user_of(request)
    permissions.basic_get(user, vh.name, src.name)
    permissions.basic_publish(user, vh.name, "")  # refused here (401), before any message is taken
    names_raw = shortstr("") + shortstr(destination)
    moved = 0
    refused: str | None = None
    while moved < count and refused is None:
        taken: list[tuple[int, Any]] = []
        for _ in range(min(BATCH, count - moved)):
            got = src.basic_get(False)
            if got is None:
                break
            taken.append((got[0], got[1]))
        if not taken:
            break
        done, refused = await _publish_batch(vh, user, names_raw, destination, taken)
        if done:
            src.ack([seq for seq, _ in taken[:done]])
            node_of(request).counters.messages_acknowledged += done
        if done < len(taken):
            src.requeue([seq for seq, _ in taken[done:]])
        moved += done
    return respond({"moved": moved, "refused": refused})


async def _publish_batch(vh: VHost, user: User, names_raw: bytes, destination: str,
                         taken: list[tuple[int, Any]]) -> tuple[int, str | None]:
    """Publish the batch in order; how many the destination has, and why the next one was refused (None
    if none was)."""
    waits: list[Any] = []
    confirms: list[HttpConfirm] = []
    for i, (_seq, msg) in enumerate(taken):
        confirm = HttpConfirm()
        confirms.append(confirm)
        try:
            result = vh.publish_as(user, Message("", destination, names_raw, msg.header, msg.body),
                                   mandatory=True, publisher=confirm, confirm_seq=1)
        except AMQPError as exc:  # a refusal of this message (its properties): it and the rest stay put
            ok = await _settled(waits)
            _detach(confirms)
            return min(ok, i), exc.text
        if result & REFUSED or not result & ROUTED:
            ok = await _settled(waits)
            _detach(confirms)
            return min(ok, i), "the destination refused the message (a limit, or it is gone)"
        waits.append(confirm.wait(result >> PENDING) if result >> PENDING else _stored())
    ok = await _settled(waits)
    _detach(confirms)
    return ok, None if ok == len(taken) else "the destination failed to store a message"


async def _stored() -> bool:
    return True


async def _settled(waits: list[Any]) -> int:
    """How many of the publishes, in order, the destination has stored (the first failure ends the run)."""
    try:
        results = await asyncio.wait_for(asyncio.gather(*waits), CONFIRM_TIMEOUT)
    except TimeoutError:
        return 0
    for i, ok in enumerate(results):
        if not ok:
            return i
    return len(results)


def _detach(confirms: list[HttpConfirm]) -> None:
    for c in confirms:
        c.detach()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/api/queues/{vhost}/{name}/move", move_messages)
