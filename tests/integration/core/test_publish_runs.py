"""Publishes that arrive together are answered one by one (broker/amqp/publish_run.py).

A client that writes many alike publishes at once (same exchange, routing key and properties) leaves them in
one read of the broker's, which takes them as one run: checked and routed once, handed to each queue in one
call. Each burst here is written in one ``sendall`` so that it is such a run, and each test checks an answer
the run must still give per message: a confirm or nack for each by what its queue did, a basic.return for each
unroutable one, the order of every queue, and an error that stops the channel before anything is published.
The same tests pass against RabbitMQ (tests/rabbitmq/), which handles each publish on its own.
"""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from rawamqp import RawAMQPClient, body_frame, content_header_frame, method_frame, raw_frame

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, cleanup, make_queue, make_exchange

BURST = 40


def _burst(channel: int, bodies: list[bytes], *, exchange: str = "", routing_key: str = "",
           properties: commands.Basic.Properties | None = None, mandatory: bool = False,
           delivery_mode: int | None = None) -> bytes:
    """The frames of one publish per body, alike but for the body, as one write. ``delivery_mode``: a raw
    content header with only that property (pamqp refuses to encode modes other than 1 and 2)."""
    publish = method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                           mandatory=mandatory))
    size = len(bodies[0])
    assert all(len(b) == size for b in bodies)  # one content header for all: one body size
    if delivery_mode is None:
        header = content_header_frame(channel, size, properties)
    else:
        header = raw_frame(2, channel, struct.pack(">HHQHB", 60, 0, size, 1 << 12, delivery_mode))
    return b"".join(publish + header + body_frame(channel, body) for body in bodies)


def _bodies(n: int, tag: str = "m") -> list[bytes]:
    return [f"{tag}{i:04d}".encode() for i in range(n)]


def _confirms(client: RawAMQPClient, channel: int, count: int) -> tuple[set[int], set[int]]:
    """Read confirms until ``count`` publishes are settled: (acked, nacked) sequence numbers. A multiple
    ack or nack settles every unsettled number up to its tag."""
    acked: set[int] = set()
    nacked: set[int] = set()
    while len(acked) + len(nacked) < count:
        frame = client.wait_for(lambda f: f.is_method(commands.Basic.Ack, channel)
                                or f.is_method(commands.Basic.Nack, channel))
        m = frame.value
        into = acked if isinstance(m, commands.Basic.Ack) else nacked
        tags = range(1, m.delivery_tag + 1) if m.multiple else (m.delivery_tag,)
        into.update(t for t in tags if t not in acked and t not in nacked)
    return acked, nacked


def _confirming_client(broker) -> RawAMQPClient:
    """A raw client whose channel 1 is open in confirm mode (a context manager: closed on exit)."""
    client = RawAMQPClient.for_broker(broker)
    client.handshake(heartbeat=0)
    client.open_channel(1)
    client.send_method(1, commands.Confirm.Select())
    client.expect_method(commands.Confirm.SelectOk, 1)
    return client


def _queue_bodies(connect, queue: str) -> list[bytes]:
    ch = connect().channel()
    out = []
    while True:
        _method, _props, body = ch.basic_get(queue, auto_ack=True)
        if body is None:
            return out
        out.append(body)


def test_a_burst_into_a_full_queue_is_confirmed_and_nacked_publish_by_publish(broker, connect, make_queue) -> None:
    queue = make_queue("limited", {"x-max-length": 5, "x-overflow": "reject-publish"})
    bodies = _bodies(12)
    with _confirming_client(broker) as client:
        client.send_raw(_burst(1, bodies, routing_key=queue))
        acked, nacked = _confirms(client, 1, len(bodies))
    assert acked == set(range(1, 6)) and nacked == set(range(6, 13)), (sorted(acked), sorted(nacked))
    assert _queue_bodies(connect, queue) == bodies[:5]


def test_a_burst_of_mandatory_publishes_to_no_queue_comes_back_publish_by_publish(broker, uid) -> None:
    bodies = _bodies(BURST)
    with _confirming_client(broker) as client:
        client.send_raw(_burst(1, bodies, routing_key=f"{uid}-nowhere", mandatory=True))
        returned: list[bytes] = []
        settled: list[int] = []
        while len(returned) < len(bodies) or len(settled) < len(bodies):
            frame = client.wait_for(lambda f: f.channel == 1)
            if frame.is_method(commands.Basic.Return):
                ret = frame.value
                assert (ret.reply_code, ret.reply_text, ret.routing_key) == (312, "NO_ROUTE", f"{uid}-nowhere")
            elif frame.type == 3:  # a returned message's body (its header comes before it)
                returned.append(frame.payload)
            elif frame.is_method(commands.Basic.Ack) or frame.is_method(commands.Basic.Nack):
                assert isinstance(frame.value, commands.Basic.Ack), frame.value
                tags = range(1, frame.value.delivery_tag + 1) if frame.value.multiple else [frame.value.delivery_tag]
                settled.extend(t for t in tags if t not in settled)
                # A confirm of an unroutable mandatory message follows its basic.return.
                assert len(returned) >= max(tags), (len(returned), frame.value)
    assert returned == bodies
    assert sorted(settled) == list(range(1, BURST + 1))


def test_a_burst_to_a_fanout_reaches_every_queue_in_order(broker, connect, make_queue, make_exchange) -> None:
    exchange = make_exchange("fan", "fanout")
    queues = [make_queue(f"q{i}") for i in range(3)]
    setup = connect().channel()
    for q in queues:
        setup.queue_bind(q, exchange)
    first, second = _bodies(BURST, "a"), _bodies(BURST, "b")
    with _confirming_client(broker) as client:
        # Two runs in one write: the second's persistent delivery mode makes its content header differ.
        client.send_raw(_burst(1, first, exchange=exchange)
                        + _burst(1, second, exchange=exchange,
                                 properties=commands.Basic.Properties(delivery_mode=2)))
        acked, nacked = _confirms(client, 1, 2 * BURST)
    assert acked == set(range(1, 2 * BURST + 1)) and not nacked
    for q in queues:
        assert _queue_bodies(connect, q) == first + second, q


def test_a_bad_publish_in_a_burst_stops_its_channel_where_it_stands(broker, connect, make_queue) -> None:
    """The first run is published; the second (an unknown delivery mode, refused by RabbitMQ up to 3.12)
    closes the channel at its first publish, and nothing of it or after it is published. The connection's
    other channel goes on."""
    queue = make_queue("target")
    good, bad, after = _bodies(7, "g"), _bodies(5, "x"), _bodies(5, "h")
    with RawAMQPClient.for_broker(broker) as client:
        client.handshake(heartbeat=0)
        client.open_channel(1)
        client.open_channel(2)
        client.send_raw(_burst(1, good, routing_key=queue)
                        + _burst(1, bad, routing_key=queue, delivery_mode=3)
                        + _burst(1, after, routing_key=queue)
                        + _burst(2, after, routing_key=queue))
        close = client.expect_channel_close(1)
        assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
        assert "delivery_mode_unknown,3" in close.reply_text
        client.send_method(2, commands.Confirm.Select())
        client.expect_method(commands.Confirm.SelectOk, 2)
    got = _queue_bodies(connect, queue)
    # Channel 2's publishes are in order among themselves, not necessarily after channel 1's (RabbitMQ: a
    # process per channel).
    assert [b for b in got if b.startswith(b"g")] == good and [b for b in got if b.startswith(b"h")] == after, got
    assert len(got) == len(good) + len(after), got


def test_a_burst_to_an_exchange_that_is_not_there_is_refused_at_its_first_publish(broker, connect, make_queue,
                                                                                  uid) -> None:
    queue = make_queue("after")
    with RawAMQPClient.for_broker(broker) as client:
        client.handshake(heartbeat=0)
        client.open_channel(1)
        client.open_channel(2)
        client.send_raw(_burst(1, _bodies(10), exchange=f"{uid}-missing") + _burst(2, _bodies(3), routing_key=queue))
        close = client.expect_channel_close(1)
        assert (close.reply_code, close.class_id, close.method_id) == (404, 60, 40)
        assert close.reply_text == f"NOT_FOUND - no exchange '{uid}-missing' in vhost '/'"
    assert _queue_bodies(connect, queue) == _bodies(3)


def test_a_burst_into_a_stream_is_confirmed_and_read_back_in_order(broker, connect, make_queue) -> None:
    """A stream takes a run in one append (StreamQueue.deliver_or_enqueue_run): each publish confirmed, each
    at its own offset, in order."""
    stream = make_queue("stream", {"x-queue-type": "stream"}, durable=True)
    bodies = _bodies(BURST)
    with _confirming_client(broker) as client:
        client.send_raw(_burst(1, bodies, routing_key=stream, properties=commands.Basic.Properties(delivery_mode=2)))
        acked, nacked = _confirms(client, 1, len(bodies))
    assert acked == set(range(1, BURST + 1)) and not nacked
    ch = connect().channel()
    ch.basic_qos(prefetch_count=BURST)
    got: list[tuple[int, bytes]] = []

    def on_message(channel, method, props, body) -> None:
        got.append((props.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
    deadline = 50
    while len(got) < BURST and deadline:
        ch.connection.process_data_events(time_limit=0.1)
        deadline -= 1
    assert [body for _, body in got] == bodies
    offsets = [offset for offset, _ in got]
    assert offsets == list(range(offsets[0], offsets[0] + BURST))


@pytest.mark.leveret_only  # RabbitMQ's queues are processes: where a dead letter lands among copies is a race there
def test_a_run_into_queues_that_dead_letter_as_they_take_answers_as_one_by_one(broker, connect, make_queue,
                                                                              make_exchange) -> None:
    """A fanout to A (length 1, drop-head, dead-lettering into B) and B (length 3, reject-publish): as each
    publish is taken, A's dropped head goes to B. Four publishes written at once as one run (alike) and as
    four different publishes (a message id each) must give the same confirms, nacks and contents of B; taken
    queue by queue, B fills with the run's copies before A's dead letters and the answers change."""
    outcomes = []
    for alike in (True, False):
        tag = "r" if alike else "s"
        fan = make_exchange(f"fan-{tag}", "fanout")
        dlx = make_exchange(f"dlx-{tag}", "fanout")
        b = make_queue(f"b-{tag}", {"x-max-length": 3, "x-overflow": "reject-publish"})
        a = make_queue(f"a-{tag}", {"x-max-length": 1, "x-overflow": "drop-head", "x-dead-letter-exchange": dlx})
        setup = connect().channel()
        setup.queue_bind(a, fan)
        setup.queue_bind(b, fan)
        setup.queue_bind(b, dlx)
        bodies = _bodies(4)
        with _confirming_client(broker) as client:
            if alike:
                client.send_raw(_burst(1, bodies, exchange=fan))
            else:
                client.send_raw(b"".join(_burst(1, [body], exchange=fan,
                                                properties=commands.Basic.Properties(message_id=str(i)))
                                         for i, body in enumerate(bodies)))
            acked, nacked = _confirms(client, 1, len(bodies))
        # (B's order of A's dead m0 and the copy of m1 follows the order the fanout lists A and B in, which
        # differs with the names: compared as a multiset.)
        outcomes.append((sorted(acked), sorted(nacked), sorted(_queue_bodies(connect, b))))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1] == ([1, 2], [3, 4], [b"m0000", b"m0000", b"m0001"])  # B: m0, A's dead m0, m1; then full


def test_a_burst_to_waiting_consumers_goes_round_while_they_have_room_and_queues_the_rest(broker, connect,
                                                                                          make_queue) -> None:
    """Two consumers with a prefetch of 3 wait on an empty queue: a run goes straight to them in turn until
    both are full (QueueProcess.deliver_or_enqueue_run), the rest is queued in order and delivered as they ack."""
    queue = make_queue("consumed")
    conn = connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    got: dict[str, list[bytes]] = {"one": [], "two": []}
    held: list[tuple[str, int]] = []

    def consumer(name: str):
        def on_message(_channel, method, _props, body) -> None:
            got[name].append(body)
            held.append((name, method.delivery_tag))
        return on_message

    ch.basic_consume(queue, consumer("one"), consumer_tag="one")
    ch.basic_consume(queue, consumer("two"), consumer_tag="two")
    bodies = _bodies(BURST)
    with RawAMQPClient.for_broker(broker) as client:
        client.handshake(heartbeat=0)
        client.open_channel(1)
        client.send_raw(_burst(1, bodies, routing_key=queue))
        client.send_method(1, commands.Confirm.Select())  # a round trip: the burst has been taken
        client.expect_method(commands.Confirm.SelectOk, 1)
    deadline = 30
    while len(held) < 6 and deadline:
        conn.process_data_events(time_limit=0.1)
        deadline -= 1
    conn.process_data_events(time_limit=0.3)
    assert sorted(got["one"] + got["two"]) == bodies[:6]  # both full: 3 each, the rest waits in the queue
    assert len(got["one"]) == len(got["two"]) == 3
    deadline = 100
    while sum(map(len, got.values())) < BURST and deadline:
        while held:
            ch.basic_ack(held.pop(0)[1])
        conn.process_data_events(time_limit=0.05)
        deadline -= 1
    assert sorted(got["one"] + got["two"]) == bodies
    for name, seen in got.items():
        assert seen == sorted(seen), name  # each consumer sees the queue's order
