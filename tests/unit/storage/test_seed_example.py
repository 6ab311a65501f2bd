"""Seed 000's worked example, step by step: the exact contents of q4, q3, delta, q2 and q1.

Messages are named 1..25 as in the seed; seq_ids start at 0, so message n has seq_id n - 1. The seed
shows two moments inside single calls (the fetch that empties q3 before and after it refills, and
maybe_deltas_to_betas before and after it joins q2); a recording subclass captures those moments from
the real code path.
"""

from __future__ import annotations

from storage.variable_queue import VariableQueue


def state(q4=(), q3=(), q2=(), q1=(), delta=()) -> dict[str, list[int]]:
    return {"q4": list(q4), "q3": list(q3), "delta": list(delta), "q2": list(q2), "q1": list(q1)}


def names(vq: VariableQueue) -> dict[str, list[int]]:
    return {part: [s + 1 for s in seqs] for part, seqs in vq.parts().items()}


class Recording(VariableQueue):
    """Snapshots the parts at the moments the seed pauses inside a call."""

    snapshots: list[tuple[str, dict[str, list[int]]]]

    def _q3_emptied(self) -> None:
        self.snapshots.append(("q3 emptied", names(self)))
        super()._q3_emptied()

    def _delta_to_q3(self) -> None:
        super()._delta_to_q3()
        self.snapshots.append(("delta loaded", names(self)))


def publish(vq: VariableQueue, ns: range | list[int]) -> None:
    for n in ns:
        vq.publish(str(n).encode(), 1, False)


def fetch(vq: VariableQueue, k: int) -> list[bytes]:
    out = []
    for _ in range(k):
        fetched = vq.fetch(False)
        assert fetched is not None
        out.append(fetched[1])
    return out


def test_seed_worked_example(harness) -> None:
    h = harness(durable=False)
    ns = h.ns
    vq = Recording(h.root + "/seed", durable=False, store=ns.persistent, transient_store=ns.transient,
                   syncer=ns.syncer)
    vq.snapshots = []

    publish(vq, range(1, 10))
    assert names(vq) == state(q4=range(1, 10))
    publish(vq, [10])
    assert names(vq) == state(q4=range(1, 11))

    vq.push_alphas_to_betas(3)  # q1 is empty: the whole quota goes to q4's rear
    assert names(vq) == state(q4=range(1, 8), q3=[8, 9, 10])

    publish(vq, range(11, 16))
    assert names(vq) == state(q4=range(1, 8), q3=[8, 9, 10], q1=range(11, 16))

    vq.push_alphas_to_betas(3, q4_quota=3)
    assert names(vq) == state(q4=[1, 2, 3, 4], q3=range(5, 14), q1=[14, 15])

    vq.push_betas_to_deltas(4)
    assert names(vq) == state(q4=[1, 2, 3, 4], q3=[5, 6, 7, 8, 9], q1=[14, 15], delta=[10, 11, 12, 13])

    publish(vq, range(16, 21))
    assert names(vq) == state(q4=[1, 2, 3, 4], q3=[5, 6, 7, 8, 9], q1=range(14, 21), delta=[10, 11, 12, 13])

    vq.push_alphas_to_betas(4, q4_quota=3)
    assert names(vq) == state(q4=[1], q3=range(2, 10), q2=[14, 15, 16, 17], q1=[18, 19, 20],
                              delta=[10, 11, 12, 13])
    vq.check_invariants()

    assert fetch(vq, 3) == [b"1", b"2", b"3"]
    assert names(vq) == state(q3=range(4, 10), q2=[14, 15, 16, 17], q1=[18, 19, 20], delta=[10, 11, 12, 13])

    assert fetch(vq, 5) == [b"4", b"5", b"6", b"7", b"8"]
    assert names(vq) == state(q3=[9], q2=[14, 15, 16, 17], q1=[18, 19, 20], delta=[10, 11, 12, 13])
    assert vq.snapshots == []

    assert fetch(vq, 1) == [b"9"]
    # Inside that fetch: q3 became empty while delta still held messages ...
    assert vq.snapshots[0] == ("q3 emptied", state(q2=[14, 15, 16, 17], q1=[18, 19, 20], delta=[10, 11, 12, 13]))
    # ... so maybe_deltas_to_betas loaded delta into q3 ...
    assert vq.snapshots[1] == ("delta loaded", state(q3=[10, 11, 12, 13], q2=[14, 15, 16, 17], q1=[18, 19, 20]))
    # ... and, delta now empty, joined q2 onto q3's rear.
    assert names(vq) == state(q3=range(10, 18), q1=[18, 19, 20])
    vq.check_invariants()

    publish(vq, range(21, 26))
    assert names(vq) == state(q3=range(10, 18), q1=range(18, 26))

    assert fetch(vq, 8) == [str(n).encode() for n in range(10, 18)]
    # Inside the eighth fetch: q3 and delta empty ...
    assert vq.snapshots[2] == ("q3 emptied", state(q1=range(18, 26)))
    # ... so q1 moved into q4.
    assert names(vq) == state(q4=range(18, 26))

    assert fetch(vq, 1) == [b"18"]
    assert names(vq) == state(q4=range(19, 26))
    vq.check_invariants()
    assert fetch(vq, 7) == [str(n).encode() for n in range(19, 26)]
    assert vq.is_empty() and vq.len() == 0
    assert len(vq.snapshots) == 3


def test_seed_example_with_durable_persistent_messages(harness) -> None:
    """The same moves with everything persistent in a durable queue: the parts match the seed too."""
    h = harness(durable=True)
    vq = h.vq
    for n in range(1, 11):
        vq.publish(str(n).encode(), 1, True)
    vq.push_alphas_to_betas(3)
    for n in range(11, 16):
        vq.publish(str(n).encode(), 1, True)
    vq.push_alphas_to_betas(3, q4_quota=3)
    vq.push_betas_to_deltas(4)
    for n in range(16, 21):
        vq.publish(str(n).encode(), 1, True)
    vq.push_alphas_to_betas(4, q4_quota=3)
    assert names(vq) == state(q4=[1], q3=range(2, 10), q2=[14, 15, 16, 17], q1=[18, 19, 20],
                              delta=[10, 11, 12, 13])
    assert fetch(vq, 9) == [str(n).encode() for n in range(1, 10)]
    assert names(vq) == state(q3=range(10, 18), q1=[18, 19, 20])
    vq.check_invariants()
