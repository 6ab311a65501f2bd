"""Server-side filter, sort and paging of a long list (``/api/queues`` with 10,000 queues), in RabbitMQ's
query words (``name``, ``use_regex``, ``sort``, ``sort_reverse``, ``page``, ``page_size``) and its paged
answer (``items``, ``page``, ``page_size``, ``page_count``, ``item_count``, ``filtered_count``,
``total_count``).

The order of work keeps a page cheap (RabbitMQ's rabbitmq-management#399): pick rows by name, sort on a
key read straight from the object, take the page, and only then build the page's JSON objects. The
name filter is bounded (broker/management/name_filter.py)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from broker.management.common import respond
from broker.management.name_filter import name_matcher, page_params

T = TypeVar("T")


def _page_of(rows: list[T], key: Callable[[T], Any], name_of: Callable[[T], str], reverse: bool,
             start: int, end: int) -> list[T]:
    """``rows[start:end]`` of the rows sorted by (key, name), ``reverse`` as ``list.sort``'s (rows equal in both
    keep their order). The first pages of 100,000 queues come from a heap of ``end`` entries instead of a sort
    of them all; the keys are read once either way."""
    n = len(rows)
    if start >= n:
        return []
    if end * 4 >= n:
        rows.sort(key=lambda o: (key(o), name_of(o)), reverse=reverse)
        return rows[start:end]
    if reverse:  # a stable reverse sort keeps equal rows in order: the larger -i (the earlier row) first
        top = heapq.nlargest(end, zip(map(key, rows), map(name_of, rows), range(0, -n, -1)))
        return [rows[-i] for _k, _name, i in top[start:end]]
    top = heapq.nsmallest(end, zip(map(key, rows), map(name_of, rows), range(n)))
    return [rows[i] for _k, _name, i in top[start:end]]


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
    page, size = params
    chunk = _page_of(rows, key, name_of, reverse, (page - 1) * size, page * size)
    items = [to_json(o) for o in chunk]
    return respond({"items": items, "page": page, "page_size": size, "page_count": -(-len(rows) // size),
                    "item_count": len(items), "filtered_count": len(rows), "total_count": total})
