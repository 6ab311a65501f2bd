"""Everything storage/ keeps for one node, opened and closed in the order recovery needs.

Layout under ``data_dir``::

    metadata.sqlite         every durable definition of the node (MetadataStore): users, vhosts,
                            permissions, policies, parameters, exchanges, queues, bindings
    metadata.json.migrated  an older node's users/vhosts file, kept as a backup after its migration
    msg_store_persistent/   the persistent MsgStore
    msg_store_transient/    the transient MsgStore (emptied at every start)
    queues/<id>/            one QueueIndex per durable queue (<id> from queue_dir_name)
    queues_transient/<id>/  the paging area of non-durable queues (emptied at every start)
    streams/<vhost id>/     one StreamStore per vhost (storage/stream_store.py: the vhost's message log,
                            its streams' consume logs and their groups' pull logs)
    deduplication/          one DedupLog per durable deduplication cache of a queue or an exchange
                            (storage/deduplication_log.py)
    delayed/                the node's DelayStore: every x-delayed-message exchange's pending messages
                            (storage/delay/), opened by the first such exchange

Start: construct ``NodeStorage`` (it first checks that the metadata describes the message files, see
below; then the message store recovers), read the definitions from ``metadata``,
call :meth:`open_queue` for every durable queue and :meth:`open_stream` for every stream (each recovers its index and gives the store its
references back), then :meth:`finish_recovery` (drops messages nobody holds, deletes the directories
of queues that no longer exist). Stop: :meth:`close` (all queues hand their buffers to the kernel, one
sync, each writes its clean-shutdown terms, then the stores write their snapshots).

The metadata comes first. Recovery trusts it to list every durable queue, and :meth:`finish_recovery`
deletes the files of the queues it does not list; a metadata file that is missing, empty (0 bytes) or
without a single row next to queue directories or store segments would make every queue an orphan and
delete all messages. So before any file is touched, :func:`check_metadata_file` and the constructor
refuse such a directory with :class:`DataDirectoryError` (the caller decides what the operator may do:
restore the file, or wipe everything with :func:`reset_data_dir`), and a file SQLite cannot read is a
:class:`~storage.metadata_store.MetadataStoreError`. Every store gets a marker row when first opened
(``NODE_KIND``/``STORAGE_KEY``), so "no rows" never means "nothing declared yet".
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import weakref
from collections.abc import Callable, Collection
from typing import Any, Literal

from storage.background import WorkerThread
from storage.commits import Commits
from storage.data_dir_lock import LOCK_FILE
from storage.deduplication_log import DIRECTORY as DEDUP_DIRECTORY
from storage.deduplication_log import DedupLog, log_id, log_ids, remove_files
from storage.delay import DelayStore
from storage.metadata_store import Metadata, MetadataStore
from storage.msg_store import SUFFIX as SEGMENT_SUFFIX
from storage.msg_store import MsgStore
from storage.stream_log import StreamLog
from storage.stream_store import MLOG, StreamStore
from storage.syncer import Syncer
from storage.variable_queue import VariableQueue

log = logging.getLogger("leveret.storage")

METADATA_FILE = "metadata.sqlite"
# The row every metadata store gets when a NodeStorage first opens it.
NODE_KIND, STORAGE_KEY = "node", "storage"
STORAGE_FORMAT = 1

MetadataFileState = Literal["missing", "empty", "present"]


class DataDirectoryError(Exception):
    """The data directory holds message data its metadata no longer describes: starting would recover
    nothing and then delete it. The text names the metadata file and what was found; nothing was changed."""


def message_data(data_dir: str) -> list[str]:
    """What in ``data_dir`` holds queue contents: queue index directories and persistent store segments
    that are not empty (a new node's first segment is, until a message arrives), as paths relative to
    ``data_dir``, sorted."""
    found: list[str] = []
    queues = os.path.join(data_dir, "queues")
    if os.path.isdir(queues):
        found += [os.path.join("queues", d) for d in sorted(os.listdir(queues))
                  if os.path.isdir(os.path.join(queues, d))]
    store = os.path.join(data_dir, "msg_store_persistent")
    if os.path.isdir(store):
        found += [os.path.join("msg_store_persistent", n) for n in sorted(os.listdir(store))
                  if n.endswith(SEGMENT_SUFFIX) and os.path.getsize(os.path.join(store, n)) > 0]
    streams = os.path.join(data_dir, "streams")
    if os.path.isdir(streams):  # a vhost's stream store holds data once its message log has a byte
        for d in sorted(os.listdir(streams)):
            mdir = os.path.join(streams, d, "messages")
            if os.path.isdir(mdir) and any(n.endswith(MLOG) and os.path.getsize(os.path.join(mdir, n)) > 0
                                           for n in os.listdir(mdir)):
                found.append(os.path.join("streams", d))
    return found


def _describe(found: list[str]) -> str:
    queues = sum(1 for f in found if f.startswith("queues" + os.sep))
    segments = sum(1 for f in found if f.startswith("msg_store_persistent" + os.sep))
    parts = [f"{queues} queue director{'y' if queues == 1 else 'ies'} in queues/"] if queues else []
    streams = sum(1 for f in found if f.startswith("streams" + os.sep))
    parts += [f"{segments} segment file{'' if segments == 1 else 's'} in msg_store_persistent/"] if segments else []
    parts += [f"{streams} vhost stream store{'' if streams == 1 else 's'} in streams/"] if streams else []
    parts += [f for f in found if os.sep not in f]
    return ", ".join(parts)


def check_metadata_file(data_dir: str) -> MetadataFileState:
    """Whether ``metadata.sqlite`` is there, without opening it (SQLite would write to it). Missing or
    empty is fine for a new node, and a :class:`DataDirectoryError` when queue directories, store
    segments or the database's own write-ahead log (where a crash leaves the latest commits) exist."""
    path = os.path.join(data_dir, METADATA_FILE)
    if not os.path.exists(path):
        state: MetadataFileState = "missing"
    elif os.path.getsize(path) == 0:
        state = "empty"
    else:
        return "present"
    found = message_data(data_dir)
    wal = path + "-wal"
    if os.path.isfile(wal) and os.path.getsize(wal) > 0:
        found.append(METADATA_FILE + "-wal")
    if found:
        what = "missing" if state == "missing" else "empty (0 bytes)"
        raise DataDirectoryError(
            f"{path} is {what}, but {data_dir} holds {_describe(found)} that only it describes; refusing to "
            f"start, nothing was changed. Restore {METADATA_FILE} (with its -wal file if it had one) from a backup")
    return state


# Entries only a node's data directory has: --force-reset wipes a directory that holds one of them (or
# nothing), never one that holds none, such as a home directory given as --data-dir by mistake.
NODE_ENTRIES = (METADATA_FILE, "metadata.json", "metadata.json.migrated", "msg_store_persistent",
                "msg_store_transient", "queues", "streams", DEDUP_DIRECTORY)


def reset_data_dir(data_dir: str, keep: Collection[str] = ()) -> list[str]:
    """Wipe the node: delete everything in ``data_dir`` except the paths in ``keep`` (e.g. a log file
    that happens to live there). Returns the names deleted; the caller says so loudly. A non-empty
    directory without any of ``NODE_ENTRIES`` is refused with DataDirectoryError, untouched."""
    keep_real = {os.path.realpath(k) for k in keep}
    removed: list[str] = []
    if not os.path.isdir(data_dir):
        return removed
    names = [n for n in os.listdir(data_dir) if n != LOCK_FILE]  # the running broker's own lock stays
    if names and not any(n in NODE_ENTRIES for n in names):
        raise DataDirectoryError(f"{data_dir} does not look like a Leveret data directory (none of "
                                 f"{', '.join(NODE_ENTRIES)} is there); refusing to delete what it holds")
    for name in sorted(names):
        path = os.path.join(data_dir, name)
        if os.path.realpath(path) in keep_real:
            continue
        if any(k.startswith(os.path.realpath(path) + os.sep) for k in keep_real):
            continue  # a kept file lives below: leave the directory too
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        removed.append(name)
    return removed


def stream_vhost_dir_name(vhost: str) -> str:
    """The directory of a vhost's stream store: a digest, since vhost names may hold any character."""
    return hashlib.sha256(vhost.encode()).hexdigest()[:32]


def queue_dir_name(vhost: str, name: str) -> str:
    """A queue's directory name: a digest, since queue names may hold any character."""
    return hashlib.sha256(f"{vhost}\0{name}".encode()).hexdigest()[:32]


class NodeStorage:
    """Opens a node's stores in recovery order; refuses (``DataDirectoryError``, ``MetadataStoreError``)
    a directory whose metadata is missing, empty, unreadable or without rows next to message data,
    before touching any file. ``check_metadata(store)`` is the caller's own check of what it keeps
    beside the store, run before the message stores open (``store`` is None when the metadata file was
    missing or empty: a new node, the file not created yet); whatever it raises stops the
    construction the same way."""

    def __init__(self, data_dir: str, loop: asyncio.AbstractEventLoop | None = None, *,
                 queue_index_embed_msgs_below: int = 4096, file_size_limit: int = 16 << 20,
                 check_metadata: Callable[[MetadataStore | None], None] | None = None,
                 delay_max_ms: int = 2 * 365 * 24 * 3_600_000, delay_bucket_ms: int = 3_600_000) -> None:
        self.data_dir = data_dir
        # The horizon of delayed messages (config delayed_message.max_delay), read by the exchanges that hold them.
        self.delay_max_ms = delay_max_ms
        # The delay store's bucket length for a new store (config delayed_message.bucket_size); an existing
        # store keeps the length it was made with.
        self.delay_bucket_ms = delay_bucket_ms
        self._delay_store: DelayStore | None = None
        os.makedirs(data_dir, exist_ok=True)
        self.embed_below = queue_index_embed_msgs_below
        # SQLite; on a cluster member the split store broker/clustering/cluster.py puts here (either is a Metadata).
        # One group commit for the message files and the metadata's WAL (storage/metadata_store.py): a publish
        # confirmed into a queue declared a moment before is confirmed after the queue's row is on disk too.
        self.syncer = Syncer(loop)
        self._loop = loop
        sqlite_store = self._open_metadata(check_metadata_file(data_dir), check_metadata)
        # When the definitions written now are on disk (storage/commits.py): the node's replies wait for it.
        self.metadata_commits: Commits = sqlite_store
        self.metadata: Metadata = sqlite_store
        self.persistent = MsgStore(os.path.join(data_dir, "msg_store_persistent"), syncer=self.syncer,
                                   loop=loop, file_size_limit=file_size_limit)
        self.transient = MsgStore(os.path.join(data_dir, "msg_store_transient"), durable=False, loop=loop,
                                  file_size_limit=file_size_limit)
        shutil.rmtree(os.path.join(data_dir, "queues_transient"), ignore_errors=True)
        os.makedirs(os.path.join(data_dir, "queues"), exist_ok=True)
        # Weak: a deleted queue's backing queue goes away with its queue process.
        self._queues: weakref.WeakValueDictionary[str, VariableQueue] = weakref.WeakValueDictionary()
        self._stream_stores: dict[str, StreamStore] = {}  # by vhost, opened by the first open_stream
        # By log id; weak, as the queues: a deleted cache's log goes with its queue or exchange.
        self._dedup_logs: weakref.WeakValueDictionary[str, DedupLog] = weakref.WeakValueDictionary()
        self._recovering = True

    def _open_metadata(self, state: MetadataFileState,
                       check_metadata: Callable[[MetadataStore | None], None] | None) -> MetadataStore:
        path = os.path.join(self.data_dir, METADATA_FILE)
        if state != "present":
            if check_metadata is not None:
                check_metadata(None)  # before the file is created: a refused start leaves none behind
            store = MetadataStore(path, self._syncer_of_a_running_node())
        else:
            store = MetadataStore(path, self._syncer_of_a_running_node())
            try:
                store.check_integrity()
                found = message_data(self.data_dir) if store.was_empty else []
                if found:
                    raise DataDirectoryError(
                        f"{store.path} holds no definitions, but {self.data_dir} holds {_describe(found)} that "
                        f"only it describes; refusing to start, nothing was changed. Restore {METADATA_FILE} "
                        f"from a backup")
                if check_metadata is not None:
                    check_metadata(store)
            except BaseException:
                store.close()
                raise
        if store.get(NODE_KIND, STORAGE_KEY) is None:
            store.put(NODE_KIND, STORAGE_KEY, {"format": STORAGE_FORMAT})
        return store

    def _syncer_of_a_running_node(self) -> Syncer | None:
        """The syncer fsyncs the metadata's commits off the loop when there is a loop; without one (tools, unit
        tests) the store fsyncs each commit itself."""
        return self.syncer if self._loop is not None else None

    @property
    def was_clean(self) -> bool:
        """Whether the last stop was a clean one (the persistent store found its snapshot)."""
        return self.persistent.was_clean

    def open_queue(self, vhost: str, name: str, durable: bool, *, encode: Callable[[Any], bytes] | None = None,
                   decode: Callable[[bytes], Any] | None = None,
                   on_confirm: Callable[[], None] | None = None) -> VariableQueue:
        """The backing queue of a queue; a durable one comes back with the messages it had."""
        root = "queues" if durable else "queues_transient"
        path = os.path.join(self.data_dir, root, queue_dir_name(vhost, name))
        vq = VariableQueue(path, durable=durable, store=self.persistent, transient_store=self.transient,
                           syncer=self.syncer, encode=encode, decode=decode, embed_below=self.embed_below,
                           on_confirm=on_confirm)
        self._queues[path] = vq
        return vq

    def open_stream(self, vhost: str, name: str, *, max_segment_size_bytes: int) -> StreamLog:
        """A stream queue's log (storage/stream_store.py), with what it had; every stream of a vhost shares
        the vhost's message log and the node's syncer."""
        store = self._stream_stores.get(vhost)
        if store is None or store.closed:
            store = StreamStore(os.path.join(self.data_dir, "streams", stream_vhost_dir_name(vhost)), self.syncer,
                                recovering=self._recovering)
            self._stream_stores[vhost] = store
        return store.open_stream(name, max_segment_size_bytes=max_segment_size_bytes)

    def open_dedup_log(self, kind: str, vhost: str, name: str, *, fresh: bool,
                       replay: Callable[[bytes, int, bool], None]) -> DedupLog:
        """The durable log of a deduplication cache (``kind``: "queue" or "exchange"), its entries fed to
        ``replay`` oldest first (storage/deduplication_log.py); ``fresh`` for a cache just declared, whose name
        may have been used before."""
        ident = log_id(kind, vhost, name)
        dedup_log = DedupLog.open(os.path.join(self.data_dir, DEDUP_DIRECTORY), ident, self.syncer, fresh, replay)
        self._dedup_logs[ident] = dedup_log
        return dedup_log

    def open_delay_store(self, now_ms: Callable[[], int]) -> DelayStore:
        """The node's delay store (one for every delayed exchange of every vhost), opened on first use with
        ``now_ms`` as its clock; it recovers what it held, and :meth:`close` checkpoints and closes it."""
        store = self._delay_store
        if store is None or store.closed:
            # Its checkpoints write thousands of bucket files: on a thread of their own, off the loop.
            background = WorkerThread(self._loop, "leveret-delay-checkpoint") if self._loop is not None else None
            store = self._delay_store = DelayStore(os.path.join(self.data_dir, "delayed"), self.syncer, now_ms,
                                                   bucket_ms=self.delay_bucket_ms, background=background)
        return store

    def _finish_dedup_recovery(self) -> None:
        """Deduplication logs nobody opened belong to queues and exchanges that no longer exist."""
        directory = os.path.join(self.data_dir, DEDUP_DIRECTORY)
        gone = log_ids(directory) - set(self._dedup_logs)
        for ident in gone:
            remove_files(directory, ident)
        if gone:
            log.info("storage: removed the deduplication logs of %d queues or exchanges that no longer exist",
                     len(gone))

    def _finish_stream_recovery(self) -> None:
        """Streams (and whole vhost stream stores) nobody opened no longer exist: their files go."""
        self._recovering = False
        root = os.path.join(self.data_dir, "streams")
        opened = {os.path.basename(s.dir) for s in self._stream_stores.values()}
        if os.path.isdir(root):
            for d in os.listdir(root):
                if d not in opened:
                    shutil.rmtree(os.path.join(root, d), ignore_errors=True)
                    log.info("storage: removed the stream store of a vhost without streams (%s)", d)
        for store in self._stream_stores.values():
            gone = store.finish_recovery()
            if gone:
                log.info("storage: removed the files of %d streams that no longer exist", len(gone))

    def finish_recovery(self) -> None:
        """Every durable queue has been opened: forget whatever none of them holds, including the
        files of queues that no longer exist (after a clean start their messages still hold store
        references, which are released by recovering and deleting them). Safe only because the
        constructor refused metadata that lists nothing next to message data."""
        root = os.path.join(self.data_dir, "queues")
        orphans = [os.path.join(root, d) for d in os.listdir(root) if os.path.join(root, d) not in self._queues]
        dirty = self.persistent.recovering
        if dirty:  # nobody counted the orphans' references: the files can simply go
            for path in orphans:
                shutil.rmtree(path, ignore_errors=True)
        self.persistent.finish_recovery()
        if not dirty:
            for path in orphans:
                VariableQueue(path, durable=True, store=self.persistent, transient_store=self.transient,
                              syncer=self.syncer).delete_and_terminate()
        if orphans:
            log.info("storage: removed the files of %d queues that no longer exist", len(orphans))
        self._finish_stream_recovery()
        self._finish_dedup_recovery()

    def close(self) -> None:
        """Clean shutdown: after this the next start is a fast one. If something cannot be written (a
        full or failing disk), no clean-shutdown marker is left either: the next start scans and keeps
        exactly what reached the disk, which includes everything that was confirmed."""
        queues = [q for q in list(self._queues.values()) if not q.deleted]
        try:
            for q in queues:
                q.close_files()
            for store in self._stream_stores.values():
                store.close()
            for dedup_log in list(self._dedup_logs.values()):
                dedup_log.close()
            if self._delay_store is not None:
                self._delay_store.close()
            self.syncer.sync()
            for q in queues:
                q.write_terms()
            self.persistent.close()
        except OSError as e:
            log.error("storage: could not write everything at shutdown (%s); the next start recovers by "
                      "scanning the files", e)
            self.persistent.abandon()
        self._queues.clear()
        self._stream_stores.clear()
        self._dedup_logs.clear()
        self._delay_store = None
        self.transient.close()
        self.syncer.stop()
        self.metadata.close()
