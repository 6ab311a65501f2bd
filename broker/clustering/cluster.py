"""A Leveret cluster on PostgreSQL: what turns a node into a member (``cluster.postgres.dsn``).

A member shares the cluster's definitions (broker/clustering/cluster_definitions.py: written through
storage/pg/shared_metadata.py, followed from the change feed) and serves the cluster's quorum queues,
whose messages are in PostgreSQL. This module is the member's life cycle: :meth:`Cluster.open_definitions`
while the node opens its storage (before the recovery pass reads the definitions), :meth:`Cluster.start`
once the node is up, :meth:`Cluster.stop` at shutdown.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from broker.clustering.cluster_definitions import DefinitionsFollower, make_where
from broker.clustering.cluster_errors import CannotForget, ClusterError, safe_dsn
from broker.clustering.cluster_figures import Snapshot
from broker.clustering.cluster_forwarding import ClusterForwarding
from broker.queues.message_codec import decode_message, encode_message
from broker.queues.queue_types import queue_type_of
from storage.backing_queue import BackingQueue
from storage.commits import AllOf
from storage.node_storage import NodeStorage
from storage.pg.claims import AdvisoryClaims
from storage.pg.cluster import LEASE_KEY, NameTaken, PgCluster
from storage.pg.connections import PG_FAILURES
from storage.pg.definitions_store import PgDefinitionsStore
from storage.pg.forget import Forgotten, NotForgettable
from storage.pg.queue_figures import PgQueueFigures
from storage.pg.queue_stats import Counted, PgQueueStatsWriter
from storage.pg.schema import SchemaTooNew
from storage.pg.shared_metadata import SplitMetadataStore

log = structlog.get_logger("leveret.cluster")

CLUSTER_NAME_TIMEOUT = 10.0  # seconds PUT /api/cluster-name waits for PostgreSQL's commit before a 503


class SharedQueueStore:
    """Opens the backing queue of a queue every member serves (a quorum queue) in the cluster's PostgreSQL
    (storage/pg/backing_queue.py), its messages encoded as the node's own store encodes them
    (broker/queues/message_codec.py). The queue registry's ``shared_store`` (broker/queues/amqqueue.py)."""

    def __init__(self, pg: PgCluster, vhost: str) -> None:
        self.pg = pg
        self.vhost = vhost

    def __call__(self, name: str, durable: bool, priority: int | None = None,
                 on_confirm: Any = None) -> BackingQueue:
        return self.pg.open_queue(self.vhost, name, priority=priority, on_confirm=on_confirm,
                                  encode=encode_message, decode=decode_message)


def shared_queue_counters(node: Any) -> list[Counted]:
    """This member's message counters of every shared (quorum) queue it has, in storage/pg/queue_stats.py's
    COUNTERS order (publish, deliver, get, redeliver, ack), each with the QueueStats object counting them (a
    queue deleted and declared anew is a new object: counted from zero). Read on the event loop, once a
    flush: plain attribute reads, nothing added to the paths that count."""
    out: list[Counted] = []
    for vh in list(node.vhosts.values()):
        for q in vh.queues:
            if queue_type_of(q.arguments).cluster_shared:
                s = q.stats
                out.append((vh.name, q.name, s, (s.published, s.delivered, s.get, s.redelivered, s.acked)))
    return out


class Cluster:
    """This node's membership of the cluster whose database ``dsn`` names."""

    def __init__(self, node: Any, dsn: str) -> None:
        """``node``: broker/node.py's Node (a layer above: typed Any, not imported)."""
        self.node = node
        self.dsn = dsn
        # The cluster's definitions in PostgreSQL (opened by connect(), on the event loop) and the member's
        # metadata store split over them and its SQLite one (open_definitions()).
        self.definitions: PgDefinitionsStore | None = None
        self.store: SplitMetadataStore | None = None
        self.follower: DefinitionsFollower | None = None
        self.pg: PgCluster | None = None
        # Node-local queues across the cluster (broker/clustering/cluster_forwarding.py), from start() on.
        self.forwarding: ClusterForwarding | None = None
        self.claims: AdvisoryClaims | None = None  # the shovels' claims (start)
        # The shared queues' figures as PostgreSQL counts them (storage/pg/queue_figures.py): what the HTTP
        # API and Prometheus show, the same on every member. Their message counters and rates too: this
        # member's counters go to PostgreSQL every second (storage/pg/queue_stats.py, from start() on), and
        # the rates are cut in slots of collect_statistics_interval (the same on every member).
        slot_ms = int(node.settings.collect_statistics_interval)
        self.figures = PgQueueFigures(dsn, rate_slot_ms=slot_ms)
        self.stats = PgQueueStatsWriter(dsn, node.name, lambda: shared_queue_counters(node), slot_ms=slot_ms,
                                        collect_node=node.counters.as_dict)

    async def connect(self) -> None:
        """Join: take an epoch and the connections that hold it (storage/pg/cluster.py), and read the shared
        definitions (storage/pg/definitions_store.py), before anything is recovered (the recovery pass opens the
        quorum queues in PostgreSQL and reads the definitions read here)."""
        try:
            # cluster.postgres.lease_seconds: how soon peers fence this node if it hangs (broker/config.py).
            self.pg = await PgCluster.connect(self.dsn, self.node.name,
                                              lease_seconds=float(self.node.settings.cluster_lease_seconds))
        except PG_FAILURES as exc:
            raise ClusterError(f"cannot reach the cluster's PostgreSQL at {safe_dsn(self.dsn)} "
                               f"(cluster.postgres.dsn): {exc}") from None
        except (SchemaTooNew, NameTaken) as exc:
            raise ClusterError(str(exc)) from None
        pg = self.pg
        pg.on_cluster_name = self._cluster_name_changed
        try:
            self.node.cluster_name = await pg.init_cluster_name(self.node.settings.cluster_name, self.node.name)
        except PG_FAILURES as exc:
            await pg.close()
            raise ClusterError(f"cannot read the cluster's name from PostgreSQL at {safe_dsn(self.dsn)}: "
                               f"{exc}") from None
        try:
            self.definitions = await PgDefinitionsStore.open(self.dsn, writer=self.node.name)
        except (*PG_FAILURES, SchemaTooNew) as exc:
            await pg.close()
            raise ClusterError(f"cannot read the cluster's definitions from PostgreSQL at {safe_dsn(self.dsn)}: "
                               f"{exc or 'no answer'}") from None

    def _cluster_name_changed(self, name: str) -> None:
        """The cluster's name changed (on any member): the node reports it (HTTP API, Prometheus, AMQP)."""
        if name != self.node.cluster_name:
            log.info("cluster name", name=name)
        self.node.cluster_name = name

    async def set_cluster_name(self, name: str) -> None:
        """PUT /api/cluster-name on a member: the cluster's name, for every member (storage/pg/cluster.py).
        Raises ClusterError when PostgreSQL does not commit it within CLUSTER_NAME_TIMEOUT seconds."""
        if self.pg is None or self.pg.fenced:
            raise ClusterError("this member is not connected to the cluster's PostgreSQL")
        try:
            await asyncio.wait_for(self.pg.set_cluster_name(name), CLUSTER_NAME_TIMEOUT)
        except PG_FAILURES as exc:
            raise ClusterError(f"cannot set the cluster's name: {exc or 'PostgreSQL did not answer'}") from None

    def queue_store(self, vhost: str) -> SharedQueueStore:
        assert self.pg is not None, "connect() first"
        return SharedQueueStore(self.pg, vhost)

    async def members(self) -> list[dict[str, Any]]:
        """Every node that joined: name, epoch, started_at, lease_until, alive (storage/pg/cluster.py); none
        while PostgreSQL is out of reach (the node reconnects by itself; the API lists this node alone)."""
        if self.pg is None or self.pg.fenced:
            return []
        try:
            return await self.pg.members()
        except PG_FAILURES as exc:
            log.warning("cannot list the cluster's members", error=str(exc))
            return []

    async def forget(self, name: str) -> Forgotten:
        """``leveret ctl forget_cluster_node NAME``: remove a member that is not running, with its node-local
        queues and what was forwarded to them (storage/pg/forget.py). Raises CannotForget (a running, an
        unknown or this member) or ClusterError (PostgreSQL out of reach)."""
        if self.pg is None or self.pg.fenced:
            raise ClusterError("this member is not connected to the cluster's PostgreSQL")
        try:
            gone = await self.pg.forget(name)
        except NotForgettable as exc:
            raise CannotForget(str(exc), unknown=exc.unknown) from None
        except PG_FAILURES as exc:
            raise ClusterError(f"cannot forget node {name}: {exc}") from None
        log.warning("forgot cluster member", member=name, runs=gone.runs, queues=gone.queues,
                    forwarded_messages_dropped=gone.forwarded, reservations_requeued=gone.requeued)
        return gone

    async def shared_figures(self) -> Snapshot | None:
        """The cluster's shared queues counted in PostgreSQL, at most a second old, and its live members;
        the last count while PostgreSQL does not answer (None if there was none)."""
        return await self.figures.snapshot()

    async def other_members_queues(self, vhost: str | None = None) -> list[tuple[str, str, str, dict[str, Any]]]:
        """The node-local queues of the other members, each with what its member answers of it
        (broker/clustering/cluster_forwarding.py ``other_members_queues``)."""
        if self.forwarding is None:
            return []
        return await self.forwarding.other_members_queues(vhost)

    async def other_members_queue(self, vhost: str, name: str) -> tuple[str, dict[str, Any]] | None:
        """Another member's node-local queue ``name`` of ``vhost``: (member, its answer, or ``{"state":
        "down"}``); None if no other member has one of that name (as far as the directory was last read)."""
        if self.forwarding is None:
            return None
        return await self.forwarding.other_member_queue(vhost, name)

    def open_definitions(self, storage: NodeStorage) -> SplitMetadataStore:
        """The node's metadata store becomes the split one (storage/pg/shared_metadata.py) over the definitions
        connect() read; the feed is followed from the version they were read at, so that a change made since is
        replayed."""
        shared = self.definitions
        assert shared is not None, "connect() first"
        self.store = SplitMetadataStore(storage.metadata, shared, make_where(self.node))
        storage.metadata = self.store  # the same Metadata (storage/metadata_store.py), split
        # Replies to the methods that write a definition wait for its commit (storage/commits.py): the shared
        # definitions' in PostgreSQL, the node-local ones' in SQLite.
        self.node.commits = AllOf(storage.metadata_commits, shared)
        self.follower = DefinitionsFollower(self.node, self.store)
        self.follower.version = shared.version_at_open
        log.info("cluster member", node=self.node.name, postgres=safe_dsn(self.dsn))
        return self.store

    async def start(self) -> None:
        """Follow the other members' changes (the node is recovered and about to listen)."""
        if self.definitions is not None:
            self.definitions.recovered()  # from now on the memory follows the feed; nothing reads the table
        if self.follower is not None:
            self.follower.start()
            for vh in self.node.vhosts.values():
                vh.catch_up = self.follower
        self.forwarding = ClusterForwarding(self.node, self.dsn)
        await self.forwarding.start()
        if self.store is not None:  # bind-ok waits for the directory's row too (storage/commits.py)
            assert self.node.storage is not None
            self.node.commits = AllOf(self.node.storage.metadata_commits, self.store.shared,
                                      self.forwarding.directory)
        # A dynamic shovel runs on the one member holding its claim (broker/shovel/placement.py).
        # Under the member's epoch key: a member that hangs past its lease loses its shovels with its sessions.
        pg = self.pg
        assert pg is not None
        self.claims = AdvisoryClaims(self.dsn, session_key=lambda: (LEASE_KEY, pg.epoch), node=self.node.name)
        self.node.shovels.placement = self.claims
        self.stats.start()

    def vhost_added(self, vh: Any) -> None:
        """A vhost made (or recovered) on this node: its routes to other members' queues and its reading of
        the definitions feed on a miss (broker/clustering/cluster_definitions.py DefinitionsFollower), once started."""
        if self.forwarding is not None:
            self.forwarding.attach(vh)
            if self.follower is not None:
                vh.catch_up = self.follower

    async def stop(self) -> None:
        """A clean leave: stop following, then give back this node's reservations (storage/pg/cluster.py)."""
        if self.follower is not None:
            await self.follower.stop()
        if self.forwarding is not None:
            await self.forwarding.stop()
        if self.claims is not None:  # the shovels stopped first (broker/server.py): another member takes them
            await self.claims.close()
        await self.stats.close()  # a last flush: a clean stop leaves every count in the totals
        await self.figures.close()
        if self.pg is not None:
            await self.pg.close()
