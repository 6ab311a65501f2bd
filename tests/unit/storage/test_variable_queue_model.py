"""VariableQueue against a plain model (RabbitMQ's classic_queue_prop_SUITE, with hypothesis).

Random publish (persistent or not, small or big) / fetch / ack / requeue / purge / page-out / clean
restart / dirty restart on a durable queue. The model is a sorted list of ready messages and a dict of
pending ones; a restart keeps the persistent messages (pending ones come back ready and delivered), a
dirty restart marks every survivor delivered. Nothing lost, nothing duplicated, order kept, redelivered
flags right. A dirty restart here is "fsynced, then abandoned": what kill -9 leaves after the last sync.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from storage_harness import Harness


class VariableQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="leveret-vq-")
        self.h = Harness(self.tmp + "/node", durable=True)
        self.target: int | None = None
        self.configure()
        self.counter = 0
        # seq_id -> (message, persistent, delivered)
        self.ready: dict[int, tuple[bytes, bool, bool]] = {}
        self.pending: dict[int, tuple[bytes, bool]] = {}

    def configure(self) -> None:
        self.h.vq.beta_floor = 2
        self.h.vq.set_ram_target(self.target)

    def teardown(self) -> None:
        try:
            self.h.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(persistent=st.booleans(), big=st.booleans(), n=st.integers(1, 6))
    def publish(self, persistent: bool, big: bool, n: int) -> None:
        for _ in range(n):
            self.counter += 1
            size = 5000 if big else 20
            m = (b"%d" % self.counter).ljust(size, b".")
            seq = self.h.vq.publish(m, size, persistent)
            assert seq not in self.ready and seq not in self.pending
            self.ready[seq] = (m, persistent, False)

    @rule(ack_required=st.booleans(), n=st.integers(1, 5))
    def fetch(self, ack_required: bool, n: int) -> None:
        for _ in range(n):
            got = self.h.vq.fetch(ack_required)
            if not self.ready:
                assert got is None
                return
            seq = min(self.ready)
            m, persistent, delivered = self.ready.pop(seq)
            assert got == (seq, m, delivered)
            if ack_required:
                self.pending[seq] = (m, persistent)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def ack(self, data) -> None:
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.pending)), min_size=1, max_size=4, unique=True))
        acked = self.h.vq.ack(seqs)
        assert acked == [self.pending.pop(s)[0] for s in seqs]

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def requeue(self, data) -> None:
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.pending)), min_size=1, max_size=4, unique=True))
        self.h.vq.requeue(seqs)
        for s in seqs:
            m, persistent = self.pending.pop(s)
            self.ready[s] = (m, persistent, True)

    @rule()
    def purge(self) -> None:
        assert self.h.vq.purge() == len(self.ready)
        self.ready.clear()

    @rule(ram=st.sampled_from([0, 3, 20, None]))
    def page_out(self, ram: int | None) -> None:
        self.target = ram
        self.h.vq.set_ram_target(ram)

    @rule(quota=st.integers(1, 10))
    def push_betas_to_deltas(self, quota: int) -> None:
        self.h.vq.push_betas_to_deltas(quota)

    def _survivors(self, dirty: bool) -> None:
        ready = {s: v for s, v in self.ready.items() if v[1]}
        for s, (m, persistent) in self.pending.items():
            if persistent:
                ready[s] = (m, True, True)
        if dirty:
            ready = {s: (m, p, True) for s, (m, p, _) in ready.items()}
        self.ready, self.pending = ready, {}

    @rule()
    def restart_clean(self) -> None:
        self.h.restart(clean=True)
        assert self.h.vq.recovered_clean is True
        self._survivors(dirty=False)
        self.configure()

    @rule()
    def restart_dirty(self) -> None:
        self.h.restart(clean=False)
        self._survivors(dirty=True)
        self.configure()

    @invariant()
    def counts_match(self) -> None:
        vq = self.h.vq
        assert vq.len() == len(self.ready)
        assert vq.pending_ack_count() == len(self.pending)
        assert vq.ready_bytes() == sum(len(m) for m, _, _ in self.ready.values())

    @invariant()
    def structure_holds(self) -> None:
        self.h.vq.check_invariants()


TestVariableQueueModel = VariableQueueMachine.TestCase
TestVariableQueueModel.settings = settings(max_examples=60, stateful_step_count=35, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
