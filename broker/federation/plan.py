"""Which federation links a vhost asks for (pure): for each exchange (and, :func:`plan_queues`, each queue), the policy that applies to it (the
matching one of highest priority, ties to the name that sorts last, as for queues: broker/policies/policy.py) and its
``federation-upstream`` or ``federation-upstream-set`` key (``all``: every upstream of the vhost) name the
upstreams; one link per (exchange, upstream).

A policy naming an upstream or a set that does not exist asks for nothing until it is defined (RabbitMQ
starts no link either). Exchanges named ``amq.*`` are left alone, as is the default exchange, which is not in
the vhost's ``exchanges``; internal exchanges are left out by the supervisor, which sees the exchanges (RabbitMQ's
``federate/1`` answers false for them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from broker.federation.definition import UPSTREAM, UPSTREAM_SET, Upstream
from broker.policies.policy import Policy

ALL = "all"


def policy_for_exchange(policies: Iterable[Policy], exchange: str) -> Policy | None:
    matching = [p for p in policies if p.applies_to_exchange(exchange)]
    return max(matching, key=lambda p: (p.priority, p.name)) if matching else None


def upstreams_for(definition: Mapping[str, Any], parameters: Mapping[tuple[str, str], Any]) -> list[Upstream]:
    """The upstreams a policy definition names (none if it names no federation key or nothing defined)."""
    defined = {name: value for (component, name), value in parameters.items() if component == UPSTREAM}
    single = definition.get(UPSTREAM)
    if isinstance(single, str):
        value = defined.get(single)
        return [Upstream.parse(single, value)] if isinstance(value, dict) else []
    set_name = definition.get(UPSTREAM_SET)
    if not isinstance(set_name, str):
        return []
    if set_name == ALL:
        return [Upstream.parse(name, value) for name, value in sorted(defined.items()) if isinstance(value, dict)]
    entries = parameters.get((UPSTREAM_SET, set_name))
    out = []
    for entry in entries if isinstance(entries, list) else []:
        name = entry.get("upstream") if isinstance(entry, dict) else None
        value = defined.get(name) if isinstance(name, str) else None
        if isinstance(name, str) and isinstance(value, dict):
            overrides = {k: v for k, v in entry.items() if k != "upstream"}
            out.append(Upstream.parse(name, {**value, **overrides}))
    return out


def plan(exchanges: Iterable[str], policies: Iterable[Policy],
         parameters: Mapping[tuple[str, str], Any]) -> dict[tuple[str, str], Upstream]:
    """(exchange, upstream name) → the upstream as that link uses it."""
    policies = list(policies)
    wanted: dict[tuple[str, str], Upstream] = {}
    if not policies or not any(c == UPSTREAM for c, _n in parameters):
        return wanted
    for exchange in exchanges:
        if exchange == "" or exchange.startswith("amq."):
            continue
        policy = policy_for_exchange(policies, exchange)
        if policy is None:
            continue
        for upstream in upstreams_for(policy.definition, parameters):
            wanted[(exchange, upstream.name)] = upstream
    return wanted


def plan_queues(queues: Iterable[tuple[str, str]], policies: Iterable[Policy],
                parameters: Mapping[tuple[str, str], Any]) -> dict[tuple[str, str], Upstream]:
    """Queue federation: (queue, upstream name) → upstream, for ``queues`` given as (name, queue type); the
    policy that applies to a queue as broker/policies/policy.py's best_match picks it. Streams are not federated."""
    policies = list(policies)
    wanted: dict[tuple[str, str], Upstream] = {}
    if not policies or not any(c == UPSTREAM for c, _n in parameters):
        return wanted
    for name, queue_type in queues:
        if queue_type == "stream":
            continue
        matching = [p for p in policies if p.applies_to_queue(name, queue_type)]
        if not matching:
            continue
        policy = max(matching, key=lambda p: (p.priority, p.name))
        for upstream in upstreams_for(policy.definition, parameters):
            wanted[(name, upstream.name)] = upstream
    return wanted
