"""Policies and operator policies (RabbitMQ's ``rabbit_policy``): a regex over object names, what kinds of
object they apply to, a priority, and a definition of keys such as ``message-ttl`` or ``max-length``.

One policy applies per object: the matching one with the highest priority (ties: the name that sorts
last, as RabbitMQ's sort does). Client arguments beat policy values; operator policy values beat both,
the lower number winning, a delivery limit below zero being none (see broker/queues/queue_args.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The federation plugin's policy keys (rabbit_federation_parameters:validate_policy): at most one of them, and
# the name a key gives must be a string. RabbitMQ 3.10.8's 400 reasons, measured through its HTTP API.
FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")
FEDERATION_TOGETHER = ("cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern "
                       "together")
FEDERATION_NAMES = (("federation-upstream", "federation upstream name"),
                    ("federation-upstream-set", "federation upstream set name"))
APPLY_TO = ("queues", "classic_queues", "quorum_queues", "streams", "exchanges", "all")
# The order the HTTP API names them in when it refuses one.
APPLY_TO_IN_ERRORS = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")


@dataclass
class Policy:
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: str = "all"
    vhost: str = "/"
    _regex: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise ValueError(f"'{self.apply_to}' is not a valid apply-to value; expected one of "
                             f"{', '.join(APPLY_TO)}")
        try:
            self._regex = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"invalid regular expression '{self.pattern}': {exc}") from None

    def applies_to_queue(self, name: str, queue_type: str = "classic") -> bool:
        if self.apply_to not in ("queues", "all", "streams" if queue_type == "stream" else f"{queue_type}_queues"):
            return False
        return self._regex.search(name) is not None

    def applies_to_exchange(self, name: str) -> bool:
        return self.apply_to in ("exchanges", "all") and self._regex.search(name) is not None

    def as_json(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": self.definition, "priority": self.priority}


def best_match(policies: dict[str, Policy], queue_name: str, queue_type: str = "classic") -> Policy | None:
    matching = [p for p in policies.values() if p.applies_to_queue(queue_name, queue_type)]
    if not matching:
        return None
    return max(matching, key=lambda p: (p.priority, p.name))


def make_policy(vhost: str, name: str, body: dict[str, Any], operator: bool = False) -> Policy:
    """A Policy from a policy body as the HTTP API and definitions files carry it; ValueError if invalid."""
    p = validate_policy(body, operator)
    return Policy(name, p["pattern"], p["definition"], p["priority"], p["apply-to"], vhost)


def validate_policy(body: dict[str, Any], operator: bool = False) -> dict[str, Any]:
    """A policy body (the HTTP API's or a definitions file's) checked as RabbitMQ checks it; raises ValueError
    with the reason."""
    pattern = body.get("pattern")
    if not isinstance(pattern, str):
        raise ValueError("pattern must be a string (a regular expression)")  # noqa: TRY004
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid pattern: {exc}") from None
    definition = body.get("definition")
    if not isinstance(definition, dict) or not definition:
        raise ValueError("definition must be a non-empty object")
    problem = federation_problem(definition)
    if problem is not None:
        raise ValueError(f"Validation failed\n\n{problem}\n")
    priority = body.get("priority", 0)
    if isinstance(priority, str) and priority.lstrip("-").isdigit():
        priority = int(priority)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError("priority must be an integer")  # noqa: TRY004
    apply_to = body.get("apply-to", "queues" if operator else "all")
    if apply_to not in APPLY_TO:
        raise ValueError(f"apply-to must be one of {', '.join(APPLY_TO_IN_ERRORS)}")
    return {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to}


def federation_problem(definition: dict[str, Any]) -> str | None:
    """Why the federation keys of a policy definition are refused (RabbitMQ's reason), or None. Two of them at
    once are refused whatever their values, as RabbitMQ's validate_policy clauses match on the number of keys
    first."""
    if sum(key in definition for key in FEDERATION_KEYS) > 1:
        return FEDERATION_TOGETHER
    for key, what in FEDERATION_NAMES:
        if key in definition and not isinstance(definition[key], str):
            return f"{_erl_html(definition[key])} is not a valid {what}"
    return None


def _erl(value: Any) -> str:
    """A JSON value as Erlang's ``~p`` prints the term a policy definition decodes to (objects are maps)."""
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
    return repr(value)


def _erl_html(value: Any) -> str:
    """:func:`_erl` as RabbitMQ's HTTP API answers it in a policy's 400 reason: ``<`` and ``>`` HTML-escaped
    (measured on 3.10.8: ``[&lt;&lt;"x"&gt;&gt;] is not a valid federation upstream set name``)."""
    return _erl(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
