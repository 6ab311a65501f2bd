"""Exchanges and their routing: direct, fanout, topic (a trie) and headers; the base class a new type extends.

An exchange's ``route(routing_key, msg, queues, exchanges)`` adds the names of the queues and exchanges its bindings
select to two sets; following exchange-to-exchange bindings and alternate exchanges is the vhost's job,
since it needs the other exchanges. Bindings are plain records; an exchange keeps them in whatever index
makes its own routing fast.

RabbitMQ's ``rabbit_exchange_type`` behaviour is the model: besides ``route`` a type may check its declare
arguments (:meth:`Exchange.validate_arguments`, RabbitMQ's ``validate/1``) and its bindings
(:meth:`Exchange.validate_binding`, ``validate_binding/2``), and a *stateful* type (one that keeps messages,
such as ``x-delayed-message``) hears of its life through hooks that do nothing by default: :meth:`on_declare`
(``create/2``), :meth:`on_recover` (``recover/2``), :meth:`on_delete` (``delete/2``) and :meth:`close` (the node
stops). Such a type reaches the broker only through the :class:`ExchangeServices` its vhost hands it (the clock,
timers, the one publish path, routing, durable storage), and may keep a published message instead of routing
it at once (:attr:`Exchange.holds_messages`, :meth:`Exchange.hold`). How to add a type: broker/exchanges/exchange_types.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from broker.clock import Clock, TimerHandle
from broker.errors import AMQPError
from broker.message import Message
from protocol.constants import PRECONDITION_FAILED

if TYPE_CHECKING:
    from broker.publish import Publisher
    from storage.node_storage import NodeStorage

QUEUE = "queue"
EXCHANGE = "exchange"


def validate_arguments(name: str, vhost: str, arguments: dict[str, Any]) -> None:
    """406 for an exchange argument every type acts on whose value it cannot use: ``alternate-exchange``
    names an exchange, so it must be UTF-8 (pamqp hands a long string that is not as ``bytes``).
    :meth:`Exchange.validate_arguments` starts with this; a type adds its own checks after it."""
    ae = arguments.get("alternate-exchange")
    if isinstance(ae, bytes):
        try:
            ae.decode()
        except UnicodeDecodeError:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'alternate-exchange' for exchange '{name}' in "
                            f"vhost '{vhost}': {{invalid_utf8,{ae[:64]!r}}}: the value must be a UTF-8 "
                            "string") from None


class Publish(Protocol):
    """:meth:`broker.vhost.VHost.publish`, the one publish path (broker/publish.py has the meaning of its
    arguments and of the int it returns). An exchange that held a message (:meth:`Exchange.hold`) lets it go
    with ``held=True``: it is then routed by the exchange's bindings as they are at that moment, not held
    again, and not counted again as a client's publish."""

    def __call__(self, exchange: Exchange, msg: Message, persistent: bool, mandatory: bool = False,
                 publisher: Publisher | None = None, confirm_seq: int = 0, dead_letter: bool = False,
                 held: bool = False, skip: Collection[str] = ()) -> int: ...


class RoutedQueue(Protocol):
    """What routing without publishing (:class:`Route`) tells about each queue reached."""

    name: str
    durable: bool

    def origins_held(self, seqs: set[int]) -> set[int]:
        """Which delayed-message dispatches (delay-store seqs) the queue holds (storage/dispatch_evidence.py)."""
        ...


class Route(Protocol):
    """:meth:`broker.vhost.VHost.route`: the queues a message published to ``exchange`` would reach now
    (exchange-to-exchange bindings and alternate exchanges followed), without publishing it."""

    def __call__(self, exchange: Exchange, msg: Message) -> Collection[RoutedQueue]: ...


class DurableStore(Protocol):
    """What survives a restart (broker/persistence.py's ``DurableDefinitions``): the node's storage, where a
    stateful exchange keeps its own files (``storage.data_dir``) and schedules its fsyncs."""

    storage: NodeStorage


class ExchangeServices:
    """What a vhost lends its exchanges (one object per vhost, shared by all of them): the only way a
    stateful exchange type reaches the rest of the broker, so that such a type is one new file.

    ``clock`` is the vhost's clock (broker/clock.py: a test hands a ManualClock), ``call_later`` its timers,
    ``publish`` the one publish path, ``route`` routing without publishing, ``durable`` the node's durable
    store (None until the node's storage is open, and in a vhost that keeps nothing, as in unit tests).
    ``bound`` counts, per destination ``(kind, name)``, the bindings of the vhost's exchanges that end there
    (kept by :meth:`Exchange.add_binding` and :meth:`Exchange.remove_binding`, so every way a binding comes or
    goes is counted: bind, unbind, recovery, a deleted exchange or queue); the vhost's limit of bindings per
    destination reads it instead of scanning the exchanges.
    """

    __slots__ = ("_durable", "bound", "clock", "publish", "route", "vhost")

    def __init__(self, vhost: str, clock: Clock, publish: Publish, route: Route,
                 durable: Callable[[], DurableStore | None] = lambda: None) -> None:
        self.vhost = vhost
        self.clock = clock
        self.publish = publish
        self.route = route
        self._durable = durable
        self.bound: dict[tuple[str, str], int] = {}

    def bindings_to(self, kind: str, destination: str) -> int:
        """How many bindings of this vhost's exchanges end at the queue or exchange ``destination``."""
        return self.bound.get((kind, destination), 0)

    @property
    def durable(self) -> DurableStore | None:
        return self._durable()

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` once, ``delay`` seconds from now, on the vhost's clock."""
        return self.clock.call_later(delay, callback, *args)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


# What tells bindings apart: (kind, destination, routing key, the arguments frozen hashable).
BindingKey = tuple[str, str, str, Any]


class Binding:
    """source exchange → destination (a queue or an exchange) with a routing key and arguments."""

    __slots__ = ("arguments", "destination", "key", "kind", "routing_key", "source")

    def __init__(self, source: str, destination: str, kind: str, routing_key: str,
                 arguments: dict[str, Any] | None) -> None:
        self.source = source
        self.destination = destination
        self.kind = kind
        self.routing_key = routing_key
        self.arguments = dict(arguments or {})
        self.key: BindingKey = (kind, destination, routing_key, _freeze(self.arguments))


class Exchange:
    """The common part: identity, flags, the set of bindings whose source is this exchange, and the hooks of
    a type's life, which do nothing unless a type needs them (see the module docstring)."""

    # The name clients declare the type by (exchange.declare's ``type``), and what the management UI shows.
    type_name: str = ""
    description: ClassVar[str] = ""
    # A type that keeps a published message instead of routing it at once sets this and implements hold().
    holds_messages: ClassVar[bool] = False

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict[str, Any] | None = None, services: ExchangeServices | None = None) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[BindingKey, Binding] = {}
        self._services = services
        # RabbitMQ's exchange message_stats, counted by VHost.publish for clients' publishes (not dead letters,
        # not a held message let go): ``publish_in`` every message published to this exchange, routed or not;
        # ``publish_out`` one per queue a message published to it reached (exchange-to-exchange hops included).
        self.publish_in = 0
        self.publish_out = 0

    @property
    def services(self) -> ExchangeServices:
        """The vhost's services (every exchange a vhost makes has them; one built by hand in a test may not)."""
        if self._services is None:
            raise RuntimeError(f"exchange '{self.name}' was built without services; build it with "
                               "broker.exchanges.exchange_types.make_exchange")
        return self._services

    @property
    def routes_as(self) -> Exchange:
        """The exchange whose routing this one does: itself, or the built-in one a type routes through (a
        delayed-message exchange its ``x-delayed-type``). A cluster's shadow of it routes as this one does."""
        return self

    # -- a type's rules and life (RabbitMQ's rabbit_exchange_type callbacks) ----------------------------------
    @classmethod
    def validate_arguments(cls, name: str, vhost: str, arguments: dict[str, Any]) -> None:
        """Raise AMQPError (406, RabbitMQ's text) for a declare argument this type cannot use. Called on every
        non-passive declare, before the exchange is looked up, as RabbitMQ's ``validate/1``. A type that adds
        checks calls ``super().validate_arguments(...)`` first."""
        validate_arguments(name, vhost, arguments)

    def validate_binding(self, binding: Binding) -> str | None:
        """An error text if this exchange cannot accept the binding's arguments, else None."""
        return None

    def on_declare(self) -> None:
        """Just declared (it is in its vhost and, if durable, in the durable store): start what the type keeps."""

    def on_recover(self) -> None:
        """Just restored at start from the durable store (its bindings come after): pick up what it kept."""

    def after_recovery(self) -> None:
        """Every durable exchange, queue and binding of the node has been restored (called once at start)."""

    def on_delete(self) -> None:
        """Deleted (its bindings are gone; so is its vhost, if that was deleted): drop what it keeps, files too."""

    def close(self) -> None:
        """The node stops: stop timers and close files, keeping what is durable for on_recover."""

    def hold(self, msg: Message, persistent: bool, publisher: Publisher | None, confirm_seq: int) -> int:
        """Only for a type with ``holds_messages``: keep ``msg`` (published to this exchange) instead of routing
        it, and return what :meth:`broker.vhost.VHost.publish` returns (broker/publish.py): ``ROUTED`` unless
        the publisher should get basic.return, and ``1 << PENDING`` if the type will call
        ``publisher.confirm_from_queue(confirm_seq)`` itself once the message is safe. Later the type lets the
        message go through ``services.publish(self, msg, persistent, held=True)``."""
        raise NotImplementedError

    @property
    def alternate_exchange(self) -> str | None:
        ae = self.arguments.get("alternate-exchange")
        return ae if isinstance(ae, str) and ae else None

    def add_binding(self, binding: Binding) -> bool:
        if binding.key in self.bindings:
            return False
        self.bindings[binding.key] = binding
        self._index_add(binding)
        services = self._services
        if services is not None:  # an exchange inside another (x-delayed-type's) has none: counted once
            dest = (binding.kind, binding.destination)
            bound = services.bound
            bound[dest] = bound.get(dest, 0) + 1
        return True

    def remove_binding(self, key: BindingKey) -> Binding | None:
        binding = self.bindings.pop(key, None)
        if binding is not None:
            self._index_remove(binding)
            services = self._services
            if services is not None:
                dest = (binding.kind, binding.destination)
                bound = services.bound
                left = bound.get(dest, 0) - 1
                if left > 0:
                    bound[dest] = left
                else:
                    bound.pop(dest, None)
        return binding

    def bindings_to(self, kind: str, destination: str) -> list[Binding]:
        return [b for b in self.bindings.values() if b.kind == kind and b.destination == destination]

    def _index_add(self, binding: Binding) -> None:
        raise NotImplementedError

    def _index_remove(self, binding: Binding) -> None:
        raise NotImplementedError

    def route(self, routing_key: str, msg: Message, queues: set[str], exchanges: set[str]) -> None:
        raise NotImplementedError


def _add_to(index: dict[Any, tuple[set[str], set[str]]], slot: Any, binding: Binding) -> None:
    entry = index.get(slot)
    if entry is None:
        entry = index[slot] = (set(), set())
    (entry[0] if binding.kind == QUEUE else entry[1]).add(binding.destination)


def _remove_from(index: dict[Any, tuple[set[str], set[str]]], slot: Any, binding: Binding,
                 still_bound: Iterable[Binding]) -> None:
    """Remove the binding's destination unless another binding with the same slot still selects it."""
    entry = index.get(slot)
    if entry is None:
        return
    for other in still_bound:
        if other.kind == binding.kind and other.destination == binding.destination:
            return
    (entry[0] if binding.kind == QUEUE else entry[1]).discard(binding.destination)
    if not entry[0] and not entry[1]:
        del index[slot]


class DirectExchange(Exchange):
    type_name = "direct"
    description = "AMQP direct exchange, as per the AMQP specification"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._routes: dict[str, tuple[set[str], set[str]]] = {}

    def _index_add(self, binding: Binding) -> None:
        _add_to(self._routes, binding.routing_key, binding)

    def _index_remove(self, binding: Binding) -> None:
        same_key = (b for b in self.bindings.values() if b.routing_key == binding.routing_key)
        _remove_from(self._routes, binding.routing_key, binding, same_key)

    def route(self, routing_key: str, msg: Message, queues: set[str], exchanges: set[str]) -> None:
        entry = self._routes.get(routing_key)
        if entry is not None:
            queues |= entry[0]
            if entry[1]:
                exchanges |= entry[1]


class FanoutExchange(Exchange):
    type_name = "fanout"
    description = "AMQP fanout exchange, as per the AMQP specification"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._all: dict[None, tuple[set[str], set[str]]] = {}

    def _index_add(self, binding: Binding) -> None:
        _add_to(self._all, None, binding)

    def _index_remove(self, binding: Binding) -> None:
        _remove_from(self._all, None, binding, self.bindings.values())

    def route(self, routing_key: str, msg: Message, queues: set[str], exchanges: set[str]) -> None:
        entry = self._all.get(None)
        if entry is not None:
            queues |= entry[0]
            if entry[1]:
                exchanges |= entry[1]


class _TrieNode:
    __slots__ = ("bindings", "children")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.bindings: set[Binding] = set()


def _words(key: str) -> list[str]:
    """The words of a topic key: '' has none (so only '#' and '' match it); '.' has two empty ones."""
    return key.split(".") if key else []


def _trie_match(root: _TrieNode, words: list[str]) -> set[Binding]:
    """The bindings of every trie path that matches ``words``: the trie run as a non-deterministic automaton,
    keeping the set of nodes reachable after each word (RabbitMQ keeps a (node, position) memo instead).

    A ``#`` node is a state that may swallow the next word and stay where it is; entering it swallows none
    (the epsilon step of :func:`_with_hashes`). Each word costs one step per live node, so a routing key of n
    words against a trie of k nodes costs O(n * k) at worst: ``#.#.#...`` bindings or keys of thousands of
    words (a CC header can carry one) stay linear in each. The old walk re-pushed every later position at
    each ``#`` node and took 11 s for a 100-``#`` binding against a 500-word key."""
    hashes: set[_TrieNode] = set()
    plain, stepping = _with_hashes({root}, hashes, [])
    for word in words:
        step: set[_TrieNode] = set()
        for nodes in (plain, stepping):  # a live '#' also swallows this word and stays live
            for node in nodes:
                children = node.children
                child = children.get(word)
                if child is not None:
                    step.add(child)
                child = children.get("*")
                if child is not None:
                    step.add(child)
        plain, stepping = _with_hashes(step, hashes, stepping)
        if not plain and not hashes:
            return set()
    found: set[Binding] = set()
    for nodes in (plain, hashes):
        for node in nodes:
            found |= node.bindings
    return found


def _with_hashes(plain: set[_TrieNode], hashes: set[_TrieNode],
                 stepping: list[_TrieNode]) -> tuple[set[_TrieNode], list[_TrieNode]]:
    """Add to ``hashes`` (in place) the ``#`` children of the new live nodes (a ``#`` may match no word) and
    theirs (``#.#``). ``stepping`` is the live ``#`` nodes with a child other than ``#``: only they can take
    a word somewhere new, so a run of ``#`` costs nothing per word."""
    pending = [n for n in plain if "#" in n.children]
    if not pending:
        return plain, stepping
    stepping = list(stepping)
    while pending:
        child = pending.pop().children["#"]
        if child not in hashes:
            hashes.add(child)
            if "#" in child.children:
                pending.append(child)
            if len(child.children) > ("#" in child.children):
                stepping.append(child)
    return plain, stepping


class TopicExchange(Exchange):
    """A trie over the words of the binding keys, with ``*`` and ``#`` as ordinary edges.

    Matching (:func:`_trie_match`) runs the trie as an automaton over the routing key's words, one word at
    a time, so its cost is the key's words times the trie nodes alive at once, whatever the ``#`` count.
    """

    type_name = "topic"
    description = "AMQP topic exchange, as per the AMQP specification"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._root = _TrieNode()
        self._cache: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def _index_add(self, binding: Binding) -> None:
        node = self._root
        for word in _words(binding.routing_key):
            node = node.children.setdefault(word, _TrieNode())
        node.bindings.add(binding)
        self._cache.clear()

    def _index_remove(self, binding: Binding) -> None:
        path = [self._root]
        words = _words(binding.routing_key)
        for word in words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        path[-1].bindings.discard(binding)
        for i in range(len(words) - 1, -1, -1):
            node = path[i + 1]
            if node.bindings or node.children:
                break
            del path[i].children[words[i]]
        self._cache.clear()

    def _match(self, routing_key: str) -> tuple[frozenset[str], frozenset[str]]:
        found = _trie_match(self._root, _words(routing_key))
        queues = frozenset(b.destination for b in found if b.kind == QUEUE)
        exchanges = frozenset(b.destination for b in found if b.kind == EXCHANGE)
        return queues, exchanges

    def route(self, routing_key: str, msg: Message, queues: set[str], exchanges: set[str]) -> None:
        rk = routing_key
        hit = self._cache.get(rk)
        if hit is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            hit = self._cache[rk] = self._match(rk)
        queues |= hit[0]
        if hit[1]:
            exchanges |= hit[1]


_X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


def amqp_equal(a: Any, b: Any) -> bool:
    """Whether two decoded AMQP field values match as RabbitMQ's headers exchange compares them (Erlang's
    ``==`` on the values): a long string and a byte array with the same bytes match (both are binaries
    there), numbers match by value whatever their width (1 matches 1.0), but a boolean matches only a
    boolean (``true`` is not 1, as Python's ``True == 1`` would have it)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (str, bytes, bytearray)) and isinstance(b, (str, bytes, bytearray)):
        return (a.encode() if isinstance(a, str) else bytes(a)) == (b.encode() if isinstance(b, str) else bytes(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(amqp_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(amqp_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (str, bytes, bytearray, dict, list, tuple)) or isinstance(b, (str, bytes, bytearray, dict,
                                                                                     list, tuple)):
        return False
    return bool(a == b)


class HeadersExchange(Exchange):
    """Matches the message's headers against each binding's arguments (``x-match`` all/any, and the
    ``-with-x`` variants that also compare ``x-`` keys). A binding value of void matches presence only."""

    type_name = "headers"
    description = "AMQP headers exchange, as per the AMQP specification"

    def validate_binding(self, binding: Binding) -> str | None:
        mode = binding.arguments.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode(errors="replace")
        if mode not in _X_MATCH_MODES:
            return f"Invalid x-match field value {mode!r}; expected all, any, all-with-x, or any-with-x"
        return None

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    @staticmethod
    def _matches(args: dict[str, Any], headers: dict[str, Any]) -> bool:
        mode = args.get("x-match", "all")
        if isinstance(mode, bytes):
            mode = mode.decode(errors="replace")
        with_x = mode.endswith("-with-x")
        want_all: bool = mode.startswith("all")
        considered = 0
        for k, v in args.items():
            if k.startswith("x-") and (not with_x or k == "x-match"):
                continue
            considered += 1
            ok = k in headers and (v is None or amqp_equal(headers[k], v))
            if want_all and not ok:
                return False
            if not want_all and ok:
                return True
        return want_all

    def route(self, routing_key: str, msg: Message, queues: set[str], exchanges: set[str]) -> None:
        if not self.bindings:
            return
        headers = msg.headers
        for b in self.bindings.values():
            if self._matches(b.arguments, headers):
                (queues if b.kind == QUEUE else exchanges).add(b.destination)

