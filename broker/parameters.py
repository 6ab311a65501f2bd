"""Runtime parameters (``/api/parameters/{component}/{vhost}/{name}``, a definitions file's ``parameters``):
only components Leveret acts on are accepted.

RabbitMQ keeps a registry of parameter components; a component no plugin registered is refused with 400
``Validation failed\\n\\ncomponent shovel not found\\n`` (rabbit_runtime_parameters:lookup_component), which
is what a RabbitMQ without the shovel or federation plugin answers. Leveret registers four components,
``vhost-limits`` (broker/policies/limits.py), ``shovel`` (dynamic shovels, broker/shovel/), ``federation-upstream`` and
``federation-upstream-set`` (exchange federation, broker/federation/). The RabbitMQ federation plugin's
``federation`` component (its internal per-link state) is refused with RabbitMQ's text plus a line naming
it, never stored. A definitions file carrying a refused parameter is refused before anything in it is
applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from broker.federation import definition as federation
from broker.policies import limits
from broker.shovel import definition as shovel

log = structlog.get_logger("leveret.parameters")

# RabbitMQ plugin components Leveret does not implement → what to call the missing feature.
NOT_IMPLEMENTED = {
    "federation": "federation (RabbitMQ's rabbitmq_federation plugin)",
}
COMPONENTS = (limits.VHOST_LIMITS_COMPONENT, shovel.COMPONENT, *federation.COMPONENTS)


class ParameterError(ValueError):
    """A parameter Leveret refuses: ``str()`` is the HTTP API's 400 reason (RabbitMQ's "Validation failed"
    form), ``reason`` the line that says why (for a definitions error)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"Validation failed\n\n{reason}\n")
        self.reason = reason.replace("\n", ": ")


def _not_found(component: str) -> str:
    """RabbitMQ's reason for an unregistered component, plus what Leveret lacks when it is a known plugin's."""
    text = f"component {component} not found"
    feature = NOT_IMPLEMENTED.get(component)
    return f"{text}\n{feature} is not implemented by Leveret" if feature else text


def validate(component: str, name: str, value: Any) -> Any:
    """The value to store for parameter ``component``/``name``; raises ParameterError with the reason."""
    if component == limits.VHOST_LIMITS_COMPONENT:
        if name != limits.VHOST_LIMITS_KEY[1]:
            # RabbitMQ stores other names but reads only "limits": refused here rather than ignored.
            raise ParameterError(f"vhost limits are the parameter 'vhost-limits/limits', not 'vhost-limits/{name}'")
        try:
            return limits.validate_vhost_limits(value)
        except limits.LimitError as exc:
            raise ParameterError(str(exc)) from None
    if component == shovel.COMPONENT:
        try:
            return shovel.validate(name, value)
        except shovel.InvalidShovel as exc:
            log.warning("shovel parameter refused", shovel=name, reason=str(exc))
            raise ParameterError(str(exc)) from None
    if component in federation.COMPONENTS:
        try:
            return federation.validate(component, name, value)
        except federation.InvalidUpstream as exc:
            log.warning("federation parameter refused", component=component, name=name, reason=str(exc))
            raise ParameterError(str(exc)) from None
    raise ParameterError(_not_found(component))


def unsupported(rows: Iterable[Mapping[str, Any]], vhost: str | None = None) -> str | None:
    """For a definitions import, before anything is applied: why the first parameter is refused (a component
    Leveret does not have, or a value its component refuses, such as a shovel with an unknown key), or None, so
    that a file with a bad parameter changes nothing. ``vhost`` is the vhost of a per-vhost file."""
    for row in rows:
        component = row.get("component")
        if not isinstance(component, str):
            continue
        where = vhost if vhost is not None else row.get("vhost", "/")
        prefix = f"parameter '{row.get('name')}' of component '{component}' in vhost '{where}': "
        if component not in COMPONENTS:
            return prefix + _not_found(component).replace("\n", ": ")
        try:
            validate(component, str(row.get("name")), row.get("value"))
        except ParameterError as exc:
            return prefix + exc.reason
    return None


def supported(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The node's metadata file at start: parameters an earlier Leveret stored for components it never
    acted on (federation; shovels before broker/shovel/ existed, stored without the shovel plugin's
    validation) are dropped with a warning when this Leveret would refuse them, so that they neither stop the
    start nor pretend to work."""
    kept = []
    for row in rows:
        component = row.get("component")
        if isinstance(component, str) and component not in COMPONENTS:
            log.warning("dropping a stored parameter of a component Leveret does not implement",
                        component=component, vhost=row.get("vhost"), name=row.get("name"))
            continue
        if isinstance(component, str):
            try:
                validate(component, str(row.get("name")), row.get("value"))
            except ParameterError as exc:
                log.warning("dropping a stored parameter its component refuses", component=component,
                            vhost=row.get("vhost"), name=row.get("name"), reason=exc.reason)
                continue
        kept.append(row)
    return kept
