"""``/api/exchanges``: list, get, declare (PUT), delete, the bindings an exchange is source or destination
of, and ``POST .../publish``. Declaring and deleting go through the vhost, as exchange.declare does; the
default exchange is ``amq.default`` in paths and ``""`` in bodies, as in RabbitMQ. A publish goes through the
vhost's one publish path (``VHost.publish_as``: broker/publish.py), as a basic.publish by the user would."""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pamqp import commands as spec

from broker.errors import AMQPError
from broker.exchanges.exchange import EXCHANGE
from broker.exchanges.exchange_types import EXCHANGE_TYPES
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
from broker.management.presenters.bindings import binding_info, default_binding_info
from broker.management.presenters.exchanges import all_exchanges, exchange_info, lookup_exchange
from broker.message import Message
from broker.publish import PENDING, REFUSED, ROUTED
from broker.security import permissions
from protocol.constants import PRECONDITION_FAILED
from protocol.fastcodec import build_content_header, shortstr

if TYPE_CHECKING:
    from broker.vhost import VHost

_PROPERTY_NAMES = {"content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                   "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
                   "cluster_id"}
_INT_PROPERTIES = {"delivery_mode", "priority", "timestamp"}


def encode_properties(props: dict[str, Any], body_size: int) -> bytes:
    """A content header from the API's ``properties`` object (RabbitMQ's names; ``type`` is message_type)."""
    unknown = set(props) - _PROPERTY_NAMES
    if unknown:
        raise bad_request(f"unknown message properties: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for name, value in props.items():
        if value is None:
            continue
        if name in _INT_PROPERTIES:
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise bad_request(f"property {name} must be an integer") from None
            if name == "timestamp":
                value = datetime.datetime.fromtimestamp(value, datetime.UTC)
        elif name == "headers":
            if not isinstance(value, dict):
                raise bad_request("property headers must be an object")
        elif not isinstance(value, str):
            value = str(value)
        values["message_type" if name == "type" else name] = value
    try:
        raw = spec.Basic.Properties(**values).marshal()
    except Exception as exc:  # noqa: BLE001
        raise bad_request(f"invalid message properties: {exc}") from None
    return build_content_header(body_size, raw)


def make_message(exchange_name: str, routing_key: str, body: bytes, properties: dict[str, Any]) -> Message:
    """The message a publish over the API carries (its ``properties`` object as a content header)."""
    header = encode_properties(properties, len(body))
    try:
        names_raw = shortstr(exchange_name) + shortstr(routing_key)
    except ValueError:
        raise bad_request("exchange name and routing key must be at most 255 bytes") from None
    return Message(exchange_name, routing_key, names_raw, header, body)


async def list_exchanges(request: web.Request) -> web.Response:
    node = node_of(request)
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    sampler = request.app["sampler"]
    return respond_list(request, (exchange_info(node, vh, ex, sampler) for vh in vhs for ex in all_exchanges(vh)))


def _lookup(request: web.Request, vh: VHost) -> Any:
    ex = lookup_exchange(vh, request.match_info["name"])
    if ex is None:
        raise not_found()
    return ex


async def get_exchange(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    return respond(exchange_info(node_of(request), vh, _lookup(request, vh), request.app["sampler"]))


async def put_exchange(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    name = request.match_info["name"]
    body = await body_of(request)
    type_name = body.get("type")
    if not isinstance(type_name, str) or not type_name:
        raise bad_request(f"type is required (one of {', '.join(sorted(EXCHANGE_TYPES))})")
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be an object")
    if name == "amq.default":
        name = ""
    permissions.exchange_declare(user_of(request), vh.name, name, arguments, passive=False)
    _ex, created = vh.declare_exchange(name, type_name, False, as_bool(body.get("durable"), True),
                                       as_bool(body.get("auto_delete")), as_bool(body.get("internal")),
                                       arguments)
    return web.Response(status=201 if created else 204)


async def delete_exchange(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    name = request.match_info["name"]
    if name == "amq.default":
        name = ""
    if name and name not in vh.exchanges:
        raise not_found()
    permissions.exchange_delete(user_of(request), vh.name, name)
    vh.delete_exchange(name, request.query.get("if-unused") == "true")
    return web.Response(status=204)


async def exchange_bindings(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    ex = _lookup(request, vh)
    if request.match_info["direction"] == "source":
        if ex.name == "":
            rows = [default_binding_info(vh, q.name) for q in vh.queues]
        else:
            rows = [binding_info(vh, b) for b in ex.bindings.values()]
    else:
        rows = [binding_info(vh, b) for b in vh.bindings() if b.kind == EXCHANGE and b.destination == ex.name]
    return respond_list(request, rows)


async def publish(request: web.Request) -> web.Response:
    vh = vhost_for_write(request)
    name = request.match_info["name"]
    if name == "amq.default":
        name = ""
    body = await body_of(request)
    routing_key = body.get("routing_key", "")
    payload = body.get("payload", "")
    encoding = body.get("payload_encoding", "string")
    properties = body.get("properties") or {}
    if not isinstance(routing_key, str) or not isinstance(payload, str) or not isinstance(properties, dict):
        raise bad_request("routing_key and payload must be strings, properties an object")
    if encoding == "string":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise bad_request("payload is not valid base64") from None
    else:
        raise bad_request("payload_encoding must be string or base64")
    node = node_of(request)
    if len(data) > node.settings.max_message_size:
        raise bad_request(f"message size {len(data)} is larger than configured max size "
                          f"{node.settings.max_message_size}")
    if name and lookup_exchange(vh, name) is None:
        raise not_found()
    msg = make_message(name, routing_key, data, properties)
    # As RabbitMQ's plugin publishes: as the user (permissions, topic permissions, user-id, ...), with
    # mandatory set ({"routed": false} for a return), and a queue's refusal (its nack) answered 400.
    confirm = HttpConfirm()
    try:
        result = vh.publish_as(user_of(request), msg, mandatory=True, publisher=confirm, confirm_seq=1)
    except AMQPError as exc:
        if exc.reply_code != PRECONDITION_FAILED:
            raise
        # The channel RabbitMQ publishes on is closed; the API answers its code and text.
        raise bad_request(f"{exc.reply_code} {exc.reply_text}") from None
    stored = True
    try:
        if result >> PENDING:
            # Like RabbitMQ's plugin (a confirm-mode channel, answering after basic.ack): a persistent
            # message in a durable queue is answered once it is on disk.
            stored = await asyncio.wait_for(confirm.wait(result >> PENDING), CONFIRM_TIMEOUT)
    except TimeoutError:
        stored = False
    finally:
        confirm.detach()
    if result & REFUSED or not stored:
        raise bad_request("rejected Unable to publish message. Check queue limits.")
    return respond({"routed": bool(result & ROUTED)})


# Seconds an HTTP publish waits for its persistent message's fsync before answering "rejected".
CONFIRM_TIMEOUT = 30.0


class _NoFlow:
    """Credit flow pauses a publisher's socket; an HTTP request has none to pause (one message each)."""

    def pause_for(self, reason: object) -> None:
        pass

    def resume_for(self, reason: object) -> None:
        pass


class HttpConfirm:
    """An HTTP publish as the publish path's confirm-mode publisher (broker/publish.py ``Publisher``): the
    queues that must fsync the message report here, and :meth:`wait` returns once all have (False if
    any failed to store it). One per request, so its confirm token is unique."""

    def __init__(self) -> None:
        self.reader = _NoFlow()
        self.published_to: set[Any] = set()
        self._pending = 0
        self._stored = True
        self._done: asyncio.Future[bool] | None = None

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        self._stored = self._stored and stored
        self._pending -= 1
        if self._pending <= 0 and self._done is not None and not self._done.done():
            self._done.set_result(self._stored)

    async def wait(self, pending: int) -> bool:
        # Confirms arrive from the syncer's callback on a later loop turn, never during publish_as.
        self._pending += pending
        self._done = asyncio.get_running_loop().create_future()
        if self._pending <= 0:
            return self._stored
        return await self._done

    def detach(self) -> None:
        """No longer counted as a publisher of the queues it published to."""
        for q in self.published_to:
            q.publisher_channels.discard(self)
        self.published_to.clear()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/exchanges", list_exchanges)
    router.add_get("/api/exchanges/{vhost}", list_exchanges)
    router.add_get("/api/exchanges/{vhost}/{name}", get_exchange)
    router.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    router.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    router.add_get("/api/exchanges/{vhost}/{name}/bindings/{direction:source|destination}", exchange_bindings)
    router.add_post("/api/exchanges/{vhost}/{name}/publish", publish)

