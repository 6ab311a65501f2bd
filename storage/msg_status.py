"""The variable queue's per-message record (the seed's ``msg_status``) and its paged-out middle (``delta``).

A ready message is an *alpha* when ``msg`` holds it in RAM (q1, q4), a *beta* when only its position is in
RAM and its content is on disk (q2, q3; a *gamma* when its index entry is on disk too), and part of
*delta* when neither is in RAM. ``persist_to`` says where its content goes on disk: the shared message
store (``STORE``) or embedded in the queue index (``INDEX``, messages under the embed threshold).
"""

from __future__ import annotations

from typing import Any

STORE = "msg_store"
INDEX = "queue_index"


class MsgStatus:
    """One message (the seed's ``msg_status``). ``msg_props`` is flattened into ``size`` and ``expiry``
    (one object less per message); ``index_pos`` locates an embedded body in its index segment."""

    # The seed's fields, in its order (msg_props flattened into size and expiry), then index_pos.
    __slots__ = ("seq_id", "msg_id", "msg", "is_persistent", "is_delivered", "msg_in_store",  # noqa: RUF023
                 "index_on_disk", "persist_to", "size", "expiry", "index_pos")

    def __init__(self, seq_id: int, msg_id: int | None, msg: Any, is_persistent: bool, is_delivered: bool,
                 msg_in_store: bool, index_on_disk: bool, persist_to: str, size: int, expiry: int | None,
                 index_pos: int) -> None:
        self.seq_id = seq_id
        self.msg_id = msg_id
        self.msg = msg
        self.is_persistent = is_persistent
        self.is_delivered = is_delivered
        self.msg_in_store = msg_in_store
        self.index_on_disk = index_on_disk
        self.persist_to = persist_to
        self.size = size
        self.expiry = expiry
        self.index_pos = index_pos

    @property
    def msg_props(self) -> tuple[int, int | None]:
        return self.size, self.expiry

    def __repr__(self) -> str:
        return f"<MsgStatus {self.seq_id}{' alpha' if self.msg is not None else ''}>"


class Delta:
    """The paged-out middle: ``count`` ready messages with ``start <= seq_id < end`` (the range may also
    hold acked or pending-ack seq_ids, which loading skips)."""

    __slots__ = ("start", "end", "count")  # noqa: RUF023

    def __init__(self, start: int = 0, end: int = 0, count: int = 0) -> None:
        self.start = start
        self.end = end
        self.count = count

    def __repr__(self) -> str:
        return f"Delta({self.start}, {self.end}, {self.count})"
