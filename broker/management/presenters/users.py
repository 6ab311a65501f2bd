"""Users and their permissions as the HTTP API shows them (``/api/users``, ``/api/permissions``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.security.auth import User


def user_info(user: User) -> dict[str, Any]:
    return {"name": user.name, "password_hash": user.password_hash, "hashing_algorithm": user.hashing_algorithm,
            "tags": list(user.tags), "limits": dict(user.limits)}


def permission_info(user: User, vhost: str) -> dict[str, Any]:
    p = user.permissions[vhost]
    return {"user": user.name, "vhost": vhost, **p.as_dict()}
