"""Authorisation: configure / write / read permission regexes, checked as RabbitMQ maps AMQP operations to
them (https://www.rabbitmq.com/docs/access-control#authorisation):

==========================  ===========================  ==========================  =====================
operation                   configure                    write                       read
==========================  ===========================  ==========================  =====================
exchange.declare            exchange                     (with alternate-exchange:   (with AE: exchange)
                                                         the AE)
exchange.declare passive    –                            –                           –
exchange.delete             exchange                     –                           –
queue.declare               queue                        (with x-dead-letter-        (with DLX: queue)
                                                         exchange: the DLX)
queue.declare passive       –                            –                           –
queue.delete                queue                        –                           –
exchange.bind / unbind      –                            destination exchange        source exchange
queue.bind / unbind         –                            queue                       exchange
basic.publish               –                            exchange                    –
basic.get / basic.consume   –                            –                           queue
queue.purge                 –                            –                           queue
connection.open             needs any permission in the vhost (530 NOT_ALLOWED otherwise)
==========================  ===========================  ==========================  =====================

The regexes are unanchored (``re.search``); an empty regex means ``^$``; the default exchange is named
``amq.default`` for these checks (so ``'^amq\\.default$'`` grants publishing to it). A refusal is a 403
ACCESS_REFUSED with RabbitMQ's text: ``access to queue 'q' in vhost '/' refused for user 'u'``.

Topic permissions (routing keys of basic.publish and binding keys of bindings on topic exchanges) are checked
on top of these by broker/security/topic_permissions.py.
"""

from __future__ import annotations

from typing import Any

from broker.errors import AMQPError
from broker.security.auth import User
from protocol.constants import ACCESS_REFUSED, NOT_ALLOWED, PRECONDITION_FAILED
from protocol.properties import amqp_type_name

QUEUE = "queue"
EXCHANGE = "exchange"
CONFIGURE, WRITE, READ = "configure", "write", "read"
DEFAULT_EXCHANGE = "amq.default"


def resource_name(kind: str, name: str) -> str:
    return DEFAULT_EXCHANGE if kind == EXCHANGE and name == "" else name


def allowed(user: User, vhost_name: str, kind: str, name: str, perm: str) -> bool:
    p = user.permissions.get(vhost_name)
    return p is not None and p.allows(perm, resource_name(kind, name))


def check(user: User, vhost_name: str, kind: str, name: str, perm: str) -> None:
    """Raise 403 ACCESS_REFUSED unless ``user`` has ``perm`` (configure/write/read) on the resource."""
    p = user.permissions.get(vhost_name)
    if p is None or not p.allows(perm, resource_name(kind, name)):
        raise AMQPError(ACCESS_REFUSED, f"access to {kind} '{resource_name(kind, name)}' in vhost "
                        f"'{vhost_name}' refused for user '{user.name}'")


def vhost_access_error(user: User, vhost_name: str) -> str | None:
    """connection.open: RabbitMQ lets a user into a vhost where it has any permission entry."""
    if vhost_name in user.permissions:
        return None
    return f"access to vhost '{vhost_name}' refused for user '{user.name}'"


def check_vhost_access(user: User, vhost_name: str) -> None:
    """Raise 530 NOT_ALLOWED (a connection error) unless ``user`` may open ``vhost_name``."""
    error = vhost_access_error(user, vhost_name)
    if error is not None:
        raise AMQPError(NOT_ALLOWED, error)


def _text(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return value if isinstance(value, str) else None


# -- one function per AMQP operation, each doing exactly the checks of the table above -----------------------

def exchange_declare(user: User, vhost: str, name: str, arguments: dict[str, Any], passive: bool) -> None:
    if passive:
        return
    check(user, vhost, EXCHANGE, name, CONFIGURE)
    ae = _text(arguments.get("alternate-exchange"))
    if ae:
        check(user, vhost, EXCHANGE, name, READ)
        check(user, vhost, EXCHANGE, ae, WRITE)


def exchange_delete(user: User, vhost: str, name: str) -> None:
    check(user, vhost, EXCHANGE, name, CONFIGURE)


def queue_declare(user: User, vhost: str, name: str, arguments: dict[str, Any], passive: bool) -> None:
    if passive:
        return
    check(user, vhost, QUEUE, name, CONFIGURE)
    raw = arguments.get("x-dead-letter-exchange")
    if raw is not None and not isinstance(raw, (str, bytes, bytearray)):
        # RabbitMQ's channel reads the dead-letter exchange for this check, before the queue's own argument
        # checks, and refuses any other type with its own text (rabbit_channel, RabbitMQ 3.10.8).
        raise AMQPError(PRECONDITION_FAILED, f"invalid type '{amqp_type_name(raw)}' for arg 'x-dead-letter-exchange' "
                        f"in queue '{name}' in vhost '{vhost}'")
    dlx = _text(raw)
    if dlx is not None:
        check(user, vhost, QUEUE, name, READ)
        check(user, vhost, EXCHANGE, dlx, WRITE)


def queue_delete(user: User, vhost: str, name: str) -> None:
    check(user, vhost, QUEUE, name, CONFIGURE)


def queue_bind(user: User, vhost: str, queue: str, exchange: str) -> None:
    """queue.bind and queue.unbind."""
    check(user, vhost, QUEUE, queue, WRITE)
    check(user, vhost, EXCHANGE, exchange, READ)


def exchange_bind(user: User, vhost: str, destination: str, source: str) -> None:
    """exchange.bind and exchange.unbind."""
    check(user, vhost, EXCHANGE, destination, WRITE)
    check(user, vhost, EXCHANGE, source, READ)


def basic_publish(user: User, vhost: str, exchange: str) -> None:
    check(user, vhost, EXCHANGE, exchange, WRITE)


def queue_read(user: User, vhost: str, queue: str) -> None:
    """basic.get, basic.consume and queue.purge."""
    check(user, vhost, QUEUE, queue, READ)


basic_get = basic_consume = queue_purge = queue_read
