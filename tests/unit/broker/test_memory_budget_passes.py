"""broker/resources/memory_budget.py: a queue that gains its first consumer or loses its last gets its new default budget
at once (consumers_changed), not at the next pass over every queue; and those passes, whose cost grows with
the number of queues, come less often when they cost more (PASS_SHARE), so that an idle broker with many
queues does not spend its time on them (10,000 idle queues: 51 → 16–21 ms of CPU a second, with the rate
sampler's change; bench/RESULTS.md's cost curves)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker.clock import ManualClock
from broker.resources import memory_budget
from broker.resources.memory_budget import DEFAULT_QUEUE_BUDGET, MemoryBudget, consumers_changed

GiB = 1024 ** 3


@dataclass
class BudgetedQueue:
    consumer_count: int = 0
    budgets: list[int | None] = field(default_factory=list)
    cost: float = 0.0  # seconds each budget takes to apply (a pass over many queues, in one)
    clock: ManualClock | None = None  # the budget's clock, advanced by ``cost`` as the budget is applied

    def ram_bytes(self) -> int:
        return 0

    def set_ram_budget(self, max_bytes: int | None) -> None:
        if self.cost and self.clock is not None:
            self.clock.advance(self.cost)
        self.budgets.append(max_bytes)

    def needs_paging(self) -> bool:
        return False

    def page(self) -> None:
        pass


@dataclass
class Node:
    queues: list[BudgetedQueue]

    @property
    def vhosts(self) -> dict[str, Node]:
        return {"/": self}


@pytest.fixture(autouse=True)
def limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_budget, "_limit", 4 * GiB)
    monkeypatch.setattr(memory_budget, "_pressure", False)
    monkeypatch.setattr(memory_budget, "resident_memory", lambda: 100 * 1024 * 1024)


def test_a_queue_gaining_or_losing_consumers_gets_its_default_at_once() -> None:
    q = BudgetedQueue()
    q.consumer_count = 1
    consumers_changed(q)
    q.consumer_count = 0
    consumers_changed(q)
    assert q.budgets == [4 * GiB // 4, min(DEFAULT_QUEUE_BUDGET, 4 * GiB // 10)]


def test_under_memory_pressure_the_shares_stay() -> None:
    budget = MemoryBudget(Node([]), None)
    budget.limited = True
    q = BudgetedQueue(consumer_count=1)
    consumers_changed(q)
    assert q.budgets == []
    budget.limited = False
    consumers_changed(q)
    assert q.budgets == [4 * GiB // 4]


def test_a_costly_pass_over_the_queues_makes_the_next_wait() -> None:
    clock = ManualClock()
    q = BudgetedQueue(cost=0.003, clock=clock)  # a pass costs 3 ms: the next one waits 0.3 s (PASS_SHARE)
    budget = MemoryBudget(Node([q]), None, clock)
    wait = 0.003 / memory_budget.PASS_SHARE
    for _ in range(50):  # ten ticks that could run a pass, at one instant
        budget.tick()
    assert len(q.budgets) == 1, q.budgets
    clock.advance(wait * 0.9)
    for _ in range(5):
        budget.tick()
    assert len(q.budgets) == 1, q.budgets  # not yet
    clock.advance(wait * 0.2)
    for _ in range(5):
        budget.tick()
    assert len(q.budgets) == 2, q.budgets
    budget.stop()
