"""Where a queue's effective settings come from (broker/queues/queue_args.py ``effective_settings``), by
RabbitMQ's documented precedence (RabbitMQ's docs/queues#optional-arguments-precedence): a client's ``x-``
argument beats the policy; an operator policy beats both for the keys it may set (expires, message-ttl,
max-length, max-length-bytes, delivery-limit), the lower number winning; an operator policy's other keys are
ignored, and queue type, max priority and single active consumer never come from a policy."""

from __future__ import annotations

import asyncio

import pytest

from broker.policies.policy import Policy
from broker.queues.queue_args import POLICY_KEYS, effective_settings, lower_limit
from broker.vhost import VHost

NUMERIC = {  # setting attribute → (policy key, argument)
    "message_ttl": ("message-ttl", "x-message-ttl"),
    "expires": ("expires", "x-expires"),
    "max_length": ("max-length", "x-max-length"),
    "max_length_bytes": ("max-length-bytes", "x-max-length-bytes"),
    "delivery_limit": ("delivery-limit", "x-delivery-limit"),
}


def policy(definition: dict, name: str = "p") -> Policy:
    return Policy(name, ".*", definition)


def test_the_operator_policy_keys_are_the_numeric_limits():
    assert {key for key, _arg, operator in POLICY_KEYS if operator} == {key for key, _ in NUMERIC.values()}


@pytest.mark.parametrize("attr", sorted(NUMERIC))
def test_numeric_limits(attr):
    key, arg = NUMERIC[attr]

    def value(arguments: dict, pol: dict | None = None, op: dict | None = None) -> int | None:
        s = effective_settings(arguments, policy(pol) if pol is not None else None,
                               policy(op, "op") if op is not None else None)
        return getattr(s, attr)

    assert value({}) is None
    assert value({arg: 50}) == 50
    assert value({}, {key: 70}) == 70
    # Argument against policy: the lower applies (RabbitMQ 3.10 holds 2 messages for x-max-length 5 under a
    # max-length 2 policy, and 2 for x-max-length 2 under 5; 3.13's queue process resolves with min too).
    assert value({arg: 50}, {key: 70}) == 50
    assert value({arg: 90}, {key: 70}) == 70
    # The operator policy: alone it applies; against an argument or a policy the lower value wins.
    assert value({}, None, {key: 30}) == 30
    assert value({arg: 50}, None, {key: 30}) == 30
    assert value({arg: 10}, None, {key: 30}) == 10
    assert value({}, {key: 70}, {key: 30}) == 30
    assert value({}, {key: 20}, {key: 30}) == 20
    # All three: the lowest of the three.
    assert value({arg: 50}, {key: 5}, {key: 30}) == 5
    assert value({arg: 10}, {key: 50}, {key: 30}) == 10
    assert value({arg: 40}, {key: 50}, {key: 30}) == 30
    assert value({arg: 0}, {key: 5}, {key: 30}) == 0  # zero is a value (max-length 0), not "unset"


def test_a_delivery_limit_below_zero_is_no_limit():
    """RabbitMQ 4.0+: ``-1`` turns the delivery limit off (its default is 20). As no limit, it is never the lower
    of two: a policy's or an operator policy's limit applies over an argument of -1, and -1 from every side is
    no limit."""
    def limit(arguments: dict, pol: dict | None = None, op: dict | None = None) -> int | None:
        return effective_settings(arguments, policy(pol) if pol is not None else None,
                                  policy(op, "op") if op is not None else None).delivery_limit

    assert limit({"x-delivery-limit": -1}) is None
    assert limit({"x-delivery-limit": -7}) is None
    assert limit({}, {"delivery-limit": -1}) is None
    assert limit({"x-delivery-limit": -1}, {"delivery-limit": 4}) == 4
    assert limit({"x-delivery-limit": 3}, {"delivery-limit": -1}) == 3
    assert limit({"x-delivery-limit": -1}, None, {"delivery-limit": 2}) == 2
    assert limit({}, {"delivery-limit": -1}, {"delivery-limit": 2}) == 2
    assert limit({}, {"delivery-limit": 5}, {"delivery-limit": -1}) == 5
    assert limit({"x-delivery-limit": -1}, {"delivery-limit": -1}, {"delivery-limit": -1}) is None
    assert limit({"x-delivery-limit": 0}, {"delivery-limit": 5}) == 0  # zero is a limit: no redelivery
    # A policy's value of another type is no limit (policy definitions' values are not checked): it must not reach
    # the requeue's comparison with a count.
    assert limit({}, {"delivery-limit": "5"}) is None
    assert limit({}, {"delivery-limit": True}) is None
    assert limit({}, {"delivery-limit": 2.5}) is None
    # The HTTP API's effective_policy_definition merges with the same rule (broker/management/presenters/queues.py).
    assert lower_limit("delivery-limit", 5, -1) == 5
    assert lower_limit("delivery-limit", -1, -3) < 0
    assert lower_limit("max-length", 5, -1) == -1  # (only the delivery limit reads a negative as none)


def test_other_keys_argument_beats_policy_and_operator_policies_cannot_set_them():
    pol = policy({"dead-letter-exchange": "pdlx", "dead-letter-routing-key": "prk", "overflow": "reject-publish",
                  "consumer-timeout": 1000})
    op = policy({"dead-letter-exchange": "odlx", "overflow": "drop-head", "consumer-timeout": 5,
                 "queue-mode": "lazy"}, "op")
    s = effective_settings({}, pol, op)
    assert (s.dlx, s.dlrk, s.overflow, s.consumer_timeout) == ("pdlx", "prk", "reject-publish", 1000)
    s = effective_settings({"x-dead-letter-exchange": "adlx", "x-dead-letter-routing-key": "ark",
                            "x-overflow": "reject-publish-dlx", "x-consumer-timeout": 2000}, pol, op)
    # consumer-timeout is a limit: the lower of argument and policy (RabbitMQ's channel resolves it with min).
    assert (s.dlx, s.dlrk, s.overflow, s.consumer_timeout) == ("adlx", "ark", "reject-publish-dlx", 1000)
    s = effective_settings({"x-consumer-timeout": 500}, pol, op)
    assert s.consumer_timeout == 500
    s = effective_settings({}, None, op)
    assert (s.dlx, s.overflow, s.consumer_timeout) == (None, "drop-head", None)  # drop-head: the default


def test_bytes_values_of_string_arguments_are_read_as_text():
    s = effective_settings({"x-dead-letter-exchange": b"dlx", "x-overflow": b"reject-publish"})
    assert (s.dlx, s.overflow) == ("dlx", "reject-publish")


def test_queue_type_priority_and_single_active_consumer_come_only_from_arguments():
    pol = policy({"x-queue-type": "quorum", "x-max-priority": 5, "x-single-active-consumer": True,
                  "max-priority": 5, "queue-type": "quorum", "single-active-consumer": True})
    s = effective_settings({}, pol, policy(pol.definition, "op"))
    assert (s.queue_type, s.max_priority, s.single_active_consumer) == ("classic", None, False)
    s = effective_settings({"x-queue-type": "quorum", "x-max-priority": 5, "x-single-active-consumer": True}, pol)
    assert (s.queue_type, s.max_priority, s.single_active_consumer) == ("quorum", 5, True)


def test_the_settings_name_the_policies_that_applied():
    s = effective_settings({}, policy({"max-length": 1}, "pol"), policy({"max-length": 2}, "oper"))
    assert (s.policy, s.operator_policy) == ("pol", "oper")
    s = effective_settings({})
    assert (s.policy, s.operator_policy) == (None, None)


@pytest.fixture
def vh():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield VHost("/")
    asyncio.set_event_loop(None)
    loop.close()


def test_a_vhost_applies_the_highest_priority_policy_of_each_kind(vh):
    q = vh.queues.declare("orders", False, False, False, False, {"x-max-length": 100}, None)[0]
    vh.policies["low"] = Policy("low", "^ord", {"max-length": 5, "message-ttl": 1000}, priority=1)
    vh.policies["high"] = Policy("high", "^orders$", {"message-ttl": 2000}, priority=2)
    vh.policies["other"] = Policy("other", "^nothing", {"message-ttl": 1}, priority=9)
    vh.operator_policies["cap"] = Policy("cap", ".*", {"max-length": 50, "message-ttl": 60000})
    vh.apply_policies()
    s = q.settings
    # "high" applies (one policy per queue); the argument beats it for max-length; the operator policy caps
    # max-length at 50 and leaves the lower TTL of "high".
    assert (s.policy, s.operator_policy, s.max_length, s.message_ttl) == ("high", "cap", 50, 2000)
    del vh.operator_policies["cap"]
    vh.apply_policies()
    assert (q.settings.operator_policy, q.settings.max_length, q.settings.message_ttl) == (None, 100, 2000)


def test_a_quorum_queue_takes_overflow_and_expires_from_its_policy_first():
    # RabbitMQ's quorum queue resolves these two with policyHasPrecedence (3.13 rabbit_quorum_queue).
    pol = policy({"overflow": "reject-publish", "expires": 90_000, "max-length": 7})
    args = {"x-queue-type": "quorum", "x-overflow": "drop-head", "x-expires": 60_000, "x-max-length": 9}
    s = effective_settings(args, pol)
    assert (s.overflow, s.expires, s.max_length) == ("reject-publish", 90_000, 7)
    classic = effective_settings({k: v for k, v in args.items() if k != "x-queue-type"}, pol)
    assert (classic.overflow, classic.expires, classic.max_length) == ("drop-head", 60_000, 7)
