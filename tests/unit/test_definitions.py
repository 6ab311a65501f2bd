"""Definitions in RabbitMQ's JSON format: a file as RabbitMQ 3.13 exports it imports unchanged (users keep
their passwords), and export → fresh node → import → export gives the same document."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
from pathlib import Path

import pytest

from broker import definitions
from broker.config import Settings
from broker.node import Node
from broker.security.auth import check_password
from broker.server import Server


def rabbit_hash(password: str, salt: bytes, algo=hashlib.sha256) -> str:
    return base64.b64encode(salt + algo(salt + password.encode()).digest()).decode()


# Shaped as `rabbitmqctl export_definitions` writes it on RabbitMQ 3.13 (tags as a list; older releases
# write a comma-separated string, which the second user uses).
RABBITMQ_313 = {
    "bindings": [
        {"arguments": {}, "destination": "orders", "destination_type": "queue", "routing_key": "order.*",
         "source": "events", "vhost": "shop"},
        {"arguments": {}, "destination": "audit", "destination_type": "exchange", "routing_key": "#",
         "source": "events", "vhost": "shop"},
    ],
    "exchanges": [
        {"arguments": {}, "auto_delete": False, "durable": True, "name": "events", "type": "topic", "vhost": "shop"},
        {"arguments": {}, "auto_delete": False, "durable": True, "internal": False, "name": "audit",
         "type": "fanout", "vhost": "shop"},
    ],
    "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-3kX9ZqYy"}],
    "parameters": [],
    "permissions": [
        {"configure": ".*", "read": ".*", "user": "admin", "vhost": "/", "write": ".*"},
        {"configure": "^shop\\.", "read": ".*", "user": "shopper", "vhost": "shop", "write": "^events$"},
    ],
    "policies": [
        {"apply-to": "queues", "definition": {"max-length": 1000, "overflow": "reject-publish"}, "name": "cap",
         "pattern": "^orders$", "priority": 1, "vhost": "shop"},
    ],
    "product_name": "RabbitMQ",
    "product_version": "3.13.7",
    "queues": [
        {"arguments": {"x-queue-type": "classic", "x-message-ttl": 60000}, "auto_delete": False, "durable": True,
         "name": "orders", "type": "classic", "vhost": "shop"},
    ],
    "rabbit_version": "3.13.7",
    "rabbitmq_version": "3.13.7",
    "topic_permissions": [{"exchange": "amq.topic", "read": ".*", "user": "shopper", "vhost": "shop",
                           "write": "^shop\\."}],
    "users": [
        {"hashing_algorithm": "rabbit_password_hashing_sha256", "limits": {}, "name": "admin",
         "password_hash": rabbit_hash("admin-pw", b"\x01\x02\x03\x04"), "tags": ["administrator"]},
        {"hashing_algorithm": "rabbit_password_hashing_sha512", "limits": {}, "name": "shopper",
         "password_hash": rabbit_hash("shop-pw", b"\x09\x08\x07\x06", hashlib.sha512),
         "tags": "management,policymaker"},
    ],
    "vhosts": [
        {"limits": [], "metadata": {"description": "", "tags": []}, "name": "/"},
        {"limits": [], "metadata": {"description": "the shop", "tags": ["prod"], "default_queue_type": "classic"},
         "name": "shop"},
    ],
}


def fresh_node(tmp_path: Path, name: str = "n") -> Node:
    return Node(Settings(data_dir=tmp_path / name))


async def test_rabbitmq_313_export_imports_unchanged(tmp_path):
    node = fresh_node(tmp_path)
    definitions.import_definitions(node, json.loads(json.dumps(RABBITMQ_313)))
    admin, shopper = node.users.users["admin"], node.users.users["shopper"]
    assert check_password("admin-pw", admin.password_hash, admin.hashing_algorithm)
    assert check_password("shop-pw", shopper.password_hash, shopper.hashing_algorithm)
    assert not check_password("wrong", shopper.password_hash, shopper.hashing_algorithm)
    assert shopper.tags == ["management", "policymaker"]
    assert node.users.authenticate("PLAIN", b"\x00shopper\x00shop-pw", "127.0.0.1", set()) is shopper
    shop = node.vhosts["shop"]
    assert shop.description == "the shop" and shop.tags == ["prod"]
    assert shopper.permissions["shop"].write == "^events$"
    assert shopper.topic_permissions["shop"]["amq.topic"] == ("^shop\\.", ".*")
    assert shop.exchanges["events"].type_name == "topic"
    q = shop.queues.get("orders")
    assert q is not None and q.durable and q.arguments["x-message-ttl"] == 60000
    assert {(b.source, b.destination, b.routing_key) for b in shop.bindings()} == \
        {("events", "orders", "order.*"), ("events", "audit", "#")}
    assert shop.policies["cap"].definition == {"max-length": 1000, "overflow": "reject-publish"}
    assert node.global_parameters["internal_cluster_id"] == "rabbitmq-cluster-id-3kX9ZqYy"


async def test_round_trip_export_import_export(tmp_path):
    first = fresh_node(tmp_path, "a")
    definitions.import_definitions(first, json.loads(json.dumps(RABBITMQ_313)))
    exported = definitions.export(first)
    second = fresh_node(tmp_path, "b")
    definitions.import_definitions(second, json.loads(json.dumps(exported)))
    assert definitions.export(second) == exported
    assert exported["product_name"] == "Leveret"
    assert {u["name"] for u in exported["users"]} == {"guest", "admin", "shopper"}


async def test_vhost_export_and_import(tmp_path):
    node = fresh_node(tmp_path)
    definitions.import_definitions(node, json.loads(json.dumps(RABBITMQ_313)))
    per_vhost = definitions.export(node, "shop")
    assert "users" not in per_vhost and all("vhost" not in q for q in per_vhost["queues"])
    node.add_vhost("copy")
    definitions.import_definitions(node, per_vhost, vhost="copy")
    assert node.vhosts["copy"].queues.get("orders") is not None
    assert "cap" in node.vhosts["copy"].policies


@pytest.mark.parametrize("bad, fragment", [
    ([], "must be a JSON object"),
    ({"users": [{"name": "x", "password_hash": "!!"}]}, "password_hash"),
    ({"users": [{"name": "x", "password_hash": "", "hashing_algorithm": "rot13"}]}, "hashing_algorithm"),
    ({"permissions": [{"user": "ghost", "vhost": "/"}]}, "unknown user 'ghost'"),
    ({"queues": [{"name": "q", "vhost": "nowhere"}]}, "vhost 'nowhere'"),
    ({"exchanges": [{"name": "x", "vhost": "/", "type": "bogus"}]}, "unknown exchange type 'bogus'"),
    ({"bindings": [{"source": "nope", "vhost": "/", "destination": "q", "destination_type": "queue"}]},
     "unknown queue 'q'"),
    ({"policies": [{"name": "p", "vhost": "/", "pattern": "(", "definition": {"a": 1}}]}, "invalid pattern"),
])
async def test_bad_definitions_are_refused_with_a_reason(tmp_path, bad, fragment):
    node = fresh_node(tmp_path)
    with pytest.raises(definitions.DefinitionsError) as info:
        definitions.import_definitions(node, bad)
    assert fragment in str(info.value)


async def test_load_file(tmp_path):
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(RABBITMQ_313))
    node = fresh_node(tmp_path)
    definitions.load_file(node, path)
    assert "shop" in node.vhosts
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(definitions.DefinitionsError, match="not valid JSON"):
        definitions.load_file(node, tmp_path / "broken.json")


# -- the one metadata store: written by the domain, read back in one ordered pass ---------------------------------

def opened_node(tmp_path: Path, name: str = "n") -> Node:
    """A node with its storage open (as at start, before it listens); close with ``close``."""
    server = Server(fresh_node(tmp_path, name))
    server.open_storage()
    _servers[id(server.node)] = server
    return server.node


# The server that opened each node's storage (it holds the data directory's lock until close()).
_servers: dict[int, Server] = {}


def close(node: Node) -> None:
    node.close_storage()
    lock = _servers.pop(id(node))._data_dir_lock
    assert lock is not None
    lock.release()


async def test_everything_imported_is_back_after_a_restart(tmp_path):
    node = opened_node(tmp_path)
    definitions.import_definitions(node, json.loads(json.dumps(RABBITMQ_313)))
    node.vhosts["shop"].set_parameter("vhost-limits", "limits", {"max-queues": 7})
    node.set_user_limits("admin", {"max-channels": 3})
    node.vhosts["/"].set_policy(node.vhosts["shop"].policies["cap"].__class__(
        "op", "^x", {"max-length": 5}, 2, "queues", "/"), operator=True)
    node.delete_users("guest")
    exported = definitions.export(node)
    assert not (tmp_path / "n" / "metadata.json").exists()  # one store: no JSON file beside it
    close(node)

    again = opened_node(tmp_path)
    assert definitions.export(again) == exported
    assert "guest" not in again.users.users
    assert again.vhosts["/"].operator_policies["op"].definition == {"max-length": 5}
    assert again.users.users["admin"].limits == {"max-channels": 3}
    # queues came back after their vhost and policies: the policy applies to the recovered queue
    assert again.vhosts["shop"].queues.get("orders").settings.max_length == 1000
    close(again)


def bulk_document(vhost: str, n: int) -> dict:
    return {"vhosts": [{"name": vhost}],
            "permissions": [{"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
            "policies": [{"vhost": vhost, "name": "p", "pattern": "^q", "definition": {"max-length": 9}}],
            "exchanges": [{"name": "x", "vhost": vhost, "type": "direct"}],
            "queues": [{"name": f"q{i}", "vhost": vhost} for i in range(n)],
            "bindings": [{"source": "x", "vhost": vhost, "destination": f"q{i}", "destination_type": "queue",
                          "routing_key": f"k{i}"} for i in range(n)]}


def rows_of(node: Node, vhost: str) -> int:
    md = node.storage.metadata
    return sum(1 for kind in md.kinds() for key, _ in md.items(kind)
               if key == vhost or (isinstance(key, tuple) and key[0] == vhost))


async def test_an_import_of_1000_queues_and_bindings_and_a_vhost_deletion_are_one_commit_each(tmp_path, monkeypatch):
    node = opened_node(tmp_path)
    md = node.storage.metadata
    before = md.commits
    definitions.import_definitions(node, bulk_document("bulk", 1000))
    assert md.commits - before == 1
    assert rows_of(node, "bulk") == 1 + 1 + 1 + 1 + 1000 + 1000  # vhost, permission, policy, exchange, q, b

    # Over HTTP the import runs in slices (the loop is free in between) and still commits once, in a thread.
    monkeypatch.setattr(definitions, "IMPORT_SLICE_SECONDS", 0.001)  # many slices
    threads: list[str] = []
    apply = md.apply
    monkeypatch.setattr(md, "apply", lambda ops: (threads.append(threading.current_thread().name), apply(ops)))
    before = md.commits
    await definitions.import_definitions_async(node, bulk_document("bulk2", 1000))
    assert md.commits - before == 1
    assert threads and threads[0] != threading.main_thread().name
    assert rows_of(node, "bulk2") == 2004

    before = md.commits
    assert node.delete_vhost("bulk")
    assert md.commits - before == 1
    assert rows_of(node, "bulk") == 0 and "bulk" not in node.users.users["guest"].permissions
    close(node)
    again = opened_node(tmp_path)
    assert "bulk" not in again.vhosts and len(again.vhosts["bulk2"].queues.get("q5").name) == 2
    close(again)


async def test_writes_between_the_slices_of_an_import_keep_their_order(tmp_path, monkeypatch):
    """A client deleting a queue the import created, between two slices, is not undone by the import's
    commit at the end."""
    node = opened_node(tmp_path)
    monkeypatch.setattr(definitions, "IMPORT_SLICE_SECONDS", 0.0)
    doc = {**bulk_document("mix", 50), "bindings": []}
    task = asyncio.ensure_future(definitions.import_definitions_async(node, doc))
    while node.vhosts.get("mix") is None or node.vhosts["mix"].queues.get("q3") is None:
        await asyncio.sleep(0)
    node.vhosts["mix"].queues.delete(node.vhosts["mix"].queues.get("q3"))
    await task
    assert node.storage.metadata.get("queue", ("mix", "q3")) is None
    assert node.storage.metadata.get("queue", ("mix", "q4")) is not None
    close(node)


async def test_a_write_that_fails_changes_nothing(tmp_path):
    """The store refuses writes (SQLite's query_only, as a read-only file would): each change raises and
    memory is as it was; after a restart the node is the same."""
    node = opened_node(tmp_path)
    definitions.import_definitions(node, bulk_document("keep", 3))
    before = definitions.export(node)
    node.storage.metadata._db.execute("PRAGMA query_only = ON")
    from broker.policies.policy import Policy
    from storage.metadata_store import MetadataWriteError

    keep = node.vhosts["keep"]
    for change in (lambda: node.add_user("new", "pw"), lambda: node.add_vhost("new"),
                   lambda: node.set_permissions("guest", "keep", "", "", ""),
                   lambda: node.clear_permissions("guest", "keep"), lambda: node.delete_users("guest"),
                   lambda: node.set_topic_permission("guest", "keep", "amq.topic", "a", "b"),
                   lambda: node.set_global_parameter("g", 1), lambda: node.set_user_limits("guest", {"max-channels": 1}),
                   lambda: keep.set_policy(Policy("p2", ".*", {"max-length": 1})), lambda: keep.clear_policy("p"),
                   lambda: keep.set_parameter("vhost-limits", "limits", {"max-queues": 1}),
                   lambda: node.delete_vhost("keep"),
                   lambda: definitions.import_definitions(node, bulk_document("new", 2))):
        with pytest.raises(MetadataWriteError):
            change()
    assert node.vhosts["keep"] is keep and keep.queues.get("q1") is not None
    assert definitions.export(node) == before
    close(node)
    again = opened_node(tmp_path)
    assert definitions.export(again) == before
    close(again)


async def test_a_classic_queue_with_a_dead_letter_strategy_from_an_earlier_leveret_is_imported_without_it(tmp_path):
    """An earlier Leveret let a classic queue keep x-dead-letter-strategy (to no effect); RabbitMQ refuses it
    there, and so does a declare now. Its export (or its stored metadata, which is imported the same way)
    still loads: the argument is left out, a quorum queue keeps its own, and the queue is redeclared as it
    was declared without a 406."""
    node = fresh_node(tmp_path)
    strategy = {"x-dead-letter-strategy": "at-least-once", "x-dead-letter-exchange": "dlx"}
    definitions.import_definitions(node, {"queues": [
        {"name": "old", "vhost": "/", "durable": True, "auto_delete": False, "arguments": dict(strategy)},
        {"name": "q", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-type": "quorum", **strategy}}]})
    vh = node.vhosts["/"]
    assert vh.queues.get("old").arguments == {"x-dead-letter-exchange": "dlx"}
    assert vh.queues.get("q").arguments["x-dead-letter-strategy"] == "at-least-once"
    # A durable classic queue recovered with the argument (stored by the earlier version) is redeclared as
    # it was declared.
    vh.queues.restore("kept", False, {"x-queue-type": "classic", **strategy})
    queue, created = vh.queues.declare("kept", False, True, False, False, dict(strategy), None)
    assert queue is vh.queues.get("kept") and not created


async def test_an_import_leaves_out_what_the_type_refuses_only_for_a_queue_it_creates(tmp_path):
    """The refused arguments are left out of a queue the import creates, by the type it will have (the vhost's
    default when the entry names none), and not out of a queue that exists: a quorum queue an earlier Leveret
    stored with x-queue-mode, imported again, is redeclared with it (leaving it out was an inequivalent
    redeclare, and a node that loads definitions at start would not have started)."""
    node = fresh_node(tmp_path)
    vh = node.vhosts["/"]
    vh.queues.restore("stored", False, {"x-queue-type": "quorum", "x-queue-mode": "lazy"})
    definitions.import_definitions(node, {"queues": [
        {"name": "stored", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-type": "quorum", "x-queue-mode": "lazy"}}]})
    assert vh.queues.get("stored").arguments == {"x-queue-type": "quorum", "x-queue-mode": "lazy"}
    node.add_vhost("qq", None, None, "quorum")
    definitions.import_definitions(node, {"queues": [
        {"name": "typed-by-default", "vhost": "qq", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-mode": "lazy", "x-max-in-memory-length": 5}}]})
    assert node.vhosts["qq"].queues.get("typed-by-default").arguments == \
        {"x-queue-type": "quorum", "x-max-in-memory-length": 5}
