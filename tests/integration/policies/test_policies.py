"""Policies and operator policies, set through the HTTP API while queues exist, with real AMQP clients.

RabbitMQ's precedence: a client's x- argument beats the policy; an operator policy beats both for the
numeric limits it sets, the lower number winning; changing a policy applies at once to existing queues.
Leveret-only here because the reference RabbitMQ node of the test suite runs without its management plugin.
"""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration.management.test_management_api import Http, mgmt_node

pytestmark = pytest.mark.leveret_only


@pytest.fixture(scope="module")
def node():
    with mgmt_node("leveret-policies-") as n:
        yield n


@pytest.fixture
def ch(node):
    conn = pika.BlockingConnection(node[0].pika_params())
    yield conn.channel()
    conn.close()


def set_policy(api: Http, name: str, pattern: str, definition: dict, priority: int = 0,
               operator: bool = False) -> None:
    kind = "operator-policies" if operator else "policies"
    status, body, _ = api("PUT", f"/api/{kind}/%2F/{name}",
                          {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": "queues"})
    assert status in (201, 204), (status, body)


def clear_policy(api: Http, name: str, operator: bool = False) -> None:
    kind = "operator-policies" if operator else "policies"
    assert api("DELETE", f"/api/{kind}/%2F/{name}")[0] == 204


def ready(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def publish(ch, queue: str, n: int) -> None:
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode())


def test_policy_message_ttl_applies_to_an_existing_queue(node, ch, uid):
    api = node[1]
    q = f"{uid}-ttl"
    ch.queue_declare(q)
    publish(ch, q, 3)
    assert ready(ch, q) == 3
    set_policy(api, f"{uid}-p", f"^{q}$", {"message-ttl": 100})
    deadline = time.monotonic() + 3
    while ready(ch, q) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready(ch, q) == 0
    clear_policy(api, f"{uid}-p")
    publish(ch, q, 1)
    time.sleep(0.3)
    assert ready(ch, q) == 1  # the TTL went with the policy
    ch.queue_delete(q)


def test_policy_max_length_applies_at_once_and_is_lifted_when_cleared(node, ch, uid):
    api = node[1]
    q = f"{uid}-len"
    ch.queue_declare(q)
    publish(ch, q, 10)
    set_policy(api, f"{uid}-p", f"^{q}$", {"max-length": 4})
    assert ready(ch, q) == 4
    body = ch.basic_get(q, auto_ack=True)[2]
    assert body == b"6"  # drop-head dropped the oldest
    clear_policy(api, f"{uid}-p")
    publish(ch, q, 5)
    assert ready(ch, q) == 8
    ch.queue_delete(q)


def test_the_lowest_of_argument_policy_and_operator_policy_limits_the_queue(node, ch, uid):
    # RabbitMQ 3.10, checked by hand with rabbitmqctl set_policy / set_operator_policy: x-max-length 5 under
    # a max-length 2 policy holds 2 (and x-max-length 2 under 5 holds 2); an operator policy of 3 over an
    # argument of 5 holds 3.
    api = node[1]
    q = f"{uid}-prec"
    ch.queue_declare(q, arguments={"x-max-length": 5})
    set_policy(api, f"{uid}-p", f"^{q}$", {"max-length": 2})
    publish(ch, q, 8)
    assert ready(ch, q) == 2  # the policy's lower number applies
    clear_policy(api, f"{uid}-p")
    set_policy(api, f"{uid}-p", f"^{q}$", {"max-length": 9})
    set_policy(api, f"{uid}-op", f"^{q}$", {"max-length": 3}, operator=True)
    publish(ch, q, 8)
    assert ready(ch, q) == 3  # the operator policy's lower number applies
    clear_policy(api, f"{uid}-op", operator=True)
    clear_policy(api, f"{uid}-p")
    ch.queue_delete(q)


def test_highest_priority_policy_applies(node, ch, uid):
    api = node[1]
    q = f"{uid}-prio"
    set_policy(api, f"{uid}-low", f"^{uid}", {"max-length": 1}, priority=1)
    set_policy(api, f"{uid}-high", f"^{uid}-prio$", {"max-length": 3}, priority=5)
    ch.queue_declare(q)
    publish(ch, q, 6)
    assert ready(ch, q) == 3
    info = api("GET", f"/api/queues/%2F/{q}")[1]
    assert info.get("policy") == f"{uid}-high"
    clear_policy(api, f"{uid}-low")
    clear_policy(api, f"{uid}-high")
    ch.queue_delete(q)


def test_policy_dead_letter_exchange(node, ch, uid):
    api = node[1]
    q, dlq = f"{uid}-src", f"{uid}-dlq"
    ch.queue_declare(dlq)
    ch.queue_declare(q)
    set_policy(api, f"{uid}-dlx", f"^{q}$", {"dead-letter-exchange": "", "dead-letter-routing-key": dlq})
    publish(ch, q, 1)
    method, _props, _body = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    deadline = time.monotonic() + 3
    while not ready(ch, dlq) and time.monotonic() < deadline:
        time.sleep(0.05)
    _m, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"0"
    assert props.headers["x-death"][0]["reason"] == "rejected"
    clear_policy(api, f"{uid}-dlx")
    ch.queue_delete(q)
    ch.queue_delete(dlq)
