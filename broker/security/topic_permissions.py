"""Topic authorisation: RabbitMQ's topic permissions (https://www.rabbitmq.com/docs/access-control#topic-authorisation).

A user may have, per vhost and exchange, a ``write`` and a ``read`` regex over routing keys
(``User.topic_permissions``). They apply only to exchanges of type ``topic``, and only where the user has an
entry for that exchange: without one everything is allowed, as on a fresh RabbitMQ. For AMQP 0-9-1 RabbitMQ
checks them at two places (rabbit_channel.erl):

* basic.publish to a topic exchange: the routing key against ``write``, after the exchange's own write
  permission (and, from RabbitMQ 4.1, the CC and BCC keys too: Leveret checks them as well, otherwise a CC
  header walks around the check);
* queue.bind, queue.unbind, exchange.bind and exchange.unbind whose source is a topic exchange: the binding
  key against ``read``.

Consuming is not checked: an AMQP 0-9-1 consumer reads a queue, whose read permission applies.

Patterns are expanded as rabbit_auth_backend_internal does: ``{username}`` and ``{vhost}`` are replaced
literally (no regex escaping), then the pattern is searched for, unanchored; an empty pattern means ``^$``.
``{client_id}`` exists only for MQTT connections ("client_id only applies to MQTT", the access-control
guide): an AMQP 0-9-1 connection has none, so it stays as written and such a pattern matches no ordinary
key. A refusal is 403 ACCESS_REFUSED, a channel error, with rabbit_access_control's 3.13 text (4.x prefixes
it with "write " / "read "): ``access to topic 'k' in exchange 'amq.topic' in vhost '/' refused for user 'u'``.

The publish path: a channel asks :func:`publish_check` once per exchange name, together with the exchange's
write permission, and keeps the answer. For a user without topic permissions on that exchange the answer is
None and a publish costs one identity test more; otherwise it is a :class:`TopicCheck`, which remembers the
keys it allowed. Changing a user's topic permissions over the HTTP API drops the cached answers of that
user's channels (:func:`permissions_changed`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any, Protocol

from broker.errors import AMQPError
from broker.security.auth import User
from protocol.constants import ACCESS_REFUSED, CLASS_BASIC

TOPIC = "topic"
WRITE, READ = "write", "read"
# Keys a TopicCheck remembers as allowed; past this many it goes on matching the regex.
ALLOWED_KEYS_KEPT = 1024


class ExchangeLike(Protocol):
    name: str
    type_name: str


def expand(pattern: str, username: str, vhost: str) -> str:
    """rabbit_auth_backend_internal's expansion: ``""`` means ``^$``; variables replaced literally."""
    return (pattern or "^$").replace("{username}", username).replace("{vhost}", vhost)


@functools.lru_cache(maxsize=4096)
def _compile(expanded: str) -> re.Pattern[str] | None:
    """None for a pattern Python cannot compile (after expansion, say a user name with a '('): nothing matches."""
    try:
        return re.compile(expanded)
    except re.error:
        return None


_BASIC_PUBLISH = 40


def refusal(user: str, vhost: str, exchange: str, key: str, publish: bool = False) -> AMQPError:
    """The 403; ``publish`` names basic.publish as the failing method (a binding's is its own frame's)."""
    where = (CLASS_BASIC, _BASIC_PUBLISH) if publish else (None, None)
    return AMQPError(ACCESS_REFUSED, f"access to topic '{key}' in exchange '{exchange}' in vhost '{vhost}' "
                     f"refused for user '{user}'", *where)


def _entry(user: User, vhost: str, exchange: str) -> tuple[str, str] | None:
    per_vhost = user.topic_permissions.get(vhost)
    return None if per_vhost is None else per_vhost.get(exchange)


class TopicCheck:
    """A channel's check of one exchange's routing keys against one user's expanded ``write`` regex."""

    __slots__ = ("_allowed", "_regex", "exchange", "user", "vhost")

    def __init__(self, user: str, vhost: str, exchange: str, pattern: str) -> None:
        self.user = user
        self.vhost = vhost
        self.exchange = exchange
        self._regex = _compile(expand(pattern, user, vhost))
        self._allowed: set[str] = set()

    def check(self, exchange: ExchangeLike, key: str) -> None:
        """403 unless ``key`` may be published to ``exchange`` (no check unless it is a topic exchange)."""
        if key in self._allowed or exchange.type_name != TOPIC:
            return
        regex = self._regex
        if regex is None or regex.search(key) is None:
            raise refusal(self.user, self.vhost, self.exchange, key, publish=True)
        if len(self._allowed) < ALLOWED_KEYS_KEPT:
            self._allowed.add(key)

    def check_all(self, exchange: ExchangeLike, keys: Iterable[str]) -> None:
        for key in keys:
            self.check(exchange, key)


def publish_check(user: User, vhost: str, exchange: str) -> TopicCheck | None:
    """What a channel keeps per exchange name: None when ``user`` has no topic permission on it."""
    entry = _entry(user, vhost, exchange)
    return None if entry is None else TopicCheck(user.name, vhost, exchange, entry[0])


class VHostLike(Protocol):
    name: str
    exchanges: dict[str, Any]


def check(user: User, vhost: VHostLike, exchange: str, key: str, perm: str) -> None:
    """A one-off check (a binding with ``READ``, a publish over the HTTP API with ``WRITE``): 403 unless
    ``user`` may use ``key`` on ``exchange``; nothing to check unless it is a topic exchange the user has a
    topic permission on."""
    entry = _entry(user, vhost.name, exchange)
    if entry is None:
        return
    ex = vhost.exchanges.get(exchange)
    if ex is None or ex.type_name != TOPIC:
        return
    regex = _compile(expand(entry[0] if perm == WRITE else entry[1], user.name, vhost.name))
    if regex is None or regex.search(key) is None:
        raise refusal(user.name, vhost.name, exchange, key)


def check_bind(user: User, vhost: VHostLike, source: str, binding_key: str) -> None:
    """queue.bind / unbind, exchange.bind / unbind: the binding key against ``read`` on the source."""
    check(user, vhost, source, binding_key, READ)


class _ChannelLike(Protocol):
    publish_checks: dict[str, Any]


class TopicCheckingConnection(Protocol):
    """What the cache's invalidation needs of a client connection (a broker.amqp.reader.Reader)."""

    user: User
    channels: dict[int, _ChannelLike]


def permissions_changed(connections: Iterable[TopicCheckingConnection], username: str) -> None:
    """``username``'s topic permissions changed: its open channels forget what they checked, so their next
    publish to each exchange is checked against the new permissions (RabbitMQ lets cached results live
    until the channel idles)."""
    for conn in connections:
        if conn.user.name == username:
            for channel in conn.channels.values():
                channel.publish_checks.clear()
