"""Queue arguments and policies → the settings a queue process acts on.

A queue's effective settings come from three places, with RabbitMQ's precedence (its queue process's
``args_policy_lookup`` and ``merge_policy_value``, checked against RabbitMQ 3.10 and read in 3.13's source):

- the numeric limits (``message-ttl``, ``expires``, ``max-length``, ``max-length-bytes``, ``delivery-limit``,
  ``consumer-timeout``): the lowest of the argument, the policy and the operator policy applies (an argument
  of 5 under a policy of 2 holds 2 messages), except that a delivery limit below zero is none (RabbitMQ 4.0+)
  and so never the lowest (:func:`lower_limit`);
- the other keys (dead-letter exchange and routing key, ``overflow``, ``queue-mode``): the client's argument
  beats the policy; except that a quorum queue takes ``overflow`` and ``expires`` from the policy first, as
  RabbitMQ's quorum queues do;
- a stream's retention and segment size (``max-length-bytes``, ``max-age``, ``stream-max-segment-size-bytes``):
  the policy beats the argument, as RabbitMQ's stream queue resolves them (its ``policy_precedence``).

A stream refuses the arguments of the other queue types (``x-message-ttl``, ``x-max-length``...) with
RabbitMQ 3.10's text ("... of queue type rabbit_stream_queue"); ``x-max-age`` is RabbitMQ's duration: a
positive integer and one of the units Y (365 days), M (30 days), D, h, m, s.

Argument values are checked at declare with RabbitMQ's error texts (406).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from broker.errors import AMQPError
from protocol.constants import PRECONDITION_FAILED
from protocol.properties import amqp_type_name

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
# The accepted ``x-queue-type`` values: broker/queues/queue_types.py's registry fills it (this module sits
# below it), so a new queue type is accepted here without an edit.
QUEUE_TYPES: list[str] = []
# Policy keys for queues: (policy key, argument, may an operator policy set it).
POLICY_KEYS = (
    ("message-ttl", "x-message-ttl", True),
    ("expires", "x-expires", True),
    ("max-length", "x-max-length", True),
    ("max-length-bytes", "x-max-length-bytes", True),
    ("overflow", "x-overflow", False),
    ("dead-letter-exchange", "x-dead-letter-exchange", False),
    ("dead-letter-routing-key", "x-dead-letter-routing-key", False),
    ("delivery-limit", "x-delivery-limit", True),
    ("consumer-timeout", "x-consumer-timeout", False),
    ("queue-mode", "x-queue-mode", False),
    ("max-age", "x-max-age", False),
    ("stream-max-segment-size-bytes", "x-stream-max-segment-size-bytes", False),
)
# The queue arguments each type refuses, whatever their value: RabbitMQ 3.10's known queue arguments outside
# the type's own list, each checked against RabbitMQ 3.10.8 (406 "invalid arg 'KEY' for queue ... of queue type
# rabbit_TYPE_queue"; tests/integration/core/test_queue_type_arguments.py). Two are Leveret's extensions and not
# refused (README, "Where Leveret answers differently"): x-delivery-limit on a classic queue, x-max-priority on a
# quorum queue.
STREAM_REFUSED_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                       "x-max-length", "x-max-priority", "x-overflow", "x-queue-mode", "x-single-active-consumer",
                       "x-delivery-limit", "x-dead-letter-strategy", "x-max-in-memory-length",
                       "x-max-in-memory-bytes", "x-quorum-initial-group-size", "x-queue-version",
                       "x-queue-master-locator")
CLASSIC_REFUSED_ARGS = ("x-dead-letter-strategy", "x-max-in-memory-length", "x-max-in-memory-bytes",
                        "x-quorum-initial-group-size", "x-queue-leader-locator", "x-initial-cluster-size",
                        "x-max-age", "x-stream-max-segment-size-bytes")
QUORUM_REFUSED_ARGS = ("x-queue-mode", "x-queue-version", "x-queue-master-locator", "x-initial-cluster-size",
                       "x-max-age", "x-stream-max-segment-size-bytes")
REFUSED_ARGS = {"classic": CLASSIC_REFUSED_ARGS, "quorum": QUORUM_REFUSED_ARGS, "stream": STREAM_REFUSED_ARGS}
# Keys a stream takes from its policy before its argument (RabbitMQ's stream ``policy_precedence``).
STREAM_POLICY_FIRST = frozenset({"max-length-bytes", "max-age", "stream-max-segment-size-bytes"})
# RabbitMQ's duration units (``rabbit_amqqueue:check_max_age``), in ms: x-max-age and x-stream-offset intervals.
DURATION_UNITS_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
                     "m": 60_000, "s": 1000}
_DURATION = re.compile(r"([0-9]+)([YMDhms])")


def _unacceptable_type(value: Any) -> str:
    return f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _integer(minimum: int | None, maximum: int | None = None) -> Callable[[Any], str | None]:
    """An integer of at least ``minimum`` (None: any) and at most ``maximum``."""
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            # RabbitMQ's check_int_arg: the error is a string, shown quoted by the reply's ~p.
            return f'"expected integer, got {amqp_type_name(value)}"'
        if minimum is not None and value < minimum:
            return "{value_zero," + str(value) + "}" if value == 0 else "{value_negative," + str(value) + "}"
        if maximum is not None and value > maximum:
            return "{max_value_exceeded," + str(value) + "}"
        return None
    return check


def _not_utf8(value: bytes) -> str:
    return f"{{invalid_utf8,{value[:64]!r}}}: the value must be a UTF-8 string"


def _one_of(choices: Sequence[str], unknown: Callable[[str], str] | None = None) -> Callable[[Any], str | None]:
    """One of ``choices``; ``unknown(value)``: RabbitMQ's own text for a string that is none of them."""
    def check(value: Any) -> str | None:
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                return _not_utf8(value)
        if value not in choices:
            if unknown is not None and isinstance(value, str):
                return unknown(value)
            return f"{{unacceptable_value,{value!r}}}; expected one of {', '.join(choices)}"
        return None
    return check


def _queue_version(value: Any) -> str | None:
    """RabbitMQ 3.10's classic queue versions: 1 and 2 (Leveret stores every classic queue its own way)."""
    if isinstance(value, int) and not isinstance(value, bool) and value not in (1, 2):
        return f"\"unsupported queue version '{value}'\""
    return None


def _string(value: Any) -> str | None:
    """A long string. pamqp hands over one that is not UTF-8 as ``bytes``: refused, since it names an
    exchange or is a routing key (RabbitMQ's names are UTF-8), and decoding it later would fail."""
    if isinstance(value, str):
        return None
    if isinstance(value, bytes):
        try:
            value.decode()
        except UnicodeDecodeError:
            return _not_utf8(value)
        return None
    return _unacceptable_type(value)


def parse_duration(value: Any) -> int | None:
    """RabbitMQ's duration ("7D", "12h", "30m", "10s", "1Y", "1M") in ms; None if it is not one (a unit
    missing or unknown, a value of 0, a fraction)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode(errors="replace")
    if not isinstance(value, str):
        return None
    match = _DURATION.fullmatch(value)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * DURATION_UNITS_MS[match.group(2)]


def _max_age(value: Any) -> str | None:
    if not isinstance(value, (str, bytes, bytearray)):
        return _unacceptable_type(value)
    return None if parse_duration(value) is not None else "invalid_max_age"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else _unacceptable_type(value)


ARGUMENT_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "x-message-ttl": _integer(0),
    "x-expires": _integer(1),
    "x-max-length": _integer(0),
    "x-max-length-bytes": _integer(0),
    "x-max-priority": _integer(0, 255),
    "x-overflow": _one_of(OVERFLOW_MODES),
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    # Only quorum queues take it (the other types' refused arguments). Leveret dead-letters at most once
    # whatever it says (README: at-least-once is served at most once).
    "x-dead-letter-strategy": _one_of(("at-most-once", "at-least-once"), lambda _v: "invalid_dlx_strategy"),
    "x-single-active-consumer": _boolean,
    "x-queue-type": _one_of(QUEUE_TYPES, lambda v: f"\"unsupported queue type '{v}'\""),
    "x-queue-mode": _one_of(("default", "lazy"), lambda v: f"\"unsupported queue mode '{v}'\""),
    "x-queue-version": _queue_version,
    # Any integer, as RabbitMQ 3.10.8 takes it; one below zero is no limit, as in RabbitMQ 4.0+ (whose default is
    # 20, so -1 is how its users turn the limit off; 3.10.8 drops such a message at its first return).
    "x-delivery-limit": _integer(None),
    "x-consumer-timeout": _integer(0),
    "x-max-age": _max_age,
    "x-stream-max-segment-size-bytes": _integer(0),
    # Taken and not used (one member stores a quorum queue's messages, PostgreSQL replicates them), but judged
    # as RabbitMQ 3.10.8 judges them: tests/integration/core/test_queue_type_arguments.py.
    "x-max-in-memory-length": _integer(0),
    "x-max-in-memory-bytes": _integer(0),
    "x-quorum-initial-group-size": _integer(1),
    "x-initial-cluster-size": _integer(1),
    "x-queue-leader-locator": _one_of(("client-local", "balanced", "random", "least-leaders"),
                                         lambda _v: "invalid_queue_locator_arg"),
}


def refused_by_type(arguments: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The queue type ``arguments`` ask for and the arguments that type refuses (and, as RabbitMQ 3.10 does, does
    not compare on a redeclare: broker/queues/amqqueue.py's ``assert_equivalence``)."""
    queue_type = arguments.get("x-queue-type", "classic")
    if isinstance(queue_type, bytes):
        queue_type = queue_type.decode(errors="replace")  # (one not UTF-8 is refused by the value checks)
    return str(queue_type), REFUSED_ARGS.get(queue_type, ())


def validate_arguments(arguments: dict[str, Any], queue: str, vhost: str, creating: bool = True) -> None:
    """406 for an argument Leveret implements whose value RabbitMQ would refuse: first, for a queue being
    created, one its type does not take (whatever its value, as RabbitMQ 3.10.8 answers), then a value. A queue
    that exists is redeclared with what it was declared with: one an earlier Leveret let a classic queue keep
    (``x-dead-letter-strategy``) is not refused then."""
    queue_type, refused = refused_by_type(arguments)
    for key in refused if creating else ():
        if key in arguments:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}' "
                            f"of queue type rabbit_{queue_type}_queue")
    for key, check in ARGUMENT_CHECKS.items():
        if key in arguments:
            problem = check(arguments[key])
            if problem:
                raise AMQPError(PRECONDITION_FAILED,
                                f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {problem}")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise AMQPError(PRECONDITION_FAILED, "invalid arg 'x-dead-letter-routing-key' for queue "
                        f"'{queue}' in vhost '{vhost}': Key x-dead-letter-routing-key should be specified "
                        "together with x-dead-letter-exchange")


def without_refused_arguments(arguments: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``arguments`` without those their queue type refuses, and which those were: a definitions file or stored
    metadata written by an earlier Leveret (which let a classic queue keep a dead-letter strategy, to no effect)
    is imported rather than refused."""
    _, refused = refused_by_type(arguments)
    dropped = [key for key in refused if key in arguments]
    if not dropped:
        return arguments, []
    return {k: v for k, v in arguments.items() if k not in dropped}, dropped


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class QueueSettings:
    """What the queue process enforces. ``None`` means unset (no limit, no TTL, ...)."""

    __slots__ = (
        "consumer_timeout",
        "delivery_limit",
        "dlrk",
        "dlx",
        "expires",
        "max_age_ms",
        "max_length",
        "max_length_bytes",
        "max_priority",
        "max_segment_size_bytes",
        "message_ttl",
        "operator_policy",
        "overflow",
        "policy",
        "queue_type",
        "single_active_consumer",
    )

    def __init__(self) -> None:
        self.message_ttl: int | None = None
        self.expires: int | None = None
        self.max_length: int | None = None
        self.max_length_bytes: int | None = None
        self.overflow = "drop-head"
        self.dlx: str | None = None
        self.dlrk: str | None = None
        self.delivery_limit: int | None = None
        self.max_priority: int | None = None
        # Streams: retention by age (x-max-age, in ms) and the size of a segment file.
        self.max_age_ms: int | None = None
        self.max_segment_size_bytes: int | None = None
        self.single_active_consumer = False
        self.consumer_timeout: int | None = None
        self.queue_type = "classic"
        self.policy: str | None = None
        self.operator_policy: str | None = None

    @property
    def has_limits(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


# Keys whose lowest value among argument, policy and operator policy applies (RabbitMQ's ``res_min``).
LOWEST_WINS = frozenset({"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit",
                         "consumer-timeout"})
# Keys a quorum queue takes from its policy before its argument (RabbitMQ's ``policyHasPrecedence``).
QUORUM_POLICY_FIRST = frozenset({"overflow", "expires"})


def _policy_value(key: str, from_policy: Any, from_operator_policy: Any) -> Any:
    """The policy side of a key (RabbitMQ's ``rabbit_policy:get``): the operator policy's value merged with
    the policy's — the lower number for a numeric limit, the operator's otherwise."""
    if from_operator_policy is None:
        return from_policy
    if from_policy is None:
        return from_operator_policy
    if key in LOWEST_WINS and isinstance(from_policy, int) and isinstance(from_operator_policy, int):
        return lower_limit(key, from_policy, from_operator_policy)
    return from_operator_policy


def lower_limit(key: str, a: int, b: int) -> int:
    """The lower of two values of the limit ``key``: a delivery limit below zero is none (RabbitMQ 4.0+), so any
    other is lower."""
    if key == "delivery-limit" and (a < 0 or b < 0):
        return max(a, b)
    return min(a, b)


def effective_settings(arguments: dict[str, Any], policy: Any = None, operator_policy: Any = None
                       ) -> QueueSettings:
    """Merge arguments, policy and operator policy (each policy: an object with ``name`` and
    ``definition``) into the settings, with RabbitMQ's precedence."""
    values: dict[str, Any] = dict(arguments)
    queue_type = _text(arguments.get("x-queue-type"))
    quorum = queue_type == "quorum"
    stream = queue_type == "stream"
    for key, arg, operator_may_set in POLICY_KEYS:
        from_policy = _policy_value(key, policy.definition.get(key) if policy is not None else None,
                                    operator_policy.definition.get(key)
                                    if operator_policy is not None and operator_may_set else None)
        if from_policy is None:
            continue
        current = values.get(arg)
        if current is None or (quorum and key in QUORUM_POLICY_FIRST) or (stream and key in STREAM_POLICY_FIRST):
            values[arg] = from_policy
        elif key in LOWEST_WINS and isinstance(current, int) and not isinstance(current, bool) \
                and isinstance(from_policy, int):
            values[arg] = lower_limit(key, current, from_policy)
    s = QueueSettings()
    s.message_ttl = values.get("x-message-ttl")
    s.expires = values.get("x-expires")
    s.max_length = values.get("x-max-length")
    s.max_length_bytes = values.get("x-max-length-bytes")
    s.overflow = _text(values.get("x-overflow", "drop-head"))
    s.dlx = _text(values.get("x-dead-letter-exchange"))
    s.dlrk = _text(values.get("x-dead-letter-routing-key"))
    # A whole number of at least 0, or none: below zero is no limit (RabbitMQ 4.0+), and a policy's value of
    # another type (policy definitions' values are not checked) must not reach the requeue's comparison.
    delivery_limit = values.get("x-delivery-limit")
    s.delivery_limit = delivery_limit if isinstance(delivery_limit, int) and not isinstance(delivery_limit, bool) \
        and delivery_limit >= 0 else None
    s.max_priority = arguments.get("x-max-priority") or None  # never from a policy
    s.single_active_consumer = bool(arguments.get("x-single-active-consumer", False))
    s.consumer_timeout = values.get("x-consumer-timeout")
    s.max_age_ms = parse_duration(values.get("x-max-age"))
    segment = values.get("x-stream-max-segment-size-bytes")
    s.max_segment_size_bytes = segment if isinstance(segment, int) and not isinstance(segment, bool) else None
    s.queue_type = _text(arguments.get("x-queue-type", "classic"))
    s.policy = policy.name if policy is not None else None
    s.operator_policy = operator_policy.name if operator_policy is not None else None
    return s


def refuse_unless_lasting(where: str, durable: bool, exclusive: bool, auto_delete: bool) -> None:
    """The declare rule of RabbitMQ's replicated queue types (quorum, stream): durable, shared and lasting; 406
    with RabbitMQ's text otherwise (``where``: "queue 'q' in vhost '/'")."""
    problem = "non-durable" if not durable else "exclusive-owner" if exclusive else \
        "auto-delete" if auto_delete else None
    if problem:
        raise AMQPError(PRECONDITION_FAILED, f"invalid property '{problem}' for {where}")
