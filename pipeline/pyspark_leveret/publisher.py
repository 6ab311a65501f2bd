"""Publishing one Spark task's messages with publisher confirms and a bounded window of unconfirmed ones.

pika's ``BlockingChannel`` in confirm mode waits for each message's confirm before the next publish (one
round trip per row), so this drives pika's asynchronous ``SelectConnection`` on the task's own thread: up to
``max_in_flight`` publishes are outstanding, each ack opens room for more, and the call returns only when
every message is confirmed. Anything that means a message may not have landed raises
:class:`PublishFailed`, which fails the Spark task so that Spark runs it again: a ``basic.nack``, a
``basic.return`` of a mandatory publish, the channel or connection closing, or no confirm progress for
``confirm_timeout`` seconds. The retried task publishes the same message ids (rows_to_messages.py), which a
de-duplicating queue drops.

The messages come in lists, one per Arrow batch, pulled from the caller's iterator inside the I/O loop. A
pull can block for as long as the upstream Spark stage takes to compute the next batch, so before each pull
the loop gets one turn to write what the previous batch published: rows reach the broker when their batch
is mapped, not when the next one is. A pull that blocks longer than the negotiated heartbeat timeout costs
the connection (and so the task, which Spark retries).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pika
from pika.channel import Channel
from pika.spec import Basic

from pyspark_leveret.rows_to_messages import Message
from pyspark_leveret.tls import NO_TLS_FILES, TLSFiles, pika_parameters

CLOSE_GRACE = 2.0  # seconds a failed task waits for connection.close-ok before it gives up on it


class PublishFailed(RuntimeError):
    """The broker did not take every message of the task (nack, return, closed channel, stalled confirms)."""


@dataclass(frozen=True)
class PublishSettings:
    """How a task publishes; plain data, pickled from the driver to each task."""

    uri: str
    max_in_flight: int = 1000
    mandatory: bool = False
    confirm_timeout: float = 120.0
    tls_files: TLSFiles = NO_TLS_FILES


def publish_confirmed(settings: PublishSettings, batches: Iterator[Sequence[Message]]) -> int:
    """Publish every message and wait for all confirms; return how many were published. A task with no
    messages opens no connection (streaming micro-batches often leave partitions empty)."""
    first = next((batch for batch in batches if batch), None)
    if first is None:
        return 0
    return _ConfirmedRun(settings, first, batches).run()


class _ConfirmedRun:
    """One connection's life: open, confirm.select, pump the window, close; the outcome is read after the
    I/O loop stops. Callbacks never raise into pika (it would log and carry on); they record the first
    failure and close the connection, and :meth:`run` raises it."""

    def __init__(self, settings: PublishSettings, first: Sequence[Message],
                 rest: Iterator[Sequence[Message]]) -> None:
        self.settings = settings
        self.batch = first  # the list being published, up to ``pos``
        self.pos = 0
        self.rest = rest
        self.drain_pending = False  # a turn of the loop is scheduled before the next pull
        self.published = 0
        self.confirmed = 0
        self.acked_floor = 0
        self.acked_above: set[int] = set()
        self.exhausted = False
        self.error: BaseException | None = None
        self.closing = False
        self.last_progress = time.monotonic()
        self.channel: Channel | None = None
        self.conn = pika.SelectConnection(
            pika_parameters(settings.uri, settings.tls_files),
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )

    def run(self) -> int:
        self.conn.ioloop.start()
        if self.error is not None:
            raise self.error
        if self.confirmed != self.published:  # the loop stopped for a reason no callback recorded
            raise PublishFailed(f"{self.published - self.confirmed} of {self.published} publishes unconfirmed")
        return self.published

    # -- failure and shutdown ----------------------------------------------------------------------------
    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._close()

    def _close(self) -> None:
        """Close politely; a broker that has stopped reading this connection (a resource alarm blocks
        publishers) never answers connection.close, so after ``CLOSE_GRACE`` seconds the loop stops anyway
        and the socket goes with the task's objects."""
        if self.closing:
            return
        self.closing = True
        if self.conn.is_open:
            self.conn.close()
            self.conn.ioloop.call_later(CLOSE_GRACE, self.conn.ioloop.stop)
        elif not self.conn.is_closing:
            self.conn.ioloop.stop()

    def _on_open_error(self, _conn: Any, err: BaseException) -> None:
        self.error = self.error or PublishFailed(f"could not connect to {_safe(self.settings.uri)}: {err!r}")
        self.conn.ioloop.stop()

    def _on_closed(self, _conn: Any, reason: BaseException) -> None:
        if not self.closing and self.error is None:
            self.error = PublishFailed(f"connection closed while publishing: {reason!r}")
        self.conn.ioloop.stop()

    # -- set-up ------------------------------------------------------------------------------------------
    def _on_open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: Channel) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=lambda _frame: self._pump())
        self.conn.ioloop.call_later(1.0, self._watchdog)

    def _on_channel_closed(self, _channel: Channel, reason: BaseException) -> None:
        if not self.closing:
            self._fail(PublishFailed(f"channel closed while publishing: {reason}"))

    # -- the window --------------------------------------------------------------------------------------
    def _pump(self, after_drain: bool = False) -> None:
        """Publish until the window is full or the rows run out; finish when all are confirmed. At the end of
        a list, give the loop a turn to write it (see the module's docstring) before pulling the next."""
        channel = self.channel
        assert channel is not None
        mandatory = self.settings.mandatory
        if after_drain:
            self.drain_pending = False
        try:
            while not self.exhausted and self.error is None \
                    and self.published - self.confirmed < self.settings.max_in_flight:
                if self.pos == len(self.batch):
                    if self.drain_pending:
                        return  # the scheduled turn pulls next, once the loop has written this list
                    if not after_drain:
                        self.drain_pending = True
                        self._after_one_poll(lambda: self._pump(after_drain=True))
                        return
                    after_drain = False
                    batch = next(self.rest, None)
                    if batch is None:
                        self.exhausted = True
                        break
                    self.batch, self.pos = batch, 0
                    continue
                msg = self.batch[self.pos]
                self.pos += 1
                channel.basic_publish(msg.exchange, msg.routing_key, msg.body, msg.properties, mandatory)
                self.published += 1
        except Exception as exc:  # noqa: BLE001 - a bad row or the upstream Spark stage: re-raised by run()
            self._fail(exc)
            return
        if self.exhausted and self.confirmed == self.published:
            self._close()

    def _after_one_poll(self, callback: Any) -> None:
        """Run ``callback`` once the loop has polled its socket (and so written what is buffered) at least
        once more. pika's loop polls, then runs the timers due; a timer added while timers run waits for the
        next pass. A timer that adds a timer therefore runs its callback after at least one poll, whether it
        was added from an I/O callback or from a timer."""
        ioloop = self.conn.ioloop
        ioloop.call_later(0, lambda: ioloop.call_later(0, callback))

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            self._fail(PublishFailed(f"the broker nacked publish #{method.delivery_tag}"
                                     f"{' and all before it' if method.multiple else ''}: not stored"))
            return
        self._record_ack(method.delivery_tag, method.multiple)
        self.last_progress = time.monotonic()
        if self.error is None:
            self._pump()

    def _record_ack(self, tag: int, multiple: bool) -> None:
        """Count confirms exactly even when single acks come out of order (a message routed to several
        queues is confirmed when the last of them has it): every tag up to ``acked_floor`` is confirmed,
        and ``acked_above`` holds the single acks beyond it."""
        if multiple:
            if tag > self.acked_floor:
                self.acked_floor = tag
                self.acked_above = {t for t in self.acked_above if t > tag}
        elif tag > self.acked_floor:
            self.acked_above.add(tag)
        while self.acked_floor + 1 in self.acked_above:
            self.acked_floor += 1
            self.acked_above.remove(self.acked_floor)
        self.confirmed = self.acked_floor + len(self.acked_above)

    def _on_return(self, _channel: Channel, method: Any, _props: Any, _body: bytes) -> None:
        self._fail(PublishFailed(
            f"a mandatory publish to exchange {method.exchange!r} with routing key {method.routing_key!r} "
            f"was returned: {method.reply_code} {method.reply_text}"))

    def _watchdog(self) -> None:
        if self.closing:
            return
        waiting = self.published > self.confirmed
        if waiting and time.monotonic() - self.last_progress > self.settings.confirm_timeout:
            self._fail(PublishFailed(f"no publisher confirm for {self.settings.confirm_timeout:.0f} s "
                                     f"({self.published - self.confirmed} outstanding)"))
            return
        if not waiting:
            self.last_progress = time.monotonic()
        self.conn.ioloop.call_later(1.0, self._watchdog)


def _safe(uri: str) -> str:
    """The URI without its password, for error messages that end up in Spark's logs."""
    params = pika.URLParameters(uri)
    return f"amqp://{params.host}:{params.port}/{params.virtual_host}"
