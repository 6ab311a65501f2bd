"""The ``leveret`` schema in PostgreSQL and its versioned migrations (documented in SCHEMA.md beside this file).

Why versioned: nodes of different Leveret releases meet one database. A node applies, in one transaction and
under a transaction advisory lock (so two nodes starting together do not both migrate), every migration above
the recorded ``leveret.schema_version``; it refuses a database whose version is newer than the newest it knows,
since it cannot know what that version changed.

Every migration is listed here, whichever module uses its tables (version 2 is storage/pg/definitions_store.py's
table, version 4 storage/pg/queue_stats.py's): a list that modules added to as they were imported made the
newest version depend on what a process happened to import, and a process that imported less refused a
database another had migrated further.
"""

from __future__ import annotations

import asyncpg

# pg_advisory_xact_lock key under which migrations run (one migrator at a time, cluster-wide).
MIGRATION_LOCK_KEY = 4240

MIGRATION_1 = """
CREATE SCHEMA IF NOT EXISTS leveret;
-- Blocks of seq ids: a node takes one value b and numbers its publishes b << 16 .. (b << 16) + 65535 itself, so
-- publish() can answer its seq id at once (the BackingQueue contract) and ordering still follows the sequence.
CREATE SEQUENCE leveret.seq_block;
CREATE SEQUENCE leveret.node_epoch MAXVALUE 2147483647;  -- advisory keys take the epoch as an int4

CREATE TABLE leveret.queue (
  queue_id   integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  vhost      text NOT NULL,
  name       text NOT NULL,
  arguments  jsonb NOT NULL DEFAULT '{}',
  UNIQUE (vhost, name));

CREATE TABLE leveret.node (            -- one row per node start; epoch is the fencing token
  epoch       bigint PRIMARY KEY,
  name        text NOT NULL,
  lease_pid   integer NOT NULL,
  lease_until timestamptz NOT NULL,
  started_at  timestamptz NOT NULL DEFAULT now(),
  stopped_at  timestamptz,             -- clean stop (close)
  dead_at     timestamptz);            -- reaped by a peer

CREATE TABLE leveret.message (
  seq            bigint   PRIMARY KEY,  -- from the node's block of leveret.seq_block
  queue_id       integer  NOT NULL,
  priority       smallint NOT NULL DEFAULT 0,
  state          smallint NOT NULL DEFAULT 0,   -- 0 ready, 1 reserved by owner (2: marked by a purge, version 9)
  owner          bigint,                        -- node epoch while reserved
  redelivered    boolean  NOT NULL DEFAULT false,
  delivery_count integer  NOT NULL DEFAULT 0,
  persistent     boolean  NOT NULL,
  expiry         bigint,                        -- the owner's absolute expiry (ms); stored, never interpreted
  size           integer  NOT NULL,
  body           bytea    NOT NULL)
WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000);
CREATE INDEX message_ready ON leveret.message (queue_id, priority DESC, seq) WHERE state = 0;
CREATE INDEX message_owner ON leveret.message (owner) WHERE state = 1;
"""

# The cluster's shared definitions (storage/pg/definitions_store.py): its rows and the change feed.
MIGRATION_2 = """
CREATE SEQUENCE leveret.definition_version;
CREATE TABLE leveret.definition (
    kind    text   NOT NULL,
    key     text   NOT NULL,
    value   bytea,                 -- msgpack; NULL: deleted (a tombstone, kept so the feed carries it)
    version bigint NOT NULL,       -- from leveret.definition_version, drawn under the definitions lock
    writer  text   NOT NULL,       -- the node that wrote it (a member skips its own changes in the feed)
    PRIMARY KEY (kind, key));
CREATE INDEX definition_by_version ON leveret.definition (version);
"""

# Node-local queues across the cluster (storage/pg/forwarding.py, broker/clustering/cluster_forwarding.py): the directory of
# every member's own queues and of their bindings from shared exchanges, and the messages forwarded to them.
MIGRATION_3 = """
CREATE TABLE leveret.local_queue (
    vhost     text    NOT NULL,
    name      text    NOT NULL,
    node      text    NOT NULL,    -- the member whose queue it is (its node name: kept across its restarts)
    durable   boolean NOT NULL,
    exclusive boolean NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE INDEX local_queue_node ON leveret.local_queue (node);
CREATE TABLE leveret.local_binding (
    vhost       text  NOT NULL,
    source      text  NOT NULL,    -- a shared (durable) exchange
    queue       text  NOT NULL,
    routing_key text  NOT NULL,
    args_hash   text  NOT NULL,
    arguments   bytea NOT NULL,    -- the broker's encoding of the binding's arguments (opaque here)
    routing     text  NOT NULL,    -- how the source routes: direct, fanout, topic or headers
    node        text  NOT NULL,
    PRIMARY KEY (vhost, source, queue, routing_key, args_hash),
    FOREIGN KEY (vhost, queue) REFERENCES leveret.local_queue ON DELETE CASCADE);
CREATE TABLE leveret.forward (
    id         bigserial PRIMARY KEY,
    target     text    NOT NULL,   -- the node name of the queues' owner
    vhost      text    NOT NULL,
    queues     text[]  NOT NULL,
    persistent boolean NOT NULL,
    body       bytea   NOT NULL)   -- the broker's message encoding (broker/queues/message_codec.py)
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0,
      autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000);
CREATE INDEX forward_target ON leveret.forward (target, id);
"""

# The shared queues' message counters and rate samples (storage/pg/queue_stats.py): every member's counts per
# queue, summed by whoever is asked, so message_stats and its rates are the same on every member.
MIGRATION_4 = """
CREATE TABLE leveret.queue_stats (
    queue_id      integer NOT NULL,
    node          text    NOT NULL,  -- the member's node name (kept across its restarts)
    source        bigint  NOT NULL,  -- the counters src_* are of (one queue object of one run of the member)
    publish       bigint  NOT NULL,  -- the member's totals, over all its sources
    deliver       bigint  NOT NULL,
    get           bigint  NOT NULL,
    redeliver     bigint  NOT NULL,
    ack           bigint  NOT NULL,
    src_publish   bigint  NOT NULL,  -- what the source had counted at its last flush
    src_deliver   bigint  NOT NULL,
    src_get       bigint  NOT NULL,
    src_redeliver bigint  NOT NULL,
    src_ack       bigint  NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, node));
CREATE TABLE leveret.queue_stats_sample (
    queue_id  integer NOT NULL,
    node      text    NOT NULL,
    slot_ms   integer NOT NULL,      -- the slot length the member samples at (collect_statistics_interval)
    slot      bigint  NOT NULL,      -- floor(PostgreSQL's epoch in ms / slot_ms) when taken
    taken_at  timestamptz NOT NULL,  -- PostgreSQL's now() when taken
    publish   bigint  NOT NULL,      -- the member's totals then (leveret.queue_stats)
    deliver   bigint  NOT NULL,
    get       bigint  NOT NULL,
    redeliver bigint  NOT NULL,
    ack       bigint  NOT NULL,
    PRIMARY KEY (queue_id, node, slot));
CREATE INDEX queue_stats_sample_node ON leveret.queue_stats_sample (node, slot);
"""

# The shared queues' message counts in the rate samples (storage/pg/queue_stats.py), so that the rates of
# messages, messages_ready and messages_unacknowledged are the same on every member too: counted by PostgreSQL
# when a member writes its sample of a slot (NULL in the samples written before).
MIGRATION_5 = """
ALTER TABLE leveret.queue_stats_sample ADD COLUMN ready bigint, ADD COLUMN unacked bigint;
CREATE INDEX message_reserved ON leveret.message (queue_id) WHERE state = 1;
"""

# Each member's node-wide counters (storage/pg/queue_stats.py): the overview's message_stats sum them over the
# live members, so every member shows the cluster's traffic, as RabbitMQ's overview does.
MIGRATION_6 = """
CREATE TABLE leveret.node_stats (
    node       text  PRIMARY KEY,               -- the member's node name; its current run's counters
    counters   jsonb NOT NULL,                  -- {counter name: value} (broker/observability/counters.py GlobalCounters)
    updated_at timestamptz NOT NULL DEFAULT now());
"""

# Samples of each member's node-wide counters, one per rate slot (storage/pg/queue_stats.py): the overview's
# message rates from PostgreSQL's clock, the same on every member asked in one slot (as the queues' in version 4).
MIGRATION_7 = """
CREATE TABLE leveret.node_stats_sample (
    node     text    NOT NULL,
    slot_ms  integer NOT NULL,                  -- the slot length the member samples by
    slot     bigint  NOT NULL,                  -- floor(epoch ms of taken_at / slot_ms)
    taken_at timestamptz NOT NULL,
    counters jsonb   NOT NULL,                  -- as in leveret.node_stats
    PRIMARY KEY (node, slot_ms, slot));
"""

# The cluster's own settings, one row each (storage/pg/cluster.py): its name (RabbitMQ's cluster_name) is one for
# the cluster, the same on every member, not each member's own.
MIGRATION_8 = """
CREATE TABLE leveret.cluster_setting (
    key        text PRIMARY KEY,               -- 'cluster_name'
    value      text NOT NULL,
    writer     text NOT NULL,                  -- the member that set it
    updated_at timestamptz NOT NULL DEFAULT now());
"""

# A purge marks the rows other members hold (state 2) until each holder answers (storage/pg/purge.py): the
# holder's answer and the reaper find them by this index (rows are in state 2 for milliseconds).
MIGRATION_9 = """
CREATE INDEX message_purging ON leveret.message (owner, queue_id) WHERE state = 2;
"""

# The status of each shovel as the member running it last reported it (storage/pg/claims.py): every member's
# GET /api/shovels lists every member's shovels, as RabbitMQ's lists every node's.
MIGRATION_10 = """
CREATE TABLE leveret.shovel_status (
    vhost      text NOT NULL,
    name       text NOT NULL,
    node       text NOT NULL,                  -- the member that runs it
    status     jsonb NOT NULL,                 -- GET /api/shovels' object, as that member made it
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (vhost, name));
"""

# (version, sql), ascending. Append only: a released migration never changes.
MIGRATIONS: list[tuple[int, str]] = [(1, MIGRATION_1), (2, MIGRATION_2), (3, MIGRATION_3), (4, MIGRATION_4),
                                     (5, MIGRATION_5), (6, MIGRATION_6), (7, MIGRATION_7),
                                     (8, MIGRATION_8), (9, MIGRATION_9), (10, MIGRATION_10)]


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer Leveret than this one."""


def latest_version() -> int:
    return MIGRATIONS[-1][0]


async def current_version(conn: asyncpg.Connection) -> int:
    """The database's schema version; 0 for a database without the ``leveret`` schema."""
    exists = await conn.fetchval("SELECT to_regclass('leveret.schema_version') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM leveret.schema_version"))


async def migrate(conn: asyncpg.Connection, migrations: list[tuple[int, str]] | None = None) -> int:
    """Bring the database to the last of ``migrations`` (default: every registered one); returns the version
    it had. Raises :class:`SchemaTooNew` when the database is past it."""
    migrations = MIGRATIONS if migrations is None else migrations
    latest = migrations[-1][0]
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await conn.execute("CREATE SCHEMA IF NOT EXISTS leveret")
        await conn.execute("CREATE TABLE IF NOT EXISTS leveret.schema_version ("
                           "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        before = await current_version(conn)
        if before > latest:
            raise SchemaTooNew(f"the database's leveret schema is version {before}, newer than this Leveret's "
                               f"{latest}: upgrade this node before it joins the cluster")
        for version, sql in migrations:
            if version > before:
                await conn.execute(sql)
                await conn.execute("INSERT INTO leveret.schema_version (version) VALUES ($1)", version)
    return before
