"""Server-side filter, sort and paging of a long list (``/api/queues`` with 10,000 queues), in RabbitMQ's
query words (``name``, ``use_regex``, ``sort``, ``sort_reverse``, ``page``, ``page_size``) and its paged
answer (``items``, ``page``, ``page_size``, ``page_count``, ``item_count``, ``filtered_count``,
``total_count``).

The order of work keeps a page cheap (RabbitMQ's rabbitmq-management#399): pick rows by name, sort on a
key read straight from the object, take the page, and only then build the page's JSON objects. The
name filter is bounded (broker/management/name_filter.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from broker.management.common import respond
from broker.management.name_filter import name_matcher, page_params

T = TypeVar("T")


def paged(request: web.Request, objects: Sequence[T], name_of: Callable[[T], str],
          sort_keys: dict[str, Callable[[T], Any]], to_json: Callable[[T], dict[str, Any]]) -> web.Response | None:
    """The paged answer when the query asks for a page sorted by a key of ``sort_keys`` (or by name, the
    default); None when the caller must fall back to building every object (a sort on another field)."""
    q = request.query
    params = page_params(q)
    if params is None:
        return None
    sort = q.get("sort") or "name"
    key = sort_keys.get(sort)
    if key is None:
        return None
    match = name_matcher(q)
    total = len(objects)
    rows = [o for o in objects if match(name_of(o))] if match is not None else list(objects)
    reverse = q.get("sort_reverse") == "true"
    rows.sort(key=lambda o: (key(o), name_of(o)), reverse=reverse)
    page, size = params
    chunk = rows[(page - 1) * size: page * size]
    items = [to_json(o) for o in chunk]
    return respond({"items": items, "page": page, "page_size": size, "page_count": -(-len(rows) // size),
                    "item_count": len(items), "filtered_count": len(rows), "total_count": total})
