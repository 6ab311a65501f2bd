"""What every resource module of the HTTP API shares: RabbitMQ's error bodies, who may see what (tags and
vhost permissions), JSON conversion of AMQP values, the ``columns`` / ``sort`` / ``name`` query options of
list endpoints, and request bodies."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.errors import AMQPError
from broker.management.name_filter import name_matcher, page_params
from broker.management.request_bodies import read_json
from broker.security.auth import User

if TYPE_CHECKING:
    from broker.node import Node
    from broker.vhost import VHost

MONITOR_TAGS = ("administrator", "monitoring")
POLICY_TAGS = ("administrator", "policymaker")
API_TAGS = ("administrator", "monitoring", "policymaker", "management")


# -- errors, as RabbitMQ's rabbit_mgmt_util writes them ---------------------------------------------------------

def _error(cls: type[web.HTTPException], error: str, reason: str, **headers: str) -> web.HTTPException:
    return cls(text=json.dumps({"error": error, "reason": reason}), content_type="application/json",
               headers=headers or None)


def not_found(reason: str = "Not Found") -> web.HTTPException:
    return _error(web.HTTPNotFound, "Object Not Found", reason)


def bad_request(reason: str) -> web.HTTPException:
    return _error(web.HTTPBadRequest, "bad_request", reason)


def conflict(reason: str) -> web.HTTPException:
    return _error(web.HTTPConflict, "conflict", reason)


def unavailable(reason: str) -> web.HTTPException:
    """503: what the request needs is out of reach now (the cluster's PostgreSQL); worth asking again."""
    return _error(web.HTTPServiceUnavailable, "service_unavailable", reason)


def not_authorised(reason: str) -> web.HTTPException:
    return _error(web.HTTPUnauthorized, "not_authorised", reason)


def unauthenticated(reason: str = "Login failed") -> web.HTTPException:
    return _error(web.HTTPUnauthorized, "not_authorised", reason,
                  **{"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'})


def amqp_error(exc: AMQPError) -> web.HTTPException:
    """An AMQP refusal from the broker's own code paths, mapped as RabbitMQ's management plugin maps them."""
    if exc.reply_code == 404:
        return not_found(exc.text)
    if exc.reply_code in (403, 530):
        return not_authorised(exc.text)
    return bad_request(exc.text)


# -- the request's node and user ----------------------------------------------------------------------------------

def node_of(request: web.Request) -> Node:
    node: Node = request.app["node"]
    return node


def user_of(request: web.Request) -> User:
    user: User = request["user"]  # put there by the authentication middleware
    return user


def require_tags(request: web.Request, tags: tuple[str, ...], what: str) -> None:
    if not user_of(request).has_tag(*tags):
        raise not_authorised(f"Not {what} user")


def require_admin(request: web.Request) -> None:
    require_tags(request, ("administrator",), "administrator")


def sees_all(user: User) -> bool:
    return user.has_tag(*MONITOR_TAGS)


def visible_vhosts(request: web.Request) -> list[VHost]:
    """The vhosts the user may look into: all for monitoring/administrator, else those it has permissions in."""
    node, user = node_of(request), user_of(request)
    return [vh for name, vh in node.vhosts.items() if sees_all(user) or name in user.permissions]


def vhost_for(request: web.Request, name: str | None = None) -> VHost:
    """The vhost named in the path (``{vhost}``), 404 if missing, 401 if the user may not see it."""
    node, user = node_of(request), user_of(request)
    name = request.match_info["vhost"] if name is None else name
    vh = node.vhosts.get(name)
    if vh is None:
        raise not_found()
    if not sees_all(user) and name not in user.permissions:
        raise not_authorised("User not authorised to access virtual host")
    return vh


def vhost_for_write(request: web.Request, name: str | None = None) -> VHost:
    """Operating on objects needs permissions in the vhost for every user, administrators included,
    as RabbitMQ's API does (it acts over an internal AMQP connection as the user)."""
    vh = vhost_for(request, name)
    user = user_of(request)
    if vh.name not in user.permissions:
        raise not_authorised(f"access to vhost '{vh.name}' refused for user '{user.name}'")
    return vh


# -- JSON ---------------------------------------------------------------------------------------------------------

def respond(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


def _get_path(item: dict[str, Any], dotted: str) -> Any:
    cur: Any = item
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _set_path(out: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = out
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def respond_list(request: web.Request, items: Iterable[dict[str, Any]]) -> web.Response:
    """A list endpoint with RabbitMQ's query options: ``name`` (a filter, ``use_regex=true`` for a regex),
    ``sort`` / ``sort_reverse``, ``columns`` (comma-separated, dotted for nested fields), ``page`` /
    ``page_size`` (then the answer is RabbitMQ's paged object)."""
    q = request.query
    rows = list(items)
    match = name_matcher(q)  # bounded: no backtracking-prone regex from a query (name_filter.py)
    if match is not None:
        rows = [r for r in rows if match(str(r.get("name", "")))]
    if q.get("sort"):
        key = q["sort"]
        rows.sort(key=lambda r: (_get_path(r, key) is None, str(_get_path(r, key))
                                 if not isinstance(_get_path(r, key), (int, float)) else _get_path(r, key)))
    if q.get("sort_reverse") == "true":
        rows.reverse()
    if q.get("columns"):
        cols = [c.strip() for c in q["columns"].split(",") if c.strip()]
        trimmed = []
        for r in rows:
            out: dict[str, Any] = {}
            for c in cols:
                v = _get_path(r, c)
                if v is not None:
                    _set_path(out, c, v)
            trimmed.append(out)
        rows = trimmed
    params = page_params(q)
    if params is not None:
        page, size = params
        total = len(rows)
        chunk = rows[(page - 1) * size: page * size]
        return respond({"items": chunk, "page": page, "page_size": size, "page_count": -(-total // size),
                        "item_count": len(chunk), "filtered_count": total, "total_count": total})
    return respond(rows)


async def body_of(request: web.Request) -> dict[str, Any]:
    """The JSON object a PUT or POST sent ({} for no body); 400 if it is not an object. Read within the
    request's size limit (broker/management/request_bodies.py)."""
    data = await read_json(request)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise bad_request("expected a JSON object")
    return data


def as_bool(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad_request(f"expected a boolean, got {value!r}")


def as_tags(value: Any) -> list[str]:
    """Tags as RabbitMQ accepts them: a list, or one comma-separated string."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a list or a comma-separated string")
