"""Stream queues (RabbitMQ's ``rabbit_stream_queue`` over AMQP 0-9-1): an append-only log read from any offset,
and, Leveret's own, consumer groups that compete for one stream's messages (QMQ's pull log, seed 001).

The queue keeps nothing but its log (storage/stream_log.py's StreamLog: the file store, or the in-memory one
on a node without storage) and, per consumer, where it reads. What users get, as RabbitMQ answers (texts
checked against RabbitMQ 3.10.8):

- **Publishing** appends the broker's encoded message (broker/queues/message_codec.py's format) to the log, whatever
  its delivery mode: a stream keeps everything. A publisher confirm waits for the fsync that covers the
  message (``StreamLog.on_durable``); a failed write or fsync nacks it (``on_durable_failed``). Many publishes
  awaiting their fsync stop the publisher's socket (credit flow, as the classic queue does).
- **Consuming** needs manual acks (``no_ack`` → 540) and a per-consumer prefetch (basic.qos global=false; none
  → 406), which is the consumer's credit: acks only give credit back, reading never removes anything.
  A channel-wide (global) prefetch is refused with 406 (RabbitMQ 3.10 tolerates it beside a per-consumer one;
  later versions refuse it). ``x-stream-offset`` says where to start: ``first``, ``last`` (the last message),
  ``next`` (the default), a numeric offset (clamped to what is retained), an AMQP timestamp (POSIX seconds)
  or an interval back from now ("1D", "12h"; x-max-age's units). Each delivery carries the header
  ``x-stream-offset`` (long), spliced into the raw content header once, at append, with the offset the
  message gets (broker/queues/stream_record.py: a delivery is three slices of the stored record, nothing
  decoded). basic.get, queue.purge, and basic.nack / basic.reject by a consumer still subscribed, answer 540
  NOT_IMPLEMENTED as RabbitMQ's streams do.
  While the vhost traces (broker/observability/trace.py), each ack, plain or a group's, is an ``ack.<stream>``
  event as for a classic queue: the acked messages are read back from the log for it, only then.
- **Filtering** follows RabbitMQ 3.13's stream filtering: a publish header ``x-stream-filter-value`` is kept
  with its segment (the store's filter summary), and a consumer's ``x-stream-filter`` (a string or a list of them)
  lets the read skip chunks that cannot hold those values. The broker does not check each message: a
  consumer may receive messages with other values (or none), and must check ``x-stream-filter-value`` itself,
  as RabbitMQ's documentation asks of its clients. (``x-stream-match-unfiltered`` is not offered.)
- **Retention** (``x-max-length-bytes``, ``x-max-age``, or the policy keys ``max-length-bytes``, ``max-age``)
  removes whole segments, oldest first, never the one being written (``StreamLog.retain``): after an append
  that started a new segment, and every :data:`RETENTION_INTERVAL` seconds on the vhost's clock.
- **Consumer groups** (Leveret only): consumers with the same ``x-stream-group`` name on a stream compete for
  its messages, work-queue style, without partitions. The group's GroupLog (the pull log) records what was
  pulled and acked; a member pulls from the group's cursor. Deliveries a member leaves unsettled come back
  to the other members with ``redelivered=true`` when its channel closes (connection close or loss,
  channel close) or when it nacks / rejects with requeue; a reject without requeue settles the message for
  the group, like an ack. A basic.cancel alone does not hand them over: AMQP 0-9-1 lets the channel still
  ack what it received, so they move on once the channel settles them or closes. After a restart the group's
  outstanding offsets (pulled, never acked) are delivered first, redelivered. A new group starts at the
  member's ``x-stream-offset`` (default ``next``); a group member's ``x-stream-filter`` is ignored (a group
  pulls every offset, so that its committed offset can advance).

Delivery is the classic queue's pull loop (:meth:`StreamQueue.run_message_queue`, scheduled with
``call_soon``, never a task per message): each turn reads, per consumer with credit, a batch bounded by its
credit, round-robin from the consumer after the one served last (a group member's batch is its share of
what the group has ready), and yields to the loop after :data:`DELIVERY_BUDGET` deliveries. Publishing and
delivering share that loop: while consumers with credit lag far behind (:meth:`StreamQueue.overloaded`),
publishers' sockets are paused until delivery catches up or has sent a batch more; a publisher let go while
a consumer still lags (a replay of a long stream) then publishes :data:`REPLAY_PUBLISH_SHARE` messages before
it can be paused again, so that a replay and its publishers split the loop two to one instead of the
publisher getting one socket read per batch delivered.

A delivery's ``seq_id`` (what the channel hands back on ack) packs the offset, the group and the consumer:
``offset << 40 | group << 20 | consumer``, so a settle finds its group even after the consumer has gone.
"""

from __future__ import annotations

import datetime
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from broker.errors import AMQPError
from broker.message import Message
from broker.queues.confirm_book import OffsetConfirmBook
from broker.queues.credit_flow import DELIVER_BACKLOG_HIGH, DELIVER_BACKLOG_LOW, FLOW_HIGH, FLOW_LOW, Pausable
from broker.queues.queue_args import QueueSettings, parse_duration, refuse_unless_lasting
from broker.queues.queue_consumers import Consumer, ConsumerSet
from broker.queues.queue_info import STREAM, ConsumerGroups, QueueCapabilities
from broker.queues.queue_shell import (
    ACCEPTED,
    CONFIRM_LATER,
    DELIVERY_BUDGET,
    QueueHost,
    QueueOwner,
    QueueShell,
)
from broker.queues.stream_record import delivered_message, encode_record, wire_parts
from protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from storage.backing_queue import Figures
from storage.stream_log import GroupLog, StreamLog, StreamRecord
from storage.stream_memory import MemoryStreamLog

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.clock import TimerHandle

# A segment's size when x-stream-max-segment-size-bytes is not given (RabbitMQ's default, 500 MB).
DEFAULT_SEGMENT_SIZE = 500_000_000
# Seconds between two retention passes (besides the one after an append that starts a segment).
RETENTION_INTERVAL = 30.0
# Records read from the log at once for one consumer (its credit bounds it too).
READ_BATCH = 128
# seq_id packing: offset << OFFSET_SHIFT | group index << GROUP_SHIFT | consumer serial.
GROUP_SHIFT = 20
OFFSET_SHIFT = 40
_SERIAL_MASK = (1 << GROUP_SHIFT) - 1
_GROUP_MASK = (1 << (OFFSET_SHIFT - GROUP_SHIFT)) - 1
FILTER_HEADER = b"x-stream-filter-value"
# Publishes a publisher let go under lag may make before the lag can pause it again: half of the deliveries
# that let it go (DELIVER_BACKLOG_HIGH). Delivery keeps two thirds of the loop, so a replaying consumer still
# catches up with a publisher as fast as itself (S9: the publisher had 0.05× RabbitMQ's rate with one socket
# read per DELIVER_BACKLOG_HIGH deliveries).
REPLAY_PUBLISH_SHARE = DELIVER_BACKLOG_HIGH // 2


@runtime_checkable
class StreamOpener(Protocol):
    """What the node's storage offers streams (broker/persistence.py's BackingQueueFactory): opening a stream's
    log (a durable one comes back as it was). Its payloads are broker/queues/stream_record.py's records (those of
    an earlier form, message_codec.py's msgpack messages, still read)."""

    def open_stream(self, name: str, max_segment_size_bytes: int) -> StreamLog: ...


def _where(vhost: QueueHost, name: str) -> str:
    return f"queue '{name}' in vhost '{vhost.name}'"


def _text(value: Any) -> Any:
    return bytes(value).decode(errors="replace") if isinstance(value, (bytes, bytearray)) else value


class _Group:
    """A consumer group as the running queue sees it: its pull log, its members, and the offsets to hand out
    again (redelivered) before pulling new ones."""

    __slots__ = ("index", "log", "members", "redeliver")

    def __init__(self, index: int, log: GroupLog) -> None:
        self.index = index
        self.log = log
        self.members = 0
        # Pulled but never acked before a restart, then whatever a departed member left unsettled.
        self.redeliver: deque[int] = deque(log.outstanding())


class _Reader:
    """One consumer's place in the stream (its next offset), its filter, its group."""

    __slots__ = ("consumer", "filter", "group", "position", "serial")

    def __init__(self, consumer: Consumer, serial: int, position: int, filter_values: frozenset[str] | None,
                 group: _Group | None) -> None:
        self.consumer = consumer
        self.serial = serial
        self.position = position
        self.filter = filter_values
        self.group = group


def _filter_value(msg: Message) -> str | None:
    """A message's ``x-stream-filter-value`` header, kept per segment by the log (None: none, or not a string)."""
    if FILTER_HEADER not in msg.header:  # cheap test on the raw properties before decoding the headers
        return None
    value = _text(msg.headers.get("x-stream-filter-value"))
    return value if isinstance(value, str) else None


class StreamQueue(QueueShell):
    """A stream: the members of broker/queues/queue_types.py's Queue over a StreamLog (see the module docstring)."""

    type_name: ClassVar[str] = "stream"
    capabilities: ClassVar[QueueCapabilities] = STREAM  # (broker/queues/queue_info.py)
    confirms: OffsetConfirmBook  # (offset, token) in offset order

    def __init__(self, vhost: QueueHost, name: str, arguments: dict[str, Any], settings: QueueSettings,
                 log: StreamLog) -> None:
        super().__init__(vhost, name, True, None, False, arguments, settings, ConsumerSet(), OffsetConfirmBook())
        self.log = log
        log.on_durable = self.on_durable
        log.on_durable_failed = self.on_durable_failed
        # Every offset below this is durable (what the log recovered, then on_durable's last word). Consumers
        # read only below it: a record a crash could still take away (and a later publish reuse the offset of)
        # is never handed out.
        self._durable_below = log.next_offset
        self._readers: dict[int, _Reader] = {}  # consumer serial → reader
        self._by_consumer: dict[Consumer, _Reader] = {}
        self._next_serial = 1
        self._groups: dict[str, _Group] = {}
        self._group_by_index: dict[int, _Group] = {}
        # Round-robin: the position (in _readers' order) the next deliver turn starts from.
        self._turn = 0
        # Credit flow towards consumers: the lowest place among consumers with credit after a deliver turn
        # that spent its whole budget (None: delivery has caught up), and what was delivered since the
        # publishers were stopped.
        self._lag_from: int | None = None
        self._delivered_while_throttled = 0
        # Publishes that end below this offset are not paused by the lag (REPLAY_PUBLISH_SHARE): a bound on the
        # log's offsets, so the publish path keeps no count of its own.
        self._lag_pause_from = 0
        self._retention_timer: TimerHandle | None = None
        self._retains = False  # whether retention limits apply (kept by _arm_retention)
        self._arm_retention()

    # -- settings (policies) -----------------------------------------------------------------------------
    def apply_settings(self, settings: QueueSettings) -> None:
        """A policy changed: new retention limits apply at once (the segment size is fixed at creation)."""
        settings.queue_type = self.settings.queue_type
        settings.max_segment_size_bytes = self.settings.max_segment_size_bytes
        self.settings = settings
        self._arm_retention()
        self.retain()

    # -- retention ------------------------------------------------------------------------------------------
    @property
    def _has_retention(self) -> bool:
        return self.settings.max_length_bytes is not None or self.settings.max_age_ms is not None

    def _arm_retention(self) -> None:
        self._retains = self._has_retention  # read once per append (deliver_or_enqueue)
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        if self._has_retention and not self.deleted:
            self._retention_timer = self._clock.call_later(RETENTION_INTERVAL, self._retention_fired)

    def _retention_fired(self) -> None:
        self._retention_timer = None
        self.retain()
        self._arm_retention()

    def retain(self) -> int:
        """Apply the stream's retention now (whole segments, oldest first); returns the segments removed."""
        if self.deleted or not self._has_retention:
            return 0
        s = self.settings
        return self.log.retain(s.max_length_bytes, s.max_age_ms, self._clock.now_ms())

    # -- publishing -------------------------------------------------------------------------------------
    def deliver_or_enqueue(self, msg: Message, persistent: bool, confirm: Any = None) -> int:
        """Append the message; its confirm (if the publisher wants one) waits for the fsync covering it."""
        self.stats.published += 1
        log = self.log
        filter_value = _filter_value(msg)
        offset = log.next_offset
        retains = self._retains
        segments = log.segment_count if retains else 0
        stored = log.append(encode_record(msg, offset), int(msg.published_at or self._clock.now_ms()), filter_value)
        if retains and log.segment_count > segments:
            self.retain()  # a new segment was started: the oldest may go now
        assert stored == offset, "a stream log numbers its records in order"
        if confirm is None or stored < self._durable_below:
            return ACCEPTED
        self.confirms.append((stored, confirm))
        return CONFIRM_LATER

    def deliver_or_enqueue_run(self, msgs: list[Message], persistent: bool, publisher: Any, first_seq: int
                               ) -> list[int]:
        """A run of messages alike in their filter value (a client's run of publishes with one content header,
        or the firehose's events of one turn: delegate.deliver_run): one append of all their records
        (``StreamLog.append_run``), each record with its own header, their confirms waiting for the fsync that
        covers them, as :meth:`deliver_or_enqueue` does for one."""
        n = len(msgs)
        self.stats.published += n
        log = self.log
        first = msgs[0]
        filter_value = _filter_value(first)  # alike in it: one filter value for the run
        offset = log.next_offset
        payloads = [encode_record(msg, offset + i) for i, msg in enumerate(msgs)]
        retains = self._retains
        segments = log.segment_count if retains else 0
        stored = log.append_run(payloads, int(first.published_at or self._clock.now_ms()), filter_value)
        if retains and log.segment_count > segments:
            self.retain()  # a new segment was started: the oldest may go now
        assert stored == offset, "a stream log numbers its records in order"
        if not first_seq:
            return [ACCEPTED] * n
        results = [ACCEPTED] * n
        durable_below = self._durable_below
        confirms = self.confirms
        for i in range(n):
            if stored + i >= durable_below:
                confirms.append((stored + i, (publisher, first_seq + i)))
                results[i] = CONFIRM_LATER
        return results

    def on_durable(self, below: int) -> None:
        """The log's fsync covered every offset below ``below``: confirm those publishes."""
        if below > self._durable_below:
            self._durable_below = below
            if self.consumers.count:
                self.schedule_run()  # consumers read only what is on disk: more is readable now
        self._settle_confirms(below, True)

    def on_durable_failed(self, below: int) -> None:
        """A write or fsync failed for offsets below ``below`` (not yet durable): nack those publishes."""
        self._settle_confirms(below, False)

    def _settle_confirms(self, below: int, stored: bool) -> None:
        self.confirms.settle_below(below, stored)
        if self.flow:
            self.maybe_release_publishers()

    @property
    def overloaded(self) -> bool:
        """Whether the publisher that just appended should wait (credit flow, as QueueProcess.overloaded):
        too many of the stream's publishes await their fsync, or consumers with credit lag more than
        :data:`DELIVER_BACKLOG_HIGH` behind what is readable while the deliver loop is busy (publishing and
        delivering share one event loop: a publisher that can outrun delivery would otherwise starve it),
        unless the publisher was let go under that lag and has not used its share of publishes yet.
        Consumers without credit, or none, never hold a publisher back."""
        if len(self.confirms) > FLOW_HIGH:
            return True
        lag_from = self._lag_from
        if lag_from is None or self._durable_below - lag_from <= DELIVER_BACKLOG_HIGH:
            return False
        if self.log.next_offset < self._lag_pause_from:
            return False  # let go under lag: its share of publishes first (REPLAY_PUBLISH_SHARE)
        self.schedule_run()  # the deliver loop is what releases the publisher again
        return True

    def maybe_release_publishers(self) -> None:
        """Let throttled publishers go once the fsync backlog is down to :data:`FLOW_LOW` and delivery has
        caught up to :data:`DELIVER_BACKLOG_LOW` (or nobody with credit lags) — or, so that a consumer
        replaying a long stream slows publishers down without stopping them, once the deliver loop has
        sent :data:`DELIVER_BACKLOG_HIGH` messages since they were stopped (then with
        :data:`REPLAY_PUBLISH_SHARE` publishes to make before the lag may stop them again)."""
        if len(self.confirms) > FLOW_LOW:
            return
        lag_from = self._lag_from
        if lag_from is not None and self._durable_below - lag_from > DELIVER_BACKLOG_LOW:
            if self._delivered_while_throttled < DELIVER_BACKLOG_HIGH:
                return
            # still lagging: the publishers' share of the loop
            self._lag_pause_from = self.log.next_offset + REPLAY_PUBLISH_SHARE
        self.release_publishers()

    def throttle(self, reader: Pausable) -> None:
        if not self.flow:
            self._delivered_while_throttled = 0  # (maybe_release_publishers' count starts now)
        self.flow.pause(reader)

    # -- consumers ----------------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """A basic.consume: RabbitMQ's stream checks (prefetch, manual ack, no global QoS), then its offset
        specification, filter and group."""
        where = _where(self.vhost, self.name)
        if not consumer.prefetch:
            raise AMQPError(PRECONDITION_FAILED, f"consumer prefetch count is not set for '{where}'")
        if consumer.no_ack:
            raise AMQPError(NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream queues {where}")
        if consumer.channel.global_prefetch:  # the channel's shared (global) prefetch
            raise AMQPError(PRECONDITION_FAILED, f"{where} does not support global qos")
        args = consumer.arguments
        position = self.start_offset(args.get("x-stream-offset", "next"))
        filter_values = self._filter_of(args.get("x-stream-filter"))
        group = None
        if "x-stream-group" in args:
            name = _text(args["x-stream-group"])
            if not isinstance(name, str) or not name:
                raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-stream-group' for {where}: a non-empty "
                                "string is expected")
            group = self._group(name, position)
            group.members += 1
            filter_values = None
        serial = self._next_serial
        self._next_serial = serial + 1 if serial < _SERIAL_MASK else 1
        reader = _Reader(consumer, serial, position, filter_values, group)
        self._readers[serial] = reader
        self._by_consumer[consumer] = reader
        self.consumers.add(consumer)
        if consumer.exclusive:
            self.exclusive_consumer = consumer
        self.schedule_run()

    def _group(self, name: str, start: int) -> _Group:
        group = self._groups.get(name)
        if group is None:
            index = len(self._groups) + 1
            if index > _GROUP_MASK:
                raise AMQPError(PRECONDITION_FAILED, f"too many consumer groups on {_where(self.vhost, self.name)}")
            group = self._groups[name] = self._group_by_index[index] = _Group(index, self.log.group(name, start))
        return group

    def start_offset(self, spec: Any) -> int:
        """Where ``x-stream-offset`` starts a consumer (406 for what is none of RabbitMQ's forms)."""
        log = self.log
        first, nxt = log.first_offset, log.next_offset
        spec = _text(spec)
        if isinstance(spec, bool):
            pass
        elif isinstance(spec, int):
            return max(first, min(spec, nxt))
        elif isinstance(spec, datetime.datetime):
            return log.offset_at(int(spec.timestamp() * 1000))
        elif spec == "first":
            return first
        elif spec == "last":
            return max(first, nxt - 1)
        elif spec == "next":
            return nxt
        elif isinstance(spec, str):
            interval = parse_duration(spec)
            if interval is not None:
                return log.offset_at(int(self._clock.now_ms()) - interval)
        raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for {_where(self.vhost, self.name)}: "
                        f"{spec!r} is not first, last, next, an offset, a timestamp or an interval")

    def _filter_of(self, value: Any) -> frozenset[str] | None:
        if value is None:
            return None
        values = value if isinstance(value, (list, tuple)) else [value]
        texts = [_text(v) for v in values]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-stream-filter' for "
                            f"{_where(self.vhost, self.name)}: a string or an array of strings is expected")
        return frozenset(texts)

    def remove_consumer(self, consumer: Consumer) -> None:
        """The consumer went (cancel, channel or connection closed). What it holds unacked stays with its
        channel, which acks it or hands it back (requeue) when it closes."""
        reader = self._by_consumer.pop(consumer, None)
        self.consumers.remove(consumer)
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None
        if reader is None:
            return
        self._readers.pop(reader.serial, None)
        if reader.group is not None:
            reader.group.members -= 1
        if self._lag_from is not None:
            self._lag_from = self._slowest_with_credit()
        if self.flow:
            self.maybe_release_publishers()

    # -- delivering --------------------------------------------------------------------------------------
    def run_message_queue(self) -> None:
        """One turn of delivery: each consumer with credit gets a batch read from its place (or its group's),
        round-robin from the one after the consumer served last, until nobody can take more or the budget is
        spent. A group member's batch is its share of what the group has to hand out, so that members with
        credit take turns even when little is readable (as a classic queue's consumers do)."""
        self._run_scheduled = False
        if self.deleted:
            return
        readers = list(self._readers.values())
        count = len(readers)
        start = self._turn % count if count else 0
        if start:
            readers = readers[start:] + readers[:start]
        budget = DELIVERY_BUDGET
        progress = True
        while budget > 0 and progress:
            progress = False
            shares = self._group_shares(readers) if self._groups else None
            for i, reader in enumerate(readers):
                consumer = reader.consumer
                if not consumer.has_room():
                    continue
                credit = min(consumer.prefetch - consumer.unacked, budget, READ_BATCH)
                if credit <= 0:
                    continue
                group = reader.group
                if group is not None:
                    sent = self._deliver_group(reader, min(credit, shares[group]) if shares else credit)
                else:
                    sent = self._deliver_own(reader, credit)
                if sent:
                    progress = True
                    budget -= sent
                    self._turn = start + i + 1
                    if budget <= 0:
                        break
        self._delivered_while_throttled += DELIVERY_BUDGET - budget
        if budget <= 0:
            self.schedule_run()
            self._lag_from = self._slowest_with_credit()
        else:
            self._lag_from = None  # everyone with credit has all there is: delivery does not lag
        if self.flow:
            self.maybe_release_publishers()

    def _group_shares(self, readers: list[_Reader]) -> dict[_Group, int]:
        """Per group, the most one member with credit takes this pass: what the group has to hand out,
        split evenly among its members with credit (at least one each)."""
        ready: dict[_Group, int] = {}
        for reader in readers:
            group = reader.group
            if group is not None and reader.consumer.has_room():
                ready[group] = ready.get(group, 0) + 1
        readable = self._durable_below
        shares: dict[_Group, int] = {}
        for group, members in ready.items():
            pending = len(group.redeliver) + max(0, readable - group.log.cursor)
            shares[group] = max(1, -(-pending // members))
        return shares

    def _slowest_with_credit(self) -> int | None:
        """The lowest place (a reader's, or its group's cursor) among consumers with credit; None if none."""
        slowest: int | None = None
        for reader in self._readers.values():
            consumer = reader.consumer
            if consumer.has_room() and consumer.prefetch > consumer.unacked:
                place = reader.group.log.cursor if reader.group is not None else reader.position
                if slowest is None or place < slowest:
                    slowest = place
        return slowest

    def _deliver_own(self, reader: _Reader, credit: int) -> int:
        log = self.log
        readable = self._durable_below
        if reader.position >= readable:
            return 0
        records = log.read(reader.position, min(credit, readable - reader.position), reader.filter)
        if records and records[-1].offset >= readable:  # a filtered read may skip ahead past the readable end
            records = [r for r in records if r.offset < readable]
        if not records:
            reader.position = readable  # a filtered read found nothing more
            return 0
        reader.position = records[-1].offset + 1
        self._send(reader, records, False)
        return len(records)

    def _deliver_group(self, reader: _Reader, credit: int) -> int:
        group = reader.group
        assert group is not None
        log = self.log
        sent = 0
        again: list[StreamRecord] = []
        while group.redeliver and len(again) < credit:
            offset = group.redeliver.popleft()
            got = log.read(offset, 1)
            if got and got[0].offset == offset:
                again.append(got[0])
            # else retention removed it: nothing left to deliver
        if again:
            self._send(reader, again, True)
            sent = len(again)
        credit -= sent
        readable = self._durable_below
        if credit > 0 and group.log.cursor < readable:
            records = log.read(group.log.cursor, min(credit, readable - group.log.cursor))
            if records:
                group.log.pulled([r.offset for r in records])
                self._send(reader, records, False)
                sent += len(records)
        return sent

    def _send(self, reader: _Reader, records: list[StreamRecord], redelivered: bool) -> None:
        consumer = reader.consumer
        channel = consumer.channel
        tail = (reader.group.index << GROUP_SHIFT if reader.group is not None else 0) | reader.serial
        stats = self.stats
        stats.delivered += len(records)
        if redelivered:
            stats.redelivered += len(records)
        deliver = channel.deliver_parts
        tracer = self.vhost.tracing
        untraced = b"" if tracer is None else tracer.names_prefix
        for record in records:
            parts = wire_parts(record.payload)
            # Raw slices unless the firehose wants a Message — not for a trace event it would skip (a trace
            # stream read while tracing: building one per delivery was a tenth of the broker's CPU) — or the
            # record is of the earlier format.
            if parts is not None and (tracer is None or parts[0].startswith(untraced)):
                deliver(consumer, self, record.offset << OFFSET_SHIFT | tail, *parts, redelivered)
            else:
                channel.deliver(consumer, self, record.offset << OFFSET_SHIFT | tail, self._as_delivered(record),
                                redelivered)

    # -- settling ----------------------------------------------------------------------------------------
    def _by_group(self, seq_ids: list[int]) -> dict[_Group, list[int]]:
        out: dict[_Group, list[int]] = {}
        for seq_id in seq_ids:
            group = self._group_by_index.get(seq_id >> GROUP_SHIFT & _GROUP_MASK)
            if group is not None:
                out.setdefault(group, []).append(seq_id >> OFFSET_SHIFT)
        return out

    def ack(self, seq_ids: list[int]) -> None:
        """Acks give the consumer credit (the channel counts it); a group's acks advance its committed offset."""
        if self.deleted:
            return
        self.stats.acked += len(seq_ids)
        if self._groups:
            for group, offsets in self._by_group(seq_ids).items():
                group.log.acked(offsets)
        tracer = self.vhost.tracing
        if tracer is not None:  # as QueueProcess.ack: the queue has the messages (read back only while tracing)
            tracer.acked(self.name, self._traced_at([seq_id >> OFFSET_SHIFT for seq_id in seq_ids],
                                                    tracer.names_prefix))

    def _traced_at(self, offsets: list[int], untraced: bytes) -> list[Message]:
        """The messages at these offsets as they were delivered (with their ``x-stream-offset`` header), but
        those whose wire names begin with ``untraced`` (the firehose's own events, left undecoded) and those
        retention has removed since. A run of consecutive offsets (a multiple ack) is one read of the log:
        a trace stream's reader acks thousands at a time, and a read per offset was half the broker's CPU
        while it read."""
        out: list[Message] = []
        for first, count in _runs(offsets):
            for record in self.log.read(first, count):
                if record.offset >= first + count:
                    break
                parts = wire_parts(record.payload)
                if parts is None or not parts[0].startswith(untraced):
                    out.append(self._as_delivered(record))
        return out

    @staticmethod
    def _as_delivered(record: StreamRecord) -> Message:
        """The stored message as delivered (its ``x-stream-offset`` header was spliced in at append: a
        publisher's own ``x-stream-offset`` is overwritten; broker/queues/stream_record.py)."""
        return delivered_message(record.payload, record.offset, record.timestamp_ms)

    def requeue(self, seq_ids: list[int]) -> None:
        """A nack / reject with requeue, or the channel closed with these unacked: a group hands them to its
        other members (redelivered); a plain consumer that is still subscribed gets RabbitMQ's 540."""
        if self.deleted:
            return
        self._refuse_settle_by_subscribed(seq_ids)
        for group, offsets in self._by_group(seq_ids).items():
            group.redeliver.extend(sorted(offsets))
        self.schedule_run()

    def reject_discard(self, seq_ids: list[int]) -> None:
        """A nack / reject without requeue: settled for a group (like an ack); 540 for a plain consumer."""
        if self.deleted:
            return
        self._refuse_settle_by_subscribed(seq_ids)
        for group, offsets in self._by_group(seq_ids).items():
            group.log.acked(offsets)

    def _refuse_settle_by_subscribed(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            reader = self._readers.get(seq_id & _SERIAL_MASK)
            if reader is not None and reader.group is None:
                raise AMQPError(NOT_IMPLEMENTED, "basic.nack and basic.reject not supported by stream queues "
                                f"{_where(self.vhost, self.name)}")

    # -- what RabbitMQ's streams do not offer -----------------------------------------------------------------
    def basic_get(self, no_ack: bool) -> tuple[int, Message, bool, int] | None:
        raise AMQPError(NOT_IMPLEMENTED, f"basic.get not supported by stream queues {_where(self.vhost, self.name)}")

    def purge(self) -> int:
        raise AMQPError(NOT_IMPLEMENTED,
                        f"queue.purge not supported by stream queues {_where(self.vhost, self.name)}")

    def reset_expiry_timer(self) -> None:
        """Streams have no x-expires (refused at declare)."""

    # -- replies that may come later (broker/queues/queue_types.py Queue): a stream's figures are at hand ---------------
    def basic_get_wait(self, retry: Callable[[], None]) -> bool:
        return False  # (not reached: basic_get refuses first)

    def message_count_wait(self, answer: Callable[[], None]) -> bool:
        return False

    def purge_count_wait(self, answer: Callable[[int], None]) -> bool:
        return False  # (not reached: purge refuses first)

    # -- figures ---------------------------------------------------------------------------------------------
    def message_count(self) -> int:
        """Messages retained (the stream's length, not what is left to read: reading removes nothing)."""
        return self.log.next_offset - self.log.first_offset

    def figures(self) -> Figures:
        return Figures(self.message_count(), 0, self.log.bytes, 0, 0)

    def consumer_groups(self) -> ConsumerGroups:
        """The stream itself: its groups are its own (:meth:`groups`, :meth:`group_info`...)."""
        return self

    def info_items(self, node_name: str) -> dict[str, Any]:
        """What a stream adds to its queue object (``type`` is "stream"; ``messages`` and ``messages_ready``
        are the messages retained, ``next_offset - first_offset``, as RabbitMQ 3.10 counts them).

        RabbitMQ's names where its ``rabbit_stream_queue`` info keys or ``rabbitmq-streams stream_status``
        columns have one: ``leader``, ``members``, ``online``, ``readers``, ``first_offset``, ``offset`` (the
        last offset written), ``committed_offset`` (one node has nothing to replicate: the last offset written,
        where osiris shows its last committed chunk) and ``segments``. Leveret's for the rest: ``last_offset``
        (``offset`` under a plainer name; -1 for a stream never written), ``next_offset`` (what the next
        publish gets: the end, exclusive, of what a reader such as the Spark source can read now),
        ``stream_bytes`` (payload bytes retained, what ``x-max-length-bytes`` limits) and ``consumer_groups``
        (:meth:`group_info`). The HTTP API shows them; the leveret_stream_* series are read from them."""
        log = self.log
        first, nxt = log.first_offset, log.next_offset
        members = self.group_consumers()
        return {
            "leader": node_name,
            "members": [node_name],
            "online": [node_name],
            "readers": self.consumers.count,
            "first_offset": first,
            "offset": nxt - 1,
            "last_offset": nxt - 1,
            "next_offset": nxt,
            "committed_offset": nxt - 1,
            "segments": log.segment_count,
            "stream_bytes": log.bytes,
            "consumer_groups": [self.group_info(name, group, members)
                                for name, group in sorted(self.groups().items())],
        }

    def group_info(self, name: str, group: GroupLog, members: dict[str, int] | None = None) -> dict[str, Any]:
        """One consumer group (Leveret's, QMQ's pull log): ``committed_offset`` (every offset below it is
        acked), ``cursor`` (the next offset the group pulls), ``outstanding`` (pulled, not acked), ``lag``
        (``next_offset - committed_offset``: what the group has still to settle, retention's losses included)
        and ``consumers`` (its members now; RabbitMQ's column name in ``list_stream_consumer_groups``)."""
        nxt = self.log.next_offset
        committed = group.committed
        counts = self.group_consumers() if members is None else members
        return {
            "vhost": self.vhost.name,
            "stream": self.name,
            "name": name,
            "committed_offset": committed,
            "cursor": group.cursor,
            "outstanding": len(group.outstanding()),
            "lag": nxt - committed,
            "consumers": counts.get(name, 0),
            "next_offset": nxt,
        }

    def group_consumers(self) -> dict[str, int]:
        """Consumers per group name (the ``x-stream-group`` argument of the stream's consumers)."""
        out: dict[str, int] = {}
        for consumer in list(self.consumers):
            name = consumer.arguments.get("x-stream-group")
            if isinstance(name, (bytes, bytearray)):
                name = bytes(name).decode(errors="replace")
            if isinstance(name, str):
                out[name] = out.get(name, 0) + 1
        return out

    def origins_held(self, seqs: set[int]) -> set[int]:
        """A stream keeps no message ids: a delayed message in doubt after a crash is appended again (at
        least once; broker/delayed/delayed_dispatch.py)."""
        return set()

    def groups(self) -> dict[str, GroupLog]:
        """The stream's consumer groups (committed offset, cursor), for the HTTP API, metrics and ctl."""
        return self.log.groups()

    def commit_group_offset(self, name: str, offset: int) -> GroupLog:
        """An outside reader's progress recorded as group ``name``'s committed offset (the Spark source's
        ``commit``: its checkpoint is the truth, the group makes its lag visible). Creates the group at
        ``offset``, or moves an existing one forward to it (never back: what was committed stays committed).
        Refused (409 by the HTTP API) while the group has consumers here, whose acks own its progress."""
        group = self._groups.get(name)
        if group is not None and group.members:
            raise AMQPError(PRECONDITION_FAILED, f"consumer group '{name}' of {_where(self.vhost, self.name)} "
                            f"has {group.members} consumer(s): their acks move its offset")
        offset = max(self.log.first_offset, min(offset, self.log.next_offset))
        log = self.log.group(name, offset)
        log.skip_to(offset)
        if group is not None:
            group.redeliver = deque(o for o in group.redeliver if o >= log.committed)
        return log

    # -- memory: the log is on disk, nothing to page -----------------------------------------------------------
    def set_ram_budget(self, max_bytes: int | None) -> None:
        pass

    def ram_bytes(self) -> int:
        return 0

    def needs_paging(self) -> bool:
        return False

    def page(self) -> None:
        pass

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def terminate(self) -> int:
        """The stream is deleted: consumers are cancelled, publishes awaiting their fsync confirmed (the queue
        has dealt with them), and the log with its groups deleted."""
        count = self.message_count()
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        self._end()
        self._readers.clear()
        self._by_consumer.clear()
        self.log.delete()
        return count


class StreamQueueType:
    """RabbitMQ's ``rabbit_stream_queue`` declare rules: durable, shared, lasting, and named by the client."""

    name = "stream"
    cluster_shared = False  # a stream's log is one node's (a shared stream is future work)

    def check_declare(self, where: str, durable: bool, exclusive: bool, auto_delete: bool,
                      server_named: bool = False) -> None:
        refuse_unless_lasting(where, durable, exclusive, auto_delete)
        if server_named:
            raise AMQPError(PRECONDITION_FAILED, "Cannot declare a server-named queue for type rabbit_stream_queue")

    def new_queue(self, vhost: QueueHost, name: str, durable: bool, owner: QueueOwner | None, auto_delete: bool,
                  arguments: dict[str, Any], settings: QueueSettings, open_store: Any) -> StreamQueue:
        """The stream's log from the node's storage (a durable stream comes back as it was), or in memory on a
        node without storage."""
        segment_size = settings.max_segment_size_bytes or DEFAULT_SEGMENT_SIZE
        if isinstance(open_store, StreamOpener):
            log = open_store.open_stream(name, segment_size)
            return StreamQueue(vhost, name, arguments, settings, log)
        return StreamQueue(vhost, name, arguments, settings, MemoryStreamLog(name, max_segment_size_bytes=segment_size))


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """``offsets`` as (first, count) runs of consecutive offsets, in their order."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and offset == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((offset, 1))
    return runs
