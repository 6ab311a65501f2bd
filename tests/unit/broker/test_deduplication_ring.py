"""broker/deduplication_ring.py against a model in plain Python objects: random appends, removals and lookups on
small rings (so that the index's buckets collide and wrap), checked after every step."""

from __future__ import annotations

import random
import resource

import pytest

from broker.deduplication_ring import DEAD, DIGEST_SIZE, MAPPED_AT, LargeRing, SmallRing, ring_for


class Model:
    """The ring's contract in a list: slots in admission order, each [digest, expiry, alive]."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: list[list] = []

    def find(self, digest: bytes) -> bool:
        return any(alive and d == digest for d, _e, alive in self.slots)

    def append(self, digest: bytes, expiry: int) -> None:
        if len(self.slots) == self.capacity:
            self.slots.pop(0)
        self.slots.append([digest, expiry, True])

    def remove(self, digest: bytes) -> None:
        for slot in self.slots:
            if slot[2] and slot[0] == digest:
                slot[2] = False

    def entries(self) -> list[tuple[bytes, int]]:
        return [(d, e) for d, e, alive in self.slots if alive]


def digest(rng: random.Random, pool: list[bytes]) -> bytes:
    """A digest from a small pool (so that keys come back), some sharing their low bits (so that they collide)."""
    if pool and rng.random() < 0.6:
        return rng.choice(pool)
    d = rng.randbytes(DIGEST_SIZE)
    if pool and rng.random() < 0.5:
        d = pool[0][:1] + d[1:]  # the same home bucket as pool[0] in any index of up to 256 buckets
    pool.append(d)
    return d


@pytest.mark.parametrize("kind", [SmallRing, LargeRing])
@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 64, 100])  # a small ring of 64 or 100 grows from 16 slots
def test_the_ring_behaves_as_its_model(kind, capacity):
    rng = random.Random(capacity)
    ring, model = kind(capacity), Model(capacity)
    pool: list[bytes] = []
    for step in range(3000):
        d = digest(rng, pool)
        slot = ring.find(d)
        assert (slot >= 0) == model.find(d), step
        if slot >= 0:
            assert ring.expiry(slot) != DEAD
            if rng.random() < 0.5:  # found expired, or admitted again: removed first
                ring.remove(slot)
                model.remove(d)
                if rng.random() < 0.5:
                    ring.append(d, step)
                    model.append(d, step)
        else:
            ring.append(d, step)
            model.append(d, step)
        assert list(ring.entries()) == model.entries(), step
        assert len(ring) == len(model.entries())
    for d in pool:  # every live one is found, nothing else
        assert (ring.find(d) >= 0) == model.find(d)


@pytest.mark.parametrize("kind", [SmallRing, LargeRing])
def test_a_full_ring_drops_its_oldest_and_a_dead_slot_waits_for_the_head(kind):
    ring = kind(3)
    a, b, c, e = (bytes([i]) * DIGEST_SIZE for i in (1, 2, 3, 4))
    for d in (a, b, c):
        ring.append(d, 0)
    ring.remove(ring.find(b))
    assert len(ring) == 2 and ring.find(b) == -1
    ring.append(e, 5)  # the ring is full of slots: the oldest (a) goes, b's dead slot stays until the head passes
    assert ring.find(a) == -1 and [x for x, _ in ring.entries()] == [c, e]
    ring.clear()
    assert len(ring) == 0 and list(ring.entries()) == [] and ring.find(c) == -1
    ring.append(c, 1)
    assert ring.find(c) >= 0


def test_a_million_entries_fit_in_well_under_64_bytes_each():
    """Issue 38's bound, filled (10,000,000 in bench/dedup_scale.py): the resident memory the ring adds, per entry."""
    n = 1_000_000
    before = _rss()
    ring = ring_for(n)
    assert isinstance(ring, LargeRing) and n >= MAPPED_AT
    rng = random.Random(1)
    chunk = rng.randbytes(DIGEST_SIZE * 1000)
    for i in range(n // 1000):
        for j in range(1000):
            d = (i * 1000 + j).to_bytes(8, "little") + chunk[j * 16 + 8:j * 16 + 16]
            ring.append(d, 0)
    grown = _rss() - before
    assert len(ring) == n
    assert grown / n <= 64, f"{grown / n:.1f} bytes an entry"


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
