"""``/api/stream-groups``: the consumer groups of stream queues (Leveret only; RabbitMQ's management API has
no such resource, its nearest being ``rabbitmq-streams list_stream_consumer_groups``). Read-only.

    GET /api/stream-groups                    every group of every stream the user may see
    GET /api/stream-groups/{vhost}            those of one vhost
    GET /api/stream-groups/{vhost}/{stream}   those of one stream (404 if it is no stream queue)

Each row (broker/management/objects.py's ``stream_group_info``)::

    {"vhost": "/", "stream": "events", "name": "billing", "committed_offset": 120, "cursor": 130,
     "outstanding": 10, "lag": 380, "consumers": 2, "next_offset": 500}

``committed_offset``: every offset below it is acked; ``cursor``: the next offset the group pulls;
``outstanding``: pulled and not acked yet; ``lag``: ``next_offset - committed_offset``; ``consumers``: the
group's members now; ``next_offset``: the stream's next offset, read at the same moment.

A stream's own figures (``first_offset``, ``next_offset``, ``segments``, ``stream_bytes``, and its groups
under ``consumer_groups``) are in its queue object, ``GET /api/queues/{vhost}/{stream}``: that is the call
for a reader that wants "how far does the stream go now" (the Spark source's ``latestOffset``). The same
figures are Prometheus series on ``/metrics/per-object`` (broker/metrics.py) and ``leveret ctl
list_stream_groups`` prints these rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from broker.management.common import not_found, respond_list, vhost_for, visible_vhosts
from broker.management.objects import group_consumers, stream_group_info
from broker.stream_queue import StreamQueue


def _rows(q: StreamQueue) -> Iterator[dict[str, Any]]:
    members = group_consumers(q)
    for name, group in sorted(q.groups().items()):
        yield stream_group_info(q, name, group, members)


async def list_stream_groups(request: web.Request) -> web.Response:
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    return respond_list(request, (row for vh in vhs for q in sorted(vh.queues, key=lambda q: q.name)
                                  if isinstance(q, StreamQueue) for row in _rows(q)))


async def stream_groups(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    name = request.match_info["stream"]
    q = vh.queues.get(name)
    if not isinstance(q, StreamQueue):
        raise not_found(f"no stream queue '{name}' in vhost '{vh.name}'")
    return respond_list(request, _rows(q))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/stream-groups", list_stream_groups)
    router.add_get("/api/stream-groups/{vhost}", list_stream_groups)
    router.add_get("/api/stream-groups/{vhost}/{stream}", stream_groups)
