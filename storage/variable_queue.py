"""The variable queue (RabbitMQ's ``rabbit_variable_queue``, as seed 000 describes it).

A queue's ready messages are, from head to tail, in five parts (every part ordered by seq_id, and
q4 < q3 < delta < q2 < q1):

- **q4**: *alphas*, the head: message and position in RAM.
- **q3**: *betas* (message on disk, position in RAM; *gammas* if the index entry is on disk too).
- **delta**: a seq_id range whose messages and positions are only on disk (``Delta``: start, end, count).
- **q2**: betas behind delta.
- **q1**: alphas published while q3 was not empty (they may not jump ahead of the paged-out middle).

Invariants (RabbitMQ's): q1 non-empty => q3 non-empty; q2 non-empty => delta non-empty; delta non-empty
=> q3 non-empty. So when q3 is empty the whole queue is q4 and a publish may go there.

Paging out (``reduce_memory_use``, driven by the RAM budget) moves alphas to betas with
``push_alphas_to_betas`` (q1 from its front, then q4 from its rear) and betas to delta with
``push_betas_to_deltas`` (q3 from its rear, keeping its head, then q2 from its front). Fetching
(``queue_out``) takes q4's head, else q3's (``fetch_from_q3``); when q3 empties, ``maybe_deltas_to_betas``
loads the next index segment of delta into q3 and, once delta is empty, joins q2 onto q3's rear; when
delta was already empty, q1 becomes q4.

``is_persistent = durable queue and persistent message``: such a message is written at once (its index
entry, embedding it when small, else the message store) and its confirm id is released only after the
fsync that covers those writes. Other messages reach disk only when paged out, to the transient store.

Pending acks keep their message in RAM: the broker's channel holds the same object until the ack, so
this costs nothing extra and lets ``ack`` return the messages (dead-lettering needs them).
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from storage.backing_queue import Figures, LocalStore, new_msg_id
from storage.msg_status import INDEX, STORE, Delta, MsgStatus
from storage.msg_store import MsgStore
from storage.queue_index import SEGMENT_ENTRIES, IndexEntry, QueueIndex, next_segment_boundary, segment_of
from storage.syncer import Syncer

log = logging.getLogger("leveret.storage")

# Betas kept in RAM before paging to delta, whatever the budget: one index segment, so a segment loaded
# from delta is not pushed straight back.
BETA_FLOOR = SEGMENT_ENTRIES
# Messages moved per reduce_memory_use call; more is left to timeout() so no single call blocks long.
PAGE_CHUNK = 2048
# Rough RAM cost of one message's bookkeeping (its MsgStatus and deque slot), for the byte budget.
STATUS_OVERHEAD = 200
# Rough RAM cost of an alpha's message object beyond its size (the broker's Message and header bytes).
MSG_OVERHEAD = 400


# q1, q2, q3 and the unconfirmed deque of a queue that has not needed them yet (VariableQueue's docstring).
# Never written to: every writer asks for the queue's own deque first; clearing it, empty, changes nothing.
NONE_YET: deque[Any] = deque()
NONE_FAILED: list[Any] = []  # the same for VariableQueue._failed


def _seq(st: MsgStatus) -> int:
    return st.seq_id


def _merge(dq: deque[MsgStatus], items: list[MsgStatus]) -> None:
    """Merge sorted ``items`` into sorted ``dq``, touching only the front of ``dq`` that they reach."""
    if not items:
        return
    top = items[-1].seq_id
    head = []
    while dq and dq[0].seq_id < top:
        head.append(dq.popleft())
    dq.extendleft(reversed(list(heapq.merge(head, items, key=_seq)) if head else items))


class VariableQueue(LocalStore):
    """A BackingQueue that pages to disk (see the module docstring and ``storage.backing_queue``).

    ``store`` / ``transient_store`` are the node's two message stores, ``syncer`` its group-commit
    syncer. ``encode`` / ``decode`` turn a message into bytes and back (identity by default: messages
    are bytes). A durable queue whose directory holds an index is recovered from it on construction.

    A broker may hold 100,000 of these, most of them empty (issue 38), so an idle one is kept small. Its
    instance dictionary stays under CPython 3.11's 30 shared keys (beyond them every instance gets a table of
    its own: 1.6 KB instead of 0.3 KB; tests/unit/storage/test_queue_footprint.py keeps count): what starts at
    a constant value and changes for few queues is a class attribute until it changes. q1, q2, q3 and the
    unconfirmed deque start as the one shared empty deque :data:`NONE_YET` (a deque is 760 bytes) and get
    their own at the first message they take (:meth:`_q1`, :meth:`_q2`, :meth:`_q3`, :meth:`_add_confirm`).
    """

    # Class-level until set (see above).
    on_available: Callable[[], None] | None = None  # never called: a fetch loads what it needs at once
    beta_floor = BETA_FLOOR
    _target_ram: int | None = None
    _budget_bytes: int | None = None  # the byte budget behind _target_ram, if one was given
    _transient_floor = 0  # transient index entries below this predate the last restart: dead
    _dirty_floor = 0  # entries below this were recovered after a crash: all count as delivered
    recovered_clean: bool | None = None
    deleted = False
    _failed: list[Any] = NONE_FAILED  # confirms whose fsync failed (the owner nacks them): rare, so shared till then

    def __init__(self, directory: str, *, durable: bool, store: MsgStore, transient_store: MsgStore,
                 syncer: Syncer, encode: Callable[[Any], bytes] | None = None,
                 decode: Callable[[bytes], Any] | None = None, embed_below: int = 4096,
                 on_confirm: Callable[[], None] | None = None) -> None:
        self.durable = durable
        self._pstore = store
        self._tstore = transient_store
        self._syncer = syncer
        self._encode = encode or _identity
        self._decode = decode or _identity
        self._embed_below = embed_below
        self.on_confirm = on_confirm
        self._index = QueueIndex(directory, syncer, durable)
        self.q1: deque[MsgStatus] = NONE_YET
        self.q2: deque[MsgStatus] = NONE_YET
        self.q3: deque[MsgStatus] = NONE_YET
        self.q4: deque[MsgStatus] = deque()
        self.delta = Delta()
        self._pending: dict[int, MsgStatus] = {}
        self._pending_bytes = 0  # body bytes of the messages pending ack
        self._next_seq_id = 0
        self._len = 0
        self._ready_bytes = 0
        self._ram_msgs = 0  # alphas: ready messages whose content is in RAM (q1 and q4)
        self._ram_bytes = 0
        self._persistent_count = 0  # persistent messages, ready or pending ack (what a restart brings back)
        self._persistent_bytes = 0
        self._unconfirmed: deque[tuple[int, list[Any]]] = NONE_YET
        self._confirmed: list[Any] = []
        if durable and self._index.found:
            self._recover()
        elif durable:
            self.recovered_clean = True  # no directory: nothing on disk, nothing to doubt

    # -- publishing ---------------------------------------------------------------------------------------
    def _new_status(self, msg: Any, size: int, persistent: bool, delivered: bool, expiry: int | None,
                    confirm: Any, msg_id: int | None) -> MsgStatus:
        """Number a new message and, if it is persistent here, write its index entry (and count it)."""
        seq_id = self._next_seq_id
        self._next_seq_id = seq_id + 1
        is_p = persistent and self.durable
        st = MsgStatus(seq_id, msg_id, msg, is_p, delivered, False, False,
                       STORE if size >= self._embed_below else INDEX, size, expiry, -1)
        if is_p:
            self._write_index(st)
            self._persistent_count += 1
            self._persistent_bytes += size
        if confirm is not None:
            self._add_confirm(confirm, is_p)
        return st

    def publish(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                confirm: Any = None, msg_id: int | None = None) -> int:
        st = self._new_status(msg, size, persistent, False, expiry, confirm, msg_id)
        if self.q3:
            self._q1().append(st)
        else:
            self.q4.append(st)
        self._len += 1
        self._ready_bytes += size
        self._ram_msgs += 1
        self._ram_bytes += size
        if self._budget_bytes is not None and self._ram_bytes > self._budget_bytes:
            # The byte budget was turned into a message target with an older mean size: redo it.
            self.set_ram_budget(self._budget_bytes)
        elif self._target_ram is not None and self._ram_msgs > self._target_ram:
            self.reduce_memory_use()
        return st.seq_id

    def publish_delivered(self, msg: Any, size: int, persistent: bool, expiry: int | None = None,
                          confirm: Any = None, msg_id: int | None = None) -> int:
        st = self._new_status(msg, size, persistent, True, expiry, confirm, msg_id)
        self._pending[st.seq_id] = st
        self._pending_bytes += size
        return st.seq_id

    # -- fetching -----------------------------------------------------------------------------------------
    def fetch(self, ack_required: bool) -> tuple[int, Any, bool] | None:
        while True:
            st = self._take()
            if st is None:
                return None
            msg = st.msg
            if msg is None:
                msg = self._load(st)
                if msg is None:  # damaged on disk (logged): drop it and go on
                    self._forget(st)
                    continue
            delivered = st.is_delivered
            if ack_required:
                if st.index_on_disk and not delivered:
                    self._index.deliver(st.seq_id)
                st.is_delivered = True
                st.msg = msg
                self._pending[st.seq_id] = st
                self._pending_bytes += st.size
            else:
                self._forget(st)
            return st.seq_id, msg, delivered

    def _take(self) -> MsgStatus | None:
        """``queue_out`` plus the ready-message counters."""
        st = self.queue_out()
        if st is not None:
            self._len -= 1
            self._ready_bytes -= st.size
            if st.msg is not None:
                self._ram_msgs -= 1
                self._ram_bytes -= st.size
        return st

    def queue_out(self) -> MsgStatus | None:
        if self.q4:
            return self.q4.popleft()
        return self.fetch_from_q3()

    def fetch_from_q3(self) -> MsgStatus | None:
        q3 = self.q3
        if not q3:
            return None  # q3 empty => delta, q2, q1 empty: the queue is empty
        st = q3.popleft()
        if not q3:
            self._q3_emptied()
        return st

    def _q3_emptied(self) -> None:
        if self.delta.count:
            self.maybe_deltas_to_betas()
        else:
            self._q1_to_q4()

    # -- q1, q2, q3: their own deque at their first message (the class docstring) ---------------------------
    def _q1(self) -> deque[MsgStatus]:
        if self.q1 is NONE_YET:
            self.q1 = deque()
        return self.q1

    def _q2(self) -> deque[MsgStatus]:
        if self.q2 is NONE_YET:
            self.q2 = deque()
        return self.q2

    def _q3(self) -> deque[MsgStatus]:
        if self.q3 is NONE_YET:
            self.q3 = deque()
        return self.q3

    def _q1_to_q4(self) -> None:
        """q3 and delta are empty (so is q2): q1's alphas are now the head."""
        self.q4.extend(self.q1)
        self.q1.clear()

    def maybe_deltas_to_betas(self) -> None:
        """Load delta's next segment into q3's rear; once delta is empty, join q2 onto q3's rear."""
        if not self.delta.count:
            return
        self._delta_to_q3()
        if not self.delta.count:
            self._q2_to_q3()

    def _delta_to_q3(self) -> None:
        d = self.delta
        while d.count and d.start < d.end:
            lo = d.start
            hi = min(next_segment_boundary(lo), d.end)
            loaded = 0
            for e in self._delta_entries(lo, hi):
                st = MsgStatus(e.seq_id, e.msg_id, None, e.persistent, e.delivered or e.seq_id < self._dirty_floor,
                               e.body_pos < 0, True, STORE if e.body_pos < 0 else INDEX, e.size, e.expiry,
                               e.body_pos)
                if st.msg_in_store and (e.msg_id is None or
                                        not (self._pstore if e.persistent else self._tstore).contains(e.msg_id)):
                    log.error("storage: message %d of %s lost from the store; dropped", e.seq_id,
                              self._index.directory)
                    self._drop_lost(st)
                    continue
                self._q3().append(st)
                loaded += 1
            d.count -= loaded
            d.start = hi
            if loaded:
                break
        if d.count and d.start >= d.end:
            log.error("storage: %d messages of %s missing from its index; dropped", d.count, self._index.directory)
            self._len -= d.count
            d.count = 0
            self._recount()
            self._index.recount_live()
        if not d.count:
            d.start = d.end = 0

    def _q2_to_q3(self) -> None:
        if self.q2:
            self._q3().extend(self.q2)
            self.q2.clear()
        if not self.q3:
            self._q1_to_q4()

    def _delta_entries(self, lo: int, hi: int) -> Iterator[IndexEntry]:
        """Delta's index entries with ``lo <= seq_id < hi``, one segment read at a time."""
        pending = self._pending
        while lo < hi:
            seg_hi = min(next_segment_boundary(lo), hi)
            for e in self._index.read_segment(segment_of(lo), lo, seg_hi, self._transient_floor):
                if e.seq_id not in pending:
                    yield e
            lo = seg_hi

    def _drop_lost(self, st: MsgStatus) -> None:
        self.delta.count -= 1
        self._len -= 1
        self._ready_bytes -= st.size
        self._index.ack(st.seq_id, st.is_persistent)
        if st.is_persistent:
            self._persistent_count -= 1
            self._persistent_bytes -= st.size

    def _recount(self) -> None:
        """Rebuild the byte and persistence counters from RAM (after delta was found inconsistent)."""
        ready = [st for part in (self.q4, self.q3, self.q2, self.q1) for st in part]
        self._ready_bytes = sum(st.size for st in ready)
        both = ready + list(self._pending.values())
        self._persistent_count = sum(1 for st in both if st.is_persistent)
        self._persistent_bytes = sum(st.size for st in both if st.is_persistent)

    # -- head of the queue: TTL --------------------------------------------------------------------------
    def _head(self) -> MsgStatus | None:
        if self.q4:
            return self.q4[0]
        if self.q3:
            return self.q3[0]
        return None

    def head_expiry(self) -> int | None:
        st = self._head()
        return None if st is None else st.expiry

    def peek(self) -> Any | None:
        """The message ``fetch`` would return next, left in place (read from disk if paged out)."""
        st = self._head()
        if st is None:
            return None
        return st.msg if st.msg is not None else self._load(st)

    def peek_many(self, count: int) -> list[tuple[int, Any, bool]]:
        """Up to ``count`` ready messages in fetch order (q4, q3, delta, q2, q1), changing nothing: betas
        and delta's messages are read from disk into the answer only, never into the queue's parts."""
        out: list[tuple[int, Any, bool]] = []
        if count <= 0:
            return out
        for st in self._peek_statuses():
            msg = st.msg if st.msg is not None else self._load(st)
            if msg is None:  # damaged or lost on disk (logged by the read): fetch will drop it
                continue
            out.append((st.seq_id, msg, st.is_delivered))
            if len(out) >= count:
                break
        return out

    def _peek_statuses(self) -> Iterator[MsgStatus]:
        yield from self.q4
        yield from self.q3
        d = self.delta
        if d.count:
            for e in self._delta_entries(d.start, d.end):
                st = MsgStatus(e.seq_id, e.msg_id, None, e.persistent, e.delivered or e.seq_id < self._dirty_floor,
                               e.body_pos < 0, True, STORE if e.body_pos < 0 else INDEX, e.size, e.expiry,
                               e.body_pos)
                if st.msg_in_store and (e.msg_id is None or
                                        not (self._pstore if e.persistent else self._tstore).contains(e.msg_id)):
                    continue
                yield st
        yield from self.q2
        yield from self.q1

    def dropwhile(self, pred: Callable[[int | None], bool]) -> tuple[int, int | None]:
        """Drop head messages while ``pred(expiry)`` holds; returns (how many, the new head's expiry)."""
        n = 0
        while True:
            st = self._head()
            if st is None or not pred(st.expiry):
                return n, None if st is None else st.expiry
            taken = self._take()
            assert taken is not None  # the head just seen
            self._forget(taken)
            n += 1

    def fetchwhile(self, pred: Callable[[int | None], bool]) -> list[tuple[int, Any, bool]]:
        """Fetch (ack required) head messages while ``pred(expiry)`` holds: for dead-lettering them."""
        out: list[tuple[int, Any, bool]] = []
        while True:
            st = self._head()
            if st is None or not pred(st.expiry):
                return out
            fetched = self.fetch(True)
            if fetched is not None:
                out.append(fetched)

    # -- acks ---------------------------------------------------------------------------------------------
    def ack(self, seq_ids: Iterable[int]) -> list[Any]:
        pending = self._pending
        out = []
        index_acks: list[tuple[int, bool]] = []  # written as one record per segment (QueueIndex.ack_many)
        for seq_id in seq_ids:
            st = pending.pop(seq_id, None)
            if st is not None:
                self._pending_bytes -= st.size
                if st.index_on_disk:
                    index_acks.append((seq_id, st.is_persistent))
                self._forget(st, index_ack=False)
                out.append(st.msg)
        if index_acks:
            self._index.ack_many(index_acks)
        return out

    def requeue(self, seq_ids: Iterable[int]) -> None:
        """Put pending acks back at their seq_id's place, marked delivered: ahead of q3 into q4 (alphas),
        ahead of delta into q3 (betas), else into delta (RabbitMQ's queue_merge / delta_merge)."""
        pending = self._pending
        sts = [pending.pop(s) for s in seq_ids if s in pending]
        if not sts:
            return
        sts.sort(key=_seq)
        q3, d = self.q3, self.delta
        i = 0
        if q3:
            limit = q3[0].seq_id
            while i < len(sts) and sts[i].seq_id < limit:
                i += 1
        else:
            i = len(sts)
        j = i
        if d.count:
            while j < len(sts) and sts[j].seq_id < d.start:
                j += 1
        else:
            j = len(sts)
        for st in sts:
            self._len += 1
            self._ready_bytes += st.size
            self._pending_bytes -= st.size
        for st in sts[:i]:
            self._ram_msgs += 1
            self._ram_bytes += st.size
        _merge(self.q4, sts[:i])
        for st in sts[i:j]:
            self._write_msg(st)
            st.msg = None
        if i < j:
            _merge(self._q3(), sts[i:j])
        for st in sts[j:]:
            self._to_delta(st)
        if self._target_ram is not None:
            self.reduce_memory_use()

    # -- paging -------------------------------------------------------------------------------------------
    def push_alphas_to_betas(self, quota: int, q4_quota: int | None = None) -> int:
        """Page out up to ``quota`` alphas, q1's oldest first (to q2 if delta holds messages, else to q3's
        rear), then q4's newest (to q3's front). With ``q4_quota`` the two parts get separate quotas
        (the seed's worked example moves a different number from each). Returns how many moved."""
        moved = 0
        q1, q4 = self.q1, self.q4
        n = quota
        while n > 0 and q1:
            st = q1.popleft()
            self._alpha_to_beta(st)
            (self._q2() if self.delta.count else self._q3()).append(st)
            n -= 1
            moved += 1
        n = n if q4_quota is None else q4_quota
        while n > 0 and q4:
            st = q4.pop()
            self._alpha_to_beta(st)
            self._q3().appendleft(st)
            n -= 1
            moved += 1
        return moved

    def push_betas_to_deltas(self, quota: int) -> int:
        """Page up to ``quota`` betas out to delta: q3 from its rear (never its head, so delta is never
        the queue's head), then q2 from its front. Returns how many moved."""
        q3, q2 = self.q3, self.q2
        moved = 0
        while moved < quota and len(q3) > 1:
            self._to_delta(q3.pop())
            moved += 1
        while moved < quota and q2:
            self._to_delta(q2.popleft())
            moved += 1
        return moved

    def _alpha_to_beta(self, st: MsgStatus) -> None:
        self._write_msg(st)
        st.msg = None
        self._ram_msgs -= 1
        self._ram_bytes -= st.size

    def _to_delta(self, st: MsgStatus) -> None:
        """Forget a ready message's RAM status, leaving it only on disk, inside delta's range."""
        self._write_index(st)
        d = self.delta
        s = st.seq_id
        if not d.count:
            d.start, d.end = s, s + 1
        elif s < d.start:
            d.start = s
        elif s >= d.end:
            d.end = s + 1
        d.count += 1

    def reduce_memory_use(self) -> None:
        """Page out towards the RAM target, at most ``PAGE_CHUNK`` messages per step."""
        target = self._target_ram
        if target is None:
            return
        excess = self._ram_msgs - target
        if excess > 0:
            self.push_alphas_to_betas(min(excess, PAGE_CHUNK))
        betas = len(self.q2) + len(self.q3)
        permitted = max(target, self.beta_floor)
        if betas > permitted:
            self.push_betas_to_deltas(min(betas - permitted, PAGE_CHUNK))

    def set_ram_target(self, messages: int | None) -> None:
        """Keep at most ``messages`` alphas in RAM (None: no limit). RabbitMQ's target_ram_count."""
        self._target_ram = messages
        self.reduce_memory_use()

    def set_demand(self, wanted: bool) -> None:
        """Only the owner publishes here: nothing to look for."""

    def set_ram_budget(self, max_bytes: int | None) -> None:
        """Keep this queue's RAM near ``max_bytes`` (None: no limit): converted to a message target with
        the queue's mean message size. The memory monitor calls this with each queue's share."""
        self._budget_bytes = max_bytes
        if max_bytes is None:
            self.set_ram_target(None)
            return
        # Each permitted alpha costs its message plus its status, and lets one more beta (a status) stay
        # in RAM; the beta floor is paid regardless. An empty queue has no mean yet: assume 1 KiB (the
        # monitor calls again as the queue fills).
        mean = self._ready_bytes // self._len if self._len else 1024
        per_alpha = mean + MSG_OVERHEAD + 2 * STATUS_OVERHEAD
        self.set_ram_target(max(0, (max_bytes - self.beta_floor * STATUS_OVERHEAD) // per_alpha))

    def ram_bytes(self) -> int:
        """Estimated RAM held by ready messages (contents plus bookkeeping)."""
        statuses = len(self.q1) + len(self.q2) + len(self.q3) + len(self.q4)
        return self._ram_bytes + self._ram_msgs * MSG_OVERHEAD + statuses * STATUS_OVERHEAD

    def needs_timeout(self) -> bool:
        """True while paging towards the target is unfinished; the owner then calls :meth:`timeout`
        soon (each step is bounded). Syncing needs no timeout: the syncer runs at each burst's end."""
        target = self._target_ram
        if target is None:
            return False
        return self._ram_msgs > target or len(self.q2) + len(self.q3) > max(target, self.beta_floor)

    def timeout(self) -> None:
        self.reduce_memory_use()

    # -- queue-wide ---------------------------------------------------------------------------------------
    def purge(self) -> int:
        n = self._len
        for part in (self.q4, self.q3, self.q2, self.q1):
            for st in part:
                self._forget(st)
            part.clear()
        d = self.delta
        if d.count:
            for e in self._delta_entries(d.start, d.end):
                self._index.ack(e.seq_id, e.persistent)
                if e.body_pos < 0 and e.msg_id is not None:  # (None: an entry that lost its id; nothing stored)
                    (self._pstore if e.persistent else self._tstore).remove(e.msg_id)
                if e.persistent:
                    self._persistent_count -= 1
                    self._persistent_bytes -= e.size
        self.delta = Delta()
        self._len = self._ready_bytes = self._ram_msgs = self._ram_bytes = 0
        return n

    def len(self) -> int:
        return self._len

    def is_empty(self) -> bool:
        return not self._len

    def pending_ack_count(self) -> int:
        return len(self._pending)

    def ready_bytes(self) -> int:
        return self._ready_bytes

    def figures(self) -> Figures:
        """Paged out: the ready messages that are not alphas (betas in q2/q3, and delta)."""
        return Figures(self._len, len(self._pending), self._ready_bytes, self._pending_bytes,
                       self._len - self._ram_msgs)

    def delete_and_terminate(self) -> int:
        n = self._len + len(self._pending)
        self.purge()
        for st in self._pending.values():
            self._forget(st)
        self._pending.clear()
        self._pending_bytes = 0
        while self._unconfirmed:  # the queue is gone: nothing left to wait for
            self._confirmed.extend(self._unconfirmed.popleft()[1])
        self._index.delete()
        self.deleted = True
        return n

    # -- confirms -----------------------------------------------------------------------------------------
    def _add_confirm(self, confirm: Any, needs_sync: bool) -> None:
        if not needs_sync:
            self._confirmed.append(confirm)
            return
        gen = self._syncer.generation
        uc = self._unconfirmed
        if uc and uc[-1][0] == gen:
            uc[-1][1].append(confirm)
            return
        if not uc:
            self._syncer.wait(self)
            if uc is NONE_YET:
                uc = self._unconfirmed = deque()
        uc.append((gen, [confirm]))

    def on_synced(self, generation: int) -> bool:
        """Syncer callback (loop thread): release the confirms the completed fsync covers."""
        uc = self._unconfirmed
        released = False
        while uc and uc[0][0] <= generation:
            self._confirmed.extend(uc.popleft()[1])
            released = True
        if released and self.on_confirm is not None:
            self.on_confirm()
        return bool(uc)

    def on_sync_failed(self, generation: int) -> bool:
        """Syncer callback: the fsync that was to cover these publishes failed; they are nacked."""
        uc = self._unconfirmed
        failed = False
        while uc and uc[0][0] <= generation:
            if self._failed is NONE_FAILED:
                self._failed = []
            self._failed.extend(uc.popleft()[1])
            failed = True
        if failed and self.on_confirm is not None:
            self.on_confirm()
        return bool(uc)

    def drain_confirmed(self) -> list[Any]:
        out = self._confirmed
        if out:
            self._confirmed = []
        return out

    def drain_failed(self) -> list[Any]:
        out = self._failed
        if not out:
            return []
        self._failed = []
        return out

    # -- disk ---------------------------------------------------------------------------------------------
    def _write_msg(self, st: MsgStatus) -> None:
        """Make sure the message's content is on disk (store, or its embedding index entry)."""
        if st.persist_to is STORE:
            if not st.msg_in_store:
                store = self._pstore if st.is_persistent else self._tstore
                mid = st.msg_id
                if mid is None:
                    mid = st.msg_id = new_msg_id()
                if not store.incref(mid):
                    store.write(mid, self._encode(st.msg))
                st.msg_in_store = True
        elif not st.index_on_disk:
            self._write_index(st)

    def _write_index(self, st: MsgStatus) -> None:
        if st.index_on_disk:
            return
        if st.persist_to is STORE:
            self._write_msg(st)
            body = None
        else:
            body = self._encode(st.msg)
        st.index_pos = self._index.publish(st.seq_id, st.msg_id, st.is_persistent, st.is_delivered, st.size,
                                           st.expiry, body)
        st.index_on_disk = True

    def _load(self, st: MsgStatus) -> Any | None:
        if st.persist_to is STORE:
            assert st.msg_id is not None  # a message paged out to the store was given its id by _write_msg
            data = (self._pstore if st.is_persistent else self._tstore).read(st.msg_id)
        else:
            data = self._index.read_body(st.seq_id, st.index_pos, st.size)
        return None if data is None else self._decode(data)

    def _forget(self, st: MsgStatus, index_ack: bool = True) -> None:
        """The message leaves the queue for good: release its index entry (unless the caller acks it in the
        index itself, ``index_ack`` False: :meth:`ack` writes a batch) and store reference."""
        if index_ack and st.index_on_disk:
            self._index.ack(st.seq_id, st.is_persistent)
        if st.msg_in_store:
            assert st.msg_id is not None  # in the store means written under its id (_write_msg, _delta_to_q3)
            (self._pstore if st.is_persistent else self._tstore).remove(st.msg_id)
        if st.is_persistent:
            self._persistent_count -= 1
            self._persistent_bytes -= st.size

    # -- recovery and shutdown ------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Rebuild from the index: everything recovered starts in delta (then one segment is loaded)."""
        index, store = self._index, self._pstore
        terms = index.recover_terms()
        if terms is not None and not store.recovering:
            self.recovered_clean = True
            self._next_seq_id = terms["next_seq_id"]
            count = terms["count"]
            self.delta = Delta(terms["start"], self._next_seq_id, count) if count else Delta()
            self._persistent_count = self._len = count
            self._persistent_bytes = self._ready_bytes = terms["bytes"]
            self._dirty_floor = terms["dirty_floor"]
        else:
            # Dirty (or the store was): read every segment, re-counting what survives and giving the
            # store its references back.
            self.recovered_clean = terms is not None
            top = -1
            start, count, nbytes, lost = -1, 0, 0, 0
            for _, seg_top, live in index.scan_all():
                top = max(top, seg_top)
                for e in live:
                    if e.body_pos < 0 and (e.msg_id is None or not store.add_recovered_ref(e.msg_id)):
                        index.ack(e.seq_id)
                        lost += 1
                        continue
                    if start < 0:
                        start = e.seq_id
                    count += 1
                    nbytes += e.size
            if lost:
                log.error("storage: %d messages of %s lost from the store", lost, index.directory)
            self._next_seq_id = max(top + 1, terms["next_seq_id"] if terms else 0)
            self.delta = Delta(start, self._next_seq_id, count) if count else Delta()
            self._persistent_count = self._len = count
            self._persistent_bytes = self._ready_bytes = nbytes
            self._dirty_floor = terms["dirty_floor"] if terms else self._next_seq_id
        self._transient_floor = self._next_seq_id
        if self.delta.count:
            self.maybe_deltas_to_betas()

    def close_files(self) -> None:
        """First half of a clean shutdown: hand every buffer to the kernel (the owner then syncs)."""
        if self.deleted:
            return
        if not self.durable:
            self._index.delete()
            return
        self._index.close(None)

    def write_terms(self) -> None:
        """Second half, after the sync: record what a restart will find so it need not scan."""
        if not self.durable or self.deleted:
            return
        starts = [st.seq_id for part in (self.q4, self.q3, self.q2, self.q1) for st in part if st.is_persistent]
        starts += [st.seq_id for st in self._pending.values() if st.is_persistent]
        if self.delta.count:
            starts.append(self.delta.start)
        self._index.close({"next_seq_id": self._next_seq_id, "count": self._persistent_count,
                           "bytes": self._persistent_bytes, "start": min(starts, default=0),
                           "dirty_floor": self._dirty_floor})

    def close(self) -> None:
        """Clean shutdown of this queue alone (NodeStorage.close does all queues with one sync)."""
        self.close_files()
        self._syncer.sync()
        self.write_terms()

    def origins_held(self, seqs: set[int]) -> set[int]:
        """A durable queue's index is the proof (storage/dispatch_evidence.py); a transient one has none."""
        return self._index.origins_held(seqs) if self.durable and not self.deleted else set()

    # -- inspection (tests, debugging) ------------------------------------------------------------------
    def parts(self) -> dict[str, list[int]]:
        """The seq_ids in each part, head first; delta's are read from the index."""
        d = self.delta
        delta = [e.seq_id for e in self._delta_entries(d.start, d.end)] if d.count else []
        return {"q4": [st.seq_id for st in self.q4], "q3": [st.seq_id for st in self.q3], "delta": delta,
                "q2": [st.seq_id for st in self.q2], "q1": [st.seq_id for st in self.q1]}

    def check_invariants(self) -> None:
        q1, q2, q3, q4, d = self.q1, self.q2, self.q3, self.q4, self.delta
        assert not q1 or q3, "q1 non-empty needs q3 non-empty"
        assert not q2 or d.count, "q2 non-empty needs delta non-empty"
        assert not d.count or q3, "delta non-empty needs q3 non-empty"
        seqs = self.parts()
        order = seqs["q4"] + seqs["q3"] + seqs["delta"] + seqs["q2"] + seqs["q1"]
        assert order == sorted(order) and len(set(order)) == len(order), order
        assert len(seqs["delta"]) == d.count, (seqs["delta"], d)
        assert len(order) == self._len, (len(order), self._len)
        assert all(st.msg is not None for part in (q1, q4) for st in part), "alphas hold their message"
        assert all(st.msg is None for part in (q2, q3) for st in part), "betas hold no message"
        assert self._ram_msgs == len(q1) + len(q4)
        assert self._pending_bytes == sum(st.size for st in self._pending.values())


def _identity(x: Any) -> Any:
    return x
