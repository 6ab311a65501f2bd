"""The definitions a Leveret cluster shares, and how a member keeps its memory in line with them.

In cluster mode (``cluster.postgres.dsn``) a member writes through storage/pg/shared_metadata.py: what
every member must see goes to the cluster's table in PostgreSQL, what is the node's own stays in its
SQLite store. :func:`make_where` is the rule, in broker terms:

- shared: vhosts, users, permissions, topic permissions, policies, operator policies, runtime and global
  parameters, durable exchanges, quorum queues (their messages are in PostgreSQL: any member serves them),
  bindings between exchanges and bindings to quorum queues; and the row saying the users and vhosts are
  there (a member joining a cluster takes the cluster's, never writes its own defaults over them);
- local: durable classic queues and bindings to them (their messages are in this node's files), a
  delayed-message exchange's reference to its local store, the node's storage-format row.

:class:`DefinitionsFollower` brings the other members' changes in: when the feed's doorbell rings (a NOTIFY
in every transaction that changed a definition), and every ``interval`` in case a ring was lost, it reads the
change feed (storage/pg/definitions_store.py) past the last version it applied and replays each change through
the broker's ordinary operations (declare, bind, set policy, delete...), inside the store's ``replaying``
so that they write nothing back. Those operations do what they always do, so a queue deleted on another
member cancels its consumers here, and a policy set there is applied to this member's queues at once.
A change made by this member is skipped (it is in memory already).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from broker.errors import AMQPError
from broker.exchanges.exchange import EXCHANGE, QUEUE
from broker.persistence import NODE_METADATA_KEY, binding_args_hash, untable
from broker.policies.policy import Policy
from broker.topology import Answers, Deferred, current_answers
from storage.metadata_store import MetadataStoreError
from storage.node_storage import NODE_KIND
from storage.pg.bell import Bell
from storage.pg.connections import stop_tasks
from storage.pg.definitions_store import DEFINITIONS_BELL, Change, PgDefinitionsStore
from storage.pg.shared_metadata import SplitMetadataStore, Where

log = structlog.get_logger("leveret.cluster")

# ``node`` below is broker/node.py's Node, a layer above this module (typed Any: no import upwards).

SHARED_KINDS = frozenset({"vhost", "user", "permission", "topic_permission", "policy", "operator_policy",
                          "parameter", "global_parameter", "exchange"})
# Routing's read of the feed (DefinitionsFollower.soon, for publishes to names nobody here knows) at most this
# often (seconds, from the start of one read to the start of the next); one at a time.
CATCH_UP_MIN_INTERVAL = 0.005
# A publish waits for that read at most this long (seconds; the directory's own timeout): past it, it is routed
# by what is here, and so are the publishes after it until the read ends.
SOON_WAIT = 3.0
# Queue types whose queues every member serves (their messages are in PostgreSQL).
SHARED_QUEUE_TYPES = frozenset({"quorum"})


def _queue_type(arguments: dict[str, Any]) -> str:
    value = arguments.get("x-queue-type") or "classic"
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def make_where(node: Any) -> Callable[[str, Any, Any], Where]:
    """The rule of the module docstring, for storage/pg/shared_metadata.py (``value`` None: a read or a
    delete, where a queue's or binding's side cannot be told: both are looked at)."""

    def where(kind: str, key: Any, value: Any) -> Where:
        if kind in SHARED_KINDS:
            return "shared"
        if kind == NODE_KIND:
            return "shared" if key == NODE_METADATA_KEY else "local" if key else "both"
        if kind == "queue":
            if value is None:
                return "both"
            return "shared" if _queue_type(untable(value["arguments"])) in SHARED_QUEUE_TYPES else "local"
        if kind == "binding":
            if value is None or not isinstance(key, tuple):
                return "both"
            vhost, _source, binding_kind, destination = key[:4]
            if binding_kind == EXCHANGE:
                return "shared"
            vh = node.vhosts.get(vhost)
            q = vh.queues.get(destination) if vh is not None else None
            return "shared" if q is not None and q.type_name in SHARED_QUEUE_TYPES else "local"
        return "local"

    return where


def apply_change(node: Any, change: Change) -> None:
    """Bring this member's memory in line with one change another member made (see the module
    docstring). Runs inside the store's ``replaying``: the operations below write nothing."""
    kind, key, value = change.kind, change.key, change.value
    if kind == "vhost":
        if value is None:
            node.delete_vhost(key)
        else:
            added = node.add_vhost(key, value.get("description", ""), list(value.get("tags", [])),
                                   value.get("default_queue_type", "classic"))
            added.default_queue_type = value.get("default_queue_type", "classic")
    elif kind == "user":
        if value is None:
            node.delete_users(key)
        else:
            node.put_user(key, value["password_hash"], list(value.get("tags", [])), value["hashing_algorithm"],
                          limits=dict(value.get("limits") or {}))
    elif kind == "permission":
        vhost, user = key
        if value is None:
            node.clear_permissions(user, vhost)
        elif user in node.users.users:
            node.set_permissions(user, vhost, value["configure"], value["write"], value["read"])
    elif kind == "topic_permission":
        vhost, user, exchange = key
        u = node.users.users.get(user)
        if u is None:
            return
        if value is None:
            entries = u.topic_permissions.get(vhost, {})
            entries.pop(exchange, None)
            if not entries:
                u.topic_permissions.pop(vhost, None)
        else:
            node.set_topic_permission(user, vhost, exchange, value["write"], value["read"])
    elif kind == "global_parameter":
        if value is None:
            node.clear_global_parameter(key)
        else:
            node.set_global_parameter(key, value)
    elif kind in ("policy", "operator_policy", "parameter", "exchange", "queue", "binding"):
        vh = node.vhosts.get(key[0])
        if vh is not None:
            _apply_vhost_change(node, vh, kind, key, value)


def _apply_vhost_change(node: Any, vh: Any, kind: str, key: tuple[str, ...], value: Any) -> None:
    if kind in ("policy", "operator_policy"):
        operator = kind == "operator_policy"
        if value is None:
            vh.clear_policy(key[1], operator)
        else:
            vh.set_policy(Policy(key[1], value["pattern"], value["definition"], value["priority"],
                                 value["apply-to"], vh.name), operator)
    elif kind == "parameter":
        if value is None:
            vh.clear_parameter(key[1], key[2])
        else:
            vh.set_parameter(key[1], key[2], value)
    elif kind == "exchange":
        if value is None:
            try:
                vh.delete_exchange(key[1], if_unused=False)
            except AMQPError:  # a system exchange: never deleted by anyone
                pass
        else:
            vh.restore_exchange(key[1], value["type"], value["auto_delete"], value["internal"],
                                untable(value["arguments"]))
            ex = vh.exchanges.get(key[1])
            if ex is not None:
                ex.after_recovery()
    elif kind == "queue":
        q = vh.queues.get(key[1])
        if value is None:
            if q is not None and q.type_name in SHARED_QUEUE_TYPES:
                vh.queues.delete(q, reason="deleted on another cluster member")
        elif q is None:
            vh.queues.restore(key[1], value["auto_delete"], untable(value["arguments"]))
    elif kind == "binding":
        _vhost, source, binding_kind, destination, routing_key, args_hash = key
        ex = vh.exchanges.get(source)
        if value is None:
            if ex is not None:
                for b in list(ex.bindings_to(binding_kind, destination)):
                    if b.routing_key == routing_key and binding_args_hash(b.arguments) == args_hash:
                        vh.unbind(source, destination, binding_kind, routing_key, b.arguments)
        elif ex is not None and (binding_kind != QUEUE or vh.queues.get(destination) is not None):
            try:
                vh.bind(source, destination, binding_kind, routing_key, untable(value["arguments"]))
            except AMQPError as exc:
                log.warning("a binding made on another cluster member could not be made here",
                            vhost=vh.name, source=source, destination=destination, reason=exc.text)


def _settle(waited: asyncio.Future[None]) -> None:
    if not waited.done():
        waited.set_result(None)


class DefinitionsFollower:
    """Replays the other members' changes (see the module docstring), every ``interval`` seconds. While
    PostgreSQL is out of reach it says so once and keeps polling; once it answers again (the store opens a
    new session by itself) it goes on from the last version it applied, so nothing made meanwhile is missed."""

    def __init__(self, node: Any, store: SplitMetadataStore, interval: float = 0.5) -> None:
        self.node = node
        self.store = store
        self.shared: PgDefinitionsStore = store.shared
        self.interval = interval
        self.version = 0
        self.applied = 0  # changes replayed, for tests and the curious
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._reads: set[asyncio.Task[None]] = set()  # now()'s reads for a method, held till done
        self._soon: asyncio.Task[None] | None = None  # soon()'s read on its way
        self._soon_waited: asyncio.Future[None] | None = None  # what a publish waits for: that read, or SOON_WAIT
        self._soon_at = 0.0  # when it started
        # Rung by every commit that changed a definition (storage/pg/definitions_store.py DEFINITIONS_BELL):
        # the feed is read at once, the poll stays for rings lost with a broken session.
        self._rung = asyncio.Event()
        self.bell = Bell(self.shared.dsn, DEFINITIONS_BELL, self._rung.set)

    def start(self) -> None:
        """Follow from ``version``: the feed's end as it was before the recovery pass read the table (set
        by the caller), so that a change made meanwhile is replayed (replaying is idempotent)."""
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.bell.start()

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._rung.wait(), self.interval)
            except TimeoutError:
                pass
            self._rung.clear()
            try:
                await self.catch_up()
            except MetadataStoreError as exc:  # PostgreSQL out of reach: the store reconnects at the next call
                if not self._failing:
                    log.warning("cannot read the cluster's definitions; retrying", error=str(exc))
                self._failing = True
                continue
            except Exception:  # never stop following: a member that did would drift from the cluster for good
                log.exception("following the cluster's definitions failed; retrying")
                self._failing = True
                continue
            if self._failing:
                log.info("reading the cluster's definitions again")
                self._failing = False

    async def catch_up(self) -> int:
        """Apply every change past ``version`` (the feed is read on the loop's own connection to PostgreSQL,
        after this member's writes accepted so far); returns how many."""
        n = 0
        while True:
            changes = await self.shared.changes_since(self.version)
            if not changes:
                return n
            n += self._apply(changes)

    # -- broker/topology.py CatchUp: a name this member does not know, maybe declared elsewhere a moment ago --
    def now(self) -> bool:
        """Read the feed before answering a client that names a queue or exchange this member does not know,
        which another member may have declared since the last poll (declare on one node, consume on another at
        once: RabbitMQ's cluster answers that from its replicated tables; waiting for the poll here meant a 404).
        Inside a channel's method or :func:`~broker.topology.answered_call` (broker/topology.py "Answers that come
        later"): the feed is read without the loop waiting, and the method handled again once it is applied; True
        if a change was. Outside them (a replayed change, another member's unbind request): the read is started
        for the next time and False answered at once."""
        answers = current_answers()
        if answers is None:
            self.soon()
            return False
        got, applied = answers.take(("catch_up",))
        if got:
            return bool(applied)
        read = asyncio.get_running_loop().create_task(self._catch_up_into(answers))
        self._reads.add(read)
        read.add_done_callback(self._reads.discard)
        raise Deferred(read)

    def soon(self) -> asyncio.Future[None] | None:
        """Routing's read of the feed (a publish to a name nobody here knows), without waiting: the read on its
        way, else a new one, unless one started less than CATCH_UP_MIN_INTERVAL ago (None: routed by what is
        here, as when the read on its way has been waited for SOON_WAIT already). A publish is not paced by a
        client's round trip as a 404 is, hence the rate; and a message routed inside a method (a tx.commit's, a
        dead letter) is routed now, past the point where the method could be handled again, hence no Deferred.
        The future is done when the read is, or after SOON_WAIT; it never fails (PostgreSQL not answering: the
        poll retries)."""
        if self._soon is not None:
            waited = self._soon_waited
            return None if waited is None or waited.done() else waited
        now = time.monotonic()
        if now - self._soon_at < CATCH_UP_MIN_INTERVAL:
            return None
        self._soon_at = now
        loop = asyncio.get_running_loop()
        waited = self._soon_waited = loop.create_future()
        self._soon = loop.create_task(self._read_soon(waited))
        timer = loop.call_later(SOON_WAIT, _settle, waited)
        waited.add_done_callback(lambda _f: timer.cancel())
        return waited

    async def _read_soon(self, waited: asyncio.Future[None]) -> None:
        try:
            await self.catch_up()
        except MetadataStoreError:
            pass  # PostgreSQL out of reach: the names stay unknown; the poll says so and retries
        except Exception:
            log.exception("reading the cluster's definitions for routing failed")
        finally:
            self._soon = None
            _settle(waited)

    async def _catch_up_into(self, answers: Answers) -> None:
        """:meth:`catch_up` for a method handled again once it is done: whether a change was applied goes into
        ``answers`` (False if PostgreSQL did not answer: the name stays unknown)."""
        try:
            applied = await self.catch_up() > 0
        except MetadataStoreError:
            applied = False
        except Exception:  # (the method goes on as if nothing was applied; the poll retries)
            log.exception("reading the cluster's definitions for a method failed")
            applied = False
        answers.put(("catch_up",), applied)

    def _apply(self, changes: list[Change]) -> int:
        """Replay ``changes`` (oldest first) past ``version``; returns how many were the other members'.
        One read may overlap another (the poll's and a method's): what is at or below
        ``version`` is applied already and skipped, so an old change is never replayed over a newer one."""
        n = 0
        with self.store.replaying():
            for change in changes:
                if change.version <= self.version:
                    continue
                self.version = change.version
                if change.writer == self.shared.writer:
                    continue
                try:
                    apply_change(self.node, change)
                except Exception:
                    log.exception("a definition changed on another cluster member could not be applied",
                                  kind=change.kind, key=str(change.key), version=change.version)
                n += 1
                self.applied += 1
        return n

    async def stop(self) -> None:
        await stop_tasks(self._task, self._soon)  # (re-cancelled while running: a cancel wait_for swallowed would hang)
        await self.bell.close()
