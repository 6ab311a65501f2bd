"""Dead-lettering (RabbitMQ's ``rabbit_dead_letter``): the message a queue republishes to its dead-letter
exchange, with the ``x-death`` history RabbitMQ 3.13+ writes, and the cycle rule.

``x-death`` is a list of tables, newest first, one per {queue, reason}; a repeat death for the same pair
increments ``count`` and moves that entry to the front, keeping the ``time``, ``exchange`` and
``routing-keys`` of the first death. ``x-first-death-*`` are set once, ``x-last-death-*`` every time.
The message's ``expiration`` is removed (kept as ``original-expiration``); ``BCC`` is always removed, and
``CC`` too when a dead-letter routing key replaces the original keys. The time of a death is the caller's
(its vhost's clock, broker/clock.py): this module never reads the time itself.
"""

from __future__ import annotations

import datetime
from typing import Any

import structlog

from broker.message import Message
from protocol.fastcodec import shortstr
from protocol.frames import FrameError
from protocol.properties import Long, body_size_of, build_content_header, with_properties

log = structlog.get_logger("leveret.dead_letter")

REJECTED, EXPIRED, MAXLEN, DELIVERY_LIMIT = "rejected", "expired", "maxlen", "delivery_limit"


def _text_list(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        return []
    return [v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else str(v) for v in value]


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else value


def make_dead_letter(msg: Message, queue: str, reason: str, dlx: str, dlrk: str | None, now: float) -> Message:
    """The message to publish to ``dlx`` after ``msg`` died in ``queue`` for ``reason`` at ``now`` (wall-clock
    ms since the epoch: ``vhost.clock.now_ms()``; ``x-death`` records it to the second, as RabbitMQ does)."""
    try:
        expiration = msg.props.expiration
        headers = msg.headers
        readable = True
    except FrameError:
        # Publish reads only what it acts on, so a malformed headers table (or a cut property list that
        # nothing needed to read) can reach a queue. Its death must not fail, nor the reject that caused it.
        expiration, headers, readable = None, {}, False
    cc = _text_list(headers.get("CC"))
    death_keys = [msg.routing_key, *cc]
    stamp = datetime.datetime.fromtimestamp(int(now / 1000), tz=datetime.UTC).replace(tzinfo=None)
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    for death in deaths:
        death["count"] = Long(int(death.get("count", 1)))  # decoded as int: written back as a long
    for i, death in enumerate(deaths):
        if _text(death.get("queue")) == queue and _text(death.get("reason")) == reason:
            death["count"] = Long(int(death.get("count", 1)) + 1)
            deaths.insert(0, deaths.pop(i))
            break
    else:
        entry: dict[str, Any] = {"count": Long(1), "reason": reason, "queue": queue, "time": stamp,
                                 "exchange": msg.exchange, "routing-keys": death_keys}
        if expiration:
            entry["original-expiration"] = expiration
        deaths.insert(0, entry)
    changes: dict[str, Any] = {"x-death": deaths}
    if "x-first-death-queue" not in headers:
        changes["x-first-death-queue"] = queue
        changes["x-first-death-reason"] = reason
        changes["x-first-death-exchange"] = msg.exchange
    changes["x-last-death-queue"] = queue
    changes["x-last-death-reason"] = reason
    changes["x-last-death-exchange"] = msg.exchange
    removed = ["BCC"]
    if dlrk is not None:
        removed.append("CC")
        routing_key = dlrk
    else:
        routing_key = msg.routing_key
    if readable:
        # Only the headers and the expiration change; every other property keeps its exact bytes.
        header = with_properties(msg.header, headers_set=changes, headers_remove=removed, expiration=None)
    else:
        header = _unreadable_replaced(msg.header, changes, queue)
    out = Message(dlx, routing_key, shortstr(dlx) + shortstr(routing_key), header, msg.body, now)
    if dlrk is None and cc:
        out.extra_keys = cc
    return out


def _unreadable_replaced(header: bytes, changes: dict[str, Any], queue: str) -> bytes:
    """The header of a dead letter whose properties cannot be read: its headers table is replaced by the
    death headers (the other properties are kept if the list is whole, else dropped)."""
    try:
        out = with_properties(header, headers=changes, expiration=None)
        dropped = "its malformed headers table"
    except FrameError:
        out = with_properties(build_content_header(body_size_of(header), b"\x00\x00"), headers=changes)
        dropped = "its properties (the property list is cut)"
    log.warning("dead-lettered message could not be read; dropped " + dropped, queue=queue)
    return out


def deaths_of(msg: Message) -> list[tuple[str, str]]:
    """(queue, reason) of each x-death entry, newest first."""
    return [(_text(d.get("queue")), _text(d.get("reason")))
            for d in msg.headers.get("x-death") or [] if isinstance(d, dict)]


def is_cycle(target_queue: str, deaths: list[tuple[str, str]]) -> bool:
    """A dead-lettered message that would reach a queue it already died in is dropped, unless one of the
    deaths since (and including) that one was a rejection: a client kept it alive on purpose."""
    for queue, reason in deaths:
        if reason == REJECTED:
            return False
        if queue == target_queue:
            return True
    return False
