"""A cluster of Leveret nodes on one PostgreSQL (issue 15): definitions made on one member are seen, and
enforced, on the others within a second or two, whichever client made them (pika or the HTTP API); a
member restarted, or started with an empty data directory, takes the cluster's definitions rather than
writing its own defaults over them. Real broker processes and a real PostgreSQL (tests/pg_server.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.error

import asyncpg
import pika
import pika.exceptions
import pytest

from broker.definitions import CLAIM_SLICE
from tests.conftest import BrokerProcess, free_port
from tests.integration.management.test_management_api import Http, q, wait_for

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]  # pg_dsn: a fresh database on the session's PostgreSQL


def member(start_broker, dsn: str, name: str, *extra: str, **kw):
    """A cluster member, returned once its HTTP API answers too (it starts just after AMQP)."""
    b = start_broker("--set", f"cluster.postgres.dsn={dsn}", "--set", f"leveret.nodename={name}", *extra, **kw)
    assert wait_for(lambda: http_status(Http(b.management_port), "/api/overview") is not None, 30)
    return b


def passive_exists(b, kind: str, name: str) -> bool:
    """Whether a passive declare of the queue (``kind`` "queue") or exchange ``name`` succeeds on ``b``."""
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    try:
        ch.queue_declare(name, passive=True) if kind == "queue" else ch.exchange_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_topology_declared_on_one_member_is_seen_on_the_other(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    conn = pika.BlockingConnection(a.pika_params())
    ch = conn.channel()
    ch.exchange_declare("orders-x", "topic", durable=True)
    ch.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind("orders", "orders-x", "order.*")
    ch.queue_declare("local-only", durable=True)  # a classic queue: its messages live on a
    assert wait_for(lambda: passive_exists(b, "exchange", "orders-x"), 30)
    assert wait_for(lambda: passive_exists(b, "queue", "orders"), 30)
    api_b = Http(b.management_port)
    bindings = wait_for(lambda: [x for x in api_b("GET", "/api/queues/%2F/orders/bindings")[1]
                                 if x["source"] == "orders-x"], 5)
    assert [(x["source"], x["routing_key"]) for x in bindings] == [("orders-x", "order.*")]
    # Deletions travel too.
    ch.queue_unbind("orders", "orders-x", "order.*")
    ch.exchange_delete("orders-x")
    ch.queue_delete("orders")
    conn.close()
    assert wait_for(lambda: not passive_exists(b, "exchange", "orders-x"), 30)
    assert wait_for(lambda: not passive_exists(b, "queue", "orders"), 30)


def test_users_permissions_and_policies_made_through_the_api_apply_on_every_member(start_broker, pg_dsn):
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    api_a, api_b = Http(a.management_port), Http(b.management_port)
    assert api_a("PUT", "/api/users/alice", {"password": "s3cret", "tags": ""})[0] in (201, 204)
    assert api_a("PUT", "/api/permissions/%2F/alice", {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)

    def alice_can_connect() -> bool:
        """Whether alice logs in on b and opens "/". The user and her permissions are two writes on a, and
        b may have applied the first and not yet the second: a refused vhost is "not yet", like a refused
        login (RabbitMQ answers the same between two such API calls)."""
        params = pika.ConnectionParameters("127.0.0.1", b.port, credentials=pika.PlainCredentials("alice", "s3cret"))
        try:
            pika.BlockingConnection(params).close()
            return True
        except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError):
            return False

    assert wait_for(alice_can_connect, 30)
    # A policy set on a applies to b's view of a shared queue.
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare("capped", durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    assert api_a("PUT", "/api/policies/%2F/cap", {"pattern": "^capped$", "definition": {"max-length": 5},
                                                   "apply-to": "queues"})[0] in (201, 204)
    effective = wait_for(lambda: api_b("GET", "/api/queues/%2F/capped")[1].get("effective_policy_definition"), 30)
    assert effective == {"max-length": 5}
    # And a user deleted on b can no longer log in on a.
    assert api_b("DELETE", "/api/users/alice")[0] == 204
    assert wait_for(lambda: api_a("GET", "/api/users/alice")[0] == 404, 30)


def test_a_member_started_later_or_restarted_takes_the_clusters_definitions(start_broker, pg_dsn, tmp_path):
    a = member(start_broker, pg_dsn, "a@test")
    api_a = Http(a.management_port)
    # The default user's password changed on a: a new member must not put guest/guest back.
    assert api_a("PUT", "/api/users/guest", {"password": "changed", "tags": "administrator"})[0] in (201, 204)
    assert api_a("PUT", "/api/vhosts/" + q("shop"), {}, auth=("guest", "changed"))[0] in (201, 204)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", a.port, credentials=pika.PlainCredentials("guest", "changed")))
    conn.channel().exchange_declare("late-x", "fanout", durable=True)
    conn.close()
    b = member(start_broker, pg_dsn, "b@test", data_dir=tmp_path / "fresh")
    api_b = Http(b.management_port)
    assert wait_for(lambda: http_status(api_b, "/api/vhosts/shop") == 200, 30)
    assert api_b("GET", "/api/exchanges/%2F/late-x", auth=("guest", "changed"))[0] == 200
    assert api_b("GET", "/api/overview", auth=("guest", "guest"))[0] == 401
    # A restarted member keeps seeing what changed while it was away.
    b.stop()
    assert api_a("DELETE", "/api/vhosts/shop", auth=("guest", "changed"))[0] == 204
    b.start()
    assert wait_for(lambda: http_status(api_b, "/api/vhosts/shop") == 404, 30)


def http_status(api: Http, path: str) -> int | None:
    """The status of a GET as guest/changed; None while the HTTP listener is not up yet."""
    try:
        return api("GET", path, auth=("guest", "changed"))[0]
    except urllib.error.URLError:
        return None


def test_a_member_cannot_start_without_its_database(start_broker, tmp_path):
    bad = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp_path / "d", log_path=tmp_path / "log",
                      extra_args=["--set", f"cluster.postgres.dsn={bad}"])
    with pytest.raises(RuntimeError, match="exited"):
        b.start()
    text = b.log_text()
    assert "cannot reach the cluster's PostgreSQL" in text and "cluster.postgres.dsn" in text


def test_every_member_is_listed_by_the_api_and_cluster_status(start_broker, pg_dsn):
    from tests.integration.management.test_ctl_operator_verbs import _cli

    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    api_a = Http(a.management_port)
    nodes = {n["name"]: n for n in api_a("GET", "/api/nodes")[1]}
    assert set(nodes) == {"a@test", "b@test"} and nodes["a@test"]["running"] and nodes["b@test"]["running"]
    assert api_a("GET", "/api/nodes/b%40test")[1]["name"] == "b@test"
    out = _cli("ctl", f"http://127.0.0.1:{a.management_port}", "--formatter", "json", "cluster_status")
    status = json.loads(out.stdout)
    assert status["disk_nodes"] == ["a@test", "b@test"] and status["running_nodes"] == ["a@test", "b@test"]
    b.stop()  # a clean stop: b is still a member, no longer running
    nodes = {n["name"]: n for n in api_a("GET", "/api/nodes")[1]}
    assert set(nodes) == {"a@test", "b@test"} and not nodes["b@test"]["running"]
    out = _cli("ctl", f"http://127.0.0.1:{a.management_port}", "cluster_status")
    assert "Running Nodes\n\na@test\n" in out.stdout and "Disk Nodes\n\na@test\nb@test\n" in out.stdout


def test_an_import_claims_its_queues_a_slice_at_a_time_and_releases_the_names_it_did_not_declare(start_broker,
                                                                                                  pg_dsn):
    """A definitions import on a claims its queues' names a slice at a time (broker/definitions.py CLAIM_SLICE):
    every queue it made is a's in the directory and routed to from b, a name b holds stays b's (the import
    declares it as b's queue, equivalence checked), and the names of a slice it stopped before declaring (a bad
    queue: 400) are released, free for b to declare as its own."""
    a = member(start_broker, pg_dsn, "a@test")
    b = member(start_broker, pg_dsn, "b@test")
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare("held-by-b", durable=True)
    conn.close()
    api_a = Http(a.management_port)
    count = CLAIM_SLICE + 30

    def queue(name: str, **arguments) -> dict:
        return {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": arguments}

    document = {"queues": [queue(f"imp-{i}") for i in range(count)] + [queue("held-by-b")],
                "bindings": [{"source": "amq.direct", "vhost": "/", "destination": f"imp-{i}",
                              "destination_type": "queue", "routing_key": f"imp-{i}", "arguments": {}}
                             for i in range(count)]}
    status, body, _ = api_a("POST", "/api/definitions", document)
    assert status in (200, 201, 204), (status, body)
    owners = _directory_owners(pg_dsn, [f"imp-{i}" for i in range(count)] + ["held-by-b"])
    assert owners == {**{f"imp-{i}": "a@test" for i in range(count)}, "held-by-b": "b@test"}
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", f"imp-{count - 1}", b"routed", mandatory=True)  # b routes by the binding row
    conn.close()
    assert wait_for(lambda: Http(a.management_port)("GET", f"/api/queues/%2F/imp-{count - 1}")[1]
                    .get("messages") == 1, 10)

    bad = {"queues": [queue("late-1"), queue("late-bad", **{"x-max-length": "many"}), queue("late-2")]}
    status, body, _ = api_a("POST", "/api/definitions", bad)
    assert status == 400 and "x-max-length" in body["reason"], (status, body)
    assert _directory_owners(pg_dsn, ["late-1", "late-bad", "late-2"]) == {"late-1": "a@test"}
    conn = pika.BlockingConnection(b.pika_params())
    conn.channel().queue_declare("late-2", durable=True)  # b's own queue now
    conn.close()
    assert _directory_owners(pg_dsn, ["late-2"]) == {"late-2": "b@test"}


def _directory_owners(dsn: str, names: list[str]) -> dict[str, str]:
    """The members that hold ``names`` in the directory of node-local queues (storage/pg/forwarding.py)."""

    async def read() -> dict[str, str]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT name, node FROM leveret.local_queue WHERE name = any($1::text[])", names)
            return {r[0]: r[1] for r in rows}
        finally:
            await conn.close()

    return asyncio.run(read())
