"""Everything storage/ keeps for one node, opened and closed in the order recovery needs.

Layout under ``data_dir``::

    metadata.sqlite         durable definitions (MetadataStore)
    msg_store_persistent/   the persistent MsgStore
    msg_store_transient/    the transient MsgStore (emptied at every start)
    queues/<id>/            one QueueIndex per durable queue (<id> from queue_dir_name)
    queues_transient/<id>/  the paging area of non-durable queues (emptied at every start)

Start: construct ``NodeStorage`` (the message store recovers), read the definitions from ``metadata``,
call :meth:`open_queue` for every durable queue (each recovers its index and gives the store its
references back), then :meth:`finish_recovery` (drops messages nobody holds, deletes the directories
of queues that no longer exist). Stop: :meth:`close` (all queues hand their buffers to the kernel, one
sync, each writes its clean-shutdown terms, then the stores write their snapshots).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import weakref
from collections.abc import Callable
from typing import Any

from storage.metadata_store import MetadataStore
from storage.msg_store import MsgStore
from storage.syncer import Syncer
from storage.variable_queue import VariableQueue

log = logging.getLogger("leveret.storage")


def queue_dir_name(vhost: str, name: str) -> str:
    """A queue's directory name: a digest, since queue names may hold any character."""
    return hashlib.sha256(f"{vhost}\0{name}".encode()).hexdigest()[:32]


class NodeStorage:
    def __init__(self, data_dir: str, loop: asyncio.AbstractEventLoop | None = None, *,
                 queue_index_embed_msgs_below: int = 4096, file_size_limit: int = 16 << 20) -> None:
        self.data_dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        self.embed_below = queue_index_embed_msgs_below
        self.syncer = Syncer(loop)
        self.metadata = MetadataStore(os.path.join(data_dir, "metadata.sqlite"))
        self.persistent = MsgStore(os.path.join(data_dir, "msg_store_persistent"), syncer=self.syncer,
                                   loop=loop, file_size_limit=file_size_limit)
        self.transient = MsgStore(os.path.join(data_dir, "msg_store_transient"), durable=False, loop=loop,
                                  file_size_limit=file_size_limit)
        shutil.rmtree(os.path.join(data_dir, "queues_transient"), ignore_errors=True)
        os.makedirs(os.path.join(data_dir, "queues"), exist_ok=True)
        # Weak: a deleted queue's backing queue goes away with its queue process.
        self._queues: weakref.WeakValueDictionary[str, VariableQueue] = weakref.WeakValueDictionary()

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

    def finish_recovery(self) -> None:
        """Every durable queue has been opened: forget whatever none of them holds, including the
        files of queues that no longer exist (after a clean start their messages still hold store
        references, which are released by recovering and deleting them)."""
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

    def close(self) -> None:
        """Clean shutdown: after this the next start is a fast one. If something cannot be written (a
        full or failing disk), no clean-shutdown marker is left either: the next start scans and keeps
        exactly what reached the disk, which includes everything that was confirmed."""
        queues = [q for q in list(self._queues.values()) if not q.deleted]
        try:
            for q in queues:
                q.close_files()
            self.syncer.sync()
            for q in queues:
                q.write_terms()
            self.persistent.close()
        except OSError as e:
            log.error("storage: could not write everything at shutdown (%s); the next start recovers by "
                      "scanning the files", e)
            self.persistent.abandon()
        self._queues.clear()
        self.transient.close()
        self.syncer.stop()
        self.metadata.close()
