"""The HTTP API's queue declare (PUT /api/queues/VHOST/NAME) and definitions import (POST /api/definitions) of
another cluster member's queue (issue 15): the equivalence check needs the owner's answer, which the member
waits for without holding its event loop (as a channel's queue.declare does); before, it asked synchronously
and every connection of the member stood still for up to the question's timeout. The owner is made slow for real (SIGSTOP); real broker processes, a real
PostgreSQL, pika and HTTP clients."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.cluster.test_cluster_deferred_replies import (
    ROUND_TRIP_MAX,
    round_trips_during,
    stopped,
)
from tests.integration.cluster.test_cluster_forwarding import channel, known_on, two
from tests.integration.management.test_management_api import Http

pytestmark = pytest.mark.leveret_only
pytest_plugins = ["pg_fixtures"]


def owner_and_asker(start_broker, pg_dsn, queue: str) -> tuple[Any, Any, Http]:
    """Two members; ``queue`` a classic queue (x-max-length 10) that lives on a, known to b; b's HTTP API."""
    a, b = two(start_broker, pg_dsn)
    conn, ch = channel(a)
    ch.queue_declare(queue, durable=True, arguments={"x-max-length": 10})
    conn.close()
    assert known_on(b, queue)
    return a, b, Http(b.management_port)


def test_an_api_declare_waiting_for_the_owner_does_not_freeze_the_member(start_broker, pg_dsn):
    a, b, api = owner_and_asker(start_broker, pg_dsn, "api-decl")
    same = {"durable": True, "arguments": {"x-max-length": 10}}
    with stopped(a):
        answer, took, trips = round_trips_during(b, lambda: api("PUT", "/api/queues/%2F/api-decl", same))
    status, body, _ = answer
    assert status == 204, (status, body)  # a never answered: accepted unchecked, as a channel's declare is
    assert took >= 0.4, took  # it waited for a...
    assert len(trips) >= 3 and max(trips) < ROUND_TRIP_MAX, (took, max(trips), len(trips))  # ... b went on
    # With a answering, the check is made: a mismatching declare is refused, a matching one accepted.
    status, body, _ = api("PUT", "/api/queues/%2F/api-decl", {"durable": True, "arguments": {"x-max-length": 20}})
    assert status == 400 and "inequivalent arg 'x-max-length'" in body["reason"], (status, body)
    assert api("PUT", "/api/queues/%2F/api-decl", same)[0] == 204


def test_a_definitions_import_waiting_for_the_owner_does_not_freeze_the_member(start_broker, pg_dsn):
    """POST /api/definitions with a queue another member holds: the import waits for the owner's answer between
    its steps with the event loop free, then checks the queue's equivalence (400 for a mismatch)."""
    a, b, api = owner_and_asker(start_broker, pg_dsn, "def-decl")

    def document(max_length: int) -> dict:
        return {"queues": [{"name": "def-decl", "vhost": "/", "durable": True, "auto_delete": False,
                            "arguments": {"x-max-length": max_length}},
                           {"name": f"def-after-{max_length}", "vhost": "/", "durable": True,
                            "auto_delete": False, "arguments": {}}]}

    with stopped(a):
        answer, took, trips = round_trips_during(b, lambda: api("POST", "/api/definitions", document(10)))
    status, body, _ = answer
    assert status in (200, 201, 204), (status, body)
    assert took >= 0.4, took  # it waited for a...
    assert len(trips) >= 3 and max(trips) < ROUND_TRIP_MAX, (took, max(trips), len(trips))  # ... b went on
    assert api("GET", "/api/queues/%2F/def-after-10")[0] == 200  # the steps after the wait were made
    status, body, _ = api("POST", "/api/definitions", document(20))
    assert status == 400 and "inequivalent arg 'x-max-length'" in body["reason"], (status, body)
