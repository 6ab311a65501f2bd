"""Publisher confirms, transactions and direct reply-to against a real broker, through pika.

What is encoded is RabbitMQ 3.10's behaviour (docs/decisions/rabbitmq-parity.md):
confirm numbering and `multiple` acks, `basic.return` before the confirm of an unroutable mandatory message,
transactional publishes/acks/rejects, returns before `tx.commit-ok`, the 406s for mixing tx and confirm
modes, and the rules of the `amq.rabbitmq.reply-to` pseudo-queue.

pika's BlockingChannel waits for every confirm in turn (so it never sees `multiple=True`) and dispatches
returns apart from acks, so the ordering tests drive the underlying ``channel._impl`` (pika.channel.Channel)
and record frames in the order they come off the wire.
"""

from __future__ import annotations

import time

import pika
import pytest
from amqp_helpers import expect_channel_error, publish, pump, ready_count, settle, wait_ready
from pika import spec
from pika.exceptions import ChannelClosedByBroker, UnroutableError

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, conn, cleanup, make_queue, make_exchange, dl_setup
pytestmark = pytest.mark.timeout(60)

REPLY_TO = "amq.rabbitmq.reply-to"


# -- helpers ---------------------------------------------------------------------------------------------


def get_bodies(conn: pika.BlockingConnection, queue: str) -> list[bytes]:
    """Take (and ack) everything ready in ``queue``."""
    ch = conn.channel()
    out = []
    while True:
        method, _p, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append(body)
    ch.close()
    return out


class ConfirmRecorder:
    """Puts a channel in confirm mode at the pika.channel.Channel level and records, in wire order,
    every basic.ack / basic.nack / basic.return; expands ``multiple`` acks over the outstanding tags."""

    def __init__(self, conn: pika.BlockingConnection, ch) -> None:
        self.conn = conn
        self.impl = ch._impl
        self.events: list = []  # Basic.Ack / Basic.Nack / Basic.Return method objects, in arrival order
        self.returned: list[tuple[spec.Basic.Return, pika.BasicProperties, bytes]] = []
        self.next_tag = 1
        self.outstanding: set[int] = set()
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.problems: list[str] = []
        selected = []
        self.impl.add_on_return_callback(self._on_return)
        self.impl.confirm_delivery(self._on_confirm, callback=lambda frame: selected.append(frame.method))
        assert pump(conn, lambda: selected or ch.is_closed)
        assert isinstance(selected[0], spec.Confirm.SelectOk)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        mandatory: bool = False,
        properties: pika.BasicProperties | None = None,
    ) -> int:
        self.impl.basic_publish(exchange, routing_key, body, properties, mandatory)
        tag = self.next_tag
        self.next_tag += 1
        self.outstanding.add(tag)
        return tag

    def _on_return(self, _ch, method, props, body) -> None:
        self.events.append(method)
        self.returned.append((method, props, body))

    def _on_confirm(self, frame) -> None:
        m = frame.method
        self.events.append(m)
        if m.multiple:
            tags = {t for t in self.outstanding if t <= m.delivery_tag}
        else:
            tags = {m.delivery_tag}
            if m.delivery_tag not in self.outstanding:
                self.problems.append(f"{m} confirms a tag that is not outstanding")
        self.outstanding -= tags
        (self.acked if isinstance(m, spec.Basic.Ack) else self.nacked).update(tags)

    def wait_all(self, timeout: float = 5.0) -> None:
        assert pump(self.conn, lambda: not self.outstanding, timeout), (
            f"unconfirmed: {sorted(self.outstanding)}"
        )

    def confirm_index(self, tag: int) -> int:
        """Position in ``events`` of the ack/nack that covers ``tag``."""
        for i, e in enumerate(self.events):
            if isinstance(e, (spec.Basic.Ack, spec.Basic.Nack)) and (
                e.delivery_tag == tag or (e.multiple and e.delivery_tag >= tag)
            ):
                return i
        raise AssertionError(f"tag {tag} never confirmed: {self.events}")


# -- confirm.select and acks ----------------------------------------------------------------------------


def test_confirm_select_ok(conn):
    ch = conn.channel()
    replies = []
    ch._impl._rpc(spec.Confirm.Select(), lambda f: replies.append(f.method), [spec.Confirm.SelectOk])
    assert pump(conn, lambda: replies)
    assert isinstance(replies[0], spec.Confirm.SelectOk)


def test_confirm_select_twice_is_fine(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    replies = []
    ch._impl._rpc(spec.Confirm.Select(), lambda f: replies.append(f.method), [spec.Confirm.SelectOk])
    assert pump(conn, lambda: replies or ch.is_closed)
    assert ch.is_open
    assert isinstance(replies[0], spec.Confirm.SelectOk)


def test_blocking_publishes_all_acked(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", q, f"m{i}".encode())  # raises on nack or return
    assert ready_count(conn, q) == 50


def test_every_publish_confirmed_exactly_once(conn, make_queue):
    q = make_queue()
    rec = ConfirmRecorder(conn, conn.channel())
    n = 500
    for i in range(n):
        rec.publish("", q, b"x%d" % i)
    rec.wait_all()
    settle(conn, 0.1)
    assert rec.problems == []
    assert rec.acked == set(range(1, n + 1))
    assert rec.nacked == set()
    assert rec.returned == []
    assert all(isinstance(e, spec.Basic.Ack) for e in rec.events)
    assert all(e.delivery_tag <= n for e in rec.events)
    assert ready_count(conn, q) == n


def test_confirm_numbering_starts_at_one_at_select(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    for _ in range(3):  # publishes before confirm.select do not count
        ch.basic_publish("", q, b"early")
    rec = ConfirmRecorder(conn, ch)
    rec.publish("", q, b"first confirmed")
    rec.wait_all()
    assert rec.events[0].delivery_tag == 1
    assert rec.acked == {1}


def test_confirm_tags_are_per_channel(conn, make_queue):
    q = make_queue()
    a = ConfirmRecorder(conn, conn.channel())
    b = ConfirmRecorder(conn, conn.channel())
    a.publish("", q, b"a1")
    a.publish("", q, b"a2")
    b.publish("", q, b"b1")
    a.wait_all()
    b.wait_all()
    assert a.acked == {1, 2}
    assert b.acked == {1}
    assert a.problems == b.problems == []


def test_unroutable_mandatory_returned_before_ack(conn, uid):
    rec = ConfirmRecorder(conn, conn.channel())
    tag = rec.publish("", f"{uid}-no-such-queue", b"lost", mandatory=True)
    rec.wait_all()
    assert rec.acked == {tag}  # an unroutable message is acked, not nacked
    assert len(rec.returned) == 1
    ret, _props, body = rec.returned[0]
    assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
    assert (ret.exchange, ret.routing_key, body) == ("", f"{uid}-no-such-queue", b"lost")
    assert rec.events.index(ret) < rec.confirm_index(tag)


def test_return_precedes_ack_among_routable_messages(conn, make_queue, uid):
    q = make_queue()
    rec = ConfirmRecorder(conn, conn.channel())
    for _ in range(20):
        rec.publish("", q, b"routed")
    lost = rec.publish("amq.direct", f"{uid}-unbound", b"lost", mandatory=True)
    for _ in range(20):
        rec.publish("", q, b"routed", mandatory=True)
    rec.wait_all()
    assert rec.problems == []
    assert rec.acked == set(range(1, 42)) and rec.nacked == set()
    returns = [e for e in rec.events if isinstance(e, spec.Basic.Return)]
    assert len(returns) == 1
    assert (returns[0].reply_code, returns[0].exchange, returns[0].routing_key) == (
        312,
        "amq.direct",
        f"{uid}-unbound",
    )
    assert rec.events.index(returns[0]) < rec.confirm_index(lost)
    assert ready_count(conn, q) == 40


def test_unroutable_non_mandatory_is_acked_without_return(conn, uid):
    rec = ConfirmRecorder(conn, conn.channel())
    tag = rec.publish("", f"{uid}-no-such-queue", b"dropped")
    tag2 = rec.publish("amq.fanout", "", b"dropped too")  # assuming nobody bound a queue to amq.fanout
    rec.wait_all()
    settle(conn, 0.1)
    assert rec.acked == {tag, tag2}
    assert rec.returned == []


def test_blocking_unroutable_non_mandatory_does_not_raise(conn, uid):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", f"{uid}-no-such-queue", b"x")  # acked: no exception
    assert ch.is_open


def test_blocking_unroutable_mandatory_raises_unroutable(conn, uid):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish("", f"{uid}-no-such-queue", b"x", mandatory=True)
    [returned] = ei.value.messages
    assert returned.method.reply_code == 312
    assert returned.body == b"x"
    assert ch.is_open


def test_mandatory_routable_is_acked_without_return(conn, make_queue):
    q = make_queue()
    rec = ConfirmRecorder(conn, conn.channel())
    rec.publish("", q, b"x", mandatory=True)
    rec.wait_all()
    settle(conn, 0.1)
    assert rec.acked == {1}
    assert rec.returned == []


def test_message_to_several_queues_is_acked_once(conn, make_queue, uid):
    qa, qb = make_queue("a"), make_queue("b")
    ch = conn.channel()
    ex = f"{uid}-fan"
    ch.exchange_declare(ex, "fanout", auto_delete=True)
    ch.queue_bind(qa, ex)
    ch.queue_bind(qb, ex)
    rec = ConfirmRecorder(conn, ch)
    rec.publish(ex, "", b"both")
    rec.wait_all()
    settle(conn, 0.1)
    assert rec.acked == {1}
    assert len(rec.events) == 1
    assert get_bodies(conn, qa) == [b"both"]
    assert get_bodies(conn, qb) == [b"both"]


def test_persistent_message_to_durable_queue_is_acked(conn, make_queue):
    q = make_queue("durable", durable=True)
    rec = ConfirmRecorder(conn, conn.channel())
    props = pika.BasicProperties(delivery_mode=2)
    for i in range(10):
        rec.publish("", q, b"p%d" % i, properties=props)
    rec.wait_all(timeout=10)
    assert rec.acked == set(range(1, 11))
    assert ready_count(conn, q) == 10


def test_publish_to_missing_exchange_in_confirm_mode_is_404_not_nack(conn, uid):
    ch = conn.channel()
    rec = ConfirmRecorder(conn, ch)
    rec.publish(f"{uid}-nope", "rk", b"x")
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 404
    assert rec.nacked == set()


# -- tx.select / commit / rollback ----------------------------------------------------------------------


def test_tx_select_ok_and_twice(conn):
    ch = conn.channel()
    ch.tx_select()
    ch.tx_select()  # selecting again is fine
    ch.tx_commit()  # committing nothing is fine
    ch.tx_rollback()
    assert ch.is_open


def test_tx_publishes_invisible_until_commit(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", q, b"m%d" % i)
    ch.basic_qos(prefetch_count=0)  # a round trip on the tx channel: the publishes have arrived
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0
    ch.tx_commit()
    assert wait_ready(conn, q, 3) == 3
    assert get_bodies(conn, q) == [b"m0", b"m1", b"m2"]


def test_tx_rollback_discards_publishes(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"discarded")
    ch.tx_rollback()
    ch.tx_commit()  # nothing left to commit
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0


def test_tx_stays_transactional_after_commit_and_rollback(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"one")
    ch.tx_commit()
    ch.basic_publish("", q, b"two")
    ch.basic_qos(prefetch_count=0)
    settle(conn, 0.1)
    assert ready_count(conn, q) == 1  # "two" waits for the next commit
    ch.tx_rollback()
    ch.basic_publish("", q, b"three")
    ch.tx_commit()
    assert wait_ready(conn, q, 2) == 2
    assert get_bodies(conn, q) == [b"one", b"three"]


def test_tx_uncommitted_publishes_dropped_when_channel_closes(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"never")
    ch.close()
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0


def _tx_take_one(conn, make_queue):
    q = make_queue()
    publish(conn, q, b"m")
    ch = conn.channel()
    ch.tx_select()
    method, _p, body = ch.basic_get(q)
    assert body == b"m"
    return q, ch, method.delivery_tag


def test_tx_ack_then_rollback_leaves_message_unacked(conn, make_queue):
    q, ch, tag = _tx_take_one(conn, make_queue)
    ch.basic_ack(tag)
    ch.tx_rollback()
    assert ready_count(conn, q) == 0  # still unacked, not requeued by the rollback
    ch.close()  # still unacked, so closing the channel requeues it
    assert wait_ready(conn, q, 1) == 1


def test_tx_ack_rolled_back_can_be_acked_again(conn, make_queue):
    q, ch, tag = _tx_take_one(conn, make_queue)
    ch.basic_ack(tag)
    ch.tx_rollback()
    ch.basic_ack(tag)  # not a double ack: the first one was rolled back
    ch.tx_commit()
    assert ch.is_open
    ch.close()
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0


def test_tx_ack_then_commit_acks(conn, make_queue):
    q, ch, tag = _tx_take_one(conn, make_queue)
    ch.basic_ack(tag)
    ch.tx_commit()
    ch.close()
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0


def test_tx_uncommitted_ack_is_discarded_on_close(conn, make_queue):
    q, ch, tag = _tx_take_one(conn, make_queue)
    ch.basic_ack(tag)
    ch.close()
    assert wait_ready(conn, q, 1) == 1


def test_tx_reject_requeue_waits_for_commit(conn, make_queue):
    q, ch, tag = _tx_take_one(conn, make_queue)
    ch.basic_reject(tag, requeue=True)
    ch.basic_qos(prefetch_count=0)
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0
    ch.tx_commit()
    assert wait_ready(conn, q, 1) == 1
    method, _p, body = conn.channel().basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"m", True)


def test_tx_nack_discard_rolled_back(conn, make_queue):
    q, ch, tag = _tx_take_one(conn, make_queue)
    ch.basic_nack(tag, requeue=False)
    ch.tx_rollback()
    ch.close()  # the nack never happened: the message is requeued
    assert wait_ready(conn, q, 1) == 1


def test_tx_rollback_does_not_requeue_deliveries(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.tx_select()
    got = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append((m, b)))
    publish(conn, q, b"a", b"b")
    assert pump(conn, lambda: len(got) == 2)  # deliveries are not transactional
    ch.tx_rollback()
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0
    assert len(got) == 2  # and nothing was redelivered
    ch.basic_ack(got[1][0].delivery_tag, multiple=True)
    ch.tx_commit()
    ch.close()
    settle(conn, 0.1)
    assert ready_count(conn, q) == 0


def test_tx_returns_arrive_before_commit_ok(conn, uid, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.tx_select()
    events = []
    ch._impl.add_on_return_callback(lambda _c, m, _p, body: events.append((m, body)))
    ch._impl.basic_publish("", q, b"routed", None, True)
    ch._impl.basic_publish("", f"{uid}-no-such-queue", b"lost", None, True)
    ch._impl.tx_commit(callback=lambda frame: events.append((frame.method, None)))
    assert pump(conn, lambda: any(isinstance(m, spec.Tx.CommitOk) for m, _ in events))
    settle(conn, 0.1)
    kinds = [type(m) for m, _ in events]
    assert kinds == [spec.Basic.Return, spec.Tx.CommitOk]
    ret, body = events[0]
    assert (ret.reply_code, ret.reply_text, body) == (312, "NO_ROUTE", b"lost")
    assert get_bodies(conn, q) == [b"routed"]


def test_tx_publish_to_missing_exchange_fails_at_once(conn, uid):
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish(f"{uid}-nope", "rk", b"x")  # no commit: the error is not deferred to it
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 404


def test_tx_select_after_confirm_is_406(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.tx_select()
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
    assert conn.is_open


def test_confirm_select_after_tx_is_406(conn):
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.confirm_delivery()
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - cannot switch from tx to confirm mode"
    assert conn.is_open


@pytest.mark.parametrize("method", ["commit", "rollback"])
def test_tx_commit_or_rollback_without_select_is_406(conn, method):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.tx_commit() if method == "commit" else ch.tx_rollback()
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - channel is not transactional"
    assert conn.is_open


# -- direct reply-to ------------------------------------------------------------------------------------


def test_direct_reply_to_round_trip(connect, make_queue):
    server_q = make_queue("rpc")
    client = connect()
    cch = client.channel()
    replies = []
    cch.basic_consume(REPLY_TO, lambda _c, m, p, b: replies.append((m, p, b)), auto_ack=True)
    cch.basic_publish(
        "", server_q, b"request", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="corr-42")
    )
    server = connect()
    sch = server.channel()
    method = None
    deadline = time.monotonic() + 5
    while method is None and time.monotonic() < deadline:
        method, props, body = sch.basic_get(server_q, auto_ack=True)
        if method is None:
            time.sleep(0.02)
    assert body == b"request"
    assert props.reply_to.startswith(REPLY_TO + ".")  # rewritten to the requester's private name
    assert len(props.reply_to) > len(REPLY_TO) + 1
    assert props.correlation_id == "corr-42"
    sch.confirm_delivery()
    sch.basic_publish(
        "", props.reply_to, b"response", pika.BasicProperties(correlation_id=props.correlation_id)
    )
    assert pump(client, lambda: replies)
    m, p, b = replies[0]
    assert b == b"response"
    assert p.correlation_id == "corr-42"
    assert m.exchange == ""
    assert m.routing_key == props.reply_to
    assert m.redelivered is False


def test_direct_reply_to_mandatory_reply_is_delivered(connect, make_queue):
    # RabbitMQ 3.10 delivers such a reply AND sends basic.return 312 NO_ROUTE for it (the pseudo-queue
    # is not a routed queue); only the delivery is asserted here, not that quirk.
    server_q = make_queue("rpc")
    client = connect()
    cch = client.channel()
    replies = []
    cch.basic_consume(REPLY_TO, lambda _c, m, p, b: replies.append(b), auto_ack=True)
    cch.basic_publish("", server_q, b"request", pika.BasicProperties(reply_to=REPLY_TO))
    server = connect()
    assert wait_ready(server, server_q, 1) == 1
    sch = server.channel()
    _m, props, _b = sch.basic_get(server_q, auto_ack=True)
    sch.basic_publish("", props.reply_to, b"response", mandatory=True)
    assert pump(client, lambda: replies)
    assert replies == [b"response"]


def test_direct_reply_to_several_replies(connect, make_queue):
    server_q = make_queue("rpc")
    client = connect()
    cch = client.channel()
    replies = []
    cch.basic_consume(REPLY_TO, lambda _c, m, p, b: replies.append(b), auto_ack=True)
    for i in range(3):
        cch.basic_publish("", server_q, b"req%d" % i, pika.BasicProperties(reply_to=REPLY_TO))
    server = connect()
    assert wait_ready(server, server_q, 3) == 3
    sch = server.channel()
    for _ in range(3):
        _m, props, body = sch.basic_get(server_q, auto_ack=True)
        sch.basic_publish("", props.reply_to, body.replace(b"req", b"resp"))
    assert pump(client, lambda: len(replies) == 3)
    assert replies == [b"resp0", b"resp1", b"resp2"]


def test_publish_with_reply_to_without_reply_consumer_is_406(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to=REPLY_TO))
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406
    assert err.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    assert ready_count(conn, q) == 0


def test_reply_consumer_on_another_channel_does_not_count(conn, make_queue):
    q = make_queue()
    conn.channel().basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    ch = conn.channel()
    ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to=REPLY_TO))
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406


def test_reply_to_consume_without_no_ack_is_406(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"
    assert conn.is_open


def test_second_reply_to_consumer_on_same_channel_is_406(conn):
    ch = conn.channel()
    ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text == "PRECONDITION_FAILED - reply consumer already set"


def test_reply_to_consumers_on_two_channels_are_fine(conn):
    ch1, ch2 = conn.channel(), conn.channel()
    ch1.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    ch2.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    assert ch1.is_open and ch2.is_open


def test_reply_to_passive_declare_succeeds(conn):
    ch = conn.channel()
    ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    ok = ch.queue_declare(REPLY_TO, passive=True).method
    assert ok.queue == REPLY_TO
    assert ok.message_count == 0


def test_reply_to_basic_get_is_404(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_get(REPLY_TO)
    assert ei.value.reply_code == 404


def test_reply_to_cannot_be_bound(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind(REPLY_TO, "amq.direct", "rk")
    # RabbitMQ's documentation says 403; RabbitMQ 3.10 answers 404 "no queue 'amq.rabbitmq.reply-to'"
    assert ei.value.reply_code in (403, 404)
    assert conn.is_open


def test_reply_to_unknown_or_gone_requester_is_unroutable(connect, make_queue):
    server_q = make_queue("rpc")
    client = connect()
    cch = client.channel()
    cch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    cch.basic_publish("", server_q, b"req", pika.BasicProperties(reply_to=REPLY_TO))
    server = connect()
    assert wait_ready(server, server_q, 1) == 1
    sch = server.channel()
    _m, props, _b = sch.basic_get(server_q, auto_ack=True)
    client.close()  # the requester is gone
    sch.confirm_delivery()
    sch.basic_publish("", props.reply_to, b"late")  # non-mandatory: dropped, acked
    with pytest.raises(UnroutableError) as ei:
        sch.basic_publish("", props.reply_to, b"late", mandatory=True)
    assert ei.value.messages[0].method.reply_code == 312
    with pytest.raises(UnroutableError):
        sch.basic_publish("", REPLY_TO + ".garbage", b"x", mandatory=True)
    assert sch.is_open


def test_cancelled_reply_consumer_no_longer_allows_reply_to(conn, make_queue):
    q = make_queue()
    ch = conn.channel()
    tag = ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to=REPLY_TO))
    err = expect_channel_error(conn, ch)
    assert err.reply_code == 406
