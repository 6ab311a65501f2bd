"""One AMQP channel (RabbitMQ's ``rabbit_channel``): routes publishes, writes publisher confirms and
mandatory returns, tracks deliveries awaiting ack (with their consumer timeout), prefetch, and answers the
channel-level methods.

The pure pieces live beside it, as in RabbitMQ: assembling a publish from its frames in
broker/amqp/command_assembler.py, confirm numbering and folding in broker/amqp/confirms.py, the transaction in
broker/amqp/tx.py, the direct reply-to consumer in broker/queues/direct_reply_to.py. Time (the consumer ack
timeout) is read from the node's clock (broker/clock.py).

The hot methods (basic.publish, its content, basic.ack/nack/reject) are decoded by the fast codec and
handled without pamqp; everything else goes through :meth:`handle_method`'s table.

Some replies cannot be given at once in a cluster: a quorum queue's basic.get and declare-ok wait for a round
in PostgreSQL, a declare of another member's queue for that member's answer, an unbind of it for the member to
carry it out. The channel answers them from a callback, the event loop serving everyone else meanwhile, and
pauses its pipeline until then (broker/amqp/method_pipeline.py: the later frames wait, channel.close too): AMQP
0-9-1 answers a channel's methods in the order they came, and a client that pipelines relies on it. The
connection's other channels go on.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from pamqp import commands as spec

from broker.amqp.command_assembler import CommandAssembler
from broker.amqp.confirms import Confirms
from broker.amqp.method_pipeline import MethodPipeline
from broker.amqp.publish_run import PublishRun
from broker.amqp.tx import COMMIT_FAILED, Transaction
from broker.errors import AMQPError
from broker.exchanges.exchange import EXCHANGE, QUEUE, Exchange
from broker.message import Message
from broker.publish import (
    FLAGS_TO_READ,
    PENDING,
    REFUSED,
    REPLY_TO,
    REPLY_TO_PREFIX,
    ROUTED,
    check_properties,
)
from broker.queues import direct_reply_to
from broker.queues.direct_reply_to import ReplyConsumer
from broker.queues.queue_consumers import Consumer
from broker.queues.queue_shell import QueueOwner
from broker.security import permissions, topic_permissions
from broker.topology import Answers, Deferred, current_answers, deferring
from protocol import fastcodec
from protocol.constants import (
    ACCESS_REFUSED,
    CLASS_BASIC,
    CLASS_QUEUE,
    COMMAND_INVALID,
    INTERNAL_ERROR,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
)
from protocol.fastcodec import PublishArgs
from protocol.methods import method_frame
from protocol.properties import amqp_type_name

if TYPE_CHECKING:
    from broker.config import Settings
    from broker.node import Node
    from broker.queues.queue_types import Queue
    from broker.security.auth import User
    from broker.topology import OtherMembersQueue
    from broker.vhost import VHost

log = structlog.get_logger("leveret.channel")

# Client libraries (client_properties "product") that give basic.qos's global flag its AMQP 0-9-1 meaning on a
# broker not named RabbitMQ: py-amqp, under kombu and Celery (see Channel._basic_qos).
SPEC_QOS_CLIENTS = frozenset({"py-amqp"})


def _nothing() -> None:
    """A deferred reply with nothing of its own to send (the replies waited for a commit: Channel._committed)."""


def _random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class ChannelConnection(QueueOwner, Protocol):
    """What a channel needs of the connection it belongs to (broker/amqp/reader.py's Reader is one): who is
    connected and to which vhost, the node, the connection's socket writes, the calls back up that a
    channel makes (a channel error, "this channel has confirms to send"), and, as the owner of exclusive
    queues, what the queue layer needs (``QueueOwner``)."""

    node: Node
    user: User
    vhost: VHost
    client_properties: dict[str, Any]
    writable: bool

    @property
    def settings(self) -> Settings: ...

    def client_capability(self, name: str) -> bool: ...

    def channel_error(self, channel_id: int, exc: AMQPError) -> None: ...

    def send(self, data: bytes) -> None: ...

    def send_content(self, channel_id: int, header: bytes, body: bytes) -> None: ...

    def send_delivery(self, channel_id: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                      names_raw: bytes, header: bytes, body: bytes) -> None: ...

    def confirms_pending(self, channel: Channel) -> None: ...

    def pause_for(self, reason: object) -> None: ...

    def resume_for(self, reason: object) -> None: ...

    def channel_frame_in_turn(self, channel: Channel, frame_type: int, payload: Any) -> None: ...


class Channel:
    # State that starts the same for every channel and changes for few of them (a consumer's channel, a
    # publisher's, one in confirm or tx mode) is a class attribute until a channel sets its own: an idle
    # channel's instance dictionary then stays under CPython 3.11's 30 shared keys (1.6 KB more per channel
    # above them; tests/unit/broker/test_connection_footprint.py). Only immutable values here.
    closing = False
    # Replies on commit (handle_method): while a method runs, the writes accepted before it and its replies
    # sent after a write of its own (None between methods); then, until they are committed, the commit and
    # those replies (_answer_later sends them first).
    _accepted_at = 0
    _outbox: list[bytes] | None = None
    _commit: asyncio.Future[None] | None = None
    next_delivery_tag = 1
    consumer_unacked = 0
    prefetch_count = 0  # for consumers created from now on (basic.qos global=false)
    global_prefetch = 0  # shared by the channel's consumers (basic.qos global=true)
    # Whether the client itself asked for a shared limit (basic.qos global=true, a prefetch above 0; not
    # py-amqp's global=false taken as one): RabbitMQ's "limiter active", which quorum queues refuse.
    global_qos = False
    # Whether the channel has published (RabbitMQ's publishing mode): an open one counts as a publisher.
    publishing = False
    # Publisher confirms: None until confirm.select.
    confirms: Confirms | None = None
    # Transactions: None until tx.select, then the work waiting for tx.commit.
    tx: Transaction | None = None
    last_queue: str | None = None
    reply_consumer: ReplyConsumer | None = None
    # While this channel's queue.delete runs: the tags of its own consumers the deletion cancels, whose
    # basic.cancel goes out after delete-ok (see _delete).
    _cancels_after_delete: list[str] | None = None
    _ack_timer: Any = None
    # This channel's message_stats (RabbitMQ's names after ``msg_``), plain ints the paths below add to;
    # the HTTP API reads them (broker/management/presenters/connections.py: channel_message_values).
    msg_publish = 0
    msg_confirm = 0
    msg_return_unroutable = 0
    msg_drop_unroutable = 0
    msg_deliver = 0
    msg_deliver_no_ack = 0
    msg_get = 0
    msg_get_no_ack = 0
    msg_get_empty = 0
    msg_redeliver = 0
    msg_ack = 0
    # The methods handle_method runs, by pamqp class (filled in after the class: the functions are its own).
    _handlers: dict[type, Callable[[Channel, Any], None]]

    def __init__(self, reader: ChannelConnection, channel_id: int) -> None:
        self.reader = reader
        self.id = channel_id
        self.vhost = reader.vhost
        self.clock = reader.node.clock
        # Content assembly: the publish being received. Its frame handlers are bound here so the reader
        # calls the assembler's directly (no extra call per frame).
        self.assembler = CommandAssembler(reader.settings, self._publish_command)
        self.on_publish = self.assembler.on_publish
        self.on_header = self.assembler.on_header
        self.on_body = self.assembler.on_body
        self.on_whole_publish = self.assembler.on_whole_publish
        # Runs of alike publishes found in one read, taken as one (broker/amqp/publish_run.py).
        self.publish_run = PublishRun(self)
        # The channel's frames in order: paused while a reply of it is deferred, its later frames waiting
        # (broker/amqp/method_pipeline.py); the reader hands a frame to it instead of handling it then.
        self.pipeline = MethodPipeline(
            dispatch=lambda frame_type, payload: reader.channel_frame_in_turn(self, frame_type, payload),
            flow=reader, mid_content=lambda: self.assembler.publish is not None, closed=lambda: self.closing)
        # Replies on commit (storage/commits.py; handle_method): the node's commits (the rest: class defaults).
        self._commits = reader.node.commits
        self._commit_outbox: list[bytes] = []
        # Deliveries awaiting ack: delivery tag → (queue, seq_id, consumer or None for basic.get).
        self.unacked: dict[int, tuple[Queue, int, Consumer | None]] = {}
        self.consumers: dict[str, Consumer] = {}
        # Consumer acknowledgement timeout: delivery tag → (deadline on the clock's monotonic seconds,
        # timeout ms), only for consumers of queues with a timeout; checked by one timer per channel.
        self._ack_deadlines: dict[int, tuple[float, int]] = {}
        # Exchanges this channel was allowed to publish to (checked once, as RabbitMQ caches it), each with
        # the user's topic-permission check of its routing keys, or None (broker/security/topic_permissions.py).
        self.publish_checks: dict[str, topic_permissions.TopicCheck | None] = {}
        # Queues this channel published to: it counts as one of their publishers while it is open.
        self.published_to: set[Queue | OtherMembersQueue] = set()  # (another member's queue too)
        self.counters = reader.node.counters

    # -- output ----------------------------------------------------------------------------------------
    def send(self, cls: type, **values: Any) -> None:
        frame = method_frame(self.id, cls, **values)
        outbox = self._outbox
        if outbox is not None and self._commits.accepted != self._accepted_at:
            outbox.append(frame)  # after the running method wrote a definition: sent on commit (handle_method)
        else:
            self.reader.send(frame)

    # -- deferred replies: the pipeline paused meanwhile -------------------------------------------------
    def _answer_later(self, answer: Callable[[], None], class_id: int, method_id: int) -> Callable[[], None]:
        """The callback of a reply that comes later (a queue's ``basic_get_wait`` / ``message_count_wait``, an
        unbind's future): it runs ``answer`` (the reply, or an AMQPError closing the channel, reported as the
        method ``class_id``/``method_id`` failing, as the reader reports one raised at once), then lets the
        frames that came since go on (the pipeline resumes). Nothing if the channel has closed meanwhile."""

        def run() -> None:
            if self.closing:
                return
            commit = self._commit
            if commit is not None:
                if not commit.done():
                    commit.add_done_callback(lambda _f: run())  # the method's writes first (handle_method)
                    return
                self._commit = None
            try:
                if commit is not None:
                    self._committed(commit)
                answer()
            except AMQPError as exc:
                if exc.class_id is None:
                    exc.class_id, exc.method_id = class_id, method_id
                self.reader.channel_error(self.id, exc)
                return
            except Exception:
                log.exception("internal error answering a deferred method", channel=self.id)
                self.reader.channel_error(self.id, AMQPError(INTERNAL_ERROR, "internal error", class_id, method_id))
                return
            self.pipeline.resume()

        return run

    def _committed(self, commit: asyncio.Future[None]) -> None:
        """The writes of the method whose reply waited (:meth:`handle_method`) are committed: its replies
        go out; or they were not within the store's timeout: 541, as a write that fails at once."""
        outbox, self._commit_outbox = self._commit_outbox, []
        exc = commit.exception()
        if exc is not None:
            raise AMQPError(INTERNAL_ERROR, str(exc))
        for frame in outbox:
            self.reader.send(frame)

    # -- content assembly (broker/amqp/command_assembler.py) ------------------------------------------------
    def _publish_command(self, args: PublishArgs, header: bytes, body: bytes) -> None:
        """A publish the assembler completed."""
        self.basic_publish(args, Message(args.exchange, args.routing_key, args.names_raw, header, body))

    # -- publishing ------------------------------------------------------------------------------------
    @property
    def confirm(self) -> bool:
        """Whether the channel is in confirm mode (confirm.select)."""
        return self.confirms is not None

    def basic_publish(self, args: PublishArgs, msg: Message, answers: Answers | None = None) -> None:
        """``answers``: what the cluster's definitions feed answered for this publish (:meth:`_publish_again`)."""
        self.publishing = True
        if args.immediate:
            raise AMQPError(NOT_IMPLEMENTED, "immediate=true", CLASS_BASIC, 40)
        topic = self.publish_check(args.exchange)
        name = args.exchange
        exchange = self.vhost.exchanges.get(name) if name else self.vhost.default_exchange
        if exchange is None or exchange.internal:
            # 404 or 403; in a cluster, first the definitions feed is read (another member may have declared
            # the exchange a moment ago): the publish waits for it, its later frames held back, the loop serving
            # others meanwhile (broker/topology.py "Answers that come later").
            if answers is None:
                answers = Answers()
            try:
                with deferring(answers):
                    exchange = self.vhost.check_publishable(name)
            except Deferred as exc:
                self.pipeline.pause()
                exc.future.add_done_callback(lambda _f: self._publish_again(args, msg, answers))
                return
        if topic is not None:
            topic.check(exchange, args.routing_key)
        flags = (msg.header[12] << 8) | msg.header[13] if len(msg.header) >= 14 else 0
        persistent = False
        if flags & FLAGS_TO_READ:
            rc = self.reply_consumer
            persistent = check_properties(msg, flags, self.reader.user, None if rc is None else rc.key)
            if topic is not None and msg.extra_keys:
                topic.check_all(exchange, msg.extra_keys)  # CC / BCC keys (RabbitMQ 4.1+ checks them too)
        if exchange.name == "" and self.vhost.clustered:
            learning = self._learning(args.routing_key)
            if learning is not None:
                # A name this member does not know, maybe another member's queue (or a quorum queue) declared a
                # moment ago: routed once the directory and the definitions feed have answered
                # (broker/clustering/cluster_forwarding.py VHostLink._lookup, broker/clustering/cluster_definitions.py soon), the loop
                # serving others meanwhile and this channel's later frames held back, so none overtakes it.
                self.pipeline.pause()
                answer = self._answer_later(lambda: self._publish_routed(exchange, args, msg, persistent),
                                            CLASS_BASIC, 40)
                learning.add_done_callback(lambda _f: answer())
                return
        self._publish_routed(exchange, args, msg, persistent)

    def publish_check(self, exchange: str) -> topic_permissions.TopicCheck | None:
        """The user may publish to ``exchange`` (403 if not; asked once per exchange, as RabbitMQ caches it):
        the check of its routing keys by topic permissions, or None."""
        try:
            return self.publish_checks[exchange]
        except KeyError:
            permissions.basic_publish(self.reader.user, self.vhost.name, exchange)
            topic = self.publish_checks[exchange] = topic_permissions.publish_check(
                self.reader.user, self.vhost.name, exchange)
            return topic

    def _learning(self, name: str) -> asyncio.Future[Any] | None:
        """Before a cluster member routes a client's default-exchange publish to ``name``: None if it knows the
        queue (its own, another member's, a direct reply-to key); else the questions about it on their way (the
        directory's look-up, the feed's read; either may be None: asked a moment ago), done once both are in."""
        vhost = self.vhost
        if vhost.queues.get(name) is not None or vhost.remote.has_queue(name) or name.startswith(REPLY_TO_PREFIX):
            return None
        looking = vhost.remote.looking_up(name)
        reading = vhost.catch_up.soon()
        if looking is None or reading is None:
            return looking or reading
        return asyncio.gather(looking, reading, return_exceptions=True)

    def _publish_again(self, args: PublishArgs, msg: Message, answers: Answers) -> None:
        """The feed answered what a publish to an exchange this member did not know waited for
        (:meth:`basic_publish`): it is published again with the answer at hand, its errors reported as
        basic.publish's; the frames held back behind it go on unless it waits again."""
        if self.closing:
            return
        self.pipeline.resume()  # (the frames after it wait for a later turn; it pauses again if it waits again)
        try:
            self.basic_publish(args, msg, answers)
        except AMQPError as exc:
            if exc.class_id is None:
                exc.class_id, exc.method_id = CLASS_BASIC, 40
            self.reader.channel_error(self.id, exc)
            return
        except Exception:
            log.exception("internal error publishing again", channel=self.id)
            self.reader.channel_error(self.id, AMQPError(INTERNAL_ERROR, "internal error", CLASS_BASIC, 40))

    def _publish_routed(self, exchange: Exchange, args: PublishArgs, msg: Message, persistent: bool) -> None:
        """A publish past its checks: into the transaction, or routed now."""
        if self.tx is not None:
            self.tx.add_publish((exchange, args, msg, persistent))
            return
        self._route(exchange, args, msg, persistent)

    def _route(self, exchange: Exchange, args: PublishArgs, msg: Message, persistent: bool,
               tx_token: int = 0) -> int:
        """Publish through the vhost (broker/publish.py), return the message if it is mandatory and went
        nowhere, and account its confirm. Returns VHost.publish's result, whose ``>> PENDING`` part counts the
        queues that will confirm it later (after an fsync); ``tx_token`` (negative) asks for those later
        confirms on behalf of a tx.commit."""
        confirms = self.confirms
        if confirms is not None:
            seq = confirms.seq = confirms.seq + 1
            result = self.vhost.publish(exchange, msg, persistent, args.mandatory, self, seq)
        else:
            result = self.vhost.publish(exchange, msg, persistent, args.mandatory, self, tx_token)
        self.msg_publish += 1
        if not result & ROUTED:
            if args.mandatory:
                self.msg_return_unroutable += 1
                self.reader.send(fastcodec.encode_basic_return(self.id, NO_ROUTE, "NO_ROUTE", args.names_raw))
                self.reader.send_content(self.id, msg.header, msg.body)
            else:
                self.msg_drop_unroutable += 1
        if confirms is not None and confirms.published(seq, result >> PENDING, result & REFUSED):
            self.reader.confirms_pending(self)
        return result

    def confirm_from_queue(self, seq: int, stored: bool = True) -> None:
        """A queue has this publish on disk (``stored``), or failed to put it there; once every queue it
        went to has answered, it is confirmed, or nacked if any of them failed."""
        if seq < 0:
            if self.tx is not None:
                self._answer_commits(self.tx.synced(1, stored))
            return
        confirms = self.confirms
        if confirms is None or self.closing:
            return
        if confirms.queue_answered(seq, stored):
            self.reader.confirms_pending(self)

    @property
    def messages_unconfirmed(self) -> int:
        """Publishes not yet confirmed to the client (RabbitMQ's ``messages_unconfirmed``): those waiting for
        their queues' fsync, and those settled this tick whose basic.ack / basic.nack is not written yet."""
        return 0 if self.confirms is None else self.confirms.messages_unconfirmed

    def flush_confirms(self) -> None:
        """Send the confirms of this tick, folded as broker/amqp/confirms.py says: nacks first, then the acks
        below the oldest publish still waiting for a queue as one multiple=true ack, the later ones one by
        one. A closed channel sends nothing: once its close (or close-ok) is written, its number belongs to
        no channel until it is reopened, when it begins anew."""
        confirms = self.confirms
        if confirms is None:
            return
        nacks, acks, acked = confirms.take()
        if self.closing:
            return
        send = self.reader.send
        channel_id = self.id
        for tag in nacks:
            send(fastcodec.encode_basic_nack(channel_id, tag, False))
        if acked:
            self.counters.messages_confirmed += acked
            self.msg_confirm += acked
            for tag, multiple in acks:
                send(fastcodec.encode_basic_ack(channel_id, tag, multiple))

    # -- delivering ------------------------------------------------------------------------------------
    def can_deliver(self) -> bool:
        if self.closing or not self.reader.writable:
            return False
        return not self.global_prefetch or self.consumer_unacked < self.global_prefetch

    def can_deliver_no_ack(self) -> bool:
        return not self.closing and self.reader.writable

    def deliver(self, consumer: Consumer, queue: Queue, seq_id: int, msg: Message,
                redelivered: bool) -> None:
        self.deliver_parts(consumer, queue, seq_id, msg.names_raw, msg.header, msg.body, redelivered)
        tracer = self.vhost.tracing
        if tracer is not None:
            tracer.delivered(queue.name, msg, redelivered, self)  # the firehose (broker/observability/trace.py)

    def deliver_parts(self, consumer: Consumer, queue: Queue, seq_id: int, names_raw: bytes, header: bytes,
                      body: bytes, redelivered: bool) -> None:
        """:meth:`deliver` from the three parts that go on the wire, for a queue that keeps a message as bytes
        (a stream: no Message is built per delivery). The firehose is the caller's to tell."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        counters = self.counters
        counters.messages_delivered += 1
        if redelivered:
            counters.messages_redelivered += 1
            self.msg_redeliver += 1
        if consumer.no_ack:
            counters.messages_delivered_consume_auto_ack += 1
            self.msg_deliver_no_ack += 1
        else:
            counters.messages_delivered_consume_manual_ack += 1
            self.msg_deliver += 1
            self.unacked[tag] = (queue, seq_id, consumer)
            consumer.unacked += 1
            self.consumer_unacked += 1
            timeout = queue.settings.consumer_timeout or self.reader.settings.consumer_timeout
            if timeout:
                self._watch_ack(tag, timeout)
        self.reader.send_delivery(self.id, consumer.tag_raw, tag, redelivered, names_raw, header, body)

    def _watch_ack(self, tag: int, timeout_ms: int) -> None:
        clock = self.clock
        self._ack_deadlines[tag] = (clock.monotonic() + timeout_ms / 1000.0, timeout_ms)
        if self._ack_timer is None:
            self._ack_timer = clock.call_later(min(timeout_ms / 1000.0, 1.0), self._check_ack_timeouts)

    def _check_ack_timeouts(self) -> None:
        """Close the channel (406) if a delivery has waited for its ack longer than the consumer timeout,
        as RabbitMQ does; its unacked messages are requeued by the close."""
        self._ack_timer = None
        if self.closing:
            return
        deadlines = self._ack_deadlines
        for tag in [t for t in deadlines if t not in self.unacked]:
            del deadlines[tag]
        if not deadlines:
            return
        clock = self.clock
        now = clock.monotonic()
        for deadline, timeout in deadlines.values():
            if deadline <= now:
                self.reader.channel_error(self.id, AMQPError(
                    PRECONDITION_FAILED, f"delivery acknowledgement on channel {self.id} timed out. Timeout "
                    f"value used: {timeout} ms. This timeout value can be configured, see consumers doc "
                    "guide to learn more", 0, 0))
                return
        soonest = min(d for d, _ in deadlines.values())
        self._ack_timer = clock.call_later(max(0.01, min(soonest - now, 1.0)), self._check_ack_timeouts)

    def deliver_reply(self, msg: Message) -> None:
        """A reply for this channel's direct reply-to consumer (no ack, no queue)."""
        rc = self.reply_consumer
        assert rc is not None
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        self.reader.send_delivery(self.id, rc.tag_raw, tag, False, msg.names_raw, msg.header, msg.body)

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        """The queue went away: forget the consumer and tell the client (consumer_cancel_notify); after
        delete-ok when this channel's own queue.delete removed it (see _delete)."""
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
            if not self.closing and self.reader.client_capability("consumer_cancel_notify"):
                if self._cancels_after_delete is not None:
                    self._cancels_after_delete.append(consumer.tag)
                else:
                    self.send(spec.Basic.Cancel, consumer_tag=consumer.tag, nowait=True)

    # -- acknowledgements ------------------------------------------------------------------------------
    def _collect(self, tag: int, multiple: bool) -> list[tuple[int, tuple[Queue, int, Consumer | None]]]:
        """Take the deliveries an ack/nack/reject names out of ``unacked``: (tag, delivery) pairs.
        ``multiple`` with tag 0 means every outstanding delivery; an unknown tag is a 406."""
        unacked = self.unacked
        if multiple:
            if tag == 0:
                pairs = list(unacked.items())
                unacked.clear()
                return pairs
            if tag not in unacked:
                raise AMQPError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            pairs = []
            for t in list(unacked):
                if t > tag:
                    break
                pairs.append((t, unacked.pop(t)))
            return pairs
        entry = unacked.pop(tag, None)
        if entry is None:
            raise AMQPError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        return [(tag, entry)]

    def _settle(self, pairs: list[tuple[int, tuple[Queue, int, Consumer | None]]], action: str) -> None:
        """Ack, requeue or discard collected deliveries, one call per queue, then let queues deliver more."""
        by_queue: dict[Queue, list[int]] = {}
        for _tag, (queue, seq_id, consumer) in pairs:
            if consumer is not None:
                consumer.unacked -= 1
                self.consumer_unacked -= 1
            ids = by_queue.get(queue)
            if ids is None:
                by_queue[queue] = [seq_id]
            else:
                ids.append(seq_id)
        if action == "ack":
            self.counters.messages_acknowledged += len(pairs)
            self.msg_ack += len(pairs)
        for queue, seq_ids in by_queue.items():
            if action == "ack":
                queue.ack(seq_ids)
            elif action == "requeue":
                queue.requeue(seq_ids)
            else:
                queue.reject_discard(seq_ids)
            queue.schedule_run()
        if self.global_prefetch:
            self._kick_consumer_queues()

    def _kick_consumer_queues(self) -> None:
        for consumer in list(self.consumers.values()):
            consumer.queue.schedule_run()

    def on_ack(self, tag: int, multiple: bool) -> None:
        pairs = self._collect(tag, multiple)
        if self.tx is not None:
            self.tx.add_settle("ack", pairs)
            return
        self._settle(pairs, "ack")

    def on_nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        pairs = self._collect(tag, multiple)
        if self.tx is not None:
            self.tx.add_settle("requeue" if requeue else "discard", pairs)
            return
        self._settle(pairs, "requeue" if requeue else "discard")

    def on_reject(self, tag: int, requeue: bool) -> None:
        self.on_nack(tag, False, requeue)

    # -- other methods ---------------------------------------------------------------------------------
    def handle_method(self, method: Any, answers: Answers | None = None) -> None:
        """One method of :attr:`_handlers`, replied on commit: a method that wrote a definition the store
        commits later (a cluster member's PostgreSQL table, storage/commits.py) has its replies sent after
        the commit, its channel's later methods waiting meanwhile (its pipeline paused); the event loop serves
        everyone else. A store that commits within the call (SQLite) leaves ``accepted`` as it was: the
        replies go out as the method ends.

        A cluster member's method that needs an answer of the directory of node-local queues (a claim of the
        name a queue.declare makes, the look-up of a name this member does not know, whether another member made
        a binding) does not wait for it on the loop: the topology starts the question and raises Deferred
        (broker/topology.py, "Answers that come later"), before the method has changed anything; the channel
        holds its later frames back and handles the method again, from its start, once the answer is in
        (:meth:`_handle_again`), with ``answers`` holding it."""
        handler = Channel._handlers.get(type(method))
        if handler is None:
            raise AMQPError(COMMAND_INVALID, f"method {method.name} not allowed on a channel")
        if answers is None:
            answers = Answers()
        commits = self._commits
        accepted = self._accepted_at = commits.accepted
        outbox: list[bytes] = []
        self._outbox = outbox
        deferred: Deferred | None = None
        try:
            with deferring(answers):
                handler(self, method)
        except Deferred as exc:
            deferred = exc
        finally:
            self._outbox = None
            commit = commits.committed() if commits.accepted != accepted else None
            if commit is None:
                for frame in outbox:
                    self.reader.send(frame)
            if deferred is None:
                answers.settle()
        if deferred is not None:
            self.pipeline.pause()
            deferred.future.add_done_callback(lambda _f: self._handle_again(method, answers))
            return
        if commit is not None:
            self._commit, self._commit_outbox = commit, outbox
            if not self.pipeline.paused:  # (else the method's own deferred reply waits for the commit: _answer_later)
                self.pipeline.pause()
                answer = self._answer_later(_nothing, method.index >> 16, method.index & 0xFFFF)
                commit.add_done_callback(lambda _f: answer())

    def _handle_again(self, method: Any, answers: Answers) -> None:
        """The directory answered what ``method`` waited for (:meth:`handle_method`): the method is handled
        again with the answer at hand, its errors reported as the reader reports a method's; the frames held
        back behind it go on unless it defers its reply again. Nothing but the clean-up of the answers if the
        channel has closed meanwhile."""
        if self.closing:
            answers.settle()
            return
        self.pipeline.resume()  # (the frames after it wait for a later turn; it pauses again if it waits again)
        try:
            self.handle_method(method, answers)
        except AMQPError as exc:
            answers.settle()
            if exc.class_id is None:
                exc.class_id, exc.method_id = method.index >> 16, method.index & 0xFFFF
            self.reader.channel_error(self.id, exc)
            return
        except Exception:
            answers.settle()
            log.exception("internal error handling a method again", channel=self.id)
            self.reader.channel_error(self.id, AMQPError(INTERNAL_ERROR, "internal error", method.index >> 16,
                                                         method.index & 0xFFFF))

    def _queue_name(self, name: str) -> str:
        """RabbitMQ's shortcut: an empty queue name means the queue last declared on this channel."""
        if name:
            return name
        if self.last_queue is None:
            raise AMQPError(NOT_FOUND, "no previously declared queue")
        return self.last_queue

    def _basic_qos(self, m: spec.Basic.Qos) -> None:
        """Prefetch, with RabbitMQ's meaning of ``global``: false is a limit for each consumer created from
        now on (existing consumers keep theirs), true is one limit shared by the channel's consumers, in
        force at once.

        Except for clients in ``SPEC_QOS_CLIENTS`` (py-amqp, the transport of kombu and Celery): there
        ``global=false`` sets the channel's shared limit, in force at once. kombu chooses the flag from the
        server's product name (``qos_semantics_matches_spec``): to RabbitMQ 3.3+ it sends ``global=true``;
        to any other product, Leveret included, ``global=false``, which in AMQP 0-9-1 itself is the channel's
        limit. Celery changes the prefetch of its running consumer that way: it keeps an ETA / countdown
        task unacked until it is due and raises the prefetch by one for each it holds
        (``qos.increment_eventually``). Under RabbitMQ's per-new-consumer meaning the raise never reaches
        the running consumer, so a worker holding as many ETA tasks as its prefetch took nothing else until
        they came due. Taking py-amqp's ``global=false`` as the ``global=true`` kombu sends RabbitMQ gives
        Celery what it gets on RabbitMQ 3.x (tests/integration/clients/test_celery_eta.py).
        """
        if m.prefetch_size:
            raise AMQPError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_qos = m.prefetch_count > 0
        if m.global_ or self._client_uses_spec_qos():
            self.global_prefetch = m.prefetch_count
            self._kick_consumer_queues()
        else:
            self.prefetch_count = m.prefetch_count
        self.send(spec.Basic.QosOk)

    def _client_uses_spec_qos(self) -> bool:
        product = self.reader.client_properties.get("product")
        if isinstance(product, (bytes, bytearray)):
            product = product.decode(errors="replace")
        return product in SPEC_QOS_CLIENTS

    def _basic_consume(self, m: spec.Basic.Consume) -> None:
        self._check_consumer_limit(m.consumer_tag)
        if m.queue == REPLY_TO:
            self._consume_reply_to(m)
            return
        name = self._queue_name(m.queue)
        permissions.basic_consume(self.reader.user, self.vhost.name, name)
        queue = self.vhost.queues.lookup(name, self.reader)
        tag = m.consumer_tag or _random_tag("amq.ctag-")
        if tag in self.consumers or (self.reply_consumer is not None and self.reply_consumer.tag == tag):
            raise AMQPError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if queue.exclusive_consumer is not None or (m.exclusive and (queue.consumers.count
                                                                     or queue.settings.single_active_consumer)):
            raise AMQPError(ACCESS_REFUSED, f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use")
        args = dict(m.arguments or {})
        priority = args.get("x-priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            # rabbit_amqqueue:check_int_arg/2's words, printed with ~p (hence the quotes): the AMQP type.
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for queue '{queue.name}' in "
                            f"vhost '{self.vhost.name}': \"expected integer, got {amqp_type_name(priority)}\"")
        consumer = Consumer(tag, self, queue, m.no_ack, self.prefetch_count, priority, m.exclusive, args)
        self.consumers[tag] = consumer
        queue.add_consumer(consumer)  # may refuse it (a stream's rules) before consume-ok; delivers only later
        if not m.nowait:
            self.send(spec.Basic.ConsumeOk, consumer_tag=tag)

    def _check_consumer_limit(self, tag: str) -> None:
        """``consumer_max_per_channel`` (RabbitMQ's key, no limit by default): a new consumer tag on a channel
        that holds that many consumers is refused with RabbitMQ's 530, a connection error, before the queue
        is looked at; a tag already in use is left to the reuse check."""
        limit = self.reader.settings.consumer_max_per_channel
        if limit is None or (tag and tag in self.consumers):
            return
        if len(self.consumers) + (self.reply_consumer is not None) >= limit:
            raise AMQPError(NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel")

    def _consume_reply_to(self, m: spec.Basic.Consume) -> None:
        tag = m.consumer_tag or _random_tag("amq.ctag-")
        self.reply_consumer = direct_reply_to.start(self.reader.node, self, tag, m.no_ack, self.reply_consumer,
                                                    self.consumers)
        if not m.nowait:
            self.send(spec.Basic.ConsumeOk, consumer_tag=tag)

    def _basic_cancel(self, m: spec.Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag or "", None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
        elif self.reply_consumer is not None and self.reply_consumer.tag == m.consumer_tag:
            direct_reply_to.stop(self.reader.node, self.reply_consumer)
            self.reply_consumer = None
        if not m.nowait:
            self.send(spec.Basic.CancelOk, consumer_tag=m.consumer_tag)

    def _basic_get(self, m: spec.Basic.Get, waited: bool = False) -> None:
        name = self._queue_name(m.queue)
        permissions.basic_get(self.reader.user, self.vhost.name, name)
        queue = self.vhost.queues.lookup(name, self.reader)
        got = queue.basic_get(m.no_ack)
        counters = self.counters
        if got is None:
            # A queue whose rows are fetched asynchronously (a cluster's quorum queue, in PostgreSQL) may have
            # messages that are not at hand yet: it fetches and calls back, and the answer is sent then.
            if not waited and queue.basic_get_wait(self._answer_later(lambda: self._basic_get(m, waited=True),
                                                                      CLASS_BASIC, 70)):
                self.pipeline.pause()
                return
            counters.messages_get_empty += 1
            self.msg_get_empty += 1
            self.send(spec.Basic.GetEmpty)
            return
        seq_id, msg, redelivered, left = got
        counters.messages_delivered += 1
        if redelivered:
            counters.messages_redelivered += 1
            self.msg_redeliver += 1
        if m.no_ack:
            counters.messages_delivered_get_auto_ack += 1
            self.msg_get_no_ack += 1
        else:
            counters.messages_delivered_get_manual_ack += 1
            self.msg_get += 1
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        if not m.no_ack:
            self.unacked[tag] = (queue, seq_id, None)
        self.reader.send(fastcodec.encode_basic_get_ok(self.id, tag, redelivered, msg.names_raw, left))
        self.reader.send_content(self.id, msg.header, msg.body)
        tracer = self.vhost.tracing
        if tracer is not None:
            tracer.delivered(queue.name, msg, redelivered, self)

    def _basic_recover(self, m: spec.Basic.Recover) -> None:
        if not m.requeue:
            raise AMQPError(NOT_IMPLEMENTED, "requeue=false")
        pairs = list(self.unacked.items())
        self.unacked.clear()
        self._settle(pairs, "requeue")
        if isinstance(m, spec.Basic.Recover):
            self.send(spec.Basic.RecoverOk)

    def _exchange_declare(self, m: spec.Exchange.Declare) -> None:
        args = dict(m.arguments or {})
        permissions.exchange_declare(self.reader.user, self.vhost.name, m.exchange, args, m.passive)
        self.vhost.declare_exchange(m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete,
                                    m.internal, args)
        if not m.nowait:
            self.send(spec.Exchange.DeclareOk)

    def _exchange_delete(self, m: spec.Exchange.Delete) -> None:
        permissions.exchange_delete(self.reader.user, self.vhost.name, m.exchange)
        self.vhost.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self.send(spec.Exchange.DeleteOk)

    def _exchange_bind(self, m: spec.Exchange.Bind) -> None:
        permissions.exchange_bind(self.reader.user, self.vhost.name, m.destination, m.source)
        topic_permissions.check_bind(self.reader.user, self.vhost, m.source, m.routing_key)
        self.vhost.bind(m.source, m.destination, EXCHANGE, m.routing_key, dict(m.arguments or {}))
        if not m.nowait:
            self.send(spec.Exchange.BindOk)

    def _exchange_unbind(self, m: spec.Exchange.Unbind) -> None:
        permissions.exchange_bind(self.reader.user, self.vhost.name, m.destination, m.source)
        topic_permissions.check_bind(self.reader.user, self.vhost, m.source, m.routing_key)
        self.vhost.unbind(m.source, m.destination, EXCHANGE, m.routing_key, dict(m.arguments or {}))
        if not m.nowait:
            self.send(spec.Exchange.UnbindOk)

    def _queue_declare(self, m: spec.Queue.Declare) -> None:
        name = m.queue
        server_named = False
        if m.passive and name == REPLY_TO:
            self.send(spec.Queue.DeclareOk, queue=name, message_count=0, consumer_count=1)
            return
        if not name and not m.passive:
            # (The same name each time the declare is handled again after a directory answer: handle_method.)
            answers = current_answers()
            name = _random_tag("amq.gen-") if answers is None else \
                answers.memo(("server-named",), lambda: _random_tag("amq.gen-"))
            server_named = True
        elif not name:
            name = self._queue_name(name)
        permissions.queue_declare(self.reader.user, self.vhost.name, name, dict(m.arguments or {}), m.passive)
        # In a cluster, the checks of another member's queue that need its answer (broker/clustering/cluster_forwarding.py).
        owner_checks: list[Callable[[], None]] = []
        queue, created = self.vhost.queues.declare(name, m.passive, m.durable, m.exclusive, m.auto_delete,
                                                     dict(m.arguments or {}), self.reader, server_named,
                                                     owner_checks)
        self.last_queue = queue.name
        self.counters.queues_declared += 1
        if created:
            self.counters.queues_created += 1
        if not m.nowait or owner_checks:
            # A queue whose store is shared by a cluster's members (a quorum queue, in PostgreSQL) recounts first,
            # so the count includes what other members confirmed before this declare; another member's queue
            # asks its member (figures, and the arguments to check). Either calls back then.
            if queue.message_count_wait(self._answer_later(lambda: self._declared(queue, owner_checks, m.nowait),
                                                           CLASS_QUEUE, 10)):
                self.pipeline.pause()
                return
            self._declared(queue, owner_checks, m.nowait)

    def _declared(self, queue: Queue | OtherMembersQueue, owner_checks: list[Callable[[], None]], nowait: bool) -> None:
        """The end of a queue.declare: the checks left for the owner's answer (406), then declare-ok."""
        for check in owner_checks:
            check()
        if not nowait:
            self.send(spec.Queue.DeclareOk, queue=queue.name, message_count=queue.message_count(),
                      consumer_count=queue.consumers.count)

    def _queue_bind(self, m: spec.Queue.Bind) -> None:
        name = self._queue_name(m.queue)
        permissions.queue_bind(self.reader.user, self.vhost.name, name, m.exchange)
        if m.exchange == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        topic_permissions.check_bind(self.reader.user, self.vhost, m.exchange, m.routing_key)
        if self.vhost.queues.get(name) is not None or \
                not self.vhost.remote.bound_remotely(m.exchange, name, m.routing_key, dict(m.arguments or {})):
            # (In a cluster, a binding another member made for its queue is already there: bind-ok.)
            self.vhost.queues.lookup(name, self.reader)
            self.vhost.bind(m.exchange, name, QUEUE, m.routing_key, dict(m.arguments or {}))
        if not m.nowait:
            self.send(spec.Queue.BindOk)

    def _queue_unbind(self, m: spec.Queue.Unbind) -> None:
        name = self._queue_name(m.queue)
        permissions.queue_bind(self.reader.user, self.vhost.name, name, m.exchange)
        if m.exchange == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        topic_permissions.check_bind(self.reader.user, self.vhost, m.exchange, m.routing_key)
        queue = self.vhost.queues.get(name)
        if queue is not None:
            self.vhost.queues.check_exclusive_access(queue, self.reader)
        unbinding = self.vhost.unbind(m.exchange, name, QUEUE, m.routing_key, dict(m.arguments or {}))
        if unbinding is not None:
            # Another cluster member's queue: unbind-ok once that member has carried the unbind out.
            answer = self._answer_later(lambda: self._unbound(unbinding), CLASS_QUEUE, 50)
            unbinding.add_done_callback(lambda _f: answer())
            self.pipeline.pause()
            return
        self.send(spec.Queue.UnbindOk)

    def _unbound(self, unbinding: asyncio.Future[None]) -> None:
        if not unbinding.cancelled():
            unbinding.result()  # (an AMQPError if the request could not be written)
        self.send(spec.Queue.UnbindOk)

    def _queue_purge(self, m: spec.Queue.Purge) -> None:
        name = self._queue_name(m.queue)
        permissions.queue_purge(self.reader.user, self.vhost.name, name)
        queue = self.vhost.queues.lookup(name, self.reader)
        count = [queue.purge()]
        if m.nowait:
            return
        # A quorum queue in a cluster purges in PostgreSQL: purge-ok after that, with what it removed.
        reply = self._answer_later(lambda: self.send(spec.Queue.PurgeOk, message_count=count[0]), CLASS_QUEUE, 30)

        def purged(n: int) -> None:
            count[0] = n
            reply()

        if queue.purge_count_wait(purged):
            self.pipeline.pause()
            return
        self.send(spec.Queue.PurgeOk, message_count=count[0])

    def _queue_delete(self, m: spec.Queue.Delete) -> None:
        name = self._queue_name(m.queue)
        permissions.queue_delete(self.reader.user, self.vhost.name, name)
        queue = self.vhost.queues.get(name)
        if queue is None:
            self.vhost.remote.refuse(name, "delete")  # another cluster member's queue: 405
        if queue is not None:
            self.vhost.queues.check_exclusive_access(queue, self.reader)
            where = f"queue '{name}' in vhost '{self.vhost.name}'"
            if (m.if_unused or m.if_empty) and queue.type_name == "quorum":
                # RabbitMQ 3.10 (probed, 3.10.8): a connection error, whatever the queue holds. In a cluster
                # the flags could not be judged here anyway: other members' consumers and counts are theirs.
                flag = "if-unused" if m.if_unused else "if-empty"
                raise AMQPError(NOT_IMPLEMENTED, f"cannot delete {where}. queue.delete operations with {flag} "
                                "flag set are not supported by quorum queues")
            if m.if_unused and queue.consumers.count:
                raise AMQPError(PRECONDITION_FAILED, f"{where} in use")
            if m.if_empty and queue.message_count():
                raise AMQPError(PRECONDITION_FAILED, f"{where} not empty")
            # A quorum queue in a cluster recounts first (as for declare-ok): delete-ok counts what other
            # members published, not this member's estimate.
            if queue.message_count_wait(self._answer_later(lambda: self._delete(queue, m.nowait), CLASS_QUEUE, 40)):
                self.pipeline.pause()
                return
            self._delete(queue, m.nowait)
        elif not m.nowait:
            self.send(spec.Queue.DeleteOk, message_count=0)

    def _delete(self, queue: Any, nowait: bool) -> None:
        """The end of a queue.delete: delete-ok with the messages the queue held (none if it went meanwhile).

        The basic.cancel of this channel's own consumers of the queue follows delete-ok, as in RabbitMQ,
        where the channel answers delete-ok as soon as the queue process has gone and learns of its
        consumers' end only afterwards, from the queue's exit (its ``queue_down`` / eol handling sends the
        cancel). A client blocked in queue.delete must get its answer first: py-amqp raises
        ConsumerCancelled for a server cancel of a consumer registered without ``on_cancel`` (kombu's),
        so a cancel ahead of delete-ok failed the delete itself (kombu's test_ack_from_another_thread)."""
        count = 0
        cancelled: list[str] = []
        if not queue.deleted:
            count = queue.message_count()
            self._cancels_after_delete = cancelled
            try:
                self.vhost.queues.delete(queue)
            finally:
                self._cancels_after_delete = None
        if not nowait:
            self.send(spec.Queue.DeleteOk, message_count=count)
        for tag in cancelled:
            self.send(spec.Basic.Cancel, consumer_tag=tag, nowait=True)

    def _confirm_select(self, m: spec.Confirm.Select) -> None:
        if self.tx is not None:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = Confirms()
        if not m.nowait:
            self.send(spec.Confirm.SelectOk)

    def _tx_select(self, m: spec.Tx.Select) -> None:
        if self.confirms is not None:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()
        self.send(spec.Tx.SelectOk)

    def _tx_commit(self, m: spec.Tx.Commit) -> None:
        tx = self.tx
        if tx is None:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional")
        for kind, item in tx.commit():
            if kind == "publish":
                exchange, args, msg, persistent = item
                if self.vhost.exchanges.get(exchange.name) is exchange or exchange.name == "":
                    tx.routed(self._route(exchange, args, msg, persistent, tx.next_token()) >> PENDING)
            else:
                self._settle(item, kind)
        # commit-ok means the transaction's persistent messages are on disk, as a confirm would.
        self._answer_commits(tx.applied())

    def _answer_commits(self, answer: int) -> None:
        """Send the commit-oks the transaction allows (broker/amqp/tx.py), or close for a failed store."""
        if self.closing or not answer:
            return
        if answer == COMMIT_FAILED:
            # commit-ok would claim the messages are on disk; there is no tx.commit failure reply in
            # AMQP 0-9-1, so the connection is closed with 541 (the client must assume the commit failed).
            self.reader.channel_error(self.id, AMQPError(
                INTERNAL_ERROR, "tx.commit: the transaction's persistent messages could not be written to disk"))
            return
        for _ in range(answer):
            self.send(spec.Tx.CommitOk)

    def _tx_rollback(self, m: spec.Tx.Rollback) -> None:
        if self.tx is None:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional")
        # Acks that are rolled back leave their deliveries unacked again (nothing is requeued).
        restored = self.tx.rollback()
        if restored:
            self.unacked = dict(sorted([*self.unacked.items(), *restored]))
        self.send(spec.Tx.RollbackOk)

    def _channel_flow(self, m: spec.Channel.Flow) -> None:
        if not m.active:
            raise AMQPError(NOT_IMPLEMENTED, "active=false")
        self.send(spec.Channel.FlowOk, active=True)

    # -- shutdown ----------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Release everything the channel holds: consumers go, unacked deliveries are requeued. Called
        just before the channel's close or close-ok is sent: confirms already settled this tick go out
        first (they are true), and from here on the channel writes nothing (``closing``)."""
        confirms = self.confirms
        if confirms is not None and confirms.settled:
            self.flush_confirms()
        self.closing = True
        for queue in self.published_to:
            queue.publisher_channels.discard(self)
        self.published_to.clear()
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        if self.reply_consumer is not None:
            direct_reply_to.stop(self.reader.node, self.reply_consumer)
            self.reply_consumer = None
        if self.tx:
            # Acks still waiting in an uncommitted transaction were never applied: requeue those too.
            self.unacked.update(self.tx.held_acks())
        pairs = list(self.unacked.items())
        self.unacked.clear()
        if pairs:
            self._settle(pairs, "requeue")
        self.tx = None
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self._ack_deadlines.clear()
        if confirms is not None:
            confirms.clear()
        self.assembler.reset()
        self.pipeline.clear()


Channel._handlers = {
    spec.Basic.Qos: Channel._basic_qos,
    spec.Basic.Consume: Channel._basic_consume,
    spec.Basic.Cancel: Channel._basic_cancel,
    spec.Basic.Get: Channel._basic_get,
    spec.Basic.Recover: Channel._basic_recover,
    spec.Basic.RecoverAsync: Channel._basic_recover,
    spec.Exchange.Declare: Channel._exchange_declare,
    spec.Exchange.Delete: Channel._exchange_delete,
    spec.Exchange.Bind: Channel._exchange_bind,
    spec.Exchange.Unbind: Channel._exchange_unbind,
    spec.Queue.Declare: Channel._queue_declare,
    spec.Queue.Bind: Channel._queue_bind,
    spec.Queue.Unbind: Channel._queue_unbind,
    spec.Queue.Purge: Channel._queue_purge,
    spec.Queue.Delete: Channel._queue_delete,
    spec.Confirm.Select: Channel._confirm_select,
    spec.Tx.Select: Channel._tx_select,
    spec.Tx.Commit: Channel._tx_commit,
    spec.Tx.Rollback: Channel._tx_rollback,
    spec.Channel.Flow: Channel._channel_flow,
}
