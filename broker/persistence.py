"""What survives a restart: every definition of the node in its one metadata store (users, vhosts,
permissions, policies, parameters, durable exchanges, queues and bindings), messages in the variable
queues, and the one ordered recovery pass that brings them back at start.

storage/ stores bytes and knows nothing of AMQP; this module is the translation: a message is stored in
broker/queues/message_codec.py's format (shared with the stream queue, a layer below), and queue and exchange
arguments as AMQP field tables.

The metadata store's kinds and keys (storage/metadata_store.py; per-vhost keys start with the vhost, so
a vhost's deletion is one prefix delete per kind, all in one transaction)::

    node              "storage" {"format"}; "metadata" {"format"}: users and vhosts are kept here
    vhost             name → {description, tags, default_queue_type}
    user              name → {password_hash, hashing_algorithm, tags, limits}
    permission        (vhost, user) → {configure, write, read}
    topic_permission  (vhost, user, exchange) → {write, read}
    policy            (vhost, name) → {pattern, definition, priority, apply-to}
    operator_policy   (vhost, name) → the same
    parameter         (vhost, component, name) → value
    global_parameter  name → value
    exchange          (vhost, name) → {type, auto_delete, internal, arguments (a field table)}
    queue             (vhost, name) → {auto_delete, arguments}
    binding           (vhost, source, kind, destination, routing key, sha1 of arguments) → {arguments}

Writers are called by the domain (the node, the vhost) *before* it changes anything in memory: a write
that fails raises storage's MetadataWriteError and nothing changes, so memory never holds what a
restart would not bring back (RabbitMQ's metadata store commits before the change takes effect, too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import decode as amqp_decode
from pamqp import encode as amqp_encode

from broker.exchanges.exchange import EXCHANGE, QUEUE, Binding, Exchange
from broker.policies.policy import Policy
from broker.queues.message_codec import decode_message, encode_message
from broker.security.auth import Permission, User, UserStore
from storage.backing_queue import BackingQueue
from storage.node_storage import NODE_KIND, NodeStorage
from storage.stream_log import StreamLog

if TYPE_CHECKING:
    from broker.queues.queue_types import Queue
    from broker.vhost import VHost

log = structlog.get_logger("leveret.persistence")

# The row saying that the node's users, vhosts, permissions, policies and parameters are in this store
# (written with the defaults of a new node, or when an older node's metadata.json was migrated).
NODE_METADATA_KEY = "metadata"
NODE_METADATA_FORMAT = 1
# Kinds whose keys start with the vhost: a vhost's deletion removes all of its rows.
VHOST_KINDS = ("exchange", "queue", "binding", "permission", "topic_permission", "policy", "operator_policy",
               "parameter")


def table_of(arguments: dict[str, Any]) -> bytes:
    """Arguments as stored: an AMQP field table."""
    return amqp_encode.field_table(arguments)


def untable(raw: bytes) -> dict[str, Any]:
    return dict(amqp_decode.field_table(raw)[1]) if raw else {}


def binding_args_hash(arguments: dict[str, Any]) -> str:
    """The last part of a binding's key: its arguments' digest (two bindings may differ only there)."""
    return hashlib.sha1(table_of(arguments)).hexdigest()


class DurableDefinitions:
    """The durable part of every vhost's topology, written as it changes and read back at start.

    Exclusive queues are never durable (RabbitMQ ignores the flag on them); a binding is durable when its
    source exchange and its destination both are.
    """

    def __init__(self, storage: NodeStorage) -> None:
        self.storage = storage
        self.metadata = storage.metadata

    # -- writing ---------------------------------------------------------------------------------------
    def exchange_declared(self, vhost: str, ex: Exchange) -> None:
        if ex.durable:
            self.metadata.put("exchange", (vhost, ex.name), {
                "type": ex.type_name, "auto_delete": ex.auto_delete, "internal": ex.internal,
                "arguments": table_of(ex.arguments)})

    def exchange_deleted(self, vhost: str, name: str) -> None:
        self.metadata.delete("exchange", (vhost, name))

    def queue_declared(self, vhost: str, q: Queue) -> None:
        if q.durable and q.exclusive_owner is None:
            self.metadata.put("queue", (vhost, q.name), {
                "auto_delete": q.auto_delete, "arguments": table_of(q.arguments)})

    def queue_deleted(self, vhost: str, name: str) -> None:
        self.metadata.delete("queue", (vhost, name))

    @staticmethod
    def _binding_key(vhost: str, b: Binding) -> tuple[str, ...]:
        return (vhost, b.source, b.kind, b.destination, b.routing_key, binding_args_hash(b.arguments))

    def binding_added(self, vh: VHost, b: Binding) -> None:
        source = vh.exchanges.get(b.source)
        if source is None or not source.durable:
            return
        if b.kind == QUEUE:
            q = vh.queues.get(b.destination)
            if q is None or not q.durable or q.exclusive_owner is not None:
                return
        else:
            dest = vh.exchanges.get(b.destination)
            if dest is None or not dest.durable:
                return
        self.metadata.put("binding", self._binding_key(vh.name, b), {"arguments": table_of(b.arguments)})

    def binding_removed(self, vhost: str, b: Binding) -> None:
        self.metadata.delete("binding", self._binding_key(vhost, b))

    # -- users, vhosts, permissions, policies, parameters --------------------------------------------------
    @property
    def has_node_metadata(self) -> bool:
        return self.metadata.get(NODE_KIND, NODE_METADATA_KEY) is not None

    def vhost_put(self, name: str, description: str, tags: list[str], default_queue_type: str) -> None:
        self.metadata.put("vhost", name, {"description": description, "tags": list(tags),
                                          "default_queue_type": default_queue_type})

    def vhost_deleted(self, vhost: str) -> None:
        """The vhost and everything in it (exchanges, queues, bindings, permissions, policies,
        parameters), in one transaction: one commit."""
        with self.metadata.transaction():
            self.metadata.delete("vhost", vhost)
            for kind in VHOST_KINDS:
                self.metadata.delete_prefix(kind, (vhost,))

    def user_put(self, user: User) -> None:
        self.metadata.put("user", user.name, {"password_hash": user.password_hash,
                                              "hashing_algorithm": user.hashing_algorithm,
                                              "tags": list(user.tags), "limits": dict(user.limits)})

    def user_deleted(self, user: User) -> None:
        """The user and its permissions and topic permissions in every vhost, in one transaction."""
        with self.metadata.transaction():
            self.metadata.delete("user", user.name)
            for vhost in user.permissions:
                self.metadata.delete("permission", (vhost, user.name))
            for vhost in user.topic_permissions:
                self.metadata.delete_prefix("topic_permission", (vhost, user.name))

    def permission_set(self, vhost: str, user: str, permission: Permission) -> None:
        self.metadata.put("permission", (vhost, user), permission.as_dict())

    def permission_cleared(self, vhost: str, user: str) -> None:
        self.metadata.delete("permission", (vhost, user))

    def topic_permission_set(self, vhost: str, user: str, exchange: str, write: str, read: str) -> None:
        self.metadata.put("topic_permission", (vhost, user, exchange), {"write": write, "read": read})

    def topic_permissions_cleared(self, vhost: str, user: str) -> None:
        self.metadata.delete_prefix("topic_permission", (vhost, user))

    def policy_set(self, vhost: str, policy: Policy, operator: bool) -> None:
        self.metadata.put("operator_policy" if operator else "policy", (vhost, policy.name),
                          {"pattern": policy.pattern, "definition": policy.definition, "priority": policy.priority,
                           "apply-to": policy.apply_to})

    def policy_cleared(self, vhost: str, name: str, operator: bool) -> None:
        self.metadata.delete("operator_policy" if operator else "policy", (vhost, name))

    def parameter_set(self, vhost: str, component: str, name: str, value: Any) -> None:
        self.metadata.put("parameter", (vhost, component, name), value)

    def parameter_cleared(self, vhost: str, component: str, name: str) -> None:
        self.metadata.delete("parameter", (vhost, component, name))

    def global_parameter_set(self, name: str, value: Any) -> None:
        self.metadata.put("global_parameter", name, value)

    def global_parameter_cleared(self, name: str) -> None:
        self.metadata.delete("global_parameter", name)

    def save_node_metadata(self, users: UserStore, vhosts: dict[str, VHost], global_parameters: dict[str, Any],
                           drop: tuple[str, str] | None = None) -> None:
        """All of the node's users, vhosts, permissions, policies and parameters, and the row saying they
        are here, in one transaction: a new node's defaults, or an older node's migrated metadata.json
        (``drop``: the row that recorded the JSON file, deleted in the same commit)."""
        with self.metadata.transaction():
            for vh in vhosts.values():
                self.vhost_put(vh.name, vh.description, vh.tags, vh.default_queue_type)
                for policy in vh.policies.values():
                    self.policy_set(vh.name, policy, operator=False)
                for policy in vh.operator_policies.values():
                    self.policy_set(vh.name, policy, operator=True)
                for (component, name), value in vh.parameters.items():
                    self.parameter_set(vh.name, component, name, value)
            for user in users.users.values():
                self.user_put(user)
                for vhost, permission in user.permissions.items():
                    self.permission_set(vhost, user.name, permission)
                for vhost, entries in user.topic_permissions.items():
                    for exchange, (write, read) in entries.items():
                        self.topic_permission_set(vhost, user.name, exchange, write, read)
            for name, value in global_parameters.items():
                self.global_parameter_set(name, value)
            if drop is not None:
                self.metadata.delete(*drop)
            self.metadata.put(NODE_KIND, NODE_METADATA_KEY, {"format": NODE_METADATA_FORMAT})

    def recover_node_metadata(self, users: UserStore, vhosts: dict[str, VHost],
                              make_vhost: Callable[[str, str, list[str], str], VHost],
                              global_parameters: dict[str, Any]) -> dict[str, int]:
        """The first part of the recovery pass, in order: vhosts, then users and their permissions, then
        policies and parameters. What the store holds replaces the node's defaults (guest, "/")."""
        counts = {"vhost": 0, "user": 0}
        rows = {kind: self.metadata.items(kind) for kind in ("vhost", "user", "permission", "topic_permission",
                                                              "policy", "operator_policy", "parameter",
                                                              "global_parameter")}
        keep = {name for name, _ in rows["vhost"]}
        for name in [n for n in vhosts if n not in keep]:
            del vhosts[name]
        for name, v in rows["vhost"]:
            vh = make_vhost(str(name), v.get("description", ""), list(v.get("tags", [])),
                            v.get("default_queue_type", "classic"))
            vh.description, vh.tags = v.get("description", ""), list(v.get("tags", []))
            vh.default_queue_type = v.get("default_queue_type", "classic")
            counts["vhost"] += 1
        users.users.clear()
        for name, v in rows["user"]:
            user = users.put(str(name), v["password_hash"], list(v.get("tags", [])), v["hashing_algorithm"])
            user.limits = dict(v.get("limits") or {})
            counts["user"] += 1
        for (vhost, name), v in rows["permission"]:
            if name in users.users and vhost in vhosts:
                users.users[name].permissions[vhost] = Permission(v["configure"], v["write"], v["read"])
        for (vhost, name, exchange), v in rows["topic_permission"]:
            if name in users.users and vhost in vhosts:
                users.users[name].topic_permissions.setdefault(vhost, {})[exchange] = (v["write"], v["read"])
        for kind in ("policy", "operator_policy"):
            for (vhost, name), v in rows[kind]:
                holder = vhosts.get(vhost)
                if holder is not None:
                    store = holder.operator_policies if kind == "operator_policy" else holder.policies
                    store[name] = Policy(name, v["pattern"], v["definition"], v["priority"], v["apply-to"], vhost)
        for (vhost, component, name), value in rows["parameter"]:
            if vhost in vhosts:
                vhosts[vhost].parameters[(component, name)] = value
        global_parameters.clear()
        global_parameters.update({str(name): value for name, value in rows["global_parameter"]})
        return counts

    # -- recovery ----------------------------------------------------------------------------------------
    def recover(self, vhosts: dict[str, VHost], make_vhost: Callable[[str], VHost]) -> None:
        """The second part of the recovery pass (after :meth:`recover_node_metadata`): re-create the
        durable exchanges, then the queues (their messages come back with them), then the bindings.
        Called once, before the node listens."""
        counts = {"exchange": 0, "queue": 0, "binding": 0}
        for (vhost, name), v in self.metadata.items("exchange"):
            vh = vhosts.get(vhost) or make_vhost(vhost)
            vh.restore_exchange(name, v["type"], v["auto_delete"], v["internal"], untable(v["arguments"]))
            counts["exchange"] += 1
        for (vhost, name), v in self.metadata.items("queue"):
            vh = vhosts.get(vhost) or make_vhost(vhost)
            vh.queues.restore(name, v["auto_delete"], untable(v["arguments"]))
            counts["queue"] += 1
        for (vhost, source, kind, dest, rk, _h), v in self.metadata.items("binding"):
            owner = vhosts.get(vhost)
            ex = owner.exchanges.get(source) if owner is not None else None
            if owner is None or ex is None or (kind == QUEUE and owner.queues.get(dest) is None) or \
                    (kind == EXCHANGE and dest not in owner.exchanges):
                continue
            ex.add_binding(Binding(source, dest, kind, rk, untable(v["arguments"])))
            counts["binding"] += 1
        self.storage.finish_recovery()
        for vh in vhosts.values():
            for ex in list(vh.exchanges.values()):
                ex.after_recovery()
        log.info("recovered durable definitions", clean=self.storage.was_clean, **counts)


class BackingQueueFactory:
    """Opens the backing queue of a queue: a variable queue over the node's stores (paging to disk under
    memory pressure; persistent messages of durable queues survive restarts); and the log of a stream
    (broker/queues/stream_queue.py's StreamOpener), whose payloads are broker/queues/stream_record.py's records."""

    def __init__(self, storage: NodeStorage, vhost: str) -> None:
        self.storage = storage
        self.vhost = vhost

    def open_stream(self, name: str, max_segment_size_bytes: int) -> StreamLog:
        """The stream's log in the node's stream store (the same stream again at a restart)."""
        return self.storage.open_stream(self.vhost, name, max_segment_size_bytes=max_segment_size_bytes)

    def __call__(self, name: str, durable: bool, priority: int | None = None,
                 on_confirm: Callable[[], None] | None = None) -> BackingQueue:
        storage_name = name if priority is None else f"{name}\x00priority-{priority}"
        return self.storage.open_queue(self.vhost, storage_name, durable, encode=encode_message,
                                       decode=decode_message, on_confirm=on_confirm)
