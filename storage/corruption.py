"""Where every store reports a record that failed its check on disk: one log line, one counter.

The policy every store follows (README, "Durability"): a record whose magic, length or CRC-32
(storage/checksum.py) does not check is **dropped and reported**, never delivered and never silently
skipped. The rest of its file, and of its queue or stream, is served as usual: a damaged record costs that
record, not the queue (refusing the whole queue would make every intact message unavailable for the sake of
one that is gone anyway, and NATS truncating a stream at its first bad block lost acknowledged messages that
were intact, nats-server #7549). The node's metadata is the exception: a damaged definitions database stops
the start (storage/metadata_store.py), because recovery trusts it to say which message files belong to whom:
damage SQLite reports, a page structure ``quick_check`` rejects, a row whose checksum fails, or a frame of its
write-ahead log that fails while committed frames follow it (storage/sqlite_wal.py).

Damage is told from a write that never landed by its shape, not its place: a record cut short at the end of a
file (fewer bytes than its header says, or zeros) is a torn write, never confirmed, cut with a warning and not
counted; a whole record that fails its check is damage, wherever it lies (a kill -9 keeps every byte written,
and a confirmed record was fsynced whole). A stream keeps a damaged entry's offset (reads skip it, the next
message gets a new offset), so an offset is never given to two messages. What no check can see: damage to the
last frame of SQLite's WAL (nothing after it tells it from a torn write: SQLite drops that one transaction).
Derived data is rebuilt rather than dropped: a delay bucket's ``.idx`` that fails the CRC its checkpoint recorded
is reported (at the first entry that differs) and rebuilt from ``.data`` (storage/delay/bucket.py).

:func:`report` writes one ``ERROR`` line naming the store, the file and the byte offset of the damage, and
counts it per store for Prometheus (``leveret_storage_corrupt_records_total{store=...}``, broker/prometheus/metrics.py).
The same damage is reported once per process however often the file is read again (a queue's segment is
re-read by every page-in): the key is ``(path, offset)``.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("leveret.storage")

# The stores a report names (the ``store`` label), fixed so that the family has every series from the start.
STORES = ("msg_store", "queue_index", "stream", "delay", "metadata", "other")

_lock = threading.Lock()  # reports come from the loop and from compaction/recovery worker threads
_counts: dict[str, int] = dict.fromkeys(STORES, 0)
_seen: set[tuple[str, int]] = set()


def store_of(path: str) -> str:
    """The store a file belongs to, from where it lies in the data directory (see storage/node_storage.py)."""
    p = path.replace("\\", "/")
    if "/msg_store_" in p:
        return "msg_store"
    if "/queues/" in p or "/queues_transient/" in p:
        return "queue_index"
    if "/streams/" in p:
        return "stream"
    if "/delayed/" in p:
        return "delay"
    if p.endswith((".sqlite", ".sqlite-wal")):
        return "metadata"
    return "other"


def report(path: str, offset: int, what: str, outcome: str = "dropped", store: str | None = None) -> bool:
    """Report damage at byte ``offset`` of ``path``: ``what`` failed, ``outcome`` is what became of it.
    Returns False (and logs nothing) when this damage was already reported by this process."""
    key = (path, offset)
    name = store or store_of(path)
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
        _counts[name] = _counts.get(name, 0) + 1
    log.error("storage: corrupt record in %s at offset %d (%s): %s; %s", path, offset, name, what, outcome)
    return True


def counts() -> dict[str, int]:
    """Corrupt records reported since the process started, per store."""
    with _lock:
        return dict(_counts)


def forget(path: str) -> None:
    """A file was deleted or rewritten: damage found in a later file of that name is new damage."""
    with _lock:
        for key in [k for k in _seen if k[0] == path]:
            _seen.discard(key)
