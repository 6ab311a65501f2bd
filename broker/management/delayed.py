"""``/api/exchanges/{vhost}/{name}/delayed``: the messages an ``x-delayed-message`` exchange holds (docs/decisions/delayed-messages.md;
Leveret only: the plugin can neither list nor cancel them, its most asked-for missing feature).

    GET    .../delayed?page_size=N&after=ID&truncate=B&encoding=auto|base64
           a page of pending messages by due time (then id), at most ``page_size`` (default 100, at most
           500), those after the cursor ``after`` (the ``next`` of the previous page); without ``truncate``
           no payload (a page reads no more than it shows), with it the first B bytes of each.
    GET    .../delayed/{id}?encoding=auto|base64   one, with its whole payload
    DELETE .../delayed/{id}    cancel one: 204; 404 if it is not pending (unknown, already let go, already
                               cancelled, or being dispatched at this moment)
    DELETE .../delayed         purge: cancel every pending message of the exchange; 204

A page is ``{"items": [...], "page_size": N, "item_count": n, "total_count": pending, "next": ID|null}``
(``next`` is null on the last page). A cursor, not RabbitMQ's ``page=``: the store reads its index from the
cursor on, so page 1000 costs what page 1 does, and a message let go between two pages shifts nothing.
An item::

    {"id": "1767225600000-42", "due_ms": 1767225600000, "due": "2026-01-01T00:00:00.000Z", "delay_ms": 60000,
     "size": 180, "payload_bytes": 100, "routing_key": "k", "persistent": true, "properties": {...}}

``id`` is ``"{due_ms}-{seq}"`` (the store's key: finding one by id reads one time bucket's index); ``size`` is
what the message takes in the delay store (routing key, properties and body); ``properties`` as the queue
``/get`` endpoint shows them, as are ``payload`` / ``payload_encoding`` when present.

Permissions, as RabbitMQ's API acts (as the user, over AMQP, so permissions in the vhost are needed by
administrators too): reading pending messages needs ``read`` on the exchange (what a queue's ``/get`` needs
on the queue, and what binding from the exchange needs); cancelling and purging need ``write`` on it (taking
back what was published to it; ``configure`` stays the right to declare and delete the exchange itself).
An exchange of another type answers 404 on every path.
"""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from broker.exchanges.delayed_exchange import FLAG_PERSISTENT, DelayedExchange
from broker.management.common import bad_request, not_found, respond, user_of, vhost_for_write
from broker.management.presenters.exchanges import lookup_exchange
from broker.management.presenters.times import iso_ms
from broker.management.queues import properties_json
from broker.security import permissions
from broker.vhost import VHost
from storage.delay import DelayRecord

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500


def parse_id(text: str) -> tuple[int, int] | None:
    """``"{due_ms}-{seq}"`` as ``(due_ms, seq)``; None if it is not one (a due time may be negative)."""
    due, sep, seq = text.rpartition("-")
    if not sep or not seq.isdigit():
        return None
    try:
        return int(due), int(seq)
    except ValueError:
        return None


def _exchange(request: web.Request, vh: VHost, perm: str) -> DelayedExchange:
    ex = lookup_exchange(vh, request.match_info["name"])
    if not isinstance(ex, DelayedExchange):
        raise not_found(f"no x-delayed-message exchange '{request.match_info['name']}' in vhost '{vh.name}'")
    permissions.check(user_of(request), vh.name, permissions.EXCHANGE, ex.name, perm)
    return ex


def _encoding(request: web.Request) -> str:
    encoding = request.query.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    return encoding


def _int_query(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer") from None
    if value < 0:
        raise bad_request(f"{name} must not be negative")
    return value


def payload_json(payload: bytes, encoding: str) -> dict[str, str]:
    """A body as the queue ``/get`` endpoint encodes it: text when ``auto`` and it is UTF-8, else base64."""
    if encoding == "auto":
        try:
            return {"payload": payload.decode(), "payload_encoding": "string"}
        except UnicodeDecodeError:
            pass
    return {"payload": base64.b64encode(payload).decode(), "payload_encoding": "base64"}


def record_json(rec: DelayRecord, truncate: int | None, encoding: str) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": f"{rec.due_ms}-{rec.seq}",
        "due_ms": rec.due_ms,
        "due": iso_ms(rec.due_ms),
        "delay_ms": rec.delay_ms,
        "size": len(rec.encode()),
        "payload_bytes": len(rec.body),
        "routing_key": rec.routing_key.decode(errors="replace"),
        "persistent": bool(rec.flags & FLAG_PERSISTENT),
        "properties": properties_json(rec.properties),
    }
    if truncate is not None:
        item.update(payload_json(rec.body[:truncate], encoding))
    return item


async def list_delayed(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    ex = _exchange(request, vh, permissions.READ)
    size = min(MAX_PAGE_SIZE, max(1, _int_query(request, "page_size", DEFAULT_PAGE_SIZE) or 1))
    truncate = _int_query(request, "truncate", None)
    encoding = _encoding(request)
    after = None
    if request.query.get("after"):
        after = parse_id(request.query["after"])
        if after is None:
            raise bad_request("after must be a message id (\"{due_ms}-{seq}\")")
    # One more than the page, to know whether another page follows.
    records = ex.list_delayed(after, size + 1)
    page = records[:size]
    stats = ex.delayed_stats()
    return respond({"items": [record_json(r, truncate, encoding) for r in page], "page_size": size,
                    "item_count": len(page), "total_count": 0 if stats is None else stats.count,
                    "next": f"{page[-1].due_ms}-{page[-1].seq}" if len(records) > size else None})


def _id(request: web.Request) -> tuple[int, int]:
    key = parse_id(request.match_info["id"])
    if key is None:
        raise not_found(f"no pending message '{request.match_info['id']}'")
    return key


async def get_delayed(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    ex = _exchange(request, vh, permissions.READ)
    encoding = _encoding(request)
    rec = ex.get_delayed(*_id(request))
    if rec is None:
        raise not_found(f"no pending message '{request.match_info['id']}' in exchange '{ex.name}'")
    item = record_json(rec, None, encoding)
    item.update(payload_json(rec.body, encoding))
    return respond(item)


async def cancel_delayed(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    ex = _exchange(request, vh, permissions.WRITE)
    if not ex.cancel_delayed(*_id(request)):
        raise not_found(f"no pending message '{request.match_info['id']}' in exchange '{ex.name}'")
    return web.Response(status=204)


async def purge_delayed(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    ex = _exchange(request, vh, permissions.WRITE)
    ex.purge_delayed()
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/exchanges/{vhost}/{name}/delayed", list_delayed)
    router.add_delete("/api/exchanges/{vhost}/{name}/delayed", purge_delayed)
    router.add_get("/api/exchanges/{vhost}/{name}/delayed/{id}", get_delayed)
    router.add_delete("/api/exchanges/{vhost}/{name}/delayed/{id}", cancel_delayed)
