"""Node-local queues keep working across a Leveret cluster (docs/decisions/postgres-cluster.md): a message published on
member B to a classic, exclusive or server-named queue that lives on member A, or to a direct reply-to
channel on A, reaches it, forwarded through PostgreSQL (storage/pg/forwarding.py has the tables and the SQL).

**The directory.** Each member writes a row per queue of its own (every queue type that is not
``cluster_shared``: classic, stream) and per binding of such a queue to a *shared* exchange (a durable one:
every member has it; the default exchange needs no row, the queue row is its binding). The row is written
before queue.declare-ok / queue.bind-ok, and the write is also the claim of the name: a queue name is one queue cluster-wide, as in RabbitMQ, so a declare on B of a name A holds
answers declare-ok for A's queue (405 if it is exclusive) instead of making a second one on B. A member
replaces its rows at start (its non-durable queues died with it) and drops its non-durable ones at a clean
stop; a crashed member's non-durable rows are dropped by any member's poll once the member is reaped
(storage/pg/cluster.py marks it dead). Rows of durable queues stay: the queue comes back with its member.

**The other members' view.** Every member reads the other members' rows after a doorbell (NOTIFY
``leveret_directory`` from the writer's commit) and every 2 s, into one :class:`~broker.clustering.remote_queue.RemoteRoutes`
per vhost, the vhost's topology (``VHost.use_topology``, broker/topology.py): proxies
(:class:`~broker.clustering.remote_queue.RemoteQueue`) and shadow exchanges holding the bindings to them,
which the vhost's routing runs beside the exchange's own bindings. A
client's default-exchange publish to a name nobody here knows is routed once the name is looked up in
PostgreSQL, so that an RPC reply published right after the client declared its reply queue elsewhere does not
depend on the doorbell's timing; a miss is remembered for :data:`NEGATIVE_TTL` seconds or until the directory
changes.

**Nothing on the loop waits for the directory** (issue 34). The directory's calls are awaited on the loop
(storage/pg/forwarding.py). A channel's method that needs the directory (the claim of a queue.declare, the
look-up of a name a method uses, whether the owner made a binding) has the question started and is handled
again, from its start, once the answer is in (broker/topology.py "Answers that come later", broker/amqp/channel.py):
the reply, and the channel's later frames, wait; every other client of the member is served meanwhile, those
of its classic queues too. The HTTP API's declares, binds and unbinds and a definitions import's steps do the
same as coroutines (broker/topology.py ``answered_call``). A client's publish to an unknown name waits the same
way (:meth:`VHostLink.looking_up`); routing that must answer at once (a tx.commit, a dead letter, the HTTP
API's publish) uses what is remembered and starts the look-up for the next message (:meth:`VHostLink._lookup`).
PostgreSQL not answering within the directory's timeout (3 s) is as before: the declare makes the queue here
without its row (written when PostgreSQL is back), a look-up finds nothing.

**Forwarding.** A publish routed to remote queues goes, with every other message of the event-loop burst, in
one INSERT into ``leveret.forward`` (one row per message and target member, listing the target's queues);
the publisher's confirm is sent after that commit (the queue answers CONFIRM_LATER, as a PostgreSQL-backed
queue does), a nack if it failed. The target member takes its rows in batches, in order, puts each message into
the named queues through the ordinary delivery path (broker/queues/delegate.py: deduplication, max-length, TTL
apply there) and commits the batch's DELETE only once its own stores have confirmed them: a crash in between
delivers the batch again (at least once), never loses it. A queue gone meanwhile drops its copy.

**Direct reply-to.** In a cluster a reply key starts with the member's name (base64url) and a dot, as
RabbitMQ's key encodes the channel's node; a reply published on B to a key of A is forwarded to A and
delivered there. On a single node keys are unchanged.

**What a member cannot do with another's queue** (the owner must): consume, basic.get, purge, delete, or bind it
anew — 405 RESOURCE_LOCKED naming the member to connect to. A bind the owner has already made is answered
bind-ok (Celery and kombu redeclare their bindings).

**Asking the owner.** A member asks another about its queues with a NOTIFY on ``leveret_figures_ask`` (JSON:
the member asked, an id, the vhost and names) and the owner answers on ``leveret_figures_reply`` (figures,
consumers, flags, arguments: :func:`queue_answer`; storage/pg/forwarding.py ``PgDirectory.ask``): no table, no
port. A declare of another member's queue waits for the answer (at most :data:`ASK_TIMEOUT`; not at all if
the owner has no live node row) and checks equivalence as RabbitMQ does: durable (from the directory) and the
arguments (from the answer) must match, else 406 PRECONDITION_FAILED ("inequivalent arg"); declare-ok (passive
too) carries the owner's message and consumer counts. An owner that does not answer in time: declare-ok,
unchecked, with 0 and 0 (logged). The channel waits without blocking the event loop (the answer checked and
declare-ok sent when it comes; broker/clustering/remote_queue.py ``message_count_wait``), holding its later methods back
meanwhile (broker/amqp/channel.py); a declare through the HTTP API or a definitions import awaits it
(broker/clustering/remote_queue.py ``answered``). The HTTP API lists the other members' queues the same way
(all of a member's queues in one question, answers reused :data:`LIST_MAX_AGE`).

**Unbind from another member.** queue.unbind of a binding of another member's queue stops the routing here at
once, deletes the binding's directory row (every member stops routing there at its next read, rung at once),
and forwards a request row (queue name :data:`UNBIND_REQUEST`) to the owner, which removes the binding from its
exchange and its own store as an unbind made there would; unbind-ok waits until the owner has taken the row
(at most 2 s; an owner that is down carries it out when it comes back), the event loop serving others meanwhile
(the future :meth:`VHostLink.unbind_remote` returns through ``VHost.unbind``, which the channel waits for). A
read of the directory whose snapshot predates the row's removal leaves the binding out when it lands after
(``VHostLink._unbound``): once unbind-ok or the HTTP API's 204 is sent, this member neither routes nor lists it.
An exclusive queue of another member: 405.

**A shared queue declared elsewhere a moment ago.** A declare of a quorum queue this member does not know reads
the definitions feed first (broker/queues/amqqueue.py ``declare``), so a declare racing the feed's poll is
checked against the other member's definition (406 if inequivalent) instead of overwriting it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from broker.clustering.remote_queue import RemoteQueue, RemoteRoutes, routing_type
from broker.errors import AMQPError
from broker.exchanges.exchange import QUEUE, Binding, Exchange
from broker.message import Message
from broker.persistence import binding_args_hash, table_of, untable
from broker.publish import PENDING, REPLY_TO_PREFIX
from broker.queues import delegate
from broker.queues.amqqueue import DeclaredElsewhere
from broker.queues.credit_flow import Pausable, PublisherFlow
from broker.queues.message_codec import decode_message, encode_message
from broker.queues.queue_types import Queue, queue_type_of
from broker.topology import Answers, Deferred, current_answers
from protocol.constants import INTERNAL_ERROR, PRECONDITION_FAILED
from storage.metadata_store import MetadataWriteError
from storage.pg.forwarding import DirectoryUnavailable, Forwarded, Owner, PgDirectory, PgForwarding

if TYPE_CHECKING:
    from broker.vhost import VHost

log = structlog.get_logger("leveret.cluster")

T = TypeVar("T")

NEGATIVE_TTL = 1.0  # seconds a default-exchange name the directory did not know is not looked up again
FLOW_HIGH = 20_000  # messages waiting for their forward commit before publishers are paused
FLOW_LOW = 5_000
# Messages forwarded to a live member that it has not taken yet (storage/pg/forwarding.py OWNER_LAG, read each
# poll) above which publishers to that member's queues are paused, as credit flow pauses a publisher into a
# queue that lags; they go on below OWNER_LAG_LOW. Without it a member that falls behind (a busy loop, a slow
# disk, SIGSTOP within its lease) lets the forward table grow without bound.
OWNER_LAG_HIGH = 20_000
OWNER_LAG_LOW = 5_000
LOCAL_CONFIRM_TIMEOUT = 30.0
ASK_TIMEOUT = 0.5  # seconds a declare waits for the owner's answer about its queue (flags, arguments, count)
LIST_TIMEOUT = 1.0  # seconds the HTTP API waits for the other members' lists of their queues
LIST_MAX_AGE = 1.0  # seconds those lists are reused
# The queue name of a request row in the forward table (an "amq." name no client can declare): a queue.unbind
# made on another member, for the owner to carry out.
UNBIND_REQUEST = "amq.leveret.unbind"


def _args_text(arguments: dict[str, Any]) -> str:
    return base64.b64encode(table_of(arguments)).decode()


def _args_of(text: str) -> dict[str, Any]:
    return untable(base64.b64decode(text))


def _claimable(arguments: dict[str, Any]) -> bool:
    """Whether a declare with ``arguments`` would claim its name in the directory: a node-local type (a shared
    one's definition is the feed's), named validly (an unknown type is the declare's error to give, unclaimed)."""
    try:
        return not queue_type_of(arguments).cluster_shared
    except (KeyError, TypeError, AttributeError):
        return False


def node_tag(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def tag_node(tag: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(tag + "=" * (-len(tag) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


class _Sink:
    """The publisher the forwarder is towards the local queues: it collects their confirms for one batch."""

    def __init__(self) -> None:
        self.reader = self  # credit flow: the forwarder is not paused by a queue (it waits for its confirms)
        self.published_to: set[Any] = set()
        self.waiting = 0
        self.failed = False
        self.done: asyncio.Future[None] | None = None

    def pause_for(self, reason: object) -> None:
        pass

    def resume_for(self, reason: object) -> None:
        pass

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        self.waiting -= 1
        if not stored:
            self.failed = True
        if self.waiting <= 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def forget(self) -> None:
        for q in self.published_to:
            q.publisher_channels.discard(self)
        self.published_to.clear()


class VHostLink(RemoteRoutes):
    """One vhost's side of the cluster: the remote queues and routes (RemoteRoutes), and the hooks the vhost
    and its queue registry call when this member's own queues and bindings come and go. The vhost layer's
    :class:`~broker.topology.Topology` for a cluster member (set with ``VHost.use_topology``): an adapter over
    storage/pg/forwarding.py's directory, here because storage/ does not import broker/."""

    def __init__(self, fw: ClusterForwarding, vh: VHost) -> None:
        super().__init__(vh.name)
        self.fw = fw
        self.vh = vh
        self.negative: dict[str, float] = {}
        self.lookup = self._lookup
        # Directory questions on their way for a channel's method (find, claim, bound_remotely; see
        # broker/topology.py "Answers that come later"), and the names being claimed that way: a second declare
        # of a name here waits for the first's claim (then finds its queue) rather than claim it again.
        self._questions: set[asyncio.Future[None]] = set()
        self._claiming: dict[str, asyncio.Future[None]] = {}
        self._looking: dict[str, asyncio.Future[None]] = {}  # routing's look-ups on their way (looking_up)
        # The owners' carrying out of the unbinds of their queues made here (unbind_remote), held until done.
        self._unbinds: set[asyncio.Future[None]] = set()
        # Those unbinds' bindings, (source, *Binding.key), that a read of the directory may still bring back: a
        # read whose snapshot predates the commit of the row's removal has the row, and applied after the
        # unbind (ClusterForwarding.reload) it made this member route and list the binding again until its next
        # read, after the unbind had been answered. Each maps to how many reads had started when the removal
        # committed (None: not committed yet); reads started by then leave the binding out, the first started
        # after it drops the entry (without_unbound).
        self._unbound: dict[tuple[Any, ...], int | None] = {}

    # -- other members' queues ---------------------------------------------------------------------------
    def _lookup(self, name: str) -> RemoteQueue | None:
        """Routing's look-up of a default-exchange name nobody here knows (RemoteRoutes.queue): what is
        remembered only, never a wait for PostgreSQL on the loop; the look-up is started in the background and
        its answer remembered for the next message. Routing has to answer now (a publish inside a tx.commit, a
        dead letter, the HTTP API's publish), so a message routed before the answer came goes where the
        member's last read of the directory says. A client's own publish to an unknown name does not get
        here unanswered: the channel waits for :meth:`looking_up` first (its later frames held back), so an RPC
        reply published right after its queue was declared on another member finds it, whatever the doorbell's
        timing. Misses are remembered NEGATIVE_TTL seconds (or until the directory changes)."""
        self.looking_up(name)
        return self.queues.get(name)

    def looking_up(self, name: str) -> asyncio.Future[None] | None:
        """See broker/topology.py: the look-up of ``name`` on its way (one per name at a time), or None if
        there is nothing to ask (known, a miss remembered, a direct reply-to key, the directory down)."""
        if self.vh.queues.get(name) is not None or name in self.queues or name.startswith(REPLY_TO_PREFIX):
            return None
        if self.negative.get(name, 0.0) > time.monotonic():
            return None
        looking = self._looking.get(name)
        if looking is not None:
            return looking
        if not self.fw.directory.available:
            return None
        looking = self._looking[name] = self._start(self._look_up(name))
        looking.add_done_callback(lambda _f: self._looking.pop(name, None))
        return looking

    async def _look_up(self, name: str) -> None:
        try:
            owner = await self.fw.directory.lookup(self.vhost, name)
        except DirectoryUnavailable:
            owner = None
        self._looked_up(name, owner)

    def _looked_up(self, name: str, owner: Any) -> RemoteQueue | None:
        """The directory's answer about ``name`` (an Owner, or None), remembered: the other member's queue, or
        a miss for NEGATIVE_TTL seconds."""
        if owner is None or owner.node == self.fw.name:
            negative = self.negative
            if len(negative) > 10_000:
                negative.clear()
            negative[name] = time.monotonic() + NEGATIVE_TTL
            return None
        q = self.queues[name] = self.fw.remote_queue(self.vhost, name, owner.node, owner.durable, owner.exclusive)
        return q

    def find(self, name: str) -> RemoteQueue | None:
        """A queue of another member named ``name`` (asking the directory, not the cache of misses). Inside
        ``deferring`` (a channel's method, broker/topology.py ``answered_call``) the question does not wait: it is
        started and :class:`~broker.topology.Deferred` raised, the method handled again with the answer (a name
        nobody holds, or PostgreSQL not answering within the directory's timeout: None). Outside it: what is
        known here, the look-up started for the next time."""
        self.negative.pop(name, None)
        q = self.queues.get(name)
        if q is not None:
            return q
        answers = current_answers()
        if answers is None:
            self.looking_up(name)
            return None
        try:
            owner = self._asked(answers, ("lookup", name), lambda: self.fw.directory.lookup(self.vhost, name))
        except DirectoryUnavailable:
            owner = None
        return self._looked_up(name, owner)

    def _asked(self, answers: Answers, key: tuple[Any, ...], ask: Callable[[], Awaitable[T]]) -> T:
        """The directory's answer to ``key`` if it is in ``answers`` (DirectoryUnavailable raised again if that
        was the answer); else the question ``ask`` is started and Deferred raised. A directory that did not
        answer recently answers at once (DirectoryUnavailable), as its calls do."""
        got, result = answers.take(key)
        if got:
            if isinstance(result, DirectoryUnavailable):
                raise result
            answer: T = result
            return answer
        if not self.fw.directory.available:
            raise DirectoryUnavailable("the cluster's PostgreSQL did not answer recently")
        raise Deferred(self._start(self._answer_into(answers, key, ask)))

    def _start(self, question: Awaitable[None]) -> asyncio.Future[None]:
        """A question on its way, held until answered (the loop keeps only a weak reference to a task)."""
        future = asyncio.ensure_future(question)
        self._questions.add(future)
        future.add_done_callback(self._questions.discard)
        return future

    @staticmethod
    async def _answer_into(answers: Answers, key: tuple[Any, ...], ask: Callable[[], Awaitable[Any]],
                           unused: Callable[[Any], Callable[[], None] | None] | None = None) -> None:
        """Ask, and put the answer (or the DirectoryUnavailable raised) into ``answers``; ``unused(answer)``
        gives the clean-up if the method does not take it."""
        try:
            result: Any = await ask()
        except DirectoryUnavailable as exc:
            result = exc
        answers.put(key, result, None if unused is None else unused(result))

    def has_queue(self, name: str) -> bool:
        return name in self.queues

    def bindings_to(self, source: str, queue: str) -> list[Binding]:
        shadow = self.shadows.get(source)
        return [] if shadow is None else [b for b in shadow.bindings.values() if b.destination == queue]

    # -- this member's queues and bindings (hooks) ---------------------------------------------------------
    def claim(self, name: str, durable: bool, exclusive: bool, arguments: dict[str, Any],
              owner_checks: list[Callable[[], None]] | None = None) -> RemoteQueue | None:
        """queue.declare of a queue not here: write its row (None: it is ours to make), or the other member's
        queue of that name. The equivalence check that needs the owner's answer is appended to ``owner_checks``
        for the caller to run once the answer is at hand (RemoteQueue.message_count_wait); without it, it is made
        now against the owner's last answer (unchecked if there is none)."""
        if queue_type_of(arguments).cluster_shared:
            return None  # its definition is shared (amqqueue.declare read the feed before coming here)
        try:
            owner = self._claimed(name, durable, exclusive)
        except DirectoryUnavailable as exc:
            log.warning("queue declared without its cluster directory row (written when PostgreSQL is back)",
                        vhost=self.vhost, queue=name, error=str(exc))
            return None
        self.negative.pop(name, None)
        if owner is None:
            self.queues.pop(name, None)
            return None
        q = self.queues[name] = self.fw.remote_queue(self.vhost, name, owner.node, owner.durable, owner.exclusive)
        if not (q.exclusive or exclusive):  # (an exclusive one is 405 whatever its arguments: the caller's)
            self._check_durable(q, durable)
            if owner_checks is None:
                self._check_answer(q, q.info(), durable, exclusive, arguments)
            else:
                owner_checks.append(lambda: self._check_answer(q, q.answer(), durable, exclusive, arguments))
        return q

    def _claimed(self, name: str, durable: bool, exclusive: bool) -> Any:
        """The directory's claim of ``name`` for this member: None (ours), or the Owner that holds it. Inside
        ``deferring`` (a channel's queue.declare; the HTTP API's and a definitions import's, through
        broker/topology.py ``answered_call``) it does not wait: the claim is started and Deferred raised, the
        declare handled again with its answer; declare-ok (or the error) is sent then, the channel's later frames
        held back meanwhile (broker/amqp/channel.py). A claim the declare did not use in the end (its channel
        closed, or the queue was made meanwhile by another declare) is released unless the queue is here
        (Answers.settle). Outside ``deferring``: :meth:`_claimed_later`."""
        answers = current_answers()
        if answers is None:
            return self._claimed_later(name)
        key = ("claim", name, durable, exclusive)
        got, result = answers.take(key)
        if got:
            if isinstance(result, DirectoryUnavailable):
                raise result
            return result
        if not self.fw.directory.available:
            raise DirectoryUnavailable("the cluster's PostgreSQL did not answer recently")
        claiming = self._claiming.get(name)
        if claiming is not None:
            raise Deferred(claiming)  # another declare of the name here first: handled again after it
        future = self._claiming[name] = self._start(self._answer_into(
            answers, key, lambda: self.fw.directory.claim(self.vhost, name, durable, exclusive),
            lambda owner: (lambda: self._unclaimed(name)) if owner is None else None))
        future.add_done_callback(lambda _f: self._claiming.pop(name, None))
        raise Deferred(future)

    def claim_ahead(self, answers: Answers, queues: list[tuple[str, bool, bool, dict[str, Any]]]
                    ) -> asyncio.Future[None] | None:
        """broker/topology.py: one claim for the names of ``queues`` that a declare would claim (not here, not
        shared, not exclusive), each answer put into ``answers`` under the key :meth:`_claimed` takes, with the
        release of a claim no declare used. The directory not answering is each declare's answer too (declared
        without its row, as :meth:`claim` logs)."""
        wanted: list[tuple[str, bool, bool]] = [
            (name, durable, exclusive) for name, durable, exclusive, arguments in queues
            if not exclusive and self.vh.queues.get(name) is None and name not in self._claiming
            and _claimable(arguments)]
        if not wanted or not self.fw.directory.available:
            return None
        return self._start(self._claimed_ahead(answers, wanted))

    async def _claimed_ahead(self, answers: Answers, wanted: list[tuple[str, bool, bool]]) -> None:
        try:
            owners: dict[str, Any] = await self.fw.directory.claim_many(self.vhost, wanted)
        except DirectoryUnavailable as exc:
            for name, durable, exclusive in wanted:
                answers.put(("claim", name, durable, exclusive), exc)
            return
        for name, durable, exclusive in wanted:
            owner = owners.get(name)
            answers.put(("claim", name, durable, exclusive), owner,
                        partial(self._unclaimed, name) if owner is None else None)

    def _claimed_later(self, name: str) -> Any:
        """A claim asked outside ``deferring``, where nothing may wait (no caller in the broker does: see
        broker/topology.py): the member that holds ``name`` as last read, else this member's, its row written by
        the next rewrite of this member's rows (a name another member holds meanwhile is logged then, as at
        start: ClusterForwarding._say_taken)."""
        q = self.queues.get(name)
        if q is not None:
            return Owner(q.node, q.queue_durable, q.exclusive)
        log.info("queue declared without waiting for its claim in the cluster directory (written with this "
                 "member's rows)", vhost=self.vhost, queue=name)
        self.fw.rewrite_own_rows()
        return None

    def _unclaimed(self, name: str) -> None:
        """A claim of ``name`` answered "ours" that no declare used: released, unless a queue of that name is
        here after all or another declare here is claiming it."""
        if self.vh.queues.get(name) is None and name not in self._claiming:
            self.fw.directory.release(self.vhost, name)

    def _check_durable(self, q: RemoteQueue, durable: bool) -> None:
        """The first of RabbitMQ's equivalence checks of a redeclare, against the owner's queue: durable, from
        the directory (no question to the owner)."""
        if q.queue_durable != durable:
            raise AMQPError(PRECONDITION_FAILED, f"inequivalent arg 'durable' for queue '{q.name}' in vhost "
                            f"'{self.vhost}': received '{str(durable).lower()}' but current is "
                            f"'{str(q.queue_durable).lower()}'")

    def _check_answer(self, q: RemoteQueue, info: dict[str, Any] | None, durable: bool, exclusive: bool,
                      arguments: dict[str, Any]) -> None:
        """The rest of the check: auto-delete and the arguments as the owner answered them in ``info`` (not
        checked if it did not answer in time)."""
        if info is None or "args" not in info:
            log.info("queue declared as another member's without its equivalence checked (the member did not "
                     "answer)", vhost=self.vhost, queue=q.name, member=q.node)
            return
        theirs = DeclaredElsewhere(q.name, q.queue_durable, bool(info.get("auto_delete")), _args_of(info["args"]))
        self.vh.queues.assert_equivalence(theirs, durable, exclusive, theirs.auto_delete, arguments)

    def queue_gone(self, q: Any) -> None:
        if not q.remote and not queue_type_of(q.arguments).cluster_shared:
            self.fw.directory.release(self.vhost, q.name)

    def bound_here(self, ex: Exchange, b: Binding) -> None:
        if not ex.durable or ex.name == "":
            return
        q = self.vh.queues.get(b.destination)
        if q is None or q.remote or queue_type_of(q.arguments).cluster_shared:
            return
        try:
            self.fw.directory.bind(self.vhost, ex.name, b.destination, b.routing_key, binding_args_hash(b.arguments),
                                   table_of(b.arguments), routing_type(ex))
        except DirectoryUnavailable as exc:
            log.warning("binding made without its cluster directory row (written when PostgreSQL is back)",
                        vhost=self.vhost, exchange=ex.name, queue=b.destination, error=str(exc))

    def unbound_here(self, b: Binding) -> None:
        if b.kind == QUEUE:
            self.fw.directory.unbind(self.vhost, b.source, b.destination, b.routing_key,
                                     binding_args_hash(b.arguments))

    def unbind_remote(self, b: Binding) -> asyncio.Future[None] | None:
        """queue.unbind of another member's queue (no binding of it here): stop routing it here at once, drop
        its directory row, and have the owner remove it from its exchange and store (a request row in the
        forward table, which the owner carries out within milliseconds). Returns at once a future that is done
        once the owner has taken the request (or after 2 s), or fails with a 541 if the request could not be
        written; the channel waits for it before unbind-ok (VHost.unbind passes it on)."""
        q = self.find(b.destination)
        if q is None:
            return None  # nobody's queue: unbinding what is not bound succeeds
        if q.exclusive:
            raise self.vh.queues._locked(q.name)
        key = (b.source, *b.key)
        self._unbound[key] = None  # (before the forget: a read in flight must not bring it back)
        self.forget_binding(b.source, b.destination, b.routing_key, b.arguments)
        request = json.dumps({"source": b.source, "queue": b.destination, "routing_key": b.routing_key,
                              "args": _args_text(b.arguments)}).encode()
        try:
            taken = self.fw.directory.unbind_for(q.node, self.vhost, b.source, b.destination, b.routing_key,
                                                 binding_args_hash(b.arguments), [UNBIND_REQUEST], request,
                                                 committed=lambda: self._unbind_committed(key))
        except DirectoryUnavailable as exc:  # as a definitions write that fails: 541 INTERNAL_ERROR (reader.py)
            self._unbound.pop(key, None)
            raise MetadataWriteError(f"cannot unbind queue '{q.name}' of cluster member '{q.node}' now (the "
                                     f"cluster's PostgreSQL does not answer): {exc}") from None
        done = asyncio.ensure_future(self._unbound_by_owner(q, taken, key))
        self._unbinds.add(done)  # (held until done: a caller that does not wait still logs)
        done.add_done_callback(self._unbind_over)
        return done

    def _unbind_committed(self, key: tuple[Any, ...]) -> None:
        """The directory row of the binding ``key`` is gone: a read started from now on has it right."""
        if key in self._unbound:
            self._unbound[key] = self.fw.reads

    def without_unbound(self, read: int, rows: list[tuple[str, str, str, dict[str, Any], str]]
                        ) -> list[tuple[str, str, str, dict[str, Any], str]]:
        """The binding ``rows`` of the ``read``-th read of the directory (ClusterForwarding.reload), without
        those unbound here that it may predate (see ``_unbound``)."""
        unbound = self._unbound
        if not unbound:
            return rows
        for key, at in list(unbound.items()):
            if at is not None and at < read:
                del unbound[key]  # this read started after the removal committed
        if not unbound:
            return rows
        return [r for r in rows if (r[0], *Binding(r[0], r[4], QUEUE, r[2], r[3]).key) not in unbound]

    async def _unbound_by_owner(self, q: RemoteQueue, taken: asyncio.Future[bool], key: tuple[Any, ...]) -> None:
        try:
            done = await taken
        except DirectoryUnavailable as exc:
            raise AMQPError(INTERNAL_ERROR, f"cannot unbind queue '{q.name}' of cluster member '{q.node}' now "
                            f"(the cluster's PostgreSQL does not answer): {exc}") from None
        finally:
            if key in self._unbound and self._unbound[key] is None:
                del self._unbound[key]  # not known to be committed: the next read shows the binding as it is
        if not done:
            log.info("unbind requested of a member that has not carried it out yet (it will when it takes the "
                     "request)", vhost=self.vhost, queue=q.name, member=q.node)

    def _unbind_over(self, done: asyncio.Future[None]) -> None:
        self._unbinds.discard(done)
        if not done.cancelled() and done.exception() is not None:
            log.warning("an unbind of another member's queue failed", vhost=self.vhost, error=str(done.exception()))

    def exchange_gone(self, name: str) -> None:
        self.fw.directory.unbind_source(self.vhost, name)

    def bound_remotely(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> bool:
        """Whether another member has made this binding to its queue (a redeclare of it is then bind-ok):
        known here, else asked of the directory (the doorbell may not have arrived yet); inside ``deferring``
        (a channel's queue.bind) without waiting, as :meth:`find`."""
        if self.bound(source, queue, routing_key, arguments):
            return True
        if self.find(queue) is None:
            return False
        args_hash = binding_args_hash(arguments)
        answers = current_answers()
        if answers is None:
            return False  # (what is known here, checked above)
        try:
            return self._asked(answers, ("has_binding", source, queue, routing_key, args_hash),
                               lambda: self.fw.directory.has_binding(self.vhost, source, queue, routing_key,
                                                                     args_hash))
        except DirectoryUnavailable:
            return False

    def refuse(self, name: str, action: str) -> None:
        """405 if ``name`` is another member's queue (``action``: what only its member can do)."""
        q = self.find(name)
        if q is not None:
            raise q.refuse(action)


class ClusterForwarding:
    """This member's forwarding (see the module docstring): started by broker/clustering/cluster.py once the
    node is recovered, stopped at shutdown."""

    def __init__(self, node: Any, dsn: str) -> None:
        """``node``: broker/node.py's Node (a layer above: typed Any)."""
        self.node = node
        self.name: str = node.name
        self.dsn = dsn
        self.directory = PgDirectory(dsn, self.name)
        self.pg: PgForwarding | None = None
        self.links: dict[str, VHostLink] = {}
        self.forwarded = 0  # messages handed to the forwarder (tests, bench)
        self.delivered = 0  # messages other members forwarded here, put into local queues
        self.dropped = 0  # of those, copies whose queue was gone
        self._paused = PublisherFlow(self)  # publishers paused until the forwards catch up (credit flow)
        self._reload_task: asyncio.Task[None] | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self._reload_again = False
        self._started = False
        self.reads = 0  # reads of the directory started (reload), and the newest one applied
        self._applied = 0
        # member -> (when, its answer about its queues by (vhost, name), None if it did not answer)
        self._answers: dict[str, tuple[float, dict[tuple[str, str], dict[str, Any]] | None]] = {}

    # -- life cycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            self._say_taken(await self.directory.replace_own(*self._own_rows()))
        except DirectoryUnavailable as exc:  # the poll writes them once PostgreSQL answers
            log.warning("cannot write this member's directory of node-local queues yet", error=str(exc))
        self.pg = PgForwarding(self.dsn, self.name, encode_message, self._confirmed, self._deliver,
                               self.directory_changed, self.answer, on_lag=self._release_publishers)
        await self.pg.start()
        if await self.pg.namesakes() > 0:
            log.warning("another live cluster member has this node's name (or this node's previous process is "
                        "not reaped yet): node-local queues need distinct names (leveret.nodename)", node=self.name)
        for vh in list(self.node.vhosts.values()):
            self.attach(vh)
        self.node.reply_key_prefix = node_tag(self.name) + "."
        self.node.forward_reply = self.forward_reply
        self._started = True
        await self.reload()
        log.info("forwarding to node-local queues of other members", node=self.name)

    @staticmethod
    def _say_taken(taken: list[tuple[str, str, str]]) -> None:
        """This member's queues whose names another member holds in the directory: the other members route to
        that one, so this one is reached only by this member's own clients (an operator's to sort out)."""
        for vhost, name, owner in taken:
            log.warning("this member's queue has a name another cluster member's queue holds: other members "
                        "route to theirs, not to this one (delete one of them)", vhost=vhost, queue=name,
                        holder=owner)

    def attach(self, vh: VHost) -> None:
        link = self.links.get(vh.name)
        if link is None or link.vh is not vh:
            link = self.links[vh.name] = VHostLink(self, vh)
        vh.use_topology(link)
        if self._started:
            self.directory_changed()

    async def stop(self) -> None:
        self._started = False
        self.node.forward_reply = None
        for vh in self.node.vhosts.values():
            vh.use_topology(None)
        for task in (self._reload_task, self._resync_task):
            if task is not None:
                task.cancel()
        if self.pg is not None:
            await self.pg.close()
        try:
            await self.directory.drop_transient_own()
        except DirectoryUnavailable as exc:
            log.warning("could not drop this member's non-durable queue rows (dropped when it is reaped)",
                        error=str(exc))
        await self.directory.close()

    def _own_rows(self) -> tuple[list[tuple[str, str, bool, bool]], list[tuple[str, str, str, str, str, bytes, str]]]:
        queues: list[tuple[str, str, bool, bool]] = []
        bindings: list[tuple[str, str, str, str, str, bytes, str]] = []
        for vh in self.node.vhosts.values():
            mine = set()
            for q in vh.queues:
                if queue_type_of(q.arguments).cluster_shared:
                    continue
                queues.append((vh.name, q.name, bool(q.durable), q.exclusive_owner is not None))
                mine.add(q.name)
            for ex in vh.exchanges.values():
                if not ex.durable:
                    continue
                for b in ex.bindings.values():
                    if b.kind == QUEUE and b.destination in mine:
                        bindings.append((vh.name, ex.name, b.destination, b.routing_key,
                                         binding_args_hash(b.arguments), table_of(b.arguments), routing_type(ex)))
        return queues, bindings

    # -- the other members' directory ------------------------------------------------------------------------
    def remote_queue(self, vhost: str, name: str, node: str, durable: bool, exclusive: bool) -> RemoteQueue:
        return RemoteQueue(vhost, name, node, durable, exclusive, self.forward, self.overloaded, self.throttle,
                           self._ask_owner)

    # -- questions between members about their node-local queues (storage/pg/forwarding.py ask) ---------------
    async def _ask_owner(self, q: RemoteQueue) -> dict[str, Any] | None:
        """What ``q``'s member answers of it now (a declare waits for it, at most ASK_TIMEOUT; the event loop
        goes on serving while the answer comes)."""
        return _row_of(q, await self.directory.ask(q.node, q.vhost_name, [q.name], ASK_TIMEOUT))

    def answer(self, vhost: str | None, names: list[str] | None) -> list[Any]:
        """This member's answer about its own node-local queues (``names`` of ``vhost``; all of the vhost, or
        of every vhost, when None): [vhost, name, {figures, flags, arguments}] each."""
        rows: list[Any] = []
        vhosts = [self.node.vhosts.get(vhost)] if vhost is not None else list(self.node.vhosts.values())
        for vh in vhosts:
            if vh is None:
                continue
            queues = [vh.queues.get(n) for n in names] if names is not None else list(vh.queues)
            for q in queues:
                if q is None or queue_type_of(q.arguments).cluster_shared:
                    continue
                rows.append([vh.name, q.name, queue_answer(q, self.node.queue_rates)])
        return rows

    async def other_member_queue(self, vhost: str, name: str) -> tuple[str, dict[str, Any]] | None:
        """One queue of :meth:`other_members_queues` (asked of its member now)."""
        link = self.links.get(vhost)
        q = link.queues.get(name) if link is not None else None
        if q is None:
            return None
        rows = await self.directory.ask(q.node, vhost, [name], LIST_TIMEOUT)
        for row in rows or ():
            if row[0] == vhost and row[1] == name:
                return q.node, dict(row[2])
        return q.node, {"state": "down"}

    async def other_members_queues(self, vhost: str | None = None) -> list[tuple[str, str, str, dict[str, Any]]]:
        """The other members' node-local queues as the directory lists them, with what each member answers
        of them (asked of all at once, at most LIST_TIMEOUT; an answer is reused LIST_MAX_AGE): (vhost, name,
        member, answer), the answer ``{"state": "down"}`` alone for a member that did not answer."""
        wanted: dict[str, list[RemoteQueue]] = {}
        for link in self.links.values():
            if vhost is not None and link.vhost != vhost:
                continue
            for q in link.queues.values():
                wanted.setdefault(q.node, []).append(q)
        if not wanted:
            return []
        now = time.monotonic()
        stale = [n for n in wanted if now - self._answers.get(n, (0.0, {}))[0] >= LIST_MAX_AGE]
        if stale:
            answers = await asyncio.gather(*(self.directory.ask(n, None, None, LIST_TIMEOUT) for n in stale),
                                           return_exceptions=True)
            for n, rows in zip(stale, answers, strict=True):
                by_name = {} if not isinstance(rows, list) else {(r[0], r[1]): dict(r[2]) for r in rows}
                self._answers[n] = (time.monotonic(), by_name if isinstance(rows, list) else None)
        out: list[tuple[str, str, str, dict[str, Any]]] = []
        for n, queues in wanted.items():
            known = self._answers.get(n, (0.0, None))[1]
            for q in queues:
                info = known.get((q.vhost_name, q.name)) if known is not None else None
                out.append((q.vhost_name, q.name, n, info if info is not None else {"state": "down"}))
        return out

    def directory_changed(self) -> None:
        """A doorbell or the poll: read the directory again (one read at a time, once more if rung meanwhile)."""
        self._release_publishers()  # the poll has just read the owners' lag
        if not self._started:
            return
        if self.directory.failed and self._resync_task is None:
            self._resync_task = asyncio.get_running_loop().create_task(self._resync())
        if self._reload_task is None:
            self._reload_task = asyncio.get_running_loop().create_task(self._reload_soon())
        else:
            self._reload_again = True

    def rewrite_own_rows(self) -> None:
        """Have this member's rows rewritten (replace_own) at the next read of the directory, or now."""
        self.directory.failed = True
        self.directory_changed()

    async def _resync(self) -> None:
        """A directory write was lost (PostgreSQL out of reach): rewrite this member's rows."""
        try:
            rows = self._own_rows()
            self._say_taken(await self.directory.replace_own(*rows, force=False))
            log.info("this member's directory rows rewritten")
        except DirectoryUnavailable:
            pass
        finally:
            self._resync_task = None

    async def _reload_soon(self) -> None:
        try:
            while True:
                self._reload_again = False
                await asyncio.sleep(0.005)  # a burst of rings is one read
                try:
                    await self.reload()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 (logged; the next round retries)
                    log.warning("cannot read the cluster's directory of node-local queues", error=str(exc))
                    return
                if not self._reload_again:
                    return
        finally:
            self._reload_task = None

    async def reload(self) -> None:
        """Read the other members' directory rows and route by them (a read older than one applied already
        is dropped; the bindings unbound here that the read may predate are left out: VHostLink._unbound)."""
        assert self.pg is not None
        self.reads += 1
        read = self.reads
        queue_rows, binding_rows = await self.pg.others()
        if read < self._applied:
            return
        self._applied = read
        by_vhost: dict[str, dict[str, RemoteQueue]] = {}
        for r in queue_rows:
            link = self.links.get(r.vhost)
            if link is None:
                continue
            old = link.queues.get(r.name)
            if old is not None and (old.node, old.queue_durable, old.exclusive) == (r.node, r.durable, r.exclusive):
                q = old
            else:
                q = self.remote_queue(r.vhost, r.name, r.node, r.durable, r.exclusive)
            by_vhost.setdefault(r.vhost, {})[r.name] = q
        bindings: dict[str, list[tuple[str, str, str, dict[str, Any], str]]] = {}
        for b in binding_rows:
            bindings.setdefault(b.vhost, []).append((b.source, b.routing, b.routing_key, untable(b.arguments),
                                                     b.queue))
        for name, link in self.links.items():
            link.replace(by_vhost.get(name, {}), link.without_unbound(read, bindings.get(name, [])))
            link.negative.clear()

    # -- forwarding ------------------------------------------------------------------------------------------
    def forward(self, q: RemoteQueue, msg: Message, persistent: bool, confirm: Any) -> None:
        assert self.pg is not None
        self.forwarded += 1
        self.pg.add(q.node, q.vhost_name, q.name, msg, persistent, confirm)

    def forward_reply(self, msg: Message) -> int:
        """A direct reply-to key of another member: forward the reply there (1), else 0."""
        tag, sep, _rest = msg.routing_key[len(REPLY_TO_PREFIX):].partition(".")
        node = tag_node(tag) if sep else None
        if node is None or node == self.name or self.pg is None:
            return 0
        self.forwarded += 1
        self.pg.add(node, "", msg.routing_key, msg, False, None)
        return 1

    def overloaded(self, owner: str) -> bool:
        """Whether a publisher into a queue of ``owner`` should pause: too many forwards not committed yet,
        or too many committed that ``owner`` has not taken. The rows not committed yet count towards
        ``owner``'s lag too (they may all be for it): a burst committed at once would otherwise carry the lag
        past the mark by a whole INSERT's worth before the publisher was paused."""
        pg = self.pg
        if pg is None:
            return False
        backlog = pg.backlog
        if backlog > FLOW_HIGH:
            return True
        if pg.owner_lag.get(owner, 0) + backlog > OWNER_LAG_HIGH:
            pg.refresh_owner_lag()  # the lag is an estimate that only grows between reads: read it now
            return True
        return False

    def throttle(self, reader: Pausable) -> None:
        self._paused.pause(reader)

    def _confirmed(self, confirms: list[Any], ok: bool) -> None:
        for publisher, seq in confirms:
            publisher.confirm_from_queue(seq, ok)
        self._release_publishers()

    def _release_publishers(self) -> None:
        """Let paused publishers go once the commits and every owner have caught up (the low marks)."""
        if not self._paused:
            return
        pg = self.pg
        if pg is None or (pg.backlog <= FLOW_LOW and all(n <= OWNER_LAG_LOW for n in pg.owner_lag.values())):
            self._paused.release()

    def _deliver(self, rows: list[Forwarded]) -> Awaitable[None] | None:
        """A batch other members forwarded here: into the local queues now (in order); the awaitable returned
        is done once they have it stored (the batch's DELETE then commits)."""
        sink = _Sink()
        node = self.node
        seq = 0
        for row in rows:
            if row.queues == [UNBIND_REQUEST]:
                self._unbind_requested(row)
                continue
            msg = decode_message(row.body)
            targets = []
            for name in row.queues:
                if name.startswith(REPLY_TO_PREFIX):
                    if not node.deliver_reply(msg):
                        self.dropped += 1
                    continue
                vh = node.vhosts.get(row.vhost)
                q = vh.queues.get(name) if vh is not None else None
                if q is None:
                    self.dropped += 1
                    continue
                targets.append(q)
            if targets:
                seq += 1
                result = delegate.deliver(targets, msg, row.persistent, sink, seq)
                sink.waiting += result >> PENDING
                self.delivered += len(targets)
        if sink.waiting <= 0:
            sink.forget()
            return None
        sink.done = asyncio.get_running_loop().create_future()
        return self._stored(sink)

    def _unbind_requested(self, row: Forwarded) -> None:
        """Another member's queue.unbind of a binding of this member's queue (VHostLink.unbind_remote)."""
        try:
            r = json.loads(row.body)
            source, queue, key, arguments = r["source"], r["queue"], r["routing_key"], _args_of(r["args"])
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            log.warning("an unbind request from another member cannot be read; dropped", error=str(exc))
            return
        vh = self.node.vhosts.get(row.vhost)
        if vh is None or vh.queues.get(queue) is None:
            return  # the queue is gone, and its bindings with it
        try:
            vh.unbind(source, queue, QUEUE, key, arguments)
        except AMQPError as exc:
            log.warning("an unbind requested by another member failed", vhost=row.vhost, queue=queue,
                        exchange=source, reason=exc.text)

    async def _stored(self, sink: _Sink) -> None:
        try:
            assert sink.done is not None
            await asyncio.wait_for(sink.done, LOCAL_CONFIRM_TIMEOUT)
        finally:
            sink.forget()
        if sink.failed:
            raise RuntimeError("a local queue could not store forwarded messages: the batch is taken again")


def _row_of(q: RemoteQueue, rows: list[Any] | None) -> dict[str, Any] | None:
    """``q``'s row of an owner's answer (None if it did not answer, or not about ``q``)."""
    for row in rows or ():
        if row[0] == q.vhost_name and row[1] == q.name:
            return dict(row[2])
    return None


def queue_answer(q: Queue, rates_of: Callable[[Queue], dict[str, float]] | None = None) -> dict[str, Any]:
    """One of this member's queues as it answers another member's question (figures, flags, arguments, its
    message counters, and their rates and its counts' as ``rates_of`` (the node's rate sampler) has them), so
    that the asker shows what this member shows."""
    f = q.figures()
    return {"stats": q.stats.message_stats(), "rates": rates_of(q) if rates_of is not None else {},
            "count": q.message_count(), "ready": f.ready, "unacked": f.unacked, "ready_bytes": f.ready_bytes,
            "unacked_bytes": f.unacked_bytes, "paged_out": f.paged_out, "consumers": q.consumers.count,
            "durable": bool(q.durable), "exclusive": q.exclusive_owner is not None,
            "auto_delete": bool(q.auto_delete), "type": q.type_name, "args": _args_text(q.arguments),
            "policy": q.settings.policy, "publishers": len(q.publisher_channels)}
