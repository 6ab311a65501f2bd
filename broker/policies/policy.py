"""Policies and operator policies (RabbitMQ's ``rabbit_policy``): a regex over object names, what kinds of
object they apply to, a priority, and a definition of keys such as ``message-ttl`` or ``max-length``.

One policy applies per object: the matching one with the highest priority (ties: the name that sorts
last, as RabbitMQ's sort does). Client arguments beat policy values; operator policy values beat both,
the lower number winning (see broker/queues/queue_args.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

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
    priority = body.get("priority", 0)
    if isinstance(priority, str) and priority.lstrip("-").isdigit():
        priority = int(priority)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError("priority must be an integer")  # noqa: TRY004
    apply_to = body.get("apply-to", "queues" if operator else "all")
    if apply_to not in APPLY_TO:
        raise ValueError(f"apply-to must be one of {', '.join(APPLY_TO_IN_ERRORS)}")
    return {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to}
