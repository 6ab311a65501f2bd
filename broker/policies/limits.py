"""Vhost limits and user limits, validated and enforced as RabbitMQ does.

* Vhost limits (https://www.rabbitmq.com/docs/vhosts#limits): ``max-connections`` and ``max-queues``. As in
  RabbitMQ they are the vhost's runtime parameter ``vhost-limits`` / ``limits`` (``rabbit_vhost_limit``),
  kept in ``vhost.parameters``; that is how they are listed under ``/api/parameters``, exported in a
  definitions file's ``parameters`` (and as ``limits`` on the vhost object, as RabbitMQ 3.13 writes it),
  imported, and written to the node's metadata store, so they survive a restart.
* User limits (https://www.rabbitmq.com/docs/user-limits): ``max-connections`` and ``max-channels``, on the
  user (``User.limits``), exported and imported as the user object's ``limits``.

A limit is an integer: a negative value means no limit, 0 refuses everything. Enforcement, with RabbitMQ's
codes and texts (rabbit_reader.erl, rabbit_queue_type.erl, v3.13.7; the user channel text as fixed on main,
3.13 prints the node name where the user name belongs):

* connection.open over the vhost's ``max-connections`` (N open connections allowed): 530 NOT_ALLOWED
  ``access to vhost '/' refused for user 'u': connection limit (N) is reached``; over the user's
  ``max-connections``: 530 ``connection refused for user 'u': user connection limit (N) is reached``. They
  are checked before the user's permission in the vhost, as RabbitMQ orders them.
* channel.open over the user's ``max-channels`` (counted over all its connections): 530 NOT_ALLOWED, a
  connection error with class and method 0, ``number of channels opened for user 'u' has reached the
  maximum allowed user limit of N``.
* queue.declare of a new queue over the vhost's ``max-queues`` (the queues of every kind in the vhost):
  406 PRECONDITION_FAILED ``cannot declare queue 'q': queue limit in vhost '/' (N) is reached``. Redeclaring
  an existing queue is not refused, and queues recovered at start are not counted against it.

Counting walks the node's connections, and only when a limit is set: nothing here runs on the publish path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from broker.errors import AMQPError
from broker.security.auth import User
from protocol.constants import NOT_ALLOWED, PRECONDITION_FAILED

VHOST_LIMITS_COMPONENT = "vhost-limits"
VHOST_LIMITS_KEY = (VHOST_LIMITS_COMPONENT, "limits")
VHOST_LIMIT_NAMES = ("max-connections", "max-queues")
USER_LIMIT_NAMES = ("max-connections", "max-channels")


class Connection(Protocol):
    """What the counting needs of a broker.amqp.reader.Reader (this module sits below the reader)."""

    state: int
    RUNNING: int
    user: User
    vhost: Any
    channels: Any


class LimitError(ValueError):
    """A limit definition RabbitMQ's validation refuses; the message is RabbitMQ's."""


# -- validation, with rabbit_parameter_validation's texts ---------------------------------------------------------

def _erl(value: Any) -> str:
    """A JSON value as Erlang prints the term it decodes to (~tp), for RabbitMQ's validation texts."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, list):
        return "[" + ",".join(_erl(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{_erl(k)} => {_erl(v)}" for k, v in value.items()) + "}"
    return str(value)


def validate(definition: Any, names: tuple[str, ...], what: str) -> dict[str, int]:
    """A limits object (``{"max-connections": 10}``) checked as rabbit_parameter_validation:proplist checks
    it: every value an integer, no unknown name. ``what`` is RabbitMQ's name for the set ("limits" for a
    vhost, "user-limits" for a user). Raises LimitError with RabbitMQ's text."""
    if not isinstance(definition, dict):
        raise LimitError(f"{what} not a list {_erl(definition)}")
    unknown = [(k, v) for k, v in definition.items() if k not in names]
    if unknown:
        terms = ",".join(f"{{{_erl(k)},{_erl(v)}}}" for k, v in unknown)
        raise LimitError(f"Unrecognised terms [{terms}] in {what}")
    for name, value in definition.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise LimitError(f"{name} should be a number, actually was {_erl(value)}")
    return dict(definition)


def validate_vhost_limits(definition: Any) -> dict[str, int]:
    """The ``vhost-limits`` parameter's value (RabbitMQ's HTTP API prefixes its errors with
    "Validation failed", as for every runtime parameter: see broker/parameters.py)."""
    return validate(definition, VHOST_LIMIT_NAMES, "limits")


def validate_user_limits(definition: Any) -> dict[str, int]:
    return validate(definition, USER_LIMIT_NAMES, "user-limits")


def user_limits_of(definition: Any) -> dict[str, int] | None:
    """A definitions file's user ``limits``: an object is the user's new limits; absent (or RabbitMQ's
    empty list) is None, which leaves them as they are. Raises LimitError."""
    return validate_user_limits(definition) if isinstance(definition, dict) else None


def apply_vhost_limits(vhost: Any, definition: Any) -> None:
    """A definitions file's vhost ``limits`` (RabbitMQ exports them there and in ``parameters``, and imports
    only the parameter; a file that has them only on the vhost is honoured rather than ignored). A
    non-empty object replaces the vhost's limits. Raises LimitError."""
    if isinstance(definition, dict) and definition:
        set_vhost_limits(vhost, validate_vhost_limits(definition))


# -- where they are kept --------------------------------------------------------------------------------------------

def vhost_limits(vhost: Any) -> Mapping[str, int]:
    """The vhost's limits (empty if none); ``vhost`` is a broker.vhost.VHost."""
    return vhost.parameters.get(VHOST_LIMITS_KEY) or {}


def set_vhost_limits(vhost: Any, limits: Mapping[str, int]) -> None:
    """Replace the vhost's limits (validated already); no limits left removes the parameter. Written to
    the metadata store by the vhost (``set_parameter`` / ``clear_parameter``), which raises if it cannot."""
    if limits:
        vhost.set_parameter(*VHOST_LIMITS_KEY, dict(limits))
    else:
        vhost.clear_parameter(*VHOST_LIMITS_KEY)


def _limit(limits: Mapping[str, int], name: str) -> int | None:
    """The limit in force: None for none (unset or negative, RabbitMQ's "no limit")."""
    value = limits.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


# -- enforcement ---------------------------------------------------------------------------------------------------

def _open(connections: Iterable[Connection]) -> Iterable[Connection]:
    return (c for c in connections if c.state == c.RUNNING)


def connection_refusal(node: Any, user: User, vhost_name: str) -> str | None:
    """connection.open: RabbitMQ's 530 text if the vhost's or the user's ``max-connections`` is reached,
    else None (also for a vhost that does not exist: that refusal is the caller's)."""
    vhost = node.vhosts.get(vhost_name)
    if vhost is None:
        return None
    limit = _limit(vhost_limits(vhost), "max-connections")
    if limit is not None and sum(1 for c in _open(node.connections) if c.vhost is vhost) >= limit:
        return f"access to vhost '{vhost_name}' refused for user '{user.name}': connection limit ({limit}) is reached"
    limit = _limit(user.limits, "max-connections")
    if limit is not None and sum(1 for c in _open(node.connections) if c.user.name == user.name) >= limit:
        return f"connection refused for user '{user.name}': user connection limit ({limit}) is reached"
    return None


def check_channel_open(connection: Connection, connections: Iterable[Connection]) -> None:
    """channel.open: 530 NOT_ALLOWED (class and method 0, as RabbitMQ sends it) once the user's channels,
    on all its connections, have reached its ``max-channels``."""
    user = connection.user
    limit = _limit(user.limits, "max-channels")
    if limit is None:
        return
    if sum(len(c.channels) for c in connections if c.user.name == user.name) >= limit:
        raise AMQPError(NOT_ALLOWED, f"number of channels opened for user '{user.name}' has reached the maximum "
                        f"allowed user limit of {limit}", 0, 0)


def check_queue_limit(vhost: Any, queue_name: str, queue_count: int) -> None:
    """Declaring a new queue: 406 once the vhost holds ``max-queues`` queues."""
    limit = _limit(vhost_limits(vhost), "max-queues")
    if limit is not None and queue_count + 1 > limit:
        raise AMQPError(PRECONDITION_FAILED, f"cannot declare queue '{queue_name}': queue limit in vhost "
                        f"'{vhost.name}' ({limit}) is reached")
