"""A channel's frames, handled in the order they came, with a paused state.

AMQP 0-9-1 answers a channel's methods in the order they came, and a client that pipelines relies on it (RabbitMQ's
channel process takes its mailbox in order). Some replies cannot be given at once in a cluster (a quorum queue's
basic.get waits for a round in PostgreSQL, a declare of another member's queue for that member's answer, a
definition's reply for its commit): the channel answers them from a callback, the event loop serving everyone
else meanwhile, and its later frames must wait until then.

So each channel's frames pass through a :class:`MethodPipeline`, in the manner of h11's ``PAUSED`` state and
uvicorn's ``FlowControl``:

- **running** (``backlog is None``): the reader handles a frame as it comes; the only cost is that one test;
- **paused** (:meth:`pause`, when a method defers its reply): frames the reader reads for the channel go to the
  backlog, in order, untouched (:meth:`add`); above :data:`HOLD_MAX` of them the connection's socket is not
  read meanwhile (credit flow, as RabbitMQ's reader blocks on a busy channel);
- **draining** (:meth:`resume`, the deferred reply sent): from the next loop turn the backlog is handed back to
  the reader, frame by frame, through the very dispatch live frames take (``dispatch``), :data:`DRAIN_PER_TURN`
  per turn; new frames still join the backlog's end, so none overtakes another; a drained frame that defers its
  reply pauses the pipeline again; an empty backlog makes it running again.

The channel.close and access.request that the reader answers itself wait in the backlog like any frame. A channel
that closes drops its backlog (:meth:`clear`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

HOLD_MAX = 10_000  # frames in one channel's backlog above which the connection's socket is not read meanwhile
DRAIN_PER_TURN = 500  # backlog frames handed back per event-loop turn once the deferred reply is sent


class SocketFlow(Protocol):
    """The connection's reading, which a long backlog pauses (broker/amqp/reader.py's Reader)."""

    def pause_for(self, reason: object) -> None: ...

    def resume_for(self, reason: object) -> None: ...


class MethodPipeline:
    """One channel's frames in order (see the module). ``dispatch(frame_type, payload)`` handles a frame as the
    reader does a live one, errors included (it does not raise); ``mid_content()`` says whether a publish's content
    is being received (a turn never ends between a publish's frames); ``closed()`` whether the channel has gone."""

    __slots__ = (
        "_closed",
        "_dispatch",
        "_drain_scheduled",
        "_flow",
        "_mid_content",
        "_socket_paused",
        "backlog",
        "paused",
    )

    def __init__(self, dispatch: Callable[[int, Any], None], flow: SocketFlow, mid_content: Callable[[], bool],
                 closed: Callable[[], bool]) -> None:
        self.backlog: deque[tuple[int, Any]] | None = None  # None: running
        self.paused = False  # a reply is deferred: nothing of the backlog is handled until resume()
        self._dispatch = dispatch
        self._flow = flow
        self._mid_content = mid_content
        self._closed = closed
        self._drain_scheduled = False
        self._socket_paused = False

    def pause(self) -> None:
        """A method deferred its reply (its callback runs later, never before the method returns)."""
        self.paused = True
        if self.backlog is None:
            self.backlog = deque()

    def add(self, frame_type: int, payload: Any) -> None:
        """A frame the reader read while ``backlog`` is not None: it waits its turn."""
        backlog = self.backlog
        assert backlog is not None, "a frame added to a running pipeline"
        backlog.append((frame_type, payload))
        if len(backlog) > HOLD_MAX and not self._socket_paused:
            self._socket_paused = True
            self._flow.pause_for(self)

    def resume(self) -> None:
        """The deferred reply is sent: the backlog is handled from the next turn on. (A method handled again
        right after, which defers again, pauses the pipeline before that turn: nothing is handled then.)"""
        self.paused = False
        if self.backlog is not None:
            self._schedule_drain()

    def frames(self) -> Iterator[tuple[int, Any]]:
        """The frames waiting, oldest first."""
        return iter(self.backlog or ())

    def clear(self) -> None:
        """The channel has closed: its backlog is dropped and the socket read again."""
        self.paused = False
        if self.backlog is not None:
            self.backlog.clear()
            self._release()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        backlog = self.backlog
        if backlog is None or self._closed():
            return
        handled = 0
        while backlog and not self.paused:
            if handled >= DRAIN_PER_TURN and not self._mid_content():
                self._schedule_drain()
                break
            frame_type, payload = backlog.popleft()
            handled += 1
            self._dispatch(frame_type, payload)
            if self._closed():
                return
        if self._socket_paused and len(backlog) <= HOLD_MAX // 2:
            self._socket_paused = False
            self._flow.resume_for(self)
        if not backlog and not self.paused:
            self._release()

    def _release(self) -> None:
        self.backlog = None
        if self._socket_paused:
            self._socket_paused = False
            self._flow.resume_for(self)
