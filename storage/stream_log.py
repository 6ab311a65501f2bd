"""What a stream queue keeps: an append-only log with offsets, read from anywhere, and its consumer groups.

This module is the interface between the broker's stream queue (broker/queues/stream_queue.py) and the stores that
implement it: the file-backed store on QMQ's log model (storage/stream_store.py: a message log per vhost, a
consume log per stream, a pull log per consumer group; seed 001) and an in-memory one for tests
(storage/stream_memory.py). Both run the same conformance suite (tests/unit/storage/test_stream_log.py).

Offsets are stream offsets as RabbitMQ streams number them: 0 for the first message ever appended, +1 per
message, never reused (retention removes the oldest, so ``first_offset`` grows; an empty stream has
``first_offset == next_offset``). Payloads are opaque bytes (the broker's encoded message); storage/ knows
nothing of AMQP.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol


class StreamRecord(NamedTuple):
    """One message of a stream, as read back."""

    offset: int
    timestamp_ms: int  # when it was appended (wall clock, ms since the epoch): offset-by-time finds it
    payload: bytes


class GroupLog(Protocol):
    """A consumer group's progress on one stream (QMQ's pull log): which offsets its members pulled, which
    they acked. Survives restarts with the stream.

    - ``cursor``: the next offset the group has not pulled yet (members pull from here, in order);
    - ``committed``: every offset below it is acked (it advances past contiguously acked offsets);
    - ``outstanding()``: pulled and not acked yet. After a restart these are the ones to redeliver (with
      ``redelivered=true``); while running, the broker redelivers a departed member's share of them.
    """

    name: str

    @property
    def cursor(self) -> int: ...

    @property
    def committed(self) -> int: ...

    def outstanding(self) -> list[int]:
        """Pulled and not acked, in offset order."""
        ...

    def pulled(self, offsets: Iterable[int]) -> None:
        """Record that these offsets were handed to a member (the cursor moves past the highest)."""
        ...

    def acked(self, offsets: Iterable[int]) -> None:
        """Record acks; ``committed`` advances past what is contiguously acked."""
        ...

    def skip_to(self, offset: int) -> None:
        """Everything below ``offset`` is settled (retention removed it, or an outside reader committed past
        it): the committed offset and the cursor move up to it, never back."""
        ...


class StreamLog(Protocol):
    """One stream: append, read from any retained offset, find an offset by time, retention, groups.

    Durability follows the variable queue's rule: ``append`` returns the offset at once; the record is on
    disk once ``on_durable`` has been called with a value above that offset (called on the event loop's
    thread after the fsync that covers it; the file store shares the node's syncer, so one fsync covers many
    streams and queues). A publisher confirm is sent only then.
    """

    name: str
    # Called with N when every offset < N is durable (fsynced); set by the stream queue.
    on_durable: Callable[[int], None] | None
    # Called with the failed range's end when a write or fsync failed (those publishes get basic.nack).
    on_durable_failed: Callable[[int], None] | None

    @property
    def first_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def segment_count(self) -> int: ...

    @property
    def bytes(self) -> int:
        """Payload bytes retained (what ``x-max-length-bytes`` limits)."""
        ...

    def append(self, payload: builtins.bytes, timestamp_ms: int, filter_value: str | None = None) -> int:
        """Append one message; returns its offset. ``filter_value``: the ``x-stream-filter-value`` header, kept
        per segment (a Bloom filter in RabbitMQ, an exact set here) so that filtered reads can skip segments that
        cannot match."""
        ...

    def append_run(self, payloads: list[builtins.bytes], timestamp_ms: int, filter_value: str | None = None) -> int:
        """Append messages one after the other, as :meth:`append` each; returns the first one's offset (the
        others follow it). One call for a run of publishes (broker/amqp/publish_run.py)."""
        ...

    def read(self, offset: int, max_records: int, filter_values: frozenset[str] | None = None
             ) -> list[StreamRecord]:
        """Up to ``max_records`` records at offsets ≥ ``max(offset, first_offset)``, in order (fewer, or none,
        at the end). With ``filter_values``, chunks whose filter cannot contain any of them may be skipped (a
        filtered read may still return other values: the caller checks; ``""`` among them stands for messages
        appended without a filter value, as osiris's ``match_unfiltered``). Never loads the stream into memory:
        cost is proportional to what is returned (plus one index lookup)."""
        ...

    def offset_at(self, timestamp_ms: int) -> int:
        """The first retained offset whose timestamp is ≥ ``timestamp_ms`` (``next_offset`` if none): a binary
        search over the index, not a scan."""
        ...

    def retain(self, max_bytes: int | None, max_age_ms: int | None, now_ms: float) -> int:
        """Apply retention: remove whole segments, oldest first, while the stream is over ``max_bytes`` or a
        segment's newest message is older than ``max_age_ms``; never the segment being written. Returns the
        number of segments removed."""
        ...

    def group(self, name: str, start_offset: int) -> GroupLog:
        """The consumer group ``name`` (created at ``start_offset`` if new; an existing group keeps its state)."""
        ...

    def groups(self) -> dict[str, GroupLog]: ...

    def delete(self) -> None:
        """The stream is deleted: its files (and groups) go."""
        ...

    def close(self) -> None: ...


class GroupProgress:
    """The bookkeeping every GroupLog keeps, whatever it is stored in: the cursor, the committed offset, what is
    pulled and not acked, and what is acked above a gap. Stores subclass it and record the changes their way
    (storage/stream_memory.py keeps nothing more; storage/stream_store.py appends them to its pull log)."""

    def __init__(self, name: str, start_offset: int) -> None:
        self.name = name
        self._cursor = start_offset
        self._committed = start_offset
        self._pulled: set[int] = set()  # pulled, not acked
        self._acked: set[int] = set()  # acked above ``committed`` (a gap below them)

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def committed(self) -> int:
        return self._committed

    def outstanding(self) -> list[int]:
        return sorted(self._pulled)

    def _apply_pulled(self, offsets: Iterable[int]) -> None:
        for o in offsets:
            if o >= self._committed and o not in self._acked:
                self._pulled.add(o)
            if o >= self._cursor:
                self._cursor = o + 1

    def _apply_acked(self, offsets: Iterable[int]) -> None:
        for o in offsets:
            if o >= self._committed:
                self._pulled.discard(o)
                self._acked.add(o)
        c = self._committed
        while c in self._acked:
            self._acked.discard(c)
            c += 1
        self._committed = c

    def _drop_below(self, offset: int) -> bool:
        """Retention removed everything below ``offset``: nothing there can be pulled or acked any more.
        Returns whether anything changed (the cursor never falls below the committed offset, so only an
        ``offset`` above the committed one changes anything)."""
        if offset <= self._committed:
            return False
        self._pulled = {o for o in self._pulled if o >= offset}
        self._acked = {o for o in self._acked if o >= offset}
        self._cursor = max(self._cursor, offset)
        self._committed = offset
        self._apply_acked(())
        return True
