"""The rate sampler behind the HTTP API's ``*_details.rate`` fields, and when each queue went idle
(``idle_since``). What it samples is walked by broker/management/presenters/sampling.py; the presenters
read the rates it keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.management.presenters.queue_figures import is_shared
from broker.queues.queue_types import Queue

if TYPE_CHECKING:
    from broker.clustering.cluster_figures import Snapshot
    from broker.queues.queue_shell import QueueStats
    from storage.backing_queue import Figures


class RateSampler:
    """Keeps the previous sample of every counter it is asked about; a rate is the change per second
    between the last two samples (taken every ``interval`` seconds by the app, the node's
    ``collect_statistics_interval``), as RabbitMQ's management agent works out ``*_details.rate``:
    ``(value now - value at the previous sample) / (seconds between the two samples)``.

    What is sampled: the node's message counters and object churn (key ``"global"``), each vhost's message
    totals (key ``("vhost", name)``), and per queue, connection, channel and exchange (key ``id(object)``)
    the counters its HTTP API object shows with a rate. Keys of objects gone are dropped at the next sample.
    A queue, connection or channel is kept as one tuple of its counters (:meth:`sample_object`), not an
    entry per counter: 10,000 idle connections with a channel held 1.9 KB each of per-counter entries."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._prev: dict[Any, tuple[float, int]] = {}
        self._rates: dict[Any, float] = {}
        # Queues, connections and channels: id(object) -> (time, the names sampled, their values) of the last
        # sample; the objects whose last two samples differed (they have rates in _rates), with their names.
        self._object_prev: dict[int, tuple[float, tuple[str, ...], tuple[int, ...]]] = {}
        self._moving: dict[int, tuple[str, ...]] = {}
        self.idle = IdleTracker()

    def observe(self, key: Any, value: int, now: float) -> None:
        prev = self._prev.get(key)
        if prev is not None and now > prev[0]:
            self._rates[key] = max(0.0, (value - prev[1]) / (now - prev[0]))
        self._prev[key] = (now, value)

    def rate(self, key: Any) -> float:
        return round(self._rates.get(key, 0.0), 1)

    def queue_rates(self, q: Queue) -> dict[str, float]:
        """The rates of one queue's sampled counters and counts (:data:`QUEUE_SAMPLED`), rounded as shown."""
        key = id(q)
        return {name: self.rate((key, name)) for name in QUEUE_SAMPLED}

    def forget_all_but(self, live: set[Any]) -> None:
        """Drop the samples and rates of every object not in ``live`` (ids of the objects sampled now, and the
        vhosts' keys): they are gone."""
        for key in [k for k in self._prev if k[0] != "global" and k[0] not in live]:
            self._prev.pop(key, None)
            self._rates.pop(key, None)
        for okey in [k for k in self._object_prev if k not in live]:
            del self._object_prev[okey]
            self._stop_moving(okey)
        self.idle.forget_all_but(live)

    def sample_queue(self, key: int, s: QueueStats, f: Figures, now: float) -> None:
        """One queue's sampled counters and counts (:data:`QUEUE_SAMPLED`)."""
        self.sample_object(key, QUEUE_SAMPLED, (s.published, s.delivered + s.get, s.delivered, s.get,
                                                s.redelivered, s.acked, f.ready, f.unacked, f.messages), now)

    def sample_object(self, key: int, names: tuple[str, ...], values: tuple[int, ...], now: float) -> None:
        """One object's sampled counters (``values``, by ``names``), kept as one tuple per object. An object
        whose counters did not move since the last sample costs one comparison: its rates are zero (absent),
        and only an object that moved writes rates. With 10,000 idle queues the per-counter way (eight
        dictionary entries written per queue every sample) was half of the idle broker's CPU. A sample of
        other ``names`` under the same key (an object gone, its id reused by another kind) starts afresh."""
        prev = self._object_prev.get(key)
        self._object_prev[key] = (now, names, values)
        if prev is None:
            return
        if prev[1] is not names:
            self._stop_moving(key)
            return
        if now <= prev[0]:
            return
        if values == prev[2]:
            self._stop_moving(key)
            return
        rates = self._rates
        dt = now - prev[0]
        for name, value, before in zip(names, values, prev[2], strict=True):
            rates[(key, name)] = max(0.0, (value - before) / dt)
        self._moving[key] = names

    def _stop_moving(self, key: int) -> None:
        names = self._moving.pop(key, None)
        if names is not None:
            for name in names:
                self._rates.pop((key, name), None)


# A shared queue's cluster-wide counters reach a member once a second (storage/pg/queue_stats.py) and its
# count is up to a second old (queue_figures.MAX_AGE): it is shown idle once they stayed the same this long.
SHARED_IDLE_AFTER = 3.0


class IdleTracker:
    """When each queue last did something, for the queue's ``idle_since``, worked out from counters the queue
    keeps anyway (nothing is added to its hot path): a queue whose activity figures (publishes, deliveries,
    gets, acks, redeliveries, dead-letterings, expiries, drops, its message and consumer counts) are the same
    as when they were last looked at (by the sampler every ``interval`` seconds, or by a request) has been idle
    since they were first seen with these values. ``idle_since`` is therefore late by at most the time between
    two looks, and a queue is first shown idle at the second look that finds it unchanged (RabbitMQ shows a
    queue idle once its process hibernates, after a second or so without work)."""

    def __init__(self) -> None:
        # id(queue) -> (the queue, its activity figures, when first seen with them). Holding the queue keeps
        # its id from being reused by a new queue until the sampler forgets a deleted one.
        self._seen: dict[int, tuple[Queue, tuple[int, ...], float]] = {}

    @staticmethod
    def activity(q: Queue, f: Figures | None = None, shared: Snapshot | None = None) -> tuple[int, ...]:
        """``f``: the queue's figures if the caller has them at hand (figures_of). A cluster member's shared
        queue is judged by the cluster's counters and counts (``shared``), so that a queue busy on another
        member does not show idle here; its consumers on this member count too."""
        if shared is not None and is_shared(q):
            c = shared.activity(q.vhost.name, q.name).counts
            n = shared.counts(q.vhost.name, q.name)
            return (c["publish"], c["deliver"], c["get"], c["ack"], c["redeliver"], n.ready, n.unacked,
                    q.consumers.count)
        s = q.stats
        if f is None:
            f = q.figures()
        return (s.published, s.delivered, s.get, s.acked, s.redelivered, s.dead_lettered, s.expired, s.dropped,
                f.ready, f.unacked, q.consumers.count)

    def observe(self, q: Queue, key: int, f: Figures | None = None,
                shared: Snapshot | None = None) -> float | None:
        """The wall-clock time (seconds since the epoch) the queue has been idle since, None if it did
        something since it was last looked at (or this is the first look); the arguments as :meth:`activity`'s."""
        figures = self.activity(q, f, shared)
        now = q.vhost.clock.now_ms() / 1000.0
        seen = self._seen.get(key)
        if seen is not None and seen[0] is q and seen[1] == figures:
            if shared is not None and now - seen[2] < SHARED_IDLE_AFTER and is_shared(q):
                return None  # the cluster's counters move once a second: unchanged this long says nothing yet
            return seen[2]
        self._seen[key] = (q, figures, now)
        return None

    def forget_all_but(self, live: set[Any]) -> None:
        for key in [k for k in self._seen if k not in live]:
            del self._seen[key]


def with_details(counts: dict[str, int], sampler: RateSampler | None, key: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": sampler.rate((key, name)) if sampler else 0.0}
    return out


# What the rate sampler keeps of each queue (RateSampler._sample_queue), in this order: the message_stats
# counters (queue_message_counts) and the message figures.
QUEUE_SAMPLED = ("publish", "deliver_get", "deliver", "get", "redeliver", "ack",
                 "messages_ready", "messages_unacknowledged", "messages")
