"""What the vhost layer needs of the other members of a cluster, declared (docs/architecture.md, "Seams").

A vhost (broker/vhost.py), its queue registry (broker/queues/amqqueue.py), the channel and the HTTP API's bindings ask
one object about the queues and bindings that live on other members: :class:`Topology`. A single node has
:class:`LocalTopology`, which knows of no other member, so the callers hold no ``is not None`` branch and mypy
checks every call; a cluster member has broker/clustering/cluster_forwarding.py's ``VHostLink``, which implements it over
storage/pg/forwarding.py's directory (an adapter in broker/: storage/ never imports broker/).

The hot path does not call the null object: :attr:`broker.vhost.VHost.clustered`, a bool set with the topology
(``VHost.use_topology``), is what routing tests per message, as it tested ``remote is not None`` before.

The definitions feed is the second thing a member may be behind on: :class:`CatchUp` is asked before a name
this member does not know is answered with 404 or routed nowhere (broker/clustering/cluster_definitions.py
``DefinitionsFollower``); :data:`NEVER_BEHIND` is a single node's.

**Answers that come later.** A member asks the directory in PostgreSQL about names it does not know (a claim of
a name a queue.declare would make here, the look-up of a name a method uses, whether the owner made a binding).
Nothing on the event loop may wait for that answer: a frozen PostgreSQL would stall every client of the member,
those of its own classic queues too (issue 34). A caller that can answer later (a channel's method, the HTTP
API) handles the method inside :func:`deferring`, with an :class:`Answers` of its own: the topology then starts
the question without waiting and raises :class:`Deferred`; the caller handles the method again from its start
once the answer is in (the topology takes it from the Answers instead of asking). A method raises Deferred
before it has changed anything, so handling it again is as handling it the first time, with the answer at hand.
A coroutine (an HTTP API handler, a definitions import) does the same with :func:`answered_call`.

Outside :func:`deferring` nothing waits either, and nothing is asked synchronously: the topology and the feed
answer from what this member knows and start the question for the next time (routing, which must answer at once:
a tx.commit's publishes, a dead letter). No caller in the broker asks a claim or a look-up that way; one that
did would have its claim written by the next rewrite of the member's rows (broker/clustering/cluster_forwarding.py).

This module sits below broker/queues/amqqueue.py and broker/vhost.py in the layers (pyproject.toml) and
imports only what lies below them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from broker.deduplication import DedupCache
    from broker.exchanges.exchange import Binding, Exchange
    from broker.message import Message

T = TypeVar("T")


class ConsumerCount(Protocol):
    """How many consumers a queue has (what a queue.declare-ok reports)."""

    @property
    def count(self) -> int: ...


class OtherMembersQueue(Protocol):
    """Another member's queue as this member sees it (broker/clustering/remote_queue.py's RemoteQueue), handed
    back where a queue of this node would be: routing and the one publish path (broker/vhost.py,
    broker/queues/delegate.py) and a queue.declare of a name another member holds (broker/queues/amqqueue.py).
    Narrower than the queue seam (broker/queues/queue_types.py's Queue): it is never consumed, settled,
    counted or listed here (the registry's look-up refuses it with 405), so it offers only what those callers
    read, and they take ``Queue | OtherMembersQueue``."""

    name: str
    durable: bool
    exclusive: bool
    publisher_channels: set[Any]
    """The channels that published to it (the publish path adds them, a channel's close removes itself)."""
    dedup: DedupCache | None
    """None: the owner deduplicates (the publish path reads it as for every queue)."""

    @property
    def remote(self) -> bool:
        """True: this member forwards to it (a caller that must act on a queue of its own tests this)."""
        ...

    @property
    def consumers(self) -> ConsumerCount:
        """Its consumers as the owner last answered (declare-ok's consumer count)."""
        ...

    def deliver_or_enqueue(self, msg: Message, persistent: bool, confirm: Any = None) -> int:
        """Forward one published message to the owner: ACCEPTED, or CONFIRM_LATER once committed for it."""
        ...

    def deliver_or_enqueue_run(self, msgs: list[Message], persistent: bool, publisher: Any, first_seq: int
                               ) -> list[int]:
        """A run, forwarded message by message (the queue seam's method of that name)."""
        ...

    @property
    def dead_letters_on_publish(self) -> bool:
        """False: what the owner dead-letters is routed there, not here."""
        ...

    @property
    def overloaded(self) -> bool:
        """Credit flow towards the owner: whether the publisher should wait (then :meth:`throttle`)."""
        ...

    def throttle(self, reader: Any) -> None: ...

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Which delayed-message dispatches it holds: none that this member could know of."""
        ...

    def message_count_wait(self, answer: Callable[[], None]) -> bool:
        """Whether a declare-ok must wait for the owner's answer (``answer`` is called once it is in)."""
        ...

    def message_count(self) -> int:
        """The owner's count as it last answered."""
        ...


class Deferred(Exception):
    """A method needs an answer of the directory that is on its way: handle the method again, from its start and
    with the same :class:`Answers`, once ``future`` is done (it never fails: a failure is the answer)."""

    def __init__(self, future: asyncio.Future[Any]) -> None:
        super().__init__("a directory answer is on its way")
        self.future = future


class Answers:
    """The directory's answers for one method being handled (see the module docstring): by the question's key,
    the answer, or the exception the question raised. An answer is kept while the method is handled again (each
    time from its start). ``settle`` runs once the method has been handled for the last time (or will not be:
    its channel closed): the clean-ups of answers it never took (a claim of a name for a queue that was not
    made is released)."""

    __slots__ = ("_cleanups", "_taken", "results")

    def __init__(self) -> None:
        self.results: dict[tuple[Any, ...], Any] = {}
        self._taken: set[tuple[Any, ...]] = set()
        self._cleanups: list[Callable[[], None]] = []

    def put(self, key: tuple[Any, ...], result: Any, unused: Callable[[], None] | None = None) -> None:
        """The answer to ``key``; ``unused`` is called at :meth:`settle` if nobody took it meanwhile."""
        self.results[key] = result
        if unused is not None:
            def cleanup() -> None:
                if key not in self._taken:
                    unused()
            self._cleanups.append(cleanup)

    def memo(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """What ``make()`` gave the first time the method was handled (a server-generated queue name): the same
        every time it is handled again."""
        if key not in self.results:
            self.results[key] = make()
        return self.results[key]

    def take(self, key: tuple[Any, ...]) -> tuple[bool, Any]:
        """(True, the answer) if it is in; else (False, None)."""
        if key in self.results:
            self._taken.add(key)
            return True, self.results[key]
        return False, None

    def settle(self) -> None:
        """The method is handled (or never will be again): clean up what it did not take."""
        if not self.results:
            return
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in cleanups:
            cleanup()
        self.results.clear()
        self._taken.clear()


class _Current:
    """The Answers of the method being handled (inside :func:`deferring`), else None. A plain attribute, not a
    context variable: a task started while a method is handled (a queue's timers, a question to the owner) must
    not inherit it; the method is handled synchronously on the loop's thread, set and reset around it."""

    answers: Answers | None = None


_CURRENT = _Current()


@contextmanager
def deferring(answers: Answers) -> Iterator[None]:
    """Within it, a question to the directory whose answer is not in ``answers`` raises :class:`Deferred`
    instead of waiting (see the module docstring)."""
    outer, _CURRENT.answers = _CURRENT.answers, answers
    try:
        yield
    finally:
        _CURRENT.answers = outer


def current_answers() -> Answers | None:
    """The caller's :class:`Answers` (inside :func:`deferring`), else None: answer from what is known."""
    return _CURRENT.answers


async def answered_call(act: Callable[[], T]) -> T:
    """``act()`` handled as a channel handles a method (see the module docstring), for a caller that can await
    (the HTTP API's declares, binds and unbinds, a definitions import's steps): inside :func:`deferring`, and
    again from its start each time it raises :class:`Deferred`, once the answer it waits for is in; the event
    loop serves everyone else meanwhile. Its clean-ups (a claim it did not use) run when it is over, however it
    ends."""
    answers = Answers()
    try:
        while True:
            try:
                with deferring(answers):
                    return act()
            except Deferred as exc:
                await exc.future
    finally:
        answers.settle()


class Topology(Protocol):
    """The other members' queues and bindings, and the hooks a member's own come and go through."""

    # -- other members' queues -------------------------------------------------------------------------------
    def queue(self, name: str) -> OtherMembersQueue | None:
        """Routing: another member's queue ``name`` (as last read, else looked up; misses are cached)."""
        ...

    def find(self, name: str) -> OtherMembersQueue | None:
        """Another member's queue ``name``, asked of the directory past the cache of misses (a declare)."""
        ...

    def looking_up(self, name: str) -> asyncio.Future[None] | None:
        """Before a client's default-exchange publish to ``name`` is routed: None if routing it needs nothing of
        the directory (a queue here, another member's known queue, a miss remembered); else the look-up of the
        name, started without waiting, done once its answer is remembered (the channel routes the publish then)."""
        ...

    def has_queue(self, name: str) -> bool:
        """Whether ``name`` is another member's queue as the directory was last read (no look-up: the HTTP
        API's listing of bindings)."""
        ...

    def claim(self, name: str, durable: bool, exclusive: bool, arguments: dict[str, Any],
              owner_checks: list[Callable[[], None]] | None = None) -> OtherMembersQueue | None:
        """queue.declare of a name not here: claim it cluster-wide (None: it is this member's to make), or
        answer the member's queue that holds it (its equivalence checks made now or appended to
        ``owner_checks``)."""
        ...

    def claim_ahead(self, answers: Answers, queues: list[tuple[str, bool, bool, dict[str, Any]]]
                    ) -> asyncio.Future[None] | None:
        """Claim the names of many queues about to be declared (``(name, durable, exclusive, arguments)``: a
        definitions import's slice) in one question, its answers put into ``answers`` as :meth:`claim` would
        put each; the declares, handled inside ``deferring(answers)`` once the future is done, take them instead
        of asking one by one, and ``answers.settle()`` releases those not used. None: nothing to ask."""
        ...

    def refuse(self, name: str, action: str) -> None:
        """Raise 405 if ``name`` is another member's queue (``action``: what only its member can do)."""
        ...

    def route(self, exchange: str, keys: Iterable[str], msg: Message, queue_names: set[str]) -> None:
        """Add the other members' queues that ``exchange``'s bindings to them select to ``queue_names``."""
        ...

    def bindings_to(self, source: str, queue: str) -> list[Binding]:
        """The bindings from ``source`` to another member's queue ``queue``, as its member made them."""
        ...

    def bound_remotely(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> bool:
        """Whether the member that owns ``queue`` made this binding (a redeclare from here is bind-ok)."""
        ...

    def unbind_remote(self, b: Binding) -> asyncio.Future[None] | None:
        """Unbind another member's queue (no binding of it here): its member carries it out. The future is
        done once it has (unbind-ok waits for it); None if no other member has that queue."""
        ...

    # -- this member's own queues and bindings (hooks) -----------------------------------------------------
    def queue_gone(self, q: Any) -> None:
        """A queue of this member was deleted (or its declare was not written): its name is free again."""
        ...

    def bound_here(self, ex: Exchange, b: Binding) -> None:
        """A binding of this member's queue was made: the other members route to it."""
        ...

    def unbound_here(self, b: Binding) -> None:
        """A binding of this member was removed."""
        ...

    def exchange_gone(self, name: str) -> None:
        """An exchange was deleted: the bindings from it to this member's queues go too."""
        ...


class LocalTopology:
    """A single node's :class:`Topology`: there are no other members. Every question answers "none", every
    hook does nothing; nothing here is on the publish path (``VHost.clustered`` is False)."""

    __slots__ = ()

    def queue(self, name: str) -> None:
        return None

    def find(self, name: str) -> None:
        return None

    def looking_up(self, name: str) -> None:
        return None

    def has_queue(self, name: str) -> bool:
        return False

    def claim(self, name: str, durable: bool, exclusive: bool, arguments: dict[str, Any],
              owner_checks: list[Callable[[], None]] | None = None) -> None:
        return None

    def claim_ahead(self, answers: Answers, queues: list[tuple[str, bool, bool, dict[str, Any]]]) -> None:
        return None

    def refuse(self, name: str, action: str) -> None:
        return None

    def route(self, exchange: str, keys: Iterable[str], msg: Message, queue_names: set[str]) -> None:
        return None

    def bindings_to(self, source: str, queue: str) -> list[Binding]:
        return []

    def bound_remotely(self, source: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> bool:
        return False

    def unbind_remote(self, b: Binding) -> None:
        return None

    def queue_gone(self, q: Any) -> None:
        return None

    def bound_here(self, ex: Exchange, b: Binding) -> None:
        return None

    def unbound_here(self, b: Binding) -> None:
        return None

    def exchange_gone(self, name: str) -> None:
        return None


LOCAL = LocalTopology()  # stateless: every single-node vhost shares it


class CatchUp(Protocol):
    """The cluster's definitions feed, read before a name this member does not know is answered (a name may have
    been declared on another member since the last poll). Neither call waits for PostgreSQL."""

    def now(self) -> bool:
        """Read the feed before answering: inside :func:`deferring`, Deferred until it is read, then True if a
        change was applied (the caller looks the name up again); outside it, the read is started for the next
        time and False answered at once."""
        ...

    def soon(self) -> asyncio.Future[None] | None:
        """Routing's read, started without waiting: the read on its way (one at a time), a new one, or None if
        the feed was read a moment ago (at most once per few milliseconds). A client's publish to a name nobody
        here knows waits for the future (its channel's later frames held back); routing itself never does."""
        ...


class NeverBehind:
    """A single node's :class:`CatchUp`: its definitions are all here."""

    __slots__ = ()

    def now(self) -> bool:
        return False

    def soon(self) -> None:
        return None


NEVER_BEHIND = NeverBehind()
