"""Memory given back after a backlog drains (broker/resources/memory_budget.py's ``give_back``): glibc keeps
freed message memory in its heap, so without a ``malloc_trim`` the resident size stays at the peak for good.

The process's resident size and the trim are replaced by readings the test controls; the queues are plain
objects reporting the bytes they hold. What a real broker gives back after S2 is measured in bench/."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker.resources import memory_budget
from broker.resources.memory_budget import RELEASE_STEP, MemoryBudget

MiB = 1024 * 1024


@dataclass
class FakeQueue:
    held: int = 0
    consumer_count: int = 1

    def ram_bytes(self) -> int:
        return self.held

    def set_ram_budget(self, max_bytes: int | None) -> None:
        pass

    def needs_paging(self) -> bool:
        return False

    def page(self) -> None:
        pass


@dataclass
class FakeVHost:
    queues: list[FakeQueue] = field(default_factory=list)


@dataclass
class FakeNode:
    vhosts: dict[str, FakeVHost] = field(default_factory=dict)


class Process:
    """The resident size the budget reads, and what a trim does to it (gives back ``freed``)."""

    def __init__(self, rss: int) -> None:
        self.rss = rss
        self.freed = 0
        self.trims = 0

    def resident(self) -> int:
        return self.rss

    def trim(self) -> None:
        self.trims += 1
        self.rss -= self.freed
        self.freed = 0


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> tuple[MemoryBudget, FakeQueue, Process]:
    proc = Process(60 * MiB)
    monkeypatch.setattr(memory_budget, "resident_memory", proc.resident)
    monkeypatch.setattr(memory_budget, "release_free_memory", proc.trim)
    queue = FakeQueue()
    budget = MemoryBudget(FakeNode({"/": FakeVHost([queue])}), None)
    return budget, queue, proc


def test_a_drained_backlog_is_given_back(setup: tuple[MemoryBudget, FakeQueue, Process]) -> None:
    budget, queue, proc = setup
    # A backlog builds up: the process grows, the queue holds 400 MiB; nothing is freed yet.
    queue.held = 400 * MiB
    proc.rss = 900 * MiB
    assert not budget.give_back(proc.rss)
    assert proc.trims == 0
    # It drains: the queue holds nothing, the heap keeps the freed blocks (resident stays at 900 MiB).
    queue.held = 0
    proc.freed = 800 * MiB
    assert budget.give_back(proc.rss)
    assert proc.trims == 1 and proc.rss == 100 * MiB and budget.releases == 1
    # Nothing more to give: no second trim.
    assert not budget.give_back(proc.rss)
    assert proc.trims == 1


def test_no_trim_while_a_backlog_is_still_growing(setup: tuple[MemoryBudget, FakeQueue, Process]) -> None:
    budget, queue, proc = setup
    for step in range(1, 6):
        queue.held = step * 100 * MiB
        proc.rss = 60 * MiB + 2 * queue.held
        assert not budget.give_back(proc.rss)
    assert proc.trims == 0


def test_growth_not_held_by_queues_is_not_trimmed_each_second(
        setup: tuple[MemoryBudget, FakeQueue, Process]) -> None:
    """Memory that connections (not queues) hold is not freed by a trim: the budget does not keep trying."""
    budget, _queue, proc = setup
    proc.rss = 60 * MiB + 3 * RELEASE_STEP
    for _ in range(10):
        assert not budget.give_back(proc.rss)
    assert proc.trims == 0


def test_a_deleted_queue_counts_as_freed(setup: tuple[MemoryBudget, FakeQueue, Process]) -> None:
    budget, queue, proc = setup
    queue.held = 300 * MiB
    proc.rss = 700 * MiB
    assert not budget.give_back(proc.rss)
    budget.node.vhosts["/"].queues.clear()  # type: ignore[attr-defined]
    proc.freed = 600 * MiB
    assert budget.give_back(proc.rss)
    assert proc.rss == 100 * MiB


def test_a_backlog_drained_by_its_consumers_is_given_back_as_it_goes(
        setup: tuple[MemoryBudget, FakeQueue, Process]) -> None:
    """Trims in the middle of a drain give back little (live messages pin the heap): the end of the drain
    is still given back."""
    budget, queue, proc = setup
    queue.held = 800 * MiB
    proc.rss = 1700 * MiB
    assert not budget.give_back(proc.rss)
    for held in (600, 400, 200):
        queue.held = held * MiB
        proc.freed = 10 * MiB  # fragmentation: hardly anything comes back yet
        assert budget.give_back(proc.rss)
    queue.held = 0
    proc.freed = proc.rss - 70 * MiB
    assert budget.give_back(proc.rss)
    assert proc.rss == 70 * MiB and proc.trims == 4
