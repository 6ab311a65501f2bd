"""Forgetting a cluster member that will not come back (``leveret ctl forget_cluster_node``, as rabbitmqctl's
verb removes a node from a RabbitMQ cluster).

A member that stops, or dies and is reaped, keeps its rows: its node rows (shown by ``/api/nodes`` as not
running), its node-local queues' directory rows and bindings (durable queues wait there for it: a publish on
another member is forwarded and kept for it), and the messages forwarded to them. For a machine that is gone
for good, they would stay for ever and its queue names could not be declared anywhere else. Forgetting it
drops them in one transaction, as RabbitMQ drops the classic queues of a forgotten node: its node rows, its
directory rows (bindings follow by the foreign key) and the messages forwarded to it. Reservations its runs
held in shared (quorum) queues are made ready again first, so nothing in them is lost.

Only a member that is not running may be forgotten: every one of its node rows is stopped or reaped (a member
past its lease and not yet reaped is refused until a peer has reaped it, within a second or so). A start of
the same name and a forget take the same advisory lock (:data:`NAME_LOCK_CLASS`), so one runs wholly before
the other; a member whose row is gone fences itself at its next heartbeat (storage/pg/cluster.py). Its
counters in ``leveret.queue_stats`` stay: the shared queues' message_stats are totals that never go
backwards; its node-wide counters (``leveret.node_stats``) go.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from storage.pg.forwarding import DIRECTORY_BELL


class NotForgettable(Exception):
    """The member cannot be forgotten: unknown, or running (the message says which)."""

    def __init__(self, message: str, unknown: bool = False) -> None:
        super().__init__(message)
        self.unknown = unknown


class Forgotten(NamedTuple):
    """What forgetting a member removed."""

    runs: int  # node rows (one per start of the member)
    queues: int  # directory rows of its node-local queues
    forwarded: int  # messages forwarded to it that it had not taken
    requeued: int  # reservations of its runs made ready again (rows of shared queues)
    requeued_in: frozenset[int]  # the ids of the queues those rows are in (whose doorbells the caller rings)


# The advisory lock (class, hashtext(name)) a forget and a start of the same name take in their transactions
# (storage/pg/cluster.py _join), so that a member starting under that name is either forgotten whole (it was
# not running yet) or refused, never half deleted.
NAME_LOCK_CLASS = 4262
# Its runs' reservations: ready again, redelivered (as the reaper does for a dead member); their queue ids.
_REQUEUE = ("UPDATE leveret.message SET state = 0, owner = NULL, redelivered = true WHERE state IN (1, 2) "
            "AND owner = ANY($1::bigint[]) RETURNING queue_id")
# The longest a forget's statements may take (a long backlog forwarded to the member is deleted in one).
STATEMENT_TIMEOUT_MS = 60_000


async def forget_member(conn: asyncpg.Connection, name: str) -> Forgotten:
    """Remove ``name`` from the cluster (see the module's docstring); raises :class:`NotForgettable`. Other
    members are told through the directory's doorbell and read the directory again; the queues' doorbells for
    the reservations made ready are the caller's to ring after the commit (PgCluster.ring, as the reaper's)."""
    async with conn.transaction():
        await conn.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        # Serialised with a start of the same name, which inserts its node row under the same lock.
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", NAME_LOCK_CLASS, name)
        runs = await conn.fetch("SELECT epoch, dead_at IS NULL AND stopped_at IS NULL AS running "
                                "FROM leveret.node WHERE name = $1", name)
        if not runs:
            raise NotForgettable(f"node {name} is not a member of this cluster", unknown=True)
        if any(r["running"] for r in runs):
            raise NotForgettable(f"node {name} is running (or was not reaped yet): stop it first")
        epochs = [int(r["epoch"]) for r in runs]
        requeued = await conn.fetch(_REQUEUE, epochs)
        forwarded = _count(await conn.execute("DELETE FROM leveret.forward WHERE target = $1", name))
        queues = _count(await conn.execute("DELETE FROM leveret.local_queue WHERE node = $1", name))
        await conn.execute("DELETE FROM leveret.node WHERE epoch = ANY($1::bigint[])", epochs)
        await conn.execute("DELETE FROM leveret.node_stats WHERE node = $1", name)
        await conn.execute("SELECT pg_notify($1, $2)", DIRECTORY_BELL, name)
    return Forgotten(len(runs), queues, forwarded, len(requeued), frozenset(int(r[0]) for r in requeued))


def _count(status: str) -> int:
    """The row count of a command tag such as ``DELETE 3`` or ``UPDATE 0``."""
    return int(status.split()[-1])
