"""Queue types (broker/queues/queue_types.py, RabbitMQ's ``rabbit_queue_type``): the registry chosen by
``x-queue-type``, the quorum declare rules, what distinguishes a quorum queue on one node (``x-delivery-count``
on every redelivery), that a new type is picked up from the registry alone, and the one backing-queue factory
(a priority queue for ``x-max-priority``)."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands as spec

from broker.clock import ManualClock
from broker.errors import AMQPError
from broker.message import Message
from broker.queues import queue_types
from broker.queues.queue_process import QueueProcess
from broker.queues.queue_types import QUEUE_TYPES, ClassicQueueType, QuorumQueue, queue_type_of
from broker.vhost import VHost
from protocol.constants import PRECONDITION_FAILED
from protocol.fastcodec import build_content_header, shortstr
from storage.memory_queue import MemoryBackingQueue
from storage.priority_queue import PriorityBackingQueue


@pytest.fixture
def vh() -> VHost:
    return VHost("/", clock=ManualClock())


def message(key: str, body: bytes, **props: Any) -> Message:
    header = build_content_header(len(body), spec.Basic.Properties(**props).marshal())
    return Message("", key, shortstr("") + shortstr(key), header, body)


def declare(vh: VHost, name: str, durable: bool = True, exclusive: bool = False, auto_delete: bool = False,
            **arguments: Any) -> Any:
    return vh.queues.declare(name, False, durable, exclusive, auto_delete, arguments, None)[0]  # type: ignore[arg-type]


def test_x_queue_type_picks_the_type_from_the_registry():
    assert queue_type_of({}) is QUEUE_TYPES["classic"]
    assert queue_type_of({"x-queue-type": "classic"}) is QUEUE_TYPES["classic"]
    assert queue_type_of({"x-queue-type": b"quorum"}) is QUEUE_TYPES["quorum"]


def test_classic_and_quorum_queues_are_their_types_processes(vh):
    classic = declare(vh, "c")
    quorum = declare(vh, "q", **{"x-queue-type": "quorum"})
    assert type(classic) is QueueProcess and classic.type_name == "classic"
    assert isinstance(quorum, QuorumQueue) and quorum.type_name == "quorum"


@pytest.mark.parametrize(("durable", "exclusive", "auto_delete", "problem"), [
    (False, False, False, "non-durable"), (True, True, False, "exclusive-owner"),
    (True, False, True, "auto-delete")])
def test_quorum_declare_refusals(vh, durable, exclusive, auto_delete, problem):
    with pytest.raises(AMQPError) as e:
        vh.queues.declare("q", False, durable, exclusive, auto_delete, {"x-queue-type": "quorum"},
                          object())  # type: ignore[arg-type]
    assert e.value.reply_code == PRECONDITION_FAILED
    assert e.value.text == f"invalid property '{problem}' for queue 'q' in vhost '/'"
    assert vh.queues.get("q") is None


@pytest.mark.parametrize(("kind", "counted"), [("classic", False), ("quorum", True)])
def test_a_quorum_queue_counts_every_return(vh, kind, counted):
    q = declare(vh, "q", **{"x-queue-type": kind})
    vh.publish(vh.default_exchange, message("q", b"m"), False)
    for n in (1, 2):
        got = q.basic_get(False)
        assert got is not None
        q.requeue([got[0]])
    got = q.basic_get(True)
    assert got is not None and got[2]  # redelivered
    assert got[1].headers.get("x-delivery-count") == (2 if counted else None)


def test_a_new_queue_type_is_one_class_and_one_registry_line(vh, monkeypatch):
    made = []

    class Recording(QueueProcess):
        type_name = "recording"

    class RecordingType(ClassicQueueType):
        name = "classic"  # replaces classic here, since queue_args validates x-queue-type values
        process = Recording

        def new_queue(self, *args: Any) -> Any:
            q = super().new_queue(*args)
            made.append(q)
            return q

    monkeypatch.setitem(QUEUE_TYPES, "classic", RecordingType())
    q = declare(vh, "r")
    assert made == [q] and type(q) is Recording and vh.queues.get("r") is q


def test_policies_are_matched_by_queue_type(vh):
    from broker.policies.policy import Policy

    vh.set_policy(Policy("only-classic", ".*", {"max-length": 1}, apply_to="classic_queues"))
    classic = declare(vh, "c")
    quorum = declare(vh, "q", **{"x-queue-type": "quorum"})
    assert classic.settings.max_length == 1 and quorum.settings.max_length is None


def test_one_factory_builds_every_backing_queue(vh):
    opened: list[tuple[str, bool, int | None]] = []

    def open_store(name: str, durable: bool, priority: int | None = None, on_confirm: Any = None) -> Any:
        opened.append((name, durable, priority))
        return MemoryBackingQueue()

    vh.queues.backing_queue_factory = open_store
    plain = declare(vh, "plain")
    prio = declare(vh, "prio", **{"x-max-priority": 2})
    assert opened == [("plain", True, None), ("prio", True, 0), ("prio", True, 1), ("prio", True, 2)]
    assert isinstance(prio.bq, PriorityBackingQueue) and isinstance(plain.bq, MemoryBackingQueue)
    for i, p in enumerate([0, 2, 1, 2]):
        vh.publish(vh.default_exchange, message("prio", b"%d-%d" % (p, i), priority=p), False)
    bodies = []
    while (got := prio.basic_get(True)) is not None:
        bodies.append(got[1].body)
    assert bodies == [b"2-1", b"2-3", b"1-2", b"0-0"]


def test_nothing_outside_the_queue_reads_its_backing_queue():
    """The seam holds: no module of broker/ but the queue process (which owns it) touches ``.bq``."""
    import re
    from pathlib import Path

    root = Path(queue_types.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "queue_process.py" and re.search(r"\.bq\b", p.read_text())]
    assert offenders == []
