"""The cluster-wide figures of the shared queues, as the HTTP API and the metrics read them, declared here so that
broker/management/ and broker/prometheus/metrics.py depend on this and not on storage/pg/ (docs/architecture.md, "Seams").

A cluster member's broker/clustering/cluster.py ``Cluster.shared_figures`` answers one :class:`Snapshot` (implemented by
storage/pg/queue_figures.py's ``Snapshot``, which mypy checks against this where ``shared_figures`` is
declared): the counts every member reads the same way from PostgreSQL, the live members, and the message
counters and rates summed over them. A single node has none (``None``) and shows each queue's own figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class QueueCounts(Protocol):
    """A shared queue's messages as PostgreSQL counts them (unacked: reserved by some member)."""

    @property
    def ready(self) -> int: ...

    @property
    def unacked(self) -> int: ...

    @property
    def ready_bytes(self) -> int: ...

    @property
    def unacked_bytes(self) -> int: ...


class QueueActivity(Protocol):
    """A shared queue's message counters summed over the members (``publish``, ``deliver``, ``get``, ``ack``,
    ``redeliver``, ...) and their rates per second over the last sampled slot."""

    @property
    def counts(self) -> Mapping[str, int]: ...

    @property
    def rates(self) -> Mapping[str, float]: ...


class MemberGrowth(Protocol):
    """One member's counter growth (``growth``) over its last sampled slot of ``seconds``."""

    @property
    def growth(self) -> Mapping[str, int]: ...

    @property
    def seconds(self) -> float: ...


class Snapshot(Protocol):
    """The cluster's shared queues counted at one moment (a queue not counted is all zero)."""

    @property
    def members(self) -> Sequence[str]:
        """The live members' names, sorted (a quorum queue's ``members`` and ``online``)."""
        ...

    @property
    def member_counters(self) -> Mapping[str, Mapping[str, int]]:
        """Each member's node counters as it last flushed them (the overview sums them)."""
        ...

    @property
    def member_deltas(self) -> Sequence[MemberGrowth]: ...

    def counts(self, vhost: str, name: str) -> QueueCounts: ...

    def activity(self, vhost: str, name: str) -> QueueActivity: ...

    def leader(self, vhost: str, name: str, asker: str) -> str:
        """The member that reports the queue (to Prometheus, as the HTTP API's ``leader``), as ``asker`` sees
        the members: the same on every member."""
        ...
