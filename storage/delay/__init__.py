"""The delay store: messages held on disk until a due time, at any horizon (docs/decisions/delayed-messages.md, QMQ's two-level wheel).

Modules, each with one job:

- :mod:`storage.delay.record`: the byte layouts (WAL/data record, index entry, dispatch-log entry);
- :mod:`storage.delay.wal`: the write-ahead log, its group-commit durability and its replay;
- :mod:`storage.delay.bucket`: one time bucket's files (``.data``, ``.idx``, ``.disp``) and counters;
- :mod:`storage.delay.manifest`: the checkpoint (bucket lengths, WAL position, next seq, dropped xrefs);
- :mod:`storage.delay.window`: the in-RAM window of soon-due index entries (pure, no I/O);
- :mod:`storage.delay.store`: :class:`DelayStore`, which ties them together.

Nothing here knows AMQP: a record carries opaque bytes and an integer exchange reference (``xref``).
"""

from storage.delay.record import DelayRecord, DueRecord, PendingEntry
from storage.delay.store import DelayStore, ExchangeStats

__all__ = ["DelayRecord", "DelayStore", "DueRecord", "ExchangeStats", "PendingEntry"]
