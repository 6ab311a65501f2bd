"""Consumer groups on a stream (Leveret only; issue 12): consumers with the same ``x-stream-group`` compete for
the stream's messages (QMQ's pull log, seed 001). Each offset goes to one member; what a member held unacked
when it went away (a client killed with SIGKILL, a closed channel) goes to the others with redelivered=true;
the group's progress survives a broker restart (outstanding offsets first, then on from its cursor)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pika
import pytest
from amqp_helpers import pump, settle

pytest_plugins = ["amqp_helpers"]
pytestmark = [pytest.mark.timeout(90), pytest.mark.leveret_only]

STREAM = {"x-queue-type": "stream"}


def declare_stream(conn, name: str) -> None:
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)


def fill(conn, queue: str, n: int, start: int = 0) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(start, start + n):
        ch.basic_publish("", queue, b"%d" % i)
    ch.close()


class Member:
    """A group member on a channel of its own: records (offset, redelivered) and acks unless ``hold``."""

    def __init__(self, conn, queue: str, group: str, prefetch: int = 10, hold: bool = False, **arguments) -> None:
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, bool]] = []
        self.hold = hold
        self.tag = self.ch.basic_consume(queue, self._on_message,
                                         arguments={"x-stream-group": group, **arguments})

    def _on_message(self, ch, method, props, body) -> None:
        self.got.append((props.headers["x-stream-offset"], method.redelivered))
        if not self.hold:
            ch.basic_ack(method.delivery_tag)


def test_members_share_the_stream_each_offset_once(connect, uid, cleanup):
    conn = connect()
    s = f"{uid}-s"
    declare_stream(conn, s)
    cleanup[0].append(s)
    fill(conn, s, 200)
    a = Member(conn, s, "g", prefetch=5, **{"x-stream-offset": "first"})
    b = Member(conn, s, "g", prefetch=5)
    pump(conn, lambda: len(a.got) + len(b.got) >= 200, timeout=20)
    settle(conn, 0.3)
    offsets = sorted(o for o, _r in a.got + b.got)
    assert offsets == list(range(200)), "every offset delivered once to the group"
    assert a.got and b.got, "both members took a share"
    # Another group reads the same stream independently; a plain consumer too.
    other = Member(conn, s, "h", prefetch=50, **{"x-stream-offset": "first"})
    pump(conn, lambda: len(other.got) >= 200, timeout=20)
    assert sorted(o for o, _r in other.got) == list(range(200))


CONSUMER = textwrap.dedent("""
    import sys, pika
    params = pika.URLParameters(sys.argv[1])
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=int(sys.argv[4]))
    held = []
    def on_message(c, method, props, body):
        held.append(props.headers["x-stream-offset"])
        if len(held) == int(sys.argv[4]):
            print(" ".join(map(str, held)), flush=True)
    ch.basic_consume(sys.argv[2], on_message, arguments={"x-stream-group": sys.argv[3], "x-stream-offset": "first"})
    ch.start_consuming()
""")


def test_a_killed_members_unacked_messages_go_to_another_redelivered(connect, broker, uid, cleanup):
    conn = connect()
    s = f"{uid}-s"
    declare_stream(conn, s)
    cleanup[0].append(s)
    fill(conn, s, 30)
    victim = subprocess.Popen([sys.executable, "-c", CONSUMER, broker.url, s, "g", "10"], stdout=subprocess.PIPE,
                              text=True)
    try:
        line = victim.stdout.readline() if victim.stdout else ""
        held = sorted(int(x) for x in line.split())
        assert len(held) == 10, f"the victim received its prefetch: {line!r}"
        survivor = Member(conn, s, "g", prefetch=5)
        pump(conn, lambda: len(survivor.got) >= 20, timeout=10)
        settle(conn, 0.3)
        assert len(survivor.got) == 20, "the victim's 10 stay with it while it lives"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
    finally:
        if victim.poll() is None:
            victim.kill()
    pump(conn, lambda: len(survivor.got) >= 30, timeout=15)
    settle(conn, 0.3)
    offsets = [o for o, _r in survivor.got]
    assert sorted(offsets) == list(range(30)), "exactly once per group: the survivor has everything else once"
    redelivered = sorted(o for o, r in survivor.got if r)
    assert redelivered == held, "exactly the victim's unacked came back, marked redelivered"
    fill(conn, s, 5, start=30)
    pump(conn, lambda: len(survivor.got) >= 35, timeout=10)
    assert sorted(o for o, _r in survivor.got)[-5:] == [30, 31, 32, 33, 34]


def test_group_resumes_after_a_restart(start_broker, uid):
    b = start_broker()
    conn = pika.BlockingConnection(b.pika_params())
    s = f"{uid}-s"
    declare_stream(conn, s)
    fill(conn, s, 10)
    m = Member(conn, s, "g", prefetch=4, hold=True, **{"x-stream-offset": "first"})
    pump(conn, lambda: len(m.got) >= 4)
    assert [o for o, _r in m.got] == [0, 1, 2, 3]
    m.ch.basic_ack(2, multiple=True)  # offsets 0 and 1 are acked; 2 and 3 are not
    settle(conn, 0.3)  # the credit given back brings 4 and 5, held unacked too
    held = sorted(o for o, _r in m.got if o >= 2)
    assert held == [2, 3, 4, 5]
    conn.close()
    b.restart()
    conn = pika.BlockingConnection(b.pika_params())
    m = Member(conn, s, "g", prefetch=20)  # an existing group: x-stream-offset no longer matters
    pump(conn, lambda: len(m.got) >= 8, timeout=10)
    settle(conn, 0.3)
    assert sorted(o for o, _r in m.got) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert sorted(o for o, r in m.got if r) == held
    conn.close()

