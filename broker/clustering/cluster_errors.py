"""What a node that is not in a cluster still needs to know of one: the errors a join or a forget raises and a
DSN fit to show. Kept apart from broker/clustering/cluster.py so that a node without ``cluster.postgres.dsn`` never imports
the cluster (asyncpg and storage/pg: about a fifth of a broker's start-up imports) — the server imports it only
when it joins one."""

from __future__ import annotations


class ClusterError(Exception):
    """The node cannot join the cluster (PostgreSQL unreachable, refused, or of a newer schema)."""


class CannotForget(Exception):
    """``Cluster.forget`` of a member that cannot be forgotten: ``unknown`` (never joined), else running or
    this member. The HTTP API's 404 or 400: raised here, so that broker/management/ need not know storage/pg."""

    def __init__(self, message: str, unknown: bool = False) -> None:
        super().__init__(message)
        self.unknown = unknown


def safe_dsn(dsn: str) -> str:
    """The DSN without its password, for logs and errors."""
    head, sep, tail = dsn.partition("@")
    if not sep or "://" not in head:
        return dsn
    scheme, _, userinfo = head.partition("://")
    return f"{scheme}://{userinfo.split(':', 1)[0]}@{tail}"
