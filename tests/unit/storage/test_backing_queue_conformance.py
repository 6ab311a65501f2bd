"""The BackingQueue contracts (storage/backing_queue.py), run against every implementation.

Variants: the in-memory queue; the variable queue non-durable and durable; and both again with a RAM
target of zero, so that every message goes through the paging paths (betas, delta) as well; the priority
queue over memory and over paging durable variable queues (every message of the suite at one priority, not
0, so the packed seq_ids are exercised; the tests at the end mix priorities). A new store is one more entry
in ``VARIANTS``. ``postgres`` is the asynchronous store of storage/pg/ on a throwaway PostgreSQL
(tests/pg_fixtures.py), driven through :class:`AsyncStoreDriver`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storage.backing_queue import BackingQueue, Figures
from storage.memory_queue import MemoryBackingQueue
from storage.node_storage import NodeStorage
from storage.priority_queue import PriorityBackingQueue

pytest_plugins = ["pg_fixtures"]


class Subject:
    def __init__(self, bq: BackingQueue, settle: Callable[[], None], durable: bool, paging: bool = False,
                 asynchronous: bool = False, close: Callable[[], None] = lambda: None) -> None:
        self.bq = bq
        self.settle = settle  # end of a burst: the group-commit flush
        self.durable = durable
        self.paging = paging  # a RAM target of zero: every ready message is paged out
        self.asynchronous = asynchronous  # fetch may answer None while len() > 0, then calls on_available
        self.close = close


class AsyncStoreDriver:
    """Runs the synchronous suite against an asynchronous store (the contract's "Availability" clause): where
    the store answers None (or has no head in memory) while ``len()`` is not 0, the driver runs the store's
    event loop until the store calls ``on_available`` — failing if it never does — and asks again, as a queue
    process would. ``on_confirm``/``on_available`` stay the owner's attributes, forwarded."""

    def __init__(self, bq: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._bq = bq
        self._loop = loop
        self.on_confirm: Callable[[], None] | None = None
        self.on_available: Callable[[], None] | None = None
        self._available = asyncio.Event()
        bq.on_confirm = self._confirmed
        bq.on_available = self._announced

    def _confirmed(self) -> None:
        if self.on_confirm is not None:
            self.on_confirm()

    def _announced(self) -> None:
        self._available.set()
        if self.on_available is not None:
            self.on_available()

    def _await_available(self) -> None:
        try:
            self._loop.run_until_complete(asyncio.wait_for(self._available.wait(), 15))
        except TimeoutError:
            raise AssertionError("the store answered None with len() > 0 and never called on_available") from None

    def _ensure_head(self) -> None:
        self._available.clear()
        while self._bq.len() > 0 and self._bq.peek() is None:
            self._await_available()
            self._available.clear()

    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None:
        self._available.clear()
        got = self._bq.fetch(ack_required)
        while got is None and self._bq.len() > 0:
            self._await_available()
            self._available.clear()
            got = self._bq.fetch(ack_required)
        return got

    def head_expiry(self) -> int | None:
        self._ensure_head()
        return self._bq.head_expiry()

    def peek(self) -> Any | None:
        self._ensure_head()
        return self._bq.peek()

    def dropwhile(self, pred: Callable[[int | None], bool]) -> tuple[int, int | None]:
        self._ensure_head()
        return self._bq.dropwhile(pred)

    def fetchwhile(self, pred: Callable[[int | None], bool]) -> list[tuple[int, Any, bool]]:
        self._ensure_head()
        return self._bq.fetchwhile(pred)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bq, name)


def _postgres(dsn: str, priority: bool = False) -> Subject:
    """One PgCluster node; with ``priority``, a priority queue of three PgBackingQueues (one per level, as the
    broker opens them), the suite's messages at level 2."""
    from storage.pg.cluster import PgCluster

    loop = asyncio.new_event_loop()
    node = loop.run_until_complete(PgCluster.connect(dsn, "conformance"))
    bq: Any = node.open_queue("/", "q")
    if priority:
        bq = PriorityBackingQueue(2, _priority_of, lambda p: node.open_queue("/", "pq", priority=p))

    def close() -> None:
        loop.run_until_complete(asyncio.wait_for(node.close(), 15))
        loop.close()
    return Subject(AsyncStoreDriver(bq, loop), lambda: loop.run_until_complete(node.wait_idle()), True,
                   asynchronous=True, close=close)


def _memory(tmp_path: Path) -> Subject:
    return Subject(MemoryBackingQueue(), lambda: None, False)


def _variable(durable: bool, paging: bool) -> Callable[[Path], Subject]:
    def make(tmp_path: Path) -> Subject:
        ns = NodeStorage(str(tmp_path / "node"))
        vq = ns.open_queue("/", "q", durable)
        ns.finish_recovery()
        if paging:  # every message paged out as far as it goes: betas, then delta
            vq.beta_floor = 1
            vq.set_ram_target(0)
        return Subject(vq, ns.syncer.flush, durable, paging)
    return make


def _priority(sub: Callable[[Path], Subject]) -> Callable[[Path], Subject]:
    """A priority queue of three sub-queues made by ``sub``; the suite's messages (bytes) all have priority 2."""
    def make(tmp_path: Path) -> Subject:
        subjects = [sub(tmp_path / f"p{p}") for p in range(3)]
        bq = PriorityBackingQueue(2, _priority_of, lambda p: subjects[p].bq)

        def settle() -> None:
            for s in subjects:
                s.settle()
        return Subject(bq, settle, subjects[0].durable, subjects[0].paging)
    return make


def _priority_of(m: Any) -> int:
    """``b"<digit>:..."`` messages carry their priority; the suite's own messages (``b"m..."``) are at 2."""
    return int(m[:1]) if m[1:2] == b":" else 2


VARIANTS = {
    "memory": _memory,
    "variable": _variable(False, False),
    "variable-durable": _variable(True, False),
    "variable-paging": _variable(False, True),
    "variable-durable-paging": _variable(True, True),
    "priority-memory": _priority(_memory),
    "priority-variable-durable-paging": _priority(_variable(True, True)),
}


@pytest.fixture(params=[*VARIANTS, "postgres", "priority-postgres"])
def subject(request, tmp_path: Path):
    if request.param in ("postgres", "priority-postgres"):
        s = _postgres(request.getfixturevalue("pg_dsn"), priority=request.param == "priority-postgres")
        yield s
        s.close()
        return
    yield VARIANTS[request.param](tmp_path)


def msg(i: int, size: int = 10) -> bytes:
    return (b"m%d-" % i).ljust(size, b".")


def drain(bq: BackingQueue, ack_required: bool = False) -> list[tuple[int, Any, bool]]:
    out = []
    while True:
        f = bq.fetch(ack_required)
        if f is None:
            return out
        out.append(f)


def test_publish_assigns_increasing_seq_ids_and_fetch_is_fifo(subject: Subject) -> None:
    bq = subject.bq
    seqs = [bq.publish(msg(i), 10, i % 2 == 0) for i in range(50)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 50
    assert bq.len() == 50 and not bq.is_empty() and bq.ready_bytes() == 500
    got = drain(bq)
    assert [m for _, m, _ in got] == [msg(i) for i in range(50)]
    assert [s for s, _, _ in got] == seqs
    assert all(not d for _, _, d in got)
    assert bq.len() == 0 and bq.is_empty() and bq.ready_bytes() == 0 and bq.fetch(True) is None


def test_large_and_small_messages_round_trip(subject: Subject) -> None:
    bq = subject.bq
    sizes = [0, 1, 100, 4095, 4096, 5000, 70000]
    for i, size in enumerate(sizes):
        bq.publish(msg(i, size), size, True)
    assert [m for _, m, _ in drain(bq)] == [msg(i, size) for i, size in enumerate(sizes)]


def test_ack_required_fetch_stays_pending_until_ack(subject: Subject) -> None:
    bq = subject.bq
    for i in range(5):
        bq.publish(msg(i), 10, True)
    fetched = [bq.fetch(True) for _ in range(3)]
    assert bq.len() == 2 and bq.pending_ack_count() == 3
    acked = bq.ack([fetched[0][0], fetched[2][0], 12345])
    assert acked == [msg(0), msg(2)]
    assert bq.pending_ack_count() == 1
    assert bq.ack([fetched[0][0]]) == []  # already acked: ignored


def test_requeue_restores_original_position_marked_delivered(subject: Subject) -> None:
    bq = subject.bq
    for i in range(10):
        bq.publish(msg(i), 10, i % 3 == 0)
    f = [bq.fetch(True) for _ in range(6)]
    bq.publish(msg(10), 10, True)
    bq.requeue([f[4][0], f[1][0]])
    bq.requeue([f[3][0], 999])
    assert bq.len() == 4 + 3 + 1 and bq.pending_ack_count() == 3
    got = drain(bq, ack_required=True)
    assert [m for _, m, _ in got] == [msg(i) for i in (1, 3, 4, 6, 7, 8, 9, 10)]
    assert [d for _, _, d in got] == [True, True, True, False, False, False, False, False]
    bq.requeue([s for s, _, _ in got] + [f[0][0]])
    got = drain(bq)
    assert [m for _, m, _ in got] == [msg(i) for i in (0, 1, 3, 4, 6, 7, 8, 9, 10)]
    assert all(d for _, _, d in got)


def test_publish_delivered_is_pending_at_once(subject: Subject) -> None:
    bq = subject.bq
    seq = bq.publish_delivered(msg(0), 10, True)
    assert bq.len() == 0 and bq.is_empty() and bq.pending_ack_count() == 1
    later = bq.publish(msg(1), 10, True)
    assert later > seq
    bq.requeue([seq])
    got = drain(bq)
    assert [(m, d) for _, m, d in got] == [(msg(0), True), (msg(1), False)]


def test_purge_drops_ready_keeps_pending(subject: Subject) -> None:
    bq = subject.bq
    for i in range(20):
        bq.publish(msg(i), 10, i % 2 == 0)
    pending = [bq.fetch(True) for _ in range(5)]
    assert bq.purge() == 15
    assert bq.len() == 0 and bq.ready_bytes() == 0 and bq.pending_ack_count() == 5
    bq.publish(msg(20), 10, True)
    bq.requeue([p[0] for p in pending])
    assert [m for _, m, _ in drain(bq)] == [msg(i) for i in (0, 1, 2, 3, 4, 20)]


def test_delete_and_terminate_counts_everything(subject: Subject) -> None:
    bq = subject.bq
    for i in range(12):
        bq.publish(msg(i), 10, True, confirm=i)
    bq.fetch(True)
    bq.fetch(True)
    assert bq.delete_and_terminate() == 12
    subject.settle()
    assert sorted(bq.drain_confirmed()) == list(range(12))


def test_confirms_come_back_exactly_once(subject: Subject) -> None:
    bq = subject.bq
    for i in range(10):
        bq.publish(msg(i), 10, i % 2 == 0, confirm=("c", i))
    bq.publish_delivered(msg(10), 10, True, confirm=("c", 10))
    early = bq.drain_confirmed()
    if subject.durable:  # only the transient ones are confirmed before the fsync
        assert sorted(early) == [("c", i) for i in (1, 3, 5, 7, 9)]
    subject.settle()
    late = bq.drain_confirmed()
    assert sorted(early + late) == [("c", i) for i in range(11)]
    subject.settle()
    assert bq.drain_confirmed() == []


def test_ttl_at_the_head(subject: Subject) -> None:
    bq = subject.bq
    for i, expiry in enumerate([100, 100, 200, None, 50]):
        bq.publish(msg(i), 10, True, expiry=expiry)
    assert bq.head_expiry() == 100
    assert bq.peek() == msg(0) and bq.len() == 5
    assert bq.dropwhile(lambda e: e is not None and e <= 100) == (2, 200)
    fetched = bq.fetchwhile(lambda e: e is not None and e <= 300)
    assert [m for _, m, _ in fetched] == [msg(2)] and bq.pending_ack_count() == 1
    assert bq.head_expiry() is None and bq.peek() == msg(3)
    assert bq.dropwhile(lambda e: True) == (2, None)
    assert bq.is_empty() and bq.head_expiry() is None and bq.peek() is None


def test_ram_budget_interface(subject: Subject) -> None:
    bq = subject.bq
    assert bq.ram_bytes() == 0 or subject.paging  # an empty queue holds (next to) nothing
    for i in range(100):
        bq.publish(msg(i, 1000), 1000, False)
    assert bq.ram_bytes() > 0
    bq.set_ram_budget(10_000)
    while bq.needs_timeout():
        bq.timeout()
    bq.set_ram_budget(None)
    assert [m for _, m, _ in drain(bq)] == [msg(i, 1000) for i in range(100)]


class Model:
    """The contracts in a dozen lines: a sorted list of ready seq_ids and a dict of pending ones."""

    def __init__(self) -> None:
        self.ready: list[tuple[int, bytes, bool]] = []
        self.pending: dict[int, tuple[int, bytes, bool]] = {}

    def publish(self, seq: int, m: bytes) -> None:
        self.ready.append((seq, m, False))

    def fetch(self, ack: bool) -> tuple[int, bytes, bool] | None:
        if not self.ready:
            return None
        item = self.ready.pop(0)
        if ack:
            self.pending[item[0]] = (item[0], item[1], True)
        return item

    def requeue(self, seqs: list[int]) -> None:
        for s in seqs:
            if s in self.pending:
                self.ready.append(self.pending.pop(s))
        self.ready.sort()


@pytest.mark.parametrize("seed", range(3))
def test_random_operations_match_the_model(subject: Subject, seed: int) -> None:
    rnd = random.Random(seed)
    bq, model = subject.bq, Model()
    n = 0
    for _ in range(1500):
        op = rnd.random()
        if op < 0.4:
            size = rnd.choice([5, 50, 5000])
            m = msg(n, size)
            n += 1
            model.publish(bq.publish(m, size, rnd.random() < 0.5), m)
        elif op < 0.7:
            ack = rnd.random() < 0.7
            assert bq.fetch(ack) == model.fetch(ack)
        elif op < 0.8 and model.pending:
            seqs = rnd.sample(sorted(model.pending), k=min(len(model.pending), rnd.randint(1, 4)))
            bq.ack(seqs)
            for s in seqs:
                del model.pending[s]
        elif op < 0.9 and model.pending:
            seqs = rnd.sample(sorted(model.pending), k=min(len(model.pending), rnd.randint(1, 4)))
            bq.requeue(seqs)
            model.requeue(seqs)
        elif op < 0.92:
            assert bq.purge() == len(model.ready)
            model.ready.clear()
        elif op < 0.95:
            bq.set_ram_budget(rnd.choice([0, 2000, 50_000, None]))
        assert bq.len() == len(model.ready)
        assert bq.pending_ack_count() == len(model.pending)
        assert bq.ready_bytes() == sum(len(m) for _, m, _ in model.ready)
        f = bq.figures()
        assert f[:4] == (len(model.ready), len(model.pending), sum(len(m) for _, m, _ in model.ready),
                         sum(len(m) for _, m, _ in model.pending.values()))
        assert 0 <= f.paged_out <= f.ready
        check = getattr(bq, "check_invariants", None)
        if check is not None and rnd.random() < 0.05:
            check()
    bq.requeue(list(model.pending))
    model.requeue(list(model.pending))
    assert drain(bq) == [(s, m, d) for s, m, d in model.ready]


def test_figures(subject: Subject) -> None:
    """Ready and pending-ack messages and bytes, through publish, fetch, requeue and ack; paged out: every
    ready message with a RAM target of zero, none without paging."""
    bq = subject.bq
    assert bq.figures() == Figures(0, 0, 0, 0, 0)
    for i, size in enumerate([100, 200, 300, 400]):
        bq.publish(msg(i, size), size, i % 2 == 0)
    delivered = bq.publish_delivered(msg(4, 50), 50, True)
    a = bq.fetch(True)
    b = bq.fetch(True)
    f = bq.figures()
    assert f[:4] == (2, 3, 700, 350) and f.messages == 5 and f.bytes == 1050
    assert f.paged_out == (2 if subject.paging else 0)
    bq.requeue([b[0]])
    f = bq.figures()
    assert f[:4] == (3, 2, 900, 150)
    assert f.paged_out == (3 if subject.paging else 0)
    bq.ack([a[0], delivered])
    assert bq.figures()[:4] == (3, 0, 900, 0)
    bq.fetch(False)
    assert bq.figures()[:4] == (2, 0, 700, 0)
    bq.delete_and_terminate()
    assert bq.figures() == Figures(0, 0, 0, 0, 0)


@pytest.mark.parametrize("kind", ["memory", "variable-paging"])
def test_priority_queue_figures_are_the_sums_of_its_sub_queues(kind: str, tmp_path: Path) -> None:
    subjects = [VARIANTS[kind](tmp_path / str(p)) for p in range(3)]
    bq = PriorityBackingQueue(2, lambda m: int(m[:1]), lambda p: subjects[p].bq)
    for i, (p, size) in enumerate([(0, 10), (2, 20), (1, 30), (2, 40)]):
        bq.publish(b"%d-%d" % (p, i) + b"." * (size - 3), size, False)
    first = bq.fetch(True)  # priority 2 first: 20 bytes
    assert first is not None and first[1].startswith(b"2-1")
    f = bq.figures()
    assert f[:4] == (3, 1, 80, 20)
    assert f.paged_out == (3 if kind == "variable-paging" else 0)
    assert f == Figures(*(sum(s.bq.figures()[i] for s in subjects) for i in range(5)))
    bq.requeue([first[0]])
    assert bq.figures()[:4] == (4, 0, 100, 0)


def test_callbacks_are_attributes_the_owner_sets(subject: Subject) -> None:
    """``on_confirm`` and ``on_available`` are plain attributes, None until the owner sets them; a
    synchronous store answers every fetch while it holds ready messages (so it never needs on_available)."""
    bq = subject.bq
    assert bq.on_confirm is None and bq.on_available is None
    woken: list[str] = []
    bq.on_confirm = lambda: woken.append("confirm")
    bq.on_available = lambda: woken.append("available")
    for i in range(30):
        bq.publish(msg(i), 10, True, confirm=i)
    subject.settle()
    if subject.durable:  # the fsync's completion is announced
        assert "confirm" in woken
    assert sorted(bq.drain_confirmed()) == list(range(30))
    while not bq.is_empty():
        assert bq.fetch(False) is not None
    # A synchronous store never needs on_available; an asynchronous one must have announced its rows.
    assert ("available" in woken) == subject.asynchronous


@pytest.mark.parametrize("kind", ["priority-memory", "priority-variable-durable-paging"])
def test_priority_queue_serves_and_expires_the_highest_priority_first(kind: str, tmp_path: Path) -> None:
    bq = VARIANTS[kind](tmp_path).bq
    for i, (p, expiry) in enumerate([(0, 10), (1, 20), (2, 30), (1, 40), (0, None)]):
        bq.publish(b"%d:%d" % (p, i), 3, False, expiry=expiry)
    assert bq.head_expiry() == 30 and bq.peek() == b"2:2"
    # Priority 2 empties, then priority 1's head (20) is dropped and its next (40) stops the walk.
    assert bq.dropwhile(lambda e: e is not None and e <= 35) == (2, 40)
    got = bq.fetchwhile(lambda e: e is not None)
    assert [m for _, m, _ in got] == [b"1:3", b"0:0"] and bq.pending_ack_count() == 2
    assert bq.head_expiry() is None and bq.len() == 1
    assert bq.ack([s for s, _, _ in got]) == [b"1:3", b"0:0"]
    assert [m for _, m, _ in drain(bq)] == [b"0:4"]
