"""``/api/queues``: list, get, declare (PUT), delete, the queue's bindings, purge (``DELETE .../contents``)
and ``POST .../get`` with RabbitMQ's ack modes, and Leveret's ``POST .../peek`` (read without taking).
``GET /api/queues?page=...`` is filtered, sorted and paged before the page's objects are built
(broker/management/listing.py). Everything goes through the vhost's queue registry and the
queue process, as the AMQP methods do. A stream queue's object (``"type": "stream"``) adds its offsets,
segments and consumer groups (broker/queues/stream_queue.py's ``info_items``); its groups alone are at
``/api/stream-groups`` (broker/management/streams.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from operator import methodcaller
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from broker.clustering import remote_queue
from broker.exchanges.exchange import QUEUE
from broker.json_values import json_safe
from broker.management.common import (
    as_bool,
    bad_request,
    body_of,
    node_of,
    not_found,
    respond,
    respond_list,
    user_of,
    vhost_for,
    vhost_for_write,
    visible_vhosts,
)
from broker.management.listing import paged
from broker.management.presenters.bindings import binding_info, default_binding_info
from broker.management.presenters.cluster import OtherMemberQueue, cluster_view, other_member_queue_info
from broker.management.presenters.queue_figures import figures_of
from broker.management.presenters.queues import queue_consumer_details, queue_info
from broker.security import permissions
from broker.topology import answered_call
from protocol.frames import FrameError
from protocol.properties import decode_properties

log = structlog.get_logger("leveret.management")

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.queues.queue_types import Queue
    from broker.topology import OtherMembersQueue
    from broker.vhost import VHost
    from storage.backing_queue import Figures

ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


def properties_json(header: bytes) -> dict[str, Any]:
    """The properties as RabbitMQ's API shows them. Publish reads only what it acts on, so a message can
    hold a malformed headers table (shown without it) or a cut property list (shown without properties)."""
    try:
        props = decode_properties(header)
    except FrameError:
        try:
            props = decode_properties(header, skip_headers=True)
        except FrameError:
            log.warning("message properties cannot be decoded; shown without them")
            return {}
        log.warning("message headers table cannot be decoded; shown without it")
    shown = (("content_type", props.content_type), ("content_encoding", props.content_encoding),
             ("headers", props.headers), ("delivery_mode", props.delivery_mode), ("priority", props.priority),
             ("correlation_id", props.correlation_id), ("reply_to", props.reply_to),
             ("expiration", props.expiration), ("message_id", props.message_id),
             ("timestamp", props.timestamp), ("type", props.message_type), ("user_id", props.user_id),
             ("app_id", props.app_id), ("cluster_id", None if props.cluster_id == "" else props.cluster_id))
    return {name: json_safe(value) for name, value in shown if value is not None}


def sort_keys(shared: Snapshot | None, empty: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    """Sort keys read straight from the queue object, so a page of 10,000 queues sorts without building
    10,000 JSON objects (broker/management/listing.py); other sort fields fall back to the full build.
    ``shared``: a cluster member's count of the shared queues (presenters/queue_figures.py figures_of).
    ``empty``: says of a listed object that it holds no message without reading its figures (a queue not in
    its vhost's ``occupied`` set): its message figures are 0. At 100,000 queues reading every queue's figures
    is most of a page's time (2.6 µs a queue on a 2-core machine)."""
    figures: Callable[[Queue | OtherMemberQueue], Figures]
    if shared is None:  # a single node: every object's own figures (100,000 of them for one sorted page)
        figures = methodcaller("figures")
    else:
        def figures(q: Queue | OtherMemberQueue) -> Figures:
            return q.figures() if isinstance(q, OtherMemberQueue) else figures_of(q, shared)

    def messages(q: Queue | OtherMemberQueue) -> int:
        f = figures(q)
        return f[0] + f[1]

    def message_bytes(q: Queue | OtherMemberQueue) -> int:
        f = figures(q)
        return f[2] + f[3]

    def figure(read: Callable[[Any], int]) -> Callable[[Any], int]:
        if empty is None:
            return read
        return lambda q: 0 if empty(q) else read(q)

    return {
        "name": lambda q: (q.name, q.vhost.name),
        "vhost": lambda q: (q.vhost.name, q.name),
        "messages": figure(messages),
        "messages_ready": figure(lambda q: figures(q).ready),
        "messages_unacknowledged": figure(lambda q: figures(q).unacked),
        "message_bytes": figure(message_bytes),
        "consumers": lambda q: q.consumers.count,
        "durable": lambda q: q.durable,
    }


SORT_KEYS = sort_keys(None)


async def list_queues(request: web.Request) -> web.Response:
    """Every queue of the vhost(s). On a cluster member: its own queues, the shared (quorum) queues with
    figures as PostgreSQL counts them (the same on every member), and the other members' node-local queues
    with what their members answer (``node``: the member that holds it)."""
    node = node_of(request)
    sampler = request.app["sampler"]
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    objects: list[Any] = [q for vh in vhs for q in vh.queues]
    view = await cluster_view(node, vhs[0].name if "vhost" in request.match_info else None)
    shared = view.shared if view is not None else None
    if view is not None:
        names = {vh.name for vh in vhs}
        objects += [other for other in view.others if other.vhost.name in names]

    def to_json(q: Any) -> dict[str, Any]:
        if isinstance(q, OtherMemberQueue):
            return other_member_queue_info(q)
        return queue_info(node, q, sampler, shared)

    occupied: set[Any] = set().union(*(vh.queues.occupied for vh in vhs))
    others = {id(q) for q in view.others} if view is not None else set()  # figures as their member answered
    page = paged(request, objects, lambda q: q.name,
                 sort_keys(shared, lambda q: q not in occupied and id(q) not in others), to_json)
    if page is not None:
        return page
    objects.sort(key=lambda q: (q.vhost.name, q.name))
    return respond_list(request, (to_json(q) for q in objects))


def _queue(request: web.Request, vh: VHost) -> Any:
    q = vh.queues.get(request.match_info["name"])
    if q is None:
        raise not_found()
    return q


async def get_queue(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    node, name = node_of(request), request.match_info["name"]
    q = vh.queues.get(name)
    if q is None and node.cluster is not None:  # another member's node-local queue: as its member answers
        found = await node.cluster.other_members_queue(vh.name, name)
        if found is not None:
            member, answer = found
            return respond(other_member_queue_info(OtherMemberQueue(vh.name, name, member, answer)))
    if q is None:
        raise not_found()
    shared = await node.cluster.shared_figures() if node.cluster is not None else None
    info = queue_info(node, q, request.app["sampler"], shared)
    info["consumer_details"] = queue_consumer_details(node, q)  # one queue's page only, as in RabbitMQ
    return respond(info)


async def put_queue(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    name = request.match_info["name"]
    body = await body_of(request)
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be an object")
    permissions.queue_declare(user_of(request), vh.name, name, arguments, passive=False)
    durable, auto_delete = as_bool(body.get("durable"), True), as_bool(body.get("auto_delete"))
    # In a cluster, what the declare asks of PostgreSQL (the claim of the name, the definitions feed for a quorum
    # queue) is awaited, the event loop serving everyone meanwhile, and the declare made once it is in (as a
    # channel's queue.declare is). Another member's queue of that name: the equivalence check waits for its
    # answer the same way, then runs here.
    owner_checks: list[Callable[[], None]] = []

    def declare() -> tuple[Queue | OtherMembersQueue, bool]:
        owner_checks.clear()
        return vh.queues.declare(name, False, durable, False, auto_delete, arguments, None, owner_checks=owner_checks)

    q, created = await answered_call(declare)
    if owner_checks:
        await remote_queue.answered(q)
        for check in owner_checks:
            check()
    return web.Response(status=201 if created else 204)


async def delete_queue(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    q = _queue(request, vh)
    permissions.queue_delete(user_of(request), vh.name, q.name)
    where = f"queue '{q.name}' in vhost '{vh.name}'"
    if request.query.get("if-unused") == "true" and q.consumers.count:
        raise bad_request(f"{where} in use")
    if request.query.get("if-empty") == "true" and q.message_count():
        raise bad_request(f"{where} not empty")
    vh.queues.delete(q)
    return web.Response(status=204)


async def purge_queue(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    q = _queue(request, vh)
    permissions.queue_purge(user_of(request), vh.name, q.name)
    q.purge()
    return web.Response(status=204)


async def queue_bindings(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    q = _queue(request, vh)
    rows = [default_binding_info(vh, q.name)]
    rows += [binding_info(vh, b) for b in vh.bindings() if b.kind == QUEUE and b.destination == q.name]
    return respond_list(request, rows)


async def get_messages(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    q = _queue(request, vh)
    body = await body_of(request)
    ackmode = body.get("ackmode", "ack_requeue_true")
    if ackmode not in ACKMODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACKMODES)}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    try:
        count = int(body.get("count", 1))
        truncate = int(body["truncate"]) if body.get("truncate") not in (None, "") else None
    except (TypeError, ValueError):
        raise bad_request("count and truncate must be integers") from None
    permissions.basic_get(user_of(request), vh.name, q.name)
    counters = node_of(request).counters
    out: list[dict[str, Any]] = []
    taken: list[int] = []
    try:
        _take_messages(q, count, truncate, encoding, counters, out, taken)
    except BaseException:
        # Whatever went wrong, the messages taken so far go back to the queue, unseen by the client.
        if taken:
            q.requeue(taken)
        raise
    # Settle after taking them all, so that requeued messages are not fetched twice.
    if taken:
        if ackmode.endswith("requeue_true"):
            q.requeue(taken)
        elif ackmode == "ack_requeue_false":
            q.ack(taken)
            counters.messages_acknowledged += len(taken)
        else:
            q.reject_discard(taken)
    return respond(out)


MAX_PEEK = 100
MAX_PEEK_BYTES = 1024 * 1024  # the whole answer's payloads: a peek at big messages stays small


async def peek_messages(request: web.Request) -> web.Response:
    """Leveret's peek (the path LavinMQ proposes, cloudamqp/lavinmq#2142): the first ``count`` ready
    messages of a classic queue, in delivery order, without taking them, so nothing is redelivered or
    reordered (RabbitMQ's "get" requeues, which sets redelivered). Needs read permission, as a get does.
    A stream has no ready messages to peek: its readers choose offsets (405)."""
    vh = vhost_for_write(request)
    q = _queue(request, vh)
    body = await body_of(request)
    try:
        count = int(body.get("count", 10))
        truncate = int(body["truncate"]) if body.get("truncate") not in (None, "") else None
    except (TypeError, ValueError):
        raise bad_request("count and truncate must be integers") from None
    if not 1 <= count <= MAX_PEEK:
        raise bad_request(f"count must be within 1..{MAX_PEEK}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    if not q.capabilities.basic_get:
        raise web.HTTPMethodNotAllowed(
            "POST", [], text='{"error":"Method Not Allowed","reason":"a stream is read from an offset, '
            'not peeked"}', content_type="application/json")
    permissions.basic_get(user_of(request), vh.name, q.name)
    out: list[dict[str, Any]] = []
    budget = MAX_PEEK_BYTES
    for position, (msg, redelivered) in enumerate(q.peek_messages(count)):
        limit = budget if truncate is None else min(truncate, budget)
        out.append(_message_json(msg, msg.body[:limit], redelivered, encoding) | {"position": position})
        budget -= min(limit, len(msg.body))
    return respond(out)


def _message_json(msg: Any, payload: bytes, redelivered: bool, encoding: str) -> dict[str, Any]:
    if encoding == "auto":
        try:
            text, payload_encoding = payload.decode(), "string"
        except UnicodeDecodeError:
            text, payload_encoding = base64.b64encode(payload).decode(), "base64"
    else:
        text, payload_encoding = base64.b64encode(payload).decode(), "base64"
    return {"payload_bytes": len(msg.body), "redelivered": redelivered, "exchange": msg.exchange,
            "routing_key": msg.routing_key, "properties": properties_json(msg.header), "payload": text,
            "payload_encoding": payload_encoding}


def _take_messages(q: Queue, count: int, truncate: int | None, encoding: str, counters: Any,
                   out: list[dict[str, Any]], taken: list[int]) -> None:
    """basic.get up to ``count`` messages (without settling them): their JSON into ``out``, their seq ids
    into ``taken``."""
    for _ in range(max(0, count)):
        got = q.basic_get(False)
        if got is None:
            if not out:
                counters.messages_get_empty += 1
            break
        seq_id, msg, redelivered, left = got
        taken.append(seq_id)
        counters.messages_delivered += 1
        counters.messages_delivered_get_manual_ack += 1
        if redelivered:
            counters.messages_redelivered += 1
        payload = msg.body if truncate is None else msg.body[:truncate]
        out.append(_message_json(msg, payload, redelivered, encoding) | {"message_count": left})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/queues", list_queues)
    router.add_get("/api/queues/detailed", list_queues)
    router.add_get("/api/queues/{vhost}", list_queues)
    router.add_get("/api/queues/{vhost}/{name}", get_queue)
    router.add_put("/api/queues/{vhost}/{name}", put_queue)
    router.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    router.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    router.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    router.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    router.add_post("/api/queues/{vhost}/{name}/peek", peek_messages)
