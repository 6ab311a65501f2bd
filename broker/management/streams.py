"""``/api/stream-groups``: the consumer groups of stream queues (Leveret only; RabbitMQ's management API has
no such resource, its nearest being ``rabbitmq-streams list_stream_consumer_groups``). Read-only.

    GET /api/stream-groups                    every group of every stream the user may see
    GET /api/stream-groups/{vhost}            those of one vhost
    GET /api/stream-groups/{vhost}/{stream}   those of one stream (404 if it is no stream queue)
    GET /api/stream-groups/{vhost}/{stream}/{group}   one group (404 if it has none of that name)
    PUT /api/stream-groups/{vhost}/{stream}/{group}   {"committed_offset": N}: record an outside reader's
        progress (the Spark source's commit) as the group's committed offset: creates the group at N, or moves
        it forward to N (never back); 204. 409 while the group has consumers (their acks own its progress);
        the user needs read permission on the stream, as a consumer does.

Each row (broker/queues/stream_queue.py's ``StreamQueue.group_info``)::

    {"vhost": "/", "stream": "events", "name": "billing", "committed_offset": 120, "cursor": 130,
     "outstanding": 10, "lag": 380, "consumers": 2, "next_offset": 500}

``committed_offset``: every offset below it is acked; ``cursor``: the next offset the group pulls;
``outstanding``: pulled and not acked yet; ``lag``: ``next_offset - committed_offset``; ``consumers``: the
group's members now; ``next_offset``: the stream's next offset, read at the same moment.

A stream's own figures (``first_offset``, ``next_offset``, ``segments``, ``stream_bytes``, and its groups
under ``consumer_groups``) are in its queue object, ``GET /api/queues/{vhost}/{stream}``: that is the call
for a reader that wants "how far does the stream go now" (the Spark source's ``latestOffset``). The same
figures are Prometheus series on ``/metrics/per-object`` (broker/prometheus/metrics.py) and ``leveret ctl
list_stream_groups`` prints these rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from broker.errors import AMQPError
from broker.management.common import (
    amqp_error,
    bad_request,
    body_of,
    conflict,
    not_found,
    respond,
    respond_list,
    user_of,
    vhost_for,
    vhost_for_write,
    visible_vhosts,
)
from broker.queues.queue_info import ConsumerGroups
from broker.security import permissions
from broker.vhost import VHost


def _rows(q: ConsumerGroups) -> Iterator[dict[str, Any]]:
    members = q.group_consumers()
    for name, group in sorted(q.groups().items()):
        yield q.group_info(name, group, members)


async def list_stream_groups(request: web.Request) -> web.Response:
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    return respond_list(request, (row for vh in vhs for q in sorted(vh.queues, key=lambda q: q.name)
                                  if (groups := q.consumer_groups()) is not None for row in _rows(groups)))


def _stream(vh: VHost, name: str) -> ConsumerGroups:
    """The consumer groups of the stream ``name`` (the queue's declared ``consumer_groups``), or 404."""
    q = vh.queues.get(name)
    groups = q.consumer_groups() if q is not None else None
    if groups is None:
        raise not_found(f"no stream queue '{name}' in vhost '{vh.name}'")
    return groups


async def stream_groups(request: web.Request) -> web.Response:
    return respond_list(request, _rows(_stream(vhost_for(request), request.match_info["stream"])))


async def stream_group(request: web.Request) -> web.Response:
    stream = request.match_info["stream"]
    q = _stream(vhost_for(request), stream)
    name = request.match_info["group"]
    group = q.groups().get(name)
    if group is None:
        raise not_found(f"no consumer group '{name}' on stream '{stream}'")
    return respond(q.group_info(name, group))


async def commit_stream_group(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    stream = request.match_info["stream"]
    q = _stream(vh, stream)
    try:
        permissions.queue_read(user_of(request), vh.name, stream)
    except AMQPError as exc:
        raise amqp_error(exc) from None
    offset = (await body_of(request)).get("committed_offset")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise bad_request("committed_offset must be a non-negative integer")
    try:
        q.commit_group_offset(request.match_info["group"], offset)
    except AMQPError as exc:
        raise conflict(exc.text) from None
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/stream-groups", list_stream_groups)
    router.add_get("/api/stream-groups/{vhost}", list_stream_groups)
    router.add_get("/api/stream-groups/{vhost}/{stream}", stream_groups)
    router.add_get("/api/stream-groups/{vhost}/{stream}/{group}", stream_group)
    router.add_put("/api/stream-groups/{vhost}/{stream}/{group}", commit_stream_group)
