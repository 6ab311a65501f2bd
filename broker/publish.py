"""The one publish path (docs/decisions/message-path.md; LavinMQ's ``vhost.publish``; in RabbitMQ the work of
``rabbit_channel``'s basic.publish clause, ``rabbit_basic`` and ``rabbit_exchange:route``).

Everything that puts a message into the broker goes through :meth:`broker.vhost.VHost.publish`: a channel's
basic.publish, the HTTP API's ``POST /api/exchanges/{vhost}/{name}/publish`` (through ``VHost.publish_as``),
the aliveness test, dead-lettering, and later a delayed message coming due or the Spark writer. It routes
(the exchange, exchange-to-exchange bindings, the alternate exchange, CC / BCC keys, direct reply-to), stamps
the publish time that TTLs count from, hands the message to every queue through ``delegate`` (confirm tokens,
credit flow, one message-store id for a persistent fan-out) and keeps the node's counters.

A message a *client* wrote is checked first, by :func:`check_properties`: the checks basic.publish makes on
the properties (user-id, expiration, delivery mode, header nesting, CC / BCC, direct reply-to's
``reply_to``). A channel runs them when the message arrives (a transaction routes it only at tx.commit, and
the CC / BCC keys it finds need the channel's topic-permission check); ``VHost.publish_as`` runs them for any
other publisher that acts as a user. Dead letters and the broker's own messages are not checked.

What ``VHost.publish`` returns is one small int, so the hot path allocates nothing for it::

    result & ROUTED      the message reached a queue (or a direct reply-to consumer): no basic.return
    result & REFUSED     a queue refused it (overflow reject-publish): the publisher's confirm is a nack
    result >> PENDING    how many queues confirm it later, after an fsync (asked for by ``confirm_seq``)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from broker.errors import AMQPError
from broker.message import Message
from protocol.constants import CLASS_BASIC, PRECONDITION_FAILED
from protocol.properties import (
    MAX_TABLE_DEPTH,
    TableTooDeep,
    array_long_strings,
    check_nesting,
    delivery_mode_of,
    field_type_name,
    table_values,
    with_properties,
)

if TYPE_CHECKING:
    from broker.security.auth import User

# The bits of VHost.publish's result (see above).
ROUTED = 1
REFUSED = 2
PENDING = 2  # shift: result >> PENDING is the number of queues that confirm later

# Direct reply-to: a consumer of REPLY_TO gets replies published to REPLY_TO_PREFIX + its channel's key.
REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."

# Content-header flag bits that make the broker look at the properties of a publish.
FLAG_HEADERS = 1 << 13
FLAG_DELIVERY_MODE = 1 << 12
FLAG_REPLY_TO = 1 << 9
FLAG_EXPIRATION = 1 << 8
FLAG_USER_ID = 1 << 4
FLAGS_TO_READ = FLAG_HEADERS | FLAG_DELIVERY_MODE | FLAG_REPLY_TO | FLAG_EXPIRATION | FLAG_USER_ID
# The headers of sender-selected distribution, in the order RabbitMQ reads them (?ROUTING_HEADERS).
_ROUTING_HEADERS = (b"CC", b"BCC")
_ARRAY = ord("A")


class Publisher(Protocol):
    """What the publish path needs of a publishing channel: where queues send its confirms, the queues it
    counts as a publisher of, and the connection credit flow pauses (broker/queues/delegate.py)."""

    reader: Any
    published_to: set[Any]

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None: ...


class ReplyTo(Protocol):
    """The direct reply-to consumers (the node's registry): delivers a reply published to
    ``amq.rabbitmq.reply-to.<key>``; 1 if its consumer is there, else 0."""

    def deliver_reply(self, msg: Message) -> int: ...


def property_flags(header: bytes) -> int:
    """The property flags of a content header (0 for one too short to have them)."""
    return (header[12] << 8) | header[13] if len(header) >= 14 else 0


def check_properties(msg: Message, flags: int, user: User, reply_key: str | None = None) -> bool:
    """basic.publish's checks of a client's message, acting on the properties that matter to the broker;
    returns whether the message is persistent. Sets ``msg.expiration_ms`` and ``msg.extra_keys`` (CC / BCC),
    removes BCC, and points ``reply_to: amq.rabbitmq.reply-to`` at ``reply_key``, the publishing channel's
    reply consumer (none: 406). Raises 406 with RabbitMQ's texts. ``flags``: :func:`property_flags`."""
    to_read = flags & FLAGS_TO_READ
    if not to_read:
        return False
    if to_read == FLAG_DELIVERY_MODE:  # the common persistent publish: one byte, not the whole property list
        return _persistent(delivery_mode_of(msg.header, flags), flags)
    props = msg.props
    if props.user_id is not None and props.user_id != user.name and "impersonator" not in user.tags:
        raise AMQPError(PRECONDITION_FAILED, f"user_id property set to '{props.user_id}' but "
                        f"authenticated user was '{user.name}'", CLASS_BASIC, 40)
    if props.expiration is not None:
        msg.expiration_ms = expiration_ms(props.expiration)
    persistent = _persistent(props.delivery_mode, flags)
    if props.headers_span is not None:
        start, end = props.headers_span
        try:
            check_nesting(msg.header, start, end)
        except TableTooDeep:
            # Accepted, it could not be routed by a headers exchange, dead-lettered or shown over HTTP.
            raise AMQPError(PRECONDITION_FAILED, f"message headers nest tables or arrays more than "
                            f"{MAX_TABLE_DEPTH} levels deep", CLASS_BASIC, 40) from None
        header = msg.header
        # One search in the common case (neither key), two more only if "CC" is there at all.
        if header.find(b"CC", start, end) >= 0 and (header.find(b"\x02CC", start, end) >= 0
                                                   or header.find(b"\x03BCC", start, end) >= 0):
            sender_selected(msg, start, end)
    if props.reply_to == REPLY_TO:
        if reply_key is None:
            raise AMQPError(PRECONDITION_FAILED, "fast reply consumer does not exist", CLASS_BASIC, 40)
        msg.replace_header(with_properties(msg.header, reply_to=REPLY_TO_PREFIX + reply_key))
    return persistent


# The longest per-message TTL RabbitMQ 3.10.8 accepts: ten years in ms (found by bisecting the reference node;
# rabbit_misc:check_expiry). Below 2^63, so a TTL always fits the 64-bit expiry of a stored message.
MAX_EXPIRATION_MS = 315_360_000_000
_LEADING_INTEGER = re.compile(r"[+-]?[0-9]+")


def expiration_ms(expiration: str) -> int:
    """The ``expiration`` property as a per-message TTL in ms, read as RabbitMQ's rabbit_basic:parse_expiration
    reads it (string:to_integer, then rabbit_misc:check_expiry), with its 406 "invalid expiration '<value>':
    <reason>": ``no_integer`` (no digits at the start), ``{leftover_string,"<rest>"}``, ``{value_negative,N}``,
    ``{value_too_large,N}``. (RabbitMQ prints the reason with ~p, which wraps a tuple that does not fit its
    line, as ``{value_too_large,`` + newline + spaces + ``N}`` for the largest numbers; this text does not.)"""
    found = _LEADING_INTEGER.match(expiration)
    if found is None:
        reason = "no_integer"
    elif found.end() < len(expiration):
        rest = expiration[found.end():].replace("\\", "\\\\").replace('"', '\\"')
        reason = f'{{leftover_string,"{rest}"}}'
    else:
        ttl = int(found.group())
        if 0 <= ttl <= MAX_EXPIRATION_MS:
            return ttl
        reason = f"{{value_negative,{ttl}}}" if ttl < 0 else f"{{value_too_large,{ttl}}}"
    raise AMQPError(PRECONDITION_FAILED, f"invalid expiration '{expiration}': {reason}", CLASS_BASIC, 40)


def _persistent(mode: int, flags: int) -> bool:
    """Whether delivery mode ``mode`` is persistent; 406 for a mode set to anything but 1 or 2:
    rabbit_basic:is_message_persistent/1 knows only 1 and 2 (RabbitMQ up to 3.12; 3.13+ with message
    containers takes any other mode as transient)."""
    if mode != 2 and mode != 1 and flags & FLAG_DELIVERY_MODE:
        raise AMQPError(PRECONDITION_FAILED, f"invalid message: {{delivery_mode_unknown,{mode}}}", CLASS_BASIC, 40)
    return mode == 2


def sender_selected(msg: Message, start: int, end: int) -> None:
    """CC and BCC headers (the table at ``msg.header[start:end]``) add routing keys; BCC is removed
    before anyone sees the message. Read from the raw table, as RabbitMQ's ``header_routes`` reads
    them: each must be an array (else 406 naming the header and its field type), and only its long
    strings are keys (an integer 7 is not the key "7")."""
    header = msg.header
    values = table_values(header, start, end, _ROUTING_HEADERS)
    keys: list[str] = []
    for name in _ROUTING_HEADERS:
        span = values.get(name)
        if span is None:
            continue
        if header[span[0]] != _ARRAY:
            raise AMQPError(PRECONDITION_FAILED, f"invalid message: {{unacceptable_type_in_header,"
                            f"\"{name.decode()}\",{field_type_name(header[span[0]])}}}", CLASS_BASIC, 40)
        keys.extend(k.decode(errors="replace") for k in array_long_strings(header, *span))
    if keys:
        msg.extra_keys = keys
    if b"BCC" in values:
        extra = msg.extra_keys
        msg.replace_header(with_properties(msg.header, headers_remove=["BCC"]))
        msg.extra_keys = extra
