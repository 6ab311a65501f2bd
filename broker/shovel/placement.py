"""Where a shovel runs: on one node, here; in a cluster, on the one member that holds its claim.

A shovel's parameter is a definition every member of a cluster has (storage/pg/shared_metadata.py), so every
member's supervisor sees it. RabbitMQ runs a dynamic shovel on one node of the cluster (a mirrored supervisor)
and starts it on another when that node goes; run on every member, a shovel from an exchange would declare a
queue per member and move each message once per member. The supervisor (broker/shovel/supervisor.py) starts a
worker only where :meth:`ShovelPlacement.holds` says so, asks for the claims it lacks every
:data:`CLAIM_EVERY` seconds, and stops its workers when the claims are lost (:meth:`ShovelPlacement.lost`:
the connection that held them is gone, so another member may hold them now).

:data:`HERE` is a single node's: every shovel runs here. A cluster member's is
broker/clustering/cluster.py's, over storage/pg/claims.py (PostgreSQL advisory locks held by one session of the
member: a member that dies releases them with its session).
"""

from __future__ import annotations

from typing import Any, Protocol

CLAIM_EVERY = 1.0  # seconds between two rounds of claims for the shovels that run nowhere here


class ShovelPlacement(Protocol):
    def holds(self, key: str) -> bool:
        """Whether this node runs the shovel ``key`` (``vhost/name``) now, without asking anyone."""
        ...

    async def claim(self, key: str) -> bool:
        """Try to take the shovel ``key``; True if this node holds it now (never waits for another holder)."""
        ...

    async def release(self, key: str) -> None:
        """This node no longer runs ``key`` (its parameter cleared, the node stopping)."""
        ...

    def lost(self) -> bool:
        """The claims held so far are gone (the session that held them ended): every shovel stops here, and is
        claimed again before it runs here again."""
        ...

    async def report(self, statuses: list[dict[str, Any]]) -> None:
        """The status objects of the shovels this node runs, for the other members' listings (GET /api/shovels
        lists every member's shovels, as RabbitMQ's lists every node's)."""
        ...

    async def others(self) -> list[dict[str, Any]]:
        """The status objects the other members reported lately of the shovels they run."""
        ...


class EveryShovelHere:
    """A single node: it runs every shovel."""

    def holds(self, key: str) -> bool:
        return True

    async def claim(self, key: str) -> bool:
        return True

    async def release(self, key: str) -> None:
        return None

    def lost(self) -> bool:
        return False

    async def report(self, statuses: list[dict[str, Any]]) -> None:
        return None

    async def others(self) -> list[dict[str, Any]]:
        return []


HERE = EveryShovelHere()
