"""A publisher into a wide fanout does not hold the broker for the whole of what it wrote (issue 19's cost
curves: one publish to 1,000 queues).

A burst of ``BURST`` small publishes to a fanout exchange bound to ``FANOUT`` queues is written in one
``sendall`` (one read for the broker: ~14 KiB, under its 16 KiB fairness slice), so before the work budget
(broker/amqp/reader.py's ``ROUTED_PER_TURN``) the broker handed all ``BURST × FANOUT`` copies over in one turn
of its loop and only then wrote or read anything else. One consumer channel consumes from the first fanout
queue and from another queue; when the burst's first copy reaches it, a second connection publishes one
message to that other queue. It must arrive before the burst's last copies, since the broker reads it
while the burst is still being routed (RabbitMQ's channel processes give the same: the second publisher is
not behind the first). Without the budget the first copy is written only once the whole burst is routed,
so the message comes last, every time. Ordering only, no timing.
"""

from __future__ import annotations

from pamqp import commands
from rawamqp import RawAMQPClient, body_frame, content_header_frame, method_frame

pytest_plugins = ["amqp_helpers"]  # its fixtures: connect, cleanup, make_exchange, make_queue

FANOUT = 400
BURST = 150


def _other_message_position(broker, connect, watched: str, other: str, exchange: str, routing_key: str) -> int:
    """Write ``BURST`` publishes to ``exchange`` / ``routing_key`` in one ``sendall``; when the first copy
    reaches ``watched``, a second connection publishes one message to ``other``. Returns how many of the
    burst's copies reached ``watched`` before it."""
    consumer = connect()
    ch = consumer.channel()
    arrivals: list[str] = []
    with RawAMQPClient.for_broker(broker) as burst, RawAMQPClient.for_broker(broker) as single:
        for c in (burst, single):
            c.handshake(heartbeat=0)
            c.open_channel(1)

        def on_burst_copy(*_args) -> None:
            if not arrivals:
                single.publish(1, b"y" * 16, routing_key=other)
            arrivals.append("burst")

        ch.basic_consume(watched, on_burst_copy, auto_ack=True)
        ch.basic_consume(other, lambda *_args: arrivals.append("other"), auto_ack=True)
        publish = method_frame(1, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
        content = content_header_frame(1, 16) + body_frame(1, b"x" * 16)
        burst.send_raw((publish + content) * BURST)

        deadline_turns = 0
        while len(arrivals) < BURST + 1 and deadline_turns < 300:
            consumer.process_data_events(time_limit=0.1)
            deadline_turns += 1
    assert arrivals.count("burst") == BURST and arrivals.count("other") == 1, arrivals.count("burst")
    return arrivals.index("other")


def _wide_fanout(connect, cleanup, uid: str, exchange: str) -> tuple[list[str], str]:
    """``FANOUT`` queues bound to ``exchange`` and one other queue, deleted at teardown."""
    setup = connect().channel()
    queues = [f"{uid}-f{i}" for i in range(FANOUT)]
    other = f"{uid}-other"
    cleanup[0].extend([*queues, other])
    for q in queues:
        setup.queue_declare(q)
        setup.queue_bind(q, exchange)
    setup.queue_declare(other)
    return queues, other


def test_a_wide_fanout_burst_does_not_hold_other_publishers_back(broker, connect, make_exchange, cleanup,
                                                               uid) -> None:
    exchange = make_exchange("fanout")
    queues, other = _wide_fanout(connect, cleanup, uid, exchange)
    position = _other_message_position(broker, connect, queues[0], other, exchange, "")
    # Before the budget: position == BURST (the whole burst routed before anything was written). With it,
    # a turn routes ~6 publishes (at 400 queues), and the rest of the burst takes ~25 more turns.
    assert position < BURST - 10, f"the other publisher's message came after {position} of {BURST}"


def test_dead_letters_into_a_wide_fanout_do_not_hold_other_publishers_back(broker, connect, make_exchange,
                                                                          make_queue, cleanup, uid) -> None:
    """The same, with the fan-out made by dead-lettering: each publish goes to one queue whose length limit of
    0 drops it at once into a dead-letter exchange bound to ``FANOUT`` queues. The burst is alike (one run,
    broker/amqp/publish_run.py), but its dead letters count towards the turn's budget as the publishes' own
    copies do, so the run goes message by message (Queue.dead_letters_on_publish): taken whole, all
    ``BURST × FANOUT`` dead copies were handed over in one turn and the other message came last."""
    dlx = make_exchange("dlx", "fanout")
    entry = make_queue("entry", {"x-max-length": 0, "x-overflow": "drop-head", "x-dead-letter-exchange": dlx})
    queues, other = _wide_fanout(connect, cleanup, uid, dlx)
    position = _other_message_position(broker, connect, queues[0], other, "", entry)
    assert position < BURST - 10, f"the other publisher's message came after {position} of {BURST}"
