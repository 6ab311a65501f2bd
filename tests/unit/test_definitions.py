"""Definitions in RabbitMQ's JSON format: a file as RabbitMQ 3.13 exports it imports unchanged (users keep
their passwords), and export → fresh node → import → export gives the same document."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from broker import definitions
from broker.auth import check_password
from broker.config import Settings
from broker.node import Node


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


async def test_load_file_and_metadata_file(tmp_path):
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(RABBITMQ_313))
    node = fresh_node(tmp_path)
    definitions.load_file(node, path)
    assert "shop" in node.vhosts
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(definitions.DefinitionsError, match="not valid JSON"):
        definitions.load_file(node, tmp_path / "broken.json")
    # The node wrote its metadata; a new node on the same data directory reads it back.
    node.users.delete("guest")
    node.metadata_changed()
    again = fresh_node(tmp_path)
    assert definitions.load_metadata(again)
    assert set(again.users.users) == {"admin", "shopper"}
    assert again.vhosts["shop"].policies["cap"].priority == 1
