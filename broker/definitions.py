"""Definitions: the broker's schema as RabbitMQ's JSON (``GET/POST /api/definitions``, ``leveret ctl
export_definitions / import_definitions``, ``load_definitions`` at boot).

The format is RabbitMQ's: ``rabbit_version``, ``rabbitmq_version``, ``product_name``, ``product_version``,
``users`` (with ``password_hash`` and ``hashing_algorithm``, so users keep their passwords), ``vhosts``,
``permissions``, ``topic_permissions``, ``parameters``, ``global_parameters``, ``policies``, ``queues``,
``exchanges``, ``bindings``. A file exported from RabbitMQ 3.x imports unchanged (``tags`` as a list or as a
comma-separated string). A per-vhost export carries only queues, exchanges, bindings, policies and
parameters, without ``vhost`` fields, and imports into the vhost it is posted to.

The node's own metadata (users, vhosts, permissions, policies, parameters) is kept in the metadata store
with everything else (broker/persistence.py), written by the node and vhost methods an import calls. Older
nodes kept it in ``<data_dir>/metadata.json`` in this format (compact JSON of :func:`export` with
``schema=False``): :func:`read_metadata_file` reads such a file once at start, before any message file is
opened (a lost or corrupt one stops the start instead of resetting the node to guest/guest), and the node
migrates it into the store.

Imports can be large (thousands of queues, bindings and users): :func:`parse` runs in a thread and refuses
nesting the decoder cannot handle; :func:`import_definitions` writes one metadata-store transaction (one
fsync), and :func:`import_definitions_async` applies the objects in short slices with the event loop free
between them, recording their writes, and commits them all at the end in one transaction (SQLite's from a worker
thread, a cluster's PostgreSQL share in its journal on the loop: storage/pg/definitions_store.py). A step that
asks PostgreSQL something first (a cluster member's claim of a queue's name, its read of the definitions feed)
waits for the answer with the loop free, and is made once it is in (broker/topology.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from broker import PRODUCT, VERSION, parameters
from broker.clustering import remote_queue
from broker.errors import AMQPError
from broker.exchanges.exchange import EXCHANGE, QUEUE
from broker.json_values import json_safe
from broker.policies import limits
from broker.policies.policy import make_policy
from broker.queues.queue_args import without_refused_arguments
from broker.security.auth import HASHING_ALGORITHMS, SHA256, hash_password, valid_password_hash
from broker.topology import Answers, Deferred, deferring

if TYPE_CHECKING:
    from broker.node import Node
    from broker.vhost import VHost

log = structlog.get_logger(__name__)

T = TypeVar("T")

METADATA_FILE = "metadata.json"


class DefinitionsError(Exception):
    pass


def _header(node: Node) -> dict[str, Any]:
    return {"rabbit_version": node.rabbitmq_version, "rabbitmq_version": node.rabbitmq_version,
            "product_name": PRODUCT, "product_version": VERSION}


def _vhost_objects(vh: VHost, with_vhost: bool, schema: bool = True) -> dict[str, list[dict[str, Any]]]:
    v = {"vhost": vh.name} if with_vhost else {}
    policies = [{**v, "name": name, "pattern": p.pattern, "apply-to": p.apply_to, "definition": p.definition,
                 "priority": p.priority} for name, p in sorted(vh.policies.items())]
    parameters = [{**v, "component": c, "name": n, "value": value}
                  for (c, n), value in sorted(vh.parameters.items())]
    if not schema:  # the metadata file: skip walking every queue and binding only to drop them
        return {"parameters": parameters, "policies": policies, "queues": [], "exchanges": [], "bindings": []}
    queues = [{"name": q.name, **v, "durable": q.durable, "auto_delete": q.auto_delete,
               "arguments": json_safe(q.arguments)}
              for q in sorted(vh.queues, key=lambda q: q.name) if q.exclusive_owner is None]
    exchanges = [{"name": ex.name, **v, "type": ex.type_name, "durable": ex.durable,
                  "auto_delete": ex.auto_delete, "internal": ex.internal, "arguments": json_safe(ex.arguments)}
                 for ex in sorted(vh.exchanges.values(), key=lambda e: e.name) if not ex.name.startswith("amq.")]
    exclusive = {q.name for q in vh.queues if q.exclusive_owner is not None}
    bindings = [{"source": b.source, **v, "destination": b.destination,
                 "destination_type": "queue" if b.kind == QUEUE else "exchange", "routing_key": b.routing_key,
                 "arguments": json_safe(b.arguments)}
                for b in sorted(vh.bindings(), key=lambda b: (b.source, b.kind, b.destination, b.routing_key))
                if not (b.kind == QUEUE and b.destination in exclusive)]
    return {"parameters": parameters, "policies": policies, "queues": queues, "exchanges": exchanges,
            "bindings": bindings}


def export(node: Node, vhost: str | None = None, schema: bool = True) -> dict[str, Any]:
    """The node's definitions (all vhosts), or one vhost's. ``schema=False`` leaves out queues,
    exchanges and bindings (the node's metadata file)."""
    if vhost is not None:
        out = _header(node)
        out.update(_vhost_objects(node.vhosts[vhost], with_vhost=False))
        return out
    users = sorted(node.users.users.values(), key=lambda u: u.name)
    out = _header(node)
    out["users"] = [{"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.hashing_algorithm,
                     "tags": list(u.tags), "limits": dict(u.limits)} for u in users]
    out["vhosts"] = []
    for name in sorted(node.vhosts):
        vh = node.vhosts[name]
        description, tags, dqt = vh.description, list(vh.tags), vh.default_queue_type
        out["vhosts"].append({"name": name, "description": description, "tags": tags,
                              "default_queue_type": dqt, "limits": dict(limits.vhost_limits(vh)) or [],
                              "metadata": {"description": description, "tags": tags, "default_queue_type": dqt}})
    out["permissions"] = [{"user": u.name, "vhost": v, **u.permissions[v].as_dict()}
                          for u in users for v in sorted(u.permissions)]
    out["topic_permissions"] = [{"user": u.name, "vhost": v, "exchange": x, "write": w, "read": r}
                                for u in users for v in sorted(u.topic_permissions)
                                for x, (w, r) in sorted(u.topic_permissions[v].items())]
    collected: dict[str, list[dict[str, Any]]] = {"parameters": [], "policies": [], "queues": [],
                                                  "exchanges": [], "bindings": []}
    for name in sorted(node.vhosts):
        for key, rows in _vhost_objects(node.vhosts[name], with_vhost=True, schema=schema).items():
            collected[key].extend(rows)
    out["parameters"] = collected["parameters"]
    out["global_parameters"] = [{"name": n, "value": v} for n, v in sorted(node.global_parameters.items())]
    out["policies"] = collected["policies"]
    if schema:
        out["queues"] = collected["queues"]
        out["exchanges"] = collected["exchanges"]
        out["bindings"] = collected["bindings"]
    else:
        out["operator_policies"] = [p.as_json() for vn in sorted(node.vhosts)
                                    for _n, p in sorted(node.vhosts[vn].operator_policies.items())]
    return out


# -- import ---------------------------------------------------------------------------------------------------------

def _tags(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list):
        return [str(t) for t in value]
    raise DefinitionsError(f"tags must be a list or a comma-separated string, got {value!r}")


def _bool(item: dict[str, Any], key: str, default: bool) -> bool:
    value = item.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise DefinitionsError(f"'{key}' must be true or false in {item!r}")
    return value


def _str(item: dict[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise DefinitionsError(f"{what} without a string '{key}': {item!r}")
    return value


# The sections of a definitions document that are lists of objects.
_LIST_KEYS = ("users", "vhosts", "permissions", "topic_permissions", "global_parameters", "parameters",
              "policies", "operator_policies", "queues", "exchanges", "bindings")


def _list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise DefinitionsError(f"'{key}' must be a list of objects")
    return value


class Wait:
    """An import step that waits for an answer (of the directory of node-local queues, of the definitions feed,
    of another cluster member about one of its queues): the import awaits it, with the event loop free, before
    its next step (:func:`import_definitions_async`)."""

    def __init__(self, answered: Callable[[], Awaitable[Any]]) -> None:
        self.answered = answered


def _answered(act: Callable[[], T], shared: Answers | None = None) -> Generator[Wait, None, T]:
    """``act()`` as broker/topology.py's ``answered_call`` runs it, as steps of the import: inside ``deferring``,
    and again from its start after each Wait for what it asked (it asks before it changes anything). With
    ``shared``, the answers asked ahead for a slice of steps (:func:`_queue_slices`), settled by the slice."""
    answers = Answers() if shared is None else shared
    try:
        while True:
            try:
                with deferring(answers):
                    return act()
            except Deferred as exc:
                yield Wait(partial(_until, exc.future))
    finally:
        if shared is None:
            answers.settle()


# Queues whose names a cluster member claims in one question before declaring them (Topology.claim_ahead):
# one committed round trip per slice instead of one per queue (issue 35: 10,000 queues with bindings imported
# at 698 bindings/s on two members when each claim was its own).
CLAIM_SLICE = 500


def _queue_slices(queues: list[dict[str, Any]], vhost_of: Callable[[dict[str, Any]], VHost]
                  ) -> Iterator[tuple[list[dict[str, Any]], dict[str, Answers], list[asyncio.Future[None]]]]:
    """The document's queues in slices of CLAIM_SLICE, each with the Answers its declares share per vhost and
    the claims asked ahead for them (awaited before the slice is declared)."""
    for start in range(0, len(queues), CLAIM_SLICE):
        chunk = queues[start:start + CLAIM_SLICE]
        by_vhost: dict[str, tuple[VHost, list[tuple[str, bool, bool, dict[str, Any]]]]] = {}
        for q in chunk:
            name, arguments = q.get("name"), q.get("arguments") or {}
            if isinstance(name, str) and isinstance(arguments, dict):
                try:
                    vh = vhost_of(q)
                except DefinitionsError:
                    continue  # raised by its declare, in its turn
                by_vhost.setdefault(vh.name, (vh, []))[1].append((name, _bool(q, "durable", True), False,
                                                                  arguments))
        answers = {name: Answers() for name in by_vhost}
        claims = [f for name, (vh, specs) in by_vhost.items()
                  if (f := vh.remote.claim_ahead(answers[name], specs)) is not None]
        yield chunk, answers, claims


async def _until(future: asyncio.Future[Any]) -> None:
    await future


def _declare_queue(vh: VHost, q: dict[str, Any], owner_checks: list[Callable[[], None]]) -> tuple[Any, bool]:
    owner_checks.clear()
    name = _str(q, "name", "queue")
    durable, auto_delete = _bool(q, "durable", True), _bool(q, "auto_delete", False)
    arguments = q.get("arguments") or {}
    if vh.queues.get(name) is None:
        # A queue to create: arguments its type does not take (by the type it gets, the vhost's default if it
        # names none) are left out, as an earlier Leveret let queues keep some. A queue that exists is
        # redeclared with what it has: it was declared with them, and the redeclare is not refused.
        arguments, dropped = without_refused_arguments(
            vh.queues.with_default_type(arguments, durable, False, auto_delete, False))
        if dropped:
            log.warning("definitions: a queue's arguments its type does not take are left out", vhost=vh.name,
                        queue=name, arguments=dropped)
    return vh.queues.declare(name, False, durable, False, auto_delete, arguments, None, owner_checks=owner_checks)


def _import_steps(node: Node, data: Any, vhost: str | None) -> Iterator[Wait | None]:
    """Apply ``data`` one object at a time, yielding after each, so that a caller on the event loop can
    let clients in between (:func:`import_definitions_async`); a step that needs an answer from PostgreSQL
    first yields a :class:`Wait` for it. Every step leaves the node consistent: an object is created whole,
    with its durable definition written, or not at all."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    if vhost is not None and vhost not in node.vhosts:
        raise DefinitionsError(f"vhost '{vhost}' does not exist")
    refused = parameters.unsupported(_list(data, "parameters"), vhost)  # before anything is applied
    if refused:
        raise DefinitionsError(refused)

    def vhost_of(item: dict[str, Any]) -> VHost:
        name = vhost if vhost is not None else item.get("vhost", node.settings.default_vhost)
        vh = node.vhosts.get(name)
        if vh is None:
            raise DefinitionsError(f"vhost '{name}' of {item!r} does not exist")
        return vh

    if vhost is None:
        for u in _list(data, "users"):
            name = _str(u, "name", "user")
            algorithm = u.get("hashing_algorithm") or SHA256
            if algorithm not in HASHING_ALGORITHMS:
                raise DefinitionsError(f"user '{name}': unknown hashing_algorithm '{algorithm}'")
            if "password" in u and "password_hash" not in u:
                password_hash, algorithm = hash_password(str(u["password"])), SHA256
            else:
                password_hash = u.get("password_hash", "")
                if not isinstance(password_hash, str) or not valid_password_hash(password_hash):
                    raise DefinitionsError(f"user '{name}': password_hash is not a base64 salted hash")
            try:
                user_limits = limits.user_limits_of(u.get("limits"))
            except limits.LimitError as exc:
                raise DefinitionsError(f"user '{name}': {exc}") from None
            node.put_user(name, password_hash, _tags(u.get("tags")), algorithm, user_limits)
            yield None
        for v in _list(data, "vhosts"):
            name = _str(v, "name", "vhost")
            meta: dict[str, Any] = v["metadata"] if isinstance(v.get("metadata"), dict) else {}
            description = v.get("description", meta.get("description", "")) or ""
            tags = _tags(v.get("tags", meta.get("tags")))
            dqt = v.get("default_queue_type", meta.get("default_queue_type")) or None
            try:
                limits.apply_vhost_limits(node.add_vhost(name, str(description), tags, dqt and str(dqt)),
                                          v.get("limits"))
            except limits.LimitError as exc:
                raise DefinitionsError(f"vhost '{name}': {exc}") from None
            yield None
        for p in _list(data, "permissions"):
            user, vh_name = _str(p, "user", "permission"), _str(p, "vhost", "permission")
            if user not in node.users.users:
                raise DefinitionsError(f"permission for unknown user '{user}'")
            if vh_name not in node.vhosts:
                raise DefinitionsError(f"permission in unknown vhost '{vh_name}'")
            try:
                node.set_permissions(user, vh_name, str(p.get("configure", "")), str(p.get("write", "")),
                                     str(p.get("read", "")))
            except re.error as exc:
                raise DefinitionsError(f"permission of '{user}' in '{vh_name}': bad regex: {exc}") from None
            yield None
        for tp in _list(data, "topic_permissions"):
            user = _str(tp, "user", "topic permission")
            if user not in node.users.users:
                raise DefinitionsError(f"topic permission for unknown user '{user}'")
            node.set_topic_permission(user, _str(tp, "vhost", "topic permission"), str(tp.get("exchange", "")),
                                      str(tp.get("write", "")), str(tp.get("read", "")))
            yield None
        for gp in _list(data, "global_parameters"):
            node.set_global_parameter(_str(gp, "name", "global parameter"), gp.get("value"))
            yield None
    for p in _list(data, "parameters"):
        vh = vhost_of(p)
        component, name = _str(p, "component", "parameter"), _str(p, "name", "parameter")
        try:
            vh.set_parameter(component, name, parameters.validate(component, name, p.get("value")))
        except parameters.ParameterError as exc:
            raise DefinitionsError(f"parameter '{name}' of component '{component}' in vhost '{vh.name}': "
                                   f"{exc.reason}") from None
        yield None
    for key in ("policies", "operator_policies"):
        for p in _list(data, key):
            vh = vhost_of(p)
            try:
                policy = make_policy(vh.name, _str(p, "name", "policy"), p, operator=key == "operator_policies")
            except ValueError as exc:
                raise DefinitionsError(f"policy '{p.get('name')}': {exc}") from None
            vh.set_policy(policy, operator=key == "operator_policies")
            yield None
    try:
        for x in _list(data, "exchanges"):
            name = _str(x, "name", "exchange")
            if name.startswith("amq.") or name == "":
                continue
            args = x.get("arguments") or {}
            vhost_of(x).declare_exchange(name, _str(x, "type", "exchange"), False, _bool(x, "durable", True),
                                         _bool(x, "auto_delete", False), _bool(x, "internal", False), args)
            yield None
        for chunk, answers, claims in _queue_slices(_list(data, "queues"), vhost_of):
            # In a cluster: the claims of the slice's names asked in one question, waited for (a name asked
            # past it, or the feed's read for a quorum queue, waited for by its declare); another member's
            # queue of that name has its equivalence check wait for that member's answer, then run here.
            try:
                for claim in claims:
                    yield Wait(partial(_until, claim))
                for q in chunk:
                    vh = vhost_of(q)
                    owner_checks: list[Callable[[], None]] = []
                    queue, _created = yield from _answered(partial(_declare_queue, vh, q, owner_checks),
                                                           answers.get(vh.name))
                    if owner_checks:
                        yield Wait(partial(remote_queue.answered, queue))
                        for check in owner_checks:
                            check()
                    yield None
            finally:
                for slice_answers in answers.values():
                    slice_answers.settle()
        for b in _list(data, "bindings"):
            vh = vhost_of(b)
            kind = QUEUE if b.get("destination_type", "queue") == "queue" else EXCHANGE
            destination = _str(b, "destination", "binding")
            if kind == QUEUE and vh.queues.get(destination) is None:
                raise DefinitionsError(f"binding to unknown queue '{destination}' in vhost '{vh.name}'")
            yield from _answered(partial(vh.bind, _str(b, "source", "binding"), destination, kind,
                                         str(b.get("routing_key", "")), b.get("arguments") or {}))
            yield None
    except AMQPError as exc:
        raise DefinitionsError(exc.text) from None


def _guarded_steps(node: Node, data: Any, vhost: str | None) -> Iterator[Wait | None]:
    """The import's steps; a value of the wrong shape deep inside an object (a list where a string
    belongs, arguments nested too deep to encode) is the document's fault, so a DefinitionsError (HTTP
    400, one line at start) rather than a Python exception. Whatever was applied is saved either way
    (the callers commit on error too)."""
    try:
        yield from _import_steps(node, data, vhost)
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as exc:
        raise DefinitionsError(f"malformed definitions ({type(exc).__name__}: {exc})") from None


def _batch(node: Node) -> AbstractContextManager[None]:
    """One metadata-store commit (one fsync) for many definitions, instead of one per object. On an
    error what was applied is committed too: it exists in memory and clients may already use it."""
    storage = node.storage
    return storage.metadata.transaction(keep_on_error=True) if storage is not None else nullcontext()


def import_definitions(node: Node, data: Any, vhost: str | None = None) -> None:
    """Create or update everything ``data`` defines (``vhost``: a per-vhost file, into that vhost), in
    one go: for start-up (``load_definitions``, before a cluster member asks the other members anything) and
    tools. Raises DefinitionsError naming the first item that cannot be imported, or one that needs an answer
    the caller cannot wait for (a running cluster member imports through :func:`import_definitions_async`)."""
    with _batch(node):
        for step in _guarded_steps(node, data, vhost):
            if step is not None:
                raise DefinitionsError("this import needs answers from the cluster's PostgreSQL: import it "
                                       "through the HTTP API (POST /api/definitions)")


# Work done between two yields to the event loop during an HTTP import: long enough that the commit
# closing each slice (an fsync) is a small share, short enough that AMQP clients barely notice.
IMPORT_SLICE_SECONDS = 0.02


async def import_definitions_async(node: Node, data: Any, vhost: str | None = None) -> None:
    """:func:`import_definitions` for the HTTP API: the objects are applied in slices of
    ``IMPORT_SLICE_SECONDS`` with the event loop free in between, so that a document of thousands of
    queues, bindings and users does not stall every client for seconds; a step waiting for an answer
    (:class:`Wait`) is awaited between slices. The slices' metadata writes are recorded, not made, and written
    at the end in one transaction without the loop waiting (``Metadata.apply_async``); other
    clients' writes in between are made at once, never part of (or rolled back with) the import's, and
    replayed after it so that the last write of a definition wins (storage/metadata_store.py). On a
    DefinitionsError what was applied is written too, then the error is raised. Runs to the end even if
    the HTTP client goes away."""
    storage = node.storage
    store = storage.metadata if storage is not None else None

    async def run() -> None:
        ops = store.open_batch() if store is not None else []
        steps = _guarded_steps(node, data, vhost)
        try:
            done = False
            while not done:
                deadline = time.monotonic() + IMPORT_SLICE_SECONDS
                wait: Wait | None = None
                with store.recording(ops) if store is not None else nullcontext():
                    for step in steps:
                        if step is not None:
                            wait = step  # awaited outside the recording: other clients' writes are theirs
                            break
                        if time.monotonic() >= deadline:
                            break
                    else:
                        done = True
                if wait is not None:
                    await wait.answered()
                else:
                    await asyncio.sleep(0)
        finally:
            if store is not None and ops:
                await store.apply_async(ops)
            elif store is not None:
                store.discard(ops)

    await asyncio.shield(asyncio.ensure_future(run()))


# -- JSON documents ------------------------------------------------------------------------------------------------

# Deeper than any real definitions document (a queue argument holding a table of arrays is about eight
# levels): deeper input is refused before anything recurses over it (encoding arguments, exporting).
MAX_DEPTH = 100


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests containers more than ``limit`` deep (iterative: no recursion to overflow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse(raw: bytes | bytearray | str) -> Any:
    """A definitions document from JSON text. Slow for big documents (about 20 ms per MB): the HTTP API
    calls it in a thread. Raises DefinitionsError for invalid JSON, nesting too deep to parse (the JSON
    decoder recurses once per level) and nesting deeper than ``MAX_DEPTH``."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise DefinitionsError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DefinitionsError(str(exc)) from None
    if _depth_exceeds(data, MAX_DEPTH):
        raise DefinitionsError(f"nested deeper than {MAX_DEPTH} levels")
    return data


def load_file(node: Node, path: Path) -> None:
    """``load_definitions``: a file, or a directory whose ``*.json`` files are imported in name order."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    for f in files:
        try:
            raw = f.read_bytes()
        except OSError as exc:
            raise DefinitionsError(f"cannot read {f}: {exc.strerror or exc}") from None
        try:
            data = parse(raw)
        except DefinitionsError as exc:
            raise DefinitionsError(f"{f} is not valid JSON: {exc}") from None
        import_definitions(node, data)


# -- an older node's metadata file (migrated into the metadata store at start) ----------------------------------------------------------------------------------

# The metadata-store row by which an older node recorded that it had written its metadata file: while it
# is there, the file missing means it was lost (not that the node is new), and the start is refused
# rather than recreating guest. The migration deletes it.
METADATA_WRITTEN = ("node", METADATA_FILE)


def read_metadata_file(data_dir: Path, *, written: bool, store_created: bool,
                       store_path: str) -> dict[str, Any] | None:
    """At start, before any message file is opened: the node's metadata document, or None for a node
    that has none yet. ``written``: the metadata store says this file was written; ``store_created``:
    the metadata store was missing and is new. A lost, empty or unreadable file, or one that outlived
    its metadata store, raises DefinitionsError naming the file (the start stops)."""
    path = Path(data_dir) / METADATA_FILE
    if not path.exists():
        if written:
            raise DefinitionsError(
                f"{path} is missing, but {store_path} records that this node wrote it: the node's users, vhosts "
                f"and permissions are gone; refusing to start rather than recreate the default user. Restore "
                f"{METADATA_FILE} from a backup")
        return None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DefinitionsError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not raw:
        raise DefinitionsError(f"{path} is empty (0 bytes): the node's users, vhosts and permissions are gone; "
                               f"refusing to start. Restore {METADATA_FILE} from a backup")
    if store_created:
        raise DefinitionsError(
            f"{store_path} was missing or empty, but {path} exists: the node's durable exchanges, queues and "
            f"bindings were in the metadata database; refusing to start. Restore it from a backup")
    try:
        data = parse(raw)
    except DefinitionsError as exc:
        raise DefinitionsError(f"{path} is corrupt ({exc}); restore it from a backup") from None
    if not isinstance(data, dict):
        raise DefinitionsError(f"{path} is corrupt (not a JSON object); restore it from a backup")
    try:
        for key in _LIST_KEYS:
            _list(data, key)
    except DefinitionsError as exc:
        raise DefinitionsError(f"{path} is corrupt ({exc}); restore it from a backup") from None
    return data


def apply_metadata(node: Node, data: dict[str, Any]) -> None:
    """An older node's metadata document replaces the default users and vhosts (the migration)."""
    node.users.users.clear()
    keep = {v.get("name") for v in _list(data, "vhosts")}
    for name in [n for n in node.vhosts if n not in keep]:
        del node.vhosts[name]
    import_definitions(node, {**data, "parameters": parameters.supported(_list(data, "parameters"))})
