"""The ``federation-upstream`` and ``federation-upstream-set`` runtime parameters: validated as
rabbit_federation_parameters does (RabbitMQ 3.10: the shared keys, the exchange keys and the queue keys of an
upstream), with RabbitMQ's reasons (broker/shovel/definition.py says how they are worded), and read into an
:class:`Upstream` with RabbitMQ's defaults.

An upstream-set is a list of ``{"upstream": NAME}`` objects; an entry may carry any upstream key too, which
then overrides the named upstream's value for links made through that set (RabbitMQ's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.shovel.definition import erl
from broker.shovel.uri import URIError, parse_uri

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
COMPONENTS = (UPSTREAM, UPSTREAM_SET)
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5.0
DEFAULT_MAX_HOPS = 1


class InvalidUpstream(ValueError):
    """``str()``: RabbitMQ's reasons, one per line (without the "Validation failed" head)."""


def _binary(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erl(value)}"


def _number(key: str, value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return None if ok else f"{key} should be a number, actually was {erl(value)}"


def _boolean(key: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erl(value)}"


def _ack_mode(key: str, value: Any) -> str | None:
    if value in ACK_MODES:
        return None
    return f"{key} should be one of [{','.join(erl(m) for m in ACK_MODES)}], actually was {erl(value)}"


def _uri(key: str, value: Any) -> str | None:
    """A URI or a list of them (RabbitMQ tries them in order). ``amqp://`` with no host is this node, as in
    RabbitMQ (federating from another vhost of the same node)."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        return f"{key} should be a non-empty list of URIs, actually was []"
    for item in items:
        if not isinstance(item, str):
            return f"{key} should be binary, actually was {erl(item)}"
        try:
            parse_uri(item)
        except URIError as exc:
            return f'"{item}" not a valid URI: {exc}'
    return None


Check = Callable[[str, Any], "str | None"]
# (key, check), in the order RabbitMQ reports them: shared, exchange, queue.
_SHARED: list[tuple[str, Check]] = [
    ("uri", _uri), ("prefetch-count", _number), ("reconnect-delay", _number), ("ack-mode", _ack_mode),
    ("trust-user-id", _boolean)]
_EXCHANGE: list[tuple[str, Check]] = [
    ("exchange", _binary), ("max-hops", _number), ("expires", _number), ("message-ttl", _number),
    ("ha-policy", _binary), ("queue-type", lambda k, v: None if v in ("classic", "quorum") else
                             f'{k} should be one of [<<"classic">>,<<"quorum">>], actually was {erl(v)}')]
_QUEUE: list[tuple[str, Check]] = [("queue", _binary), ("consumer-tag", _binary)]
_KEYS = _SHARED + _EXCHANGE + _QUEUE


def _problems(name: str, value: dict[str, Any], mandatory: tuple[str, ...],
              extra: list[tuple[str, Check]]) -> list[str]:
    problems: list[str] = []
    for key, check in extra + _KEYS:
        if key in value:
            problem = check(key, value[key])
            if problem:
                problems.append(problem)
        elif key in mandatory:
            problems.append(f'Key "{key}" not found in {name}')
    known = {k for k, _ in extra + _KEYS}
    unknown = {k: v for k, v in value.items() if k not in known}
    if unknown:
        problems.append(f"Unrecognised terms {erl(unknown)} in {name}")
    return problems


def validate(component: str, name: str, value: Any) -> Any:
    """The value to store (unchanged) if valid; else raises InvalidUpstream with RabbitMQ's reasons."""
    if component == UPSTREAM:
        if not isinstance(value, dict):
            raise InvalidUpstream(f"{name} should be a table, actually was {erl(value)}")
        problems = _problems(name, value, ("uri",), [])
    else:
        if not isinstance(value, list):
            raise InvalidUpstream(f"{name} should be a list, actually was {erl(value)}")
        problems = []
        for entry in value:
            if not isinstance(entry, dict):
                problems.append(f"{name} should be a list of tables, actually was {erl(entry)}")
                continue
            problems += _problems(name, entry, ("upstream",), [("upstream", _binary)])
    if problems:
        raise InvalidUpstream("\n".join(problems))
    return value


@dataclass(frozen=True)
class Upstream:
    """One upstream as a link uses it: the parameter's value (an upstream-set entry's keys over it) with
    RabbitMQ's defaults filled in. ``exchange`` None: the federated exchange's own name."""

    name: str
    uris: tuple[str, ...]
    exchange: str | None = None
    max_hops: int = DEFAULT_MAX_HOPS
    prefetch_count: int = DEFAULT_PREFETCH
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    expires: int | None = None
    message_ttl: int | None = None
    queue: str | None = None  # a federated queue's upstream queue (None: its own name)

    @classmethod
    def parse(cls, name: str, value: dict[str, Any]) -> Upstream:
        uri = value["uri"]
        expires, ttl = value.get("expires"), value.get("message-ttl")
        return cls(name=name, uris=(uri,) if isinstance(uri, str) else tuple(uri), exchange=value.get("exchange"),
                   max_hops=int(value.get("max-hops", DEFAULT_MAX_HOPS)),
                   prefetch_count=int(value.get("prefetch-count", DEFAULT_PREFETCH)),
                   reconnect_delay=float(value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)),
                   ack_mode=str(value.get("ack-mode", "on-confirm")),
                   trust_user_id=bool(value.get("trust-user-id", False)),
                   expires=None if expires is None else int(expires),
                   message_ttl=None if ttl is None else int(ttl), queue=value.get("queue"))
