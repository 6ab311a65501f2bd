"""A ``shovel`` runtime parameter's value: validated as rabbit_shovel_parameters does (RabbitMQ 3.10, amqp091
on both sides), with its answers, and read into a :class:`ShovelDefinition` with RabbitMQ's defaults.

RabbitMQ's reasons quote values as Erlang terms (``<<"bogus">>``), name the shovel in "Key ... not found in
NAME" and list every problem, one per line; the HTTP API puts them after "Validation failed". The same
strings are given here so that operators' scripts that match them keep working. The 3.10 key names are
the ``src-``/``dest-`` prefixed ones; the older unprefixed ones (``prefetch-count``, ``delete-after``,
``add-forward-headers``, ``publish-properties``) are accepted too, as 3.10 still does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.shovel.uri import URIError, parse_uri

COMPONENT = "shovel"
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5.0
# basic properties a shovel may set on what it publishes (``dest-publish-properties``), pamqp's names ← RabbitMQ's.
PUBLISH_PROPERTIES = {"content_type": "content_type", "content_encoding": "content_encoding",
                      "headers": "headers", "delivery_mode": "delivery_mode", "priority": "priority",
                      "correlation_id": "correlation_id", "reply_to": "reply_to", "expiration": "expiration",
                      "message_id": "message_id", "timestamp": "timestamp", "type": "message_type",
                      "user_id": "user_id", "app_id": "app_id", "cluster_id": "cluster_id"}


class InvalidShovel(ValueError):
    """``str()``: RabbitMQ's reasons, one per line (without the "Validation failed" head)."""


def erl(value: Any) -> str:
    """A JSON value as Erlang's ``~p`` prints the term RabbitMQ decoded it to."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(erl(v) for v in value) + "]"
    if isinstance(value, dict):
        return "[" + ",".join("{" + erl(k) + "," + erl(v) + "}" for k, v in value.items()) + "]"
    return repr(value)


def _binary(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erl(value)}"


def _number(key: str, value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return None if ok else f"{key} should be a number, actually was {erl(value)}"


def _boolean(key: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erl(value)}"


def _uri(key: str, value: Any) -> str | None:
    if isinstance(value, list):
        for item in value:
            problem = _uri(key, item) if isinstance(item, str) else _binary(key, item)
            if problem:
                return problem
        return None
    if not isinstance(value, str):
        return f"{key} should be list, actually was {erl(value)}"
    try:
        parse_uri(value)
    except URIError as exc:
        return f'"{value}" not a valid URI: {exc}'
    return None


def _delete_after(key: str, value: Any) -> str | None:
    if value in ("never", "queue-length") or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return (f'{key} should be a number greater than or equal to 0, "never" or "queue-length", '
            f"actually was {erl(value)}")


def _ack_mode(key: str, value: Any) -> str | None:
    if value in ACK_MODES:
        return None
    return f"{key} should be one of [{','.join(erl(m) for m in ACK_MODES)}], actually was {erl(value)}"


def _table(key: str, value: Any) -> str | None:
    return None if isinstance(value, dict) else f"{key} should be a table, actually was {erl(value)}"


def _properties(key: str, value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"{key} should be a table, actually was {erl(value)}"
    unknown = [(k, v) for k, v in value.items() if k not in PUBLISH_PROPERTIES]
    if unknown:
        return f"Unrecognised terms {erl(dict(unknown))} in {key}"
    return None


Check = Callable[[str, Any], "str | None"]
# (key, check, mandatory), in the order RabbitMQ reports them: destination, source, then the shovel's own.
_DEST: list[tuple[str, Check, bool]] = [
    ("dest-uri", _uri, True), ("dest-exchange", _binary, False), ("dest-exchange-key", _binary, False),
    ("dest-queue", _binary, False), ("dest-queue-args", _table, False),
    ("dest-add-forward-headers", _boolean, False), ("dest-add-timestamp-header", _boolean, False),
    ("add-forward-headers", _boolean, False), ("add-timestamp-header", _boolean, False),
    ("dest-publish-properties", _properties, False), ("publish-properties", _properties, False),
]
_SRC: list[tuple[str, Check, bool]] = [
    ("src-uri", _uri, True), ("src-exchange", _binary, False), ("src-exchange-key", _binary, False),
    ("src-queue", _binary, False), ("src-queue-args", _table, False), ("src-prefetch-count", _number, False),
    ("prefetch-count", _number, False), ("src-delete-after", _delete_after, False),
    ("delete-after", _delete_after, False),
]
_GENERAL: list[tuple[str, Check, bool]] = [
    ("reconnect-delay", _number, False), ("ack-mode", _ack_mode, False),
    ("src-protocol", lambda k, v: None if v == "amqp091" else
     f"{k} should be one of [<<\"amqp091\">>], actually was {erl(v)} (amqp10 is not implemented by Leveret)", False),
    ("dest-protocol", lambda k, v: None if v == "amqp091" else
     f"{k} should be one of [<<\"amqp091\">>], actually was {erl(v)} (amqp10 is not implemented by Leveret)", False),
]
KNOWN_KEYS = frozenset(k for table in (_DEST, _SRC, _GENERAL) for k, _, _ in table)


def validate(name: str, value: Any) -> dict[str, Any]:
    """The value to store (unchanged) if it is a valid amqp091 shovel; else raises InvalidShovel."""
    if not isinstance(value, dict):
        raise InvalidShovel(f"{name} should be a table, actually was {erl(value)}")
    problems: list[str] = []
    both = [k for k in ("src-exchange", "src-queue") if k in value]
    if not both:
        problems.append("Must specify 'src-exchange' or 'src-queue'")
    elif len(both) == 2:
        problems.append("Cannot specify 'src-exchange' and 'src-queue'")
    if "dest-exchange" in value and "dest-queue" in value:
        problems.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    after = value.get("src-delete-after", value.get("delete-after"))
    if isinstance(after, int) and not isinstance(after, bool) and value.get("ack-mode") == "no-ack":
        problems.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    for table in (_DEST, _SRC, _GENERAL):
        for key, check, mandatory in table:
            if key in value:
                problem = check(key, value[key])
                if problem:
                    problems.append(problem)
            elif mandatory:
                problems.append(f'Key "{key}" not found in {name}')
    unknown = {k: v for k, v in value.items() if k not in KNOWN_KEYS}
    if unknown:
        problems.append(f"Unrecognised terms {erl(unknown)} in {name}")
    if problems:
        raise InvalidShovel("\n".join(problems))
    return value


def _uris(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


@dataclass(frozen=True)
class ShovelDefinition:
    """A validated shovel with RabbitMQ's defaults filled in."""

    vhost: str
    name: str
    src_uris: list[str]
    dest_uris: list[str]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_queue_args: dict[str, Any] = field(default_factory=dict)
    prefetch_count: int = DEFAULT_PREFETCH
    delete_after: str | int = "never"
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    ack_mode: str = "on-confirm"
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY

    @classmethod
    def parse(cls, vhost: str, name: str, value: dict[str, Any]) -> ShovelDefinition:
        def first(*keys: str, default: Any = None) -> Any:
            return next((value[k] for k in keys if k in value), default)

        return cls(
            vhost=vhost, name=name, src_uris=_uris(value["src-uri"]), dest_uris=_uris(value["dest-uri"]),
            src_queue=value.get("src-queue"), src_exchange=value.get("src-exchange"),
            src_exchange_key=value.get("src-exchange-key", ""), src_queue_args=value.get("src-queue-args", {}),
            prefetch_count=int(first("src-prefetch-count", "prefetch-count", default=DEFAULT_PREFETCH)),
            delete_after=first("src-delete-after", "delete-after", default="never"),
            dest_queue=value.get("dest-queue"), dest_exchange=value.get("dest-exchange"),
            dest_exchange_key=value.get("dest-exchange-key"), dest_queue_args=value.get("dest-queue-args", {}),
            add_forward_headers=bool(first("dest-add-forward-headers", "add-forward-headers", default=False)),
            add_timestamp_header=bool(first("dest-add-timestamp-header", "add-timestamp-header", default=False)),
            publish_properties=dict(first("dest-publish-properties", "publish-properties", default={})),
            ack_mode=value.get("ack-mode", "on-confirm"),
            reconnect_delay=float(value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)))
