"""An older data directory (users, vhosts, permissions, policies and parameters in ``metadata.json``;
exchanges, queues and bindings in ``metadata.sqlite``) is migrated at the first start into the one
metadata store, in one commit, and ``metadata.json`` is renamed ``metadata.json.migrated`` (kept as a
backup, never read again). Everything is there after the migration and again after a restart."""

from __future__ import annotations

import contextlib
import signal

import pika
import pytest
from old_metadata import api, new_old_sqlite, old_document, rabbit_hash, write_old_json

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]


def old_data_dir(data_dir):
    new_old_sqlite(data_dir, queues=[("shop", "orders")], exchanges=[("shop", "events", "topic")],
                   bindings=[("shop", "events", "orders", "order.*")])
    write_old_json(data_dir, old_document(
        users=[{"name": "admin", "password_hash": rabbit_hash("admin-pw"), "tags": ["administrator"], "limits": {},
                "hashing_algorithm": "rabbit_password_hashing_sha256"},
               {"name": "shopper", "password_hash": rabbit_hash("shop-pw", b"\x09\x08\x07\x06"),
                "tags": ["management"], "limits": {"max-channels": 4},
                "hashing_algorithm": "rabbit_password_hashing_sha256"}],
        vhosts=[{"name": "/"}, {"name": "shop", "description": "the shop", "tags": ["prod"],
                                "limits": {"max-queues": 50}}],
        permissions=[{"user": "admin", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
                     {"user": "admin", "vhost": "shop", "configure": ".*", "write": ".*", "read": ".*"},
                     {"user": "shopper", "vhost": "shop", "configure": "^shop\\.", "write": ".*", "read": ".*"}],
        topic_permissions=[{"user": "shopper", "vhost": "shop", "exchange": "events", "write": "^order\\.",
                            "read": ".*"}],
        parameters=[{"vhost": "shop", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 50}}],
        global_parameters=[{"name": "cluster_name", "value": "old-cluster"}],
        policies=[{"vhost": "shop", "name": "cap", "pattern": "^orders$", "apply-to": "queues",
                   "definition": {"max-length": 1000}, "priority": 1}],
        operator_policies=[{"vhost": "shop", "name": "op-ttl", "pattern": ".*", "apply-to": "queues",
                            "definition": {"message-ttl": 600000}, "priority": 0}]))


def check_node(b) -> None:
    """What the old metadata.json and metadata.sqlite described, seen through the HTTP API and AMQP."""
    def get(path):
        status, body = api(b, "GET", path, user="admin", password="admin-pw")
        assert status == 200, (path, status, body)
        return body

    assert {u["name"] for u in get("/api/users")} == {"admin", "shopper"}  # no guest: the old node had none
    assert get("/api/users/shopper")["tags"] in (["management"], "management")
    assert get("/api/user-limits/shopper") == [{"user": "shopper", "value": {"max-channels": 4}}]
    shop = get("/api/vhosts/shop")
    assert shop["description"] == "the shop" and shop["tags"] == ["prod"]
    assert {(p["user"], p["vhost"], p["configure"]) for p in get("/api/permissions")} == \
        {("admin", "/", ".*"), ("admin", "shop", ".*"), ("shopper", "shop", "^shop\\.")}
    assert get("/api/topic-permissions") == [{"user": "shopper", "vhost": "shop", "exchange": "events",
                                              "write": "^order\\.", "read": ".*"}]
    assert [(p["name"], p["definition"]) for p in get("/api/policies/shop")] == [("cap", {"max-length": 1000})]
    assert [p["name"] for p in get("/api/operator-policies/shop")] == ["op-ttl"]
    assert get("/api/vhost-limits/shop") == [{"vhost": "shop", "value": {"max-queues": 50}}]
    assert get("/api/global-parameters/cluster_name")["value"] == "old-cluster"
    # The durable queue came back in its (migrated) vhost, with its binding and the policy applied.
    assert get("/api/queues/shop/orders")["policy"] == "cap"
    assert [(x["source"], x["routing_key"]) for x in get("/api/bindings/shop/e/events/q/orders")] == \
        [("events", "order.*")]
    params = b.pika_params()
    params.virtual_host, params.credentials = "shop", pika.PlainCredentials("shopper", "shop-pw")
    conn = pika.BlockingConnection(params)
    try:
        assert conn.channel().queue_declare("orders", passive=True).method.message_count == 0
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            conn.close()
    assert api(b, "GET", "/api/overview")[0] == 401  # guest/guest does not exist


def test_an_old_metadata_json_is_migrated_once_and_survives_restarts(start_broker, tmp_path):
    data = tmp_path / "old"
    old_data_dir(data)
    b = start_broker(data_dir=data)
    check_node(b)
    assert not (data / "metadata.json").exists()
    migrated = (data / "metadata.json.migrated").read_bytes()
    assert b"shopper" in migrated
    assert "metadata.json migrated into the metadata store" in b.log_text()

    assert b.stop(signal.SIGTERM) == 0
    b.start()
    check_node(b)
    assert not (data / "metadata.json").exists()
    assert (data / "metadata.json.migrated").read_bytes() == migrated  # not read, not touched again
    assert b.log_text().count("metadata.json migrated") == 1

    # Changes after the migration go to the store, and the backup is never read again.
    assert api(b, "DELETE", "/api/users/shopper", user="admin", password="admin-pw")[0] == 204
    b.stop(signal.SIGKILL)
    b.start()
    assert api(b, "GET", "/api/users/shopper", user="admin", password="admin-pw")[0] == 404
