"""``/api/policies``, ``/api/operator-policies``, ``/api/parameters`` and ``/api/global-parameters``.

Policies are broker.policies.policy.Policy objects set through ``vhost.set_policy`` / ``vhost.clear_policy``,
which apply them to the vhost's queues at once (broker/policies/policy.py, broker/queues/queue_args.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker import parameters
from broker.management.common import (
    POLICY_TAGS,
    bad_request,
    body_of,
    node_of,
    not_found,
    require_admin,
    require_tags,
    respond,
    respond_list,
    vhost_for,
    visible_vhosts,
)
from broker.policies.policy import Policy, make_policy


def policy_info(vhost: str, name: str, policy: Policy) -> dict[str, Any]:
    return {**policy.as_json(), "vhost": vhost, "name": name}


def _operator(request: web.Request) -> bool:
    """Whether the request is about operator policies (/api/operator-policies) rather than policies."""
    return "operator-policies" in request.path


def _policies(request: web.Request, vh: Any) -> dict[str, Policy]:
    """The vhost's policies the request is about (its operator policies, or its policies)."""
    policies: dict[str, Policy] = vh.operator_policies if _operator(request) else vh.policies
    return policies


def _can_see(request: web.Request) -> None:
    if "operator-policies" in request.path:
        require_admin(request)


async def list_policies(request: web.Request) -> web.Response:
    _can_see(request)
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    return respond_list(request, (policy_info(vh.name, name, p) for vh in sorted(vhs, key=lambda v: v.name)
                                  for name, p in sorted(_policies(request, vh).items())))


async def get_policy(request: web.Request) -> web.Response:
    _can_see(request)
    vh = vhost_for(request)
    policy = _policies(request, vh).get(request.match_info["name"])
    if policy is None:
        raise not_found()
    return respond(policy_info(vh.name, request.match_info["name"], policy))


async def put_policy(request: web.Request) -> web.Response:
    operator = _operator(request)
    if operator:
        require_admin(request)
    else:
        require_tags(request, POLICY_TAGS, "policymaker")
    vh = vhost_for(request)
    body = await body_of(request)
    name = request.match_info["name"]
    try:
        policy = make_policy(vh.name, name, body, operator)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    existed = name in _policies(request, vh)
    vh.set_policy(policy, operator)
    return web.Response(status=204 if existed else 201)


async def delete_policy(request: web.Request) -> web.Response:
    if _operator(request):
        require_admin(request)
    else:
        require_tags(request, POLICY_TAGS, "policymaker")
    vh = vhost_for(request)
    if not vh.clear_policy(request.match_info["name"], _operator(request)):
        raise not_found()
    return web.Response(status=204)


# -- runtime parameters: only components Leveret acts on (broker/parameters.py), others refused --------------

def parameter_info(vhost: str, component: str, name: str, value: Any) -> dict[str, Any]:
    return {"vhost": vhost, "component": component, "name": name, "value": value}


async def list_parameters(request: web.Request) -> web.Response:
    component = request.match_info.get("component")
    vhs = [vhost_for(request)] if "vhost" in request.match_info else visible_vhosts(request)
    return respond_list(request, (parameter_info(vh.name, c, n, v) for vh in vhs
                                  for (c, n), v in sorted(vh.parameters.items())
                                  if component is None or c == component))


async def get_parameter(request: web.Request) -> web.Response:
    vh = vhost_for(request)
    key = (request.match_info["component"], request.match_info["name"])
    if key not in vh.parameters:
        raise not_found()
    return respond(parameter_info(vh.name, *key, vh.parameters[key]))


async def put_parameter(request: web.Request) -> web.Response:
    require_tags(request, POLICY_TAGS, "policymaker")
    vh = vhost_for(request)
    body = await body_of(request)
    if "value" not in body:
        raise bad_request("value is required")
    key = (request.match_info["component"], request.match_info["name"])
    try:
        value = parameters.validate(*key, body["value"])
    except parameters.ParameterError as exc:
        raise bad_request(str(exc)) from None
    existed = key in vh.parameters
    vh.set_parameter(*key, value)
    return web.Response(status=204 if existed else 201)


async def delete_parameter(request: web.Request) -> web.Response:
    require_tags(request, POLICY_TAGS, "policymaker")
    vh = vhost_for(request)
    if not vh.clear_parameter(request.match_info["component"], request.match_info["name"]):
        raise not_found()
    return web.Response(status=204)


async def list_global_parameters(request: web.Request) -> web.Response:
    require_admin(request)
    params = node_of(request).global_parameters
    return respond_list(request, ({"name": n, "value": v} for n, v in sorted(params.items())))


async def get_global_parameter(request: web.Request) -> web.Response:
    require_admin(request)
    params = node_of(request).global_parameters
    name = request.match_info["name"]
    if name not in params:
        raise not_found()
    return respond({"name": name, "value": params[name]})


async def put_global_parameter(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    body = await body_of(request)
    if "value" not in body:
        raise bad_request("value is required")
    name = request.match_info["name"]
    existed = name in node.global_parameters
    node.set_global_parameter(name, body["value"])
    return web.Response(status=204 if existed else 201)


async def delete_global_parameter(request: web.Request) -> web.Response:
    require_admin(request)
    node = node_of(request)
    if not node.clear_global_parameter(request.match_info["name"]):
        raise not_found()
    return web.Response(status=204)


def add_routes(router: web.UrlDispatcher) -> None:
    for base in ("/api/policies", "/api/operator-policies"):
        router.add_get(base, list_policies)
        router.add_get(base + "/{vhost}", list_policies)
        router.add_get(base + "/{vhost}/{name}", get_policy)
        router.add_put(base + "/{vhost}/{name}", put_policy)
        router.add_delete(base + "/{vhost}/{name}", delete_policy)
    router.add_get("/api/parameters", list_parameters)
    router.add_get("/api/parameters/{component}", list_parameters)
    router.add_get("/api/parameters/{component}/{vhost}", list_parameters)
    router.add_get("/api/parameters/{component}/{vhost}/{name}", get_parameter)
    router.add_put("/api/parameters/{component}/{vhost}/{name}", put_parameter)
    router.add_delete("/api/parameters/{component}/{vhost}/{name}", delete_parameter)
    router.add_get("/api/global-parameters", list_global_parameters)
    router.add_get("/api/global-parameters/{name}", get_global_parameter)
    router.add_put("/api/global-parameters/{name}", put_global_parameter)
    router.add_delete("/api/global-parameters/{name}", delete_global_parameter)
