"""Credit flow towards publishers: the marks, and the set of publishers' readers a queue has paused.

RabbitMQ's reader publishes to a queue process only while it holds credit the queue grants back as it gets
through its work (``credit_flow``); a queue that falls behind stops granting, and the publishing connection's
reader blocks ("flow" in the management UI). Here the publish path calls the queue directly, so the queue
answers the same question after each publish (``overloaded``: broker/queues/delegate.py) and, when it is
behind, pauses the publisher's socket reading (:class:`PublisherFlow`) until it has caught up to the low mark.
What "behind" means is the queue type's own (the classic queue's store and deliver loop, the stream's fsync and
its readers' lag, the cluster's uncommitted forwards): the marks below are shared, the judgement is not.
"""

from __future__ import annotations

from typing import Any, Protocol

# Publishes accepted and waiting for the fsync (or commit) that covers them: over the high mark the queue pauses
# its publishers, and lets them go again once the backlog is down to the low mark.
FLOW_HIGH = 4000
FLOW_LOW = 1000
# While consumers have room but the deliver loop is this far behind, the publishers wait (RabbitMQ's queue
# process is then "busy" and grants no credit), so that a publisher that can outrun the consumers does not
# starve them by filling the queue instead.
DELIVER_BACKLOG_HIGH = 2000
DELIVER_BACKLOG_LOW = 500


class Pausable(Protocol):
    """A publisher's reader (broker/amqp/reader.py): it stops reading its socket while any reason holds it."""

    def pause_for(self, reason: object) -> None: ...

    def resume_for(self, reason: object) -> None: ...


class PublisherFlow(set[Any]):
    """The readers one queue (or the forwarding to other members) has paused, each paused once for that owner
    and all let go together. A set, so that the checks on the publish and deliver paths (``if flow:``) cost
    what a plain set's do."""

    __slots__ = ("_owner",)

    def __init__(self, owner: object) -> None:
        super().__init__()
        self._owner = owner

    def pause(self, reader: Pausable) -> None:
        """Stop reading ``reader``'s socket for this owner (once, however often it is asked)."""
        if reader not in self:
            self.add(reader)
            reader.pause_for(self._owner)

    def release(self) -> None:
        """Let every paused reader go (each resumes unless something else still holds it: an alarm, a turn)."""
        owner = self._owner
        for reader in self:
            reader.resume_for(owner)
        self.clear()
