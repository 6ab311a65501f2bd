"""The disk-full lane (issue 9): what publishers and consumers see when the broker's disk fills up.

The data directory is a 64 MiB tmpfs mounted by the test under its ``tmp_path`` (unmounted at teardown, even
after a failure); "more space" is ``mount -o remount,size=256m``, as an operator would do. Two applications, A
and B, publish persistent messages (2-64 KiB, a sequence number in each body) with publisher confirms, each
to a durable queue of its own, keeping 16 unconfirmed, and record what became of every message (acked,
nacked, connection lost unanswered) and every ``connection.blocked`` / ``unblocked``. Nothing waits without a
bound. The promises checked:

* ENOSPC (``disk_free_limit.absolute=1MB``): the disk fills, by A and B themselves or, to be sure writes
  fail with ENOSPC whatever the alarm does, by another process taking the last bytes while they publish.
  Once the volume has room again, every publish still pending is answered (ack, nack or close) within 10 s
  with no other traffic, and then 80 more per publisher, plus 80 from a new application C, are confirmed
  within 30 s of the remount: no publisher waits forever;
* every confirmed message can be read back, intact, once, in publish order per publisher: live, after a
  clean restart (SIGTERM) and after ``kill -9``; the log has no "bad record" / "corrupt" / "unreadable";
* the disk alarm (RabbitMQ's default limit 50MB, and a tighter 16MB) blocks A and B
  (``connection.blocked``) before the disk is full: free space never reaches zero, no write error is
  logged, nothing is nacked; after the remount they are unblocked and everything is confirmed and readable;
* after the disk has been full and space is freed, ONE persistent publish with no other traffic (to the
  queue that was being filled, or to a quiet one) is confirmed within 10 s: no stall until some other queue
  gets a publish;
* during a disk alarm ``queue.declare`` of a new durable queue (and exchange.declare, queue.bind) is
  answered, as in RabbitMQ, which blocks only connections that publish; the queue exists after a restart.

Needs root (mount -t tmpfs); skipped with the reason where mounting is impossible. Config key used:
``disk_free_limit.absolute`` (``--set``; plus ``--management-port 0 --prometheus-port 0``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from disk_full_helpers import (
    ACK,
    CLOSED,
    NACK,
    MiB,
    MountImpossible,
    Publisher,
    Volume,
    bad_log_lines,
    check_queue,
    parse_body,
    read_queue,
    write_error_lines,
)
from rawamqp import ConnectionClosedError, FrameTimeout, RawAMQPClient, commands

pytestmark = [pytest.mark.leveret_only, pytest.mark.slow]

VOLUME_SIZE = "64m"
MORE_SPACE = "256m"
ANSWER_WITHIN = 30.0  # s after space was freed: every pending publish answered, new ones confirmed
QUIET_BOUND = 10.0  # s after space was freed: pending publishes answered without help from other traffic
MORE_PER_PUBLISHER = 80  # publishes per publisher once there is room again


# -- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Volume]:
    """A 64 MiB tmpfs of the test's own; unmounted at teardown (lazily if a broker still holds it)."""
    v = Volume(tmp_path / "disk", VOLUME_SIZE)
    try:
        v.mount()
    except MountImpossible as e:
        pytest.skip(str(e))
    try:
        yield v
    finally:
        v.unmount()


@pytest.fixture
def disk_broker(volume: Volume, start_broker) -> Callable[[str], object]:
    """Start a Leveret whose data directory is on ``volume``, with ``disk_free_limit.absolute`` set.

    Requested after ``volume``, so ``start_broker`` tears down (SIGKILL) before the volume is unmounted."""

    def start(limit: str):
        return start_broker("--management-port", "0", "--prometheus-port", "0",
                            "--set", f"disk_free_limit.absolute={limit}", data_dir=volume.path / "data")

    return start


# -- the lane -----------------------------------------------------------------------------------------------


def wait_until(pred: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def stuck(p: Publisher, quiet: float = 1.5) -> bool:
    """The publisher cannot go on: blocked by the broker, its connection gone, or no answer for ``quiet`` s
    although it has messages out."""
    if p.blocked or (p.session is not None and p.session.closed):
        return True
    return p.unsettled_count() > 0 and time.monotonic() - p.last_progress > quiet


def pub_report(pubs: list[Publisher]) -> str:
    return "\n  ".join(p.summary() for p in pubs)


def more_space_and_publish(volume: Volume, pubs: list[Publisher], uid: str) -> list[str]:
    """Remount with more room, then:

    1. with no other traffic, every publish still pending must be answered (ack, nack or connection
       close) within QUIET_BOUND s: nothing may stall until some other queue gets a publish;
    2. each publisher publishes MORE_PER_PUBLISHER more (on a new connection if the broker closed its own),
       and a third application, C, starts publishing to a queue of its own; all must be acked within
       ANSWER_WITHIN s of the remount.

    C is appended to ``pubs``. Returns the problems found."""
    problems = []
    volume.resize(MORE_SPACE)
    t_freed = time.monotonic()
    deadline = t_freed + ANSWER_WITHIN
    pending = {p.name: p.unsettled() for p in pubs}
    for p in pubs:
        p.wait_settled(max(0.0, t_freed + QUIET_BOUND - time.monotonic()))
    for p in pubs:
        still = [s for s in pending[p.name] if s not in p.outcome]
        if still:
            problems.append(
                f"{p.name}: {len(still)} of {len(pending[p.name])} publishes pending when the disk filled got no "
                f"answer (no ack, nack or close) within {QUIET_BOUND:.0f} s of the remount, with no other traffic; "
                f"first {still[:6]}; connection blocked: {p.blocked}")
        elif pending[p.name]:
            took = max(p.settled_at[s] for s in pending[p.name]) - t_freed
            print(f"{p.name}: the {len(pending[p.name])} publishes pending when the disk filled were answered "
                  f"{took:.2f} s after the remount: "
                  f"{dict(Counter(p.outcome[s] for s in pending[p.name]))}")

    pubs.append(Publisher(pubs[0].broker, "C", f"{uid}.c", window=pubs[0].window).connect())
    new: dict[str, list[int]] = {}
    for p in pubs:
        p.reconnect_if_closed()
        first = p.next_seq
        p.publish(MORE_PER_PUBLISHER)
        new[p.name] = list(range(first, first + MORE_PER_PUBLISHER))
    for p in pubs:
        p.wait_settled(max(0.0, deadline - time.monotonic()), upto=new[p.name][-1])
    for p in pubs:
        still = [s for s in pending.get(p.name, []) if s not in p.outcome]
        if still:
            problems.append(f"{p.name}: {len(still)} publishes pending when the disk filled still unanswered "
                            f"{ANSWER_WITHIN:.0f} s after the remount (after other publishers published)")
        sent_new = [s for s in new[p.name] if s in p.sent_at]
        unanswered = [s for s in new[p.name] if p.outcome.get(s) is None]
        not_acked = {s: p.outcome[s] for s in new[p.name] if p.outcome.get(s) not in (None, ACK)}
        if unanswered or not_acked:
            problems.append(
                f"{p.name}: of {MORE_PER_PUBLISHER} publishes after the remount, {len(sent_new)} were sent, "
                f"{len(unanswered)} unanswered within {ANSWER_WITHIN:.0f} s of it, not acked: "
                f"{dict(list(not_acked.items())[:8])}")
        else:
            took = max(p.settled_at[s] for s in new[p.name]) - t_freed
            print(f"{p.name}: {MORE_PER_PUBLISHER} publishes after the remount all confirmed {took:.2f} s after it")
    return problems


def verify_everywhere(b, pubs: list[Publisher]) -> list[str]:
    """Read every queue back live, after a SIGTERM restart and after a kill -9; the problems found."""
    problems = []
    for p in pubs:
        p.stop()
    stages = [("live", None), ("after a clean restart (SIGTERM)", "term"), ("after kill -9 and restart", "kill")]
    for stage, how in stages:
        if how == "term":
            rc = b.stop()
            if rc != 0:
                problems.append(f"clean stop exited {rc} (expected 0)")
            b.start(timeout=40)
        elif how == "kill":
            b.kill9()
            b.start(timeout=40)
        for p in pubs:
            t0 = time.monotonic()
            try:
                bodies = read_queue(b, p.queue)
            except pika.exceptions.AMQPError as e:
                problems.append(f"{stage}: reading {p.queue} failed: {e!r}")
                continue
            found = check_queue(bodies, p, stage)
            problems += found
            print(f"{stage}: {p.name} read {len(bodies)} messages in {time.monotonic() - t0:.1f} s "
                  f"({len(p.acked)} confirmed){'; PROBLEMS' if found else ''}")
    bad = bad_log_lines(b.log_text())
    if bad:
        problems.append(f"the log reports unreadable stored data ({len(bad)} lines), e.g.: " + " | ".join(bad[:4]))
    return problems


def publishers(b, uid: str, window: int = 16) -> list[Publisher]:
    """Two applications, each publishing to a durable queue of its own."""
    return [Publisher(b, "A", f"{uid}.a", window=window).connect(),
            Publisher(b, "B", f"{uid}.b", window=window).connect()]


# -- 1. the disk fills up: ENOSPC -----------------------------------------------------------------------------


@pytest.mark.timeout(200)
@pytest.mark.parametrize("filler", ["publishers", "another-process"])
def test_after_enospc_and_more_space_every_confirmed_message_is_readable(disk_broker, volume, uid, filler):
    """With ``disk_free_limit.absolute=1MB`` the disk fills up: either the two publishers fill it
    (``publishers``: whether the broker's own writes reach ENOSPC depends on how fast its alarm reacts; the
    lowest free space seen is printed) or another process takes the last free bytes while they publish
    (``another-process``: writes fail with ENOSPC whatever the alarm does). Then the volume is given more
    room. Promises: with no other traffic, every publish still pending is answered within 10 s; then 80 more
    per publisher and 80 from a new publisher C are confirmed within 30 s of the remount; every confirmed
    message is readable, intact, once and in order per publisher, live, after SIGTERM + restart and after
    kill -9 + restart; the log has no "bad record", "corrupt" or "unreadable" line."""
    b = disk_broker("1MB")
    pubs = publishers(b, uid)
    volume.start_sampling()
    t0 = time.monotonic()
    for p in pubs:
        p.publish(10**6)  # as fast as the window allows, until the disk is full
    if filler == "another-process":
        assert wait_until(lambda: all(len(p.acked) >= 40 for p in pubs), 20), \
            f"publishing did not get going:\n  {pub_report(pubs)}"
        taken = volume.fill(leave=0)
        print(f"another process took the last {taken / MiB:.1f} MiB")
    full = wait_until(lambda: volume.free() < 1 * MiB and all(stuck(p) for p in pubs), 40)
    for p in pubs:
        p.hold()
    fill_s = time.monotonic() - t0
    volume.stop_sampling()
    assert full, (f"the volume did not fill up within 40 s (free {volume.free() / MiB:.1f} MiB):\n  "
                  f"{pub_report(pubs)}")
    time.sleep(0.5)  # what is in flight lands
    log = b.log_text()
    enospc = write_error_lines(log)
    print(f"disk full after {fill_s:.1f} s; lowest free space seen {volume.min_free} bytes; "
          f"write errors in the log: {len(enospc)}, e.g. {enospc[:2]}")
    print("before the remount:\n  " + pub_report(pubs))

    problems = more_space_and_publish(volume, pubs, uid)
    print("after the remount:\n  " + pub_report(pubs))
    problems += verify_everywhere(b, pubs)
    assert not problems, "\n".join(problems)


# -- 2. the disk alarm comes first ----------------------------------------------------------------------------


@pytest.mark.timeout(200)
@pytest.mark.parametrize("limit", ["50MB", "16MB"])
def test_disk_alarm_blocks_publishers_before_the_disk_is_full(disk_broker, volume, uid, limit):
    """With RabbitMQ's default ``disk_free_limit.absolute`` (50MB) and with a tighter 16MB, on a 64 MiB volume,
    two fast publishers (16 unconfirmed each) are stopped by the disk alarm before the disk is full: each gets
    ``connection.blocked``, free space never reaches zero, no write or fsync error is logged, nothing is
    nacked and no connection is closed. After the remount the alarm clears: they are unblocked, what was
    pending is confirmed within 10 s, 80 more per publisher (and 80 from a new publisher) within 30 s, and
    every confirmed message is readable, in order, live and after both kinds of restart."""
    b = disk_broker(limit)
    pubs = publishers(b, uid)
    volume.start_sampling()
    t0 = time.monotonic()
    for p in pubs:
        p.publish(10**6)
    settled = wait_until(lambda: all(stuck(p) for p in pubs) or (volume.min_free or 0) == 0, 40)
    for p in pubs:
        p.hold()
    time.sleep(1.0)  # anything the alarm missed would show now
    volume.stop_sampling()
    print(f"publishers stopped after {time.monotonic() - t0:.1f} s; lowest free space seen "
          f"{(volume.min_free or 0) / MiB:.2f} MiB (limit {limit}):\n  {pub_report(pubs)}")
    problems = []
    if not settled:
        problems.append(f"publishers were neither blocked nor stopped within 40 s:\n  {pub_report(pubs)}")
    for p in pubs:
        if not p.ever_blocked:
            problems.append(f"{p.name} never got connection.blocked")
    if volume.min_free == 0:
        problems.append(f"the disk filled up (0 bytes free) before the alarm stopped the publishers (limit {limit})")
    errors = write_error_lines(b.log_text())
    if errors:
        problems.append(f"write errors were logged ({len(errors)}), e.g.: " + " | ".join(errors[:3]))

    problems += more_space_and_publish(volume, pubs, uid)
    for p in pubs:
        # An alarm only delays: nothing A or B published may be nacked or cut off by a closed connection.
        bad = {s: p.outcome[s] for s in p.sent if p.outcome.get(s) in (NACK, CLOSED)}
        if bad:
            problems.append(f"{p.name}: {len(bad)} publishes nacked or cut off by the broker, e.g. "
                            f"{dict(list(bad.items())[:8])}")
        if p.ever_blocked and p.blocked:
            problems.append(f"{p.name} is still blocked after the remount (no connection.unblocked)")
    problems += verify_everywhere(b, pubs)
    assert not problems, "\n".join(problems)


# -- 3. no stall after the disk was full -----------------------------------------------------------------------


def publish_one_bounded(b, queue: str, body: bytes, timeout: float) -> tuple[str, float, list[str]]:
    """On a new connection: declare ``queue`` (durable), select confirms and publish one persistent message;
    returns (what happened, seconds from the publish, connection-level frames seen). What happened is "ack",
    "nack", the broker's close, or "no answer" if none of these came within ``timeout``."""
    seen: list[str] = []
    with RawAMQPClient.for_broker(b, timeout=timeout) as c:
        c.handshake(heartbeat=0)  # with the connection.blocked capability
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue=queue, durable=True))
        c.expect_method(commands.Queue.DeclareOk, 1)
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk, 1)
        t0 = time.monotonic()
        c.publish(1, body, routing_key=queue, properties=commands.Basic.Properties(delivery_mode=2))
        deadline = t0 + timeout
        while True:
            try:
                f = c.recv_frame(timeout=max(0.0, deadline - time.monotonic()))
            except FrameTimeout:
                return f"no answer within {timeout:.0f} s: no confirm, no error", time.monotonic() - t0, seen
            except ConnectionClosedError as e:
                return f"connection dropped: {e}", time.monotonic() - t0, seen
            v = getattr(f, "value", None)
            if isinstance(v, commands.Basic.Ack):
                return ACK, time.monotonic() - t0, seen
            if isinstance(v, commands.Basic.Nack):
                return NACK, time.monotonic() - t0, seen
            if isinstance(v, (commands.Connection.Close, commands.Channel.Close)):
                return f"{v.name} {v.reply_code} {v.reply_text}", time.monotonic() - t0, seen
            if isinstance(v, (commands.Connection.Blocked, commands.Connection.Unblocked)):
                seen.append(f"{v.name} after {time.monotonic() - t0:.2f} s")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("target", "size"), [
    ("queue-being-filled", 200),  # embedded in the queue index
    ("quiet-queue", 200),
    ("quiet-queue", 40 * 1024),  # in the message store
], ids=["filled-queue-small", "quiet-queue-small", "quiet-queue-large"])
def test_first_publish_after_space_is_freed_is_confirmed(disk_broker, volume, uid, target, size):
    """Two publishers fill the disk until writes fail (another process takes the last bytes while they
    publish, so ENOSPC is certain), then go away; the volume is given more room. Then ONE persistent publish,
    by a new connection and with no other traffic at all, to the queue that was being filled or to a durable
    queue declared before and never touched, must be confirmed within 10 s and be readable: the broker must
    not stall it until some other queue happens to be published to."""
    b = disk_broker("1MB")
    quiet = f"{uid}.quiet"
    with contextlib.closing(pika.BlockingConnection(b.pika_params())) as conn:
        conn.channel().queue_declare(quiet, durable=True)
    pubs = publishers(b, uid)
    volume.start_sampling()
    for p in pubs:
        p.publish(10**6)
    assert wait_until(lambda: all(len(p.acked) >= 40 for p in pubs), 20), \
        f"publishing did not get going:\n  {pub_report(pubs)}"
    volume.fill(leave=0)
    assert wait_until(lambda: all(stuck(p) for p in pubs), 20), \
        f"the publishers were never stopped by the full disk:\n  {pub_report(pubs)}"
    for p in pubs:
        p.hold()
    time.sleep(0.5)
    volume.stop_sampling()
    print(f"disk full: lowest free space {volume.min_free} bytes; write errors logged: "
          f"{write_error_lines(b.log_text())[:1]}\n  {pub_report(pubs)}")
    for p in pubs:
        p.stop()  # the filling applications go away

    volume.resize(MORE_SPACE)
    q = pubs[0].queue if target == "queue-being-filled" else quiet
    body = b"single-publish:" + b"s" * size
    outcome, took, seen = publish_one_bounded(b, q, body, timeout=10.0)
    print(f"single publish of {size} bytes to {target} after the remount: {outcome} after {took:.2f} s; "
          f"connection-level frames: {seen}")
    assert outcome == ACK, (f"the first publish after space was freed ({size} bytes to {target}): {outcome}; "
                            f"connection.blocked/unblocked seen: {seen or 'none'}")
    bodies = read_queue(b, q)
    assert bodies.count(body) == 1, f"the confirmed message is in {q} {bodies.count(body)} times"
    # A's unconfirmed publishes may land after it (the broker reads what A sent before it went away once the
    # alarm clears); A's confirmed ones must all be there, in order.
    filled = [x for x in bodies if x != body] if q == pubs[0].queue else read_queue(b, pubs[0].queue)
    problems = check_queue(filled, pubs[0], "after the remount")
    assert not problems, "\n".join(problems)


# -- 4. declares during a disk alarm ---------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_queue_declare_is_answered_during_a_disk_alarm(disk_broker, volume, uid):
    """RabbitMQ's disk alarm blocks only connections that publish; declaring, binding and consuming go on.
    With ``disk_free_limit.absolute=50MB`` and another process leaving 20 MiB free (below the limit, not zero):
    a publisher gets ``connection.blocked``; meanwhile another connection's ``queue.declare`` of a new
    durable queue (and an exchange declare and a bind) are answered within 10 s. Once the space is back the
    publisher is unblocked and its message confirmed; after a restart the new queue and its binding exist."""
    b = disk_broker("50MB")
    pq, newq, newx = f"{uid}.pub", f"{uid}.declared-under-alarm", f"{uid}.x"
    p = Publisher(b, "P", pq, window=1).connect()
    volume.fill(leave=20 * MiB)
    assert volume.free() > 0
    p.publish(1)
    assert wait_until(lambda: p.ever_blocked, 10), \
        f"no connection.blocked with {volume.free() / MiB:.1f} MiB free and a 50MB limit: {p.summary()}"

    with RawAMQPClient.for_broker(b, timeout=10) as c:
        c.handshake(heartbeat=0)
        c.open_channel(1)
        steps = [
            (commands.Queue.Declare(queue=newq, durable=True), commands.Queue.DeclareOk),
            (commands.Exchange.Declare(exchange=newx, exchange_type="direct", durable=True),
             commands.Exchange.DeclareOk),
            (commands.Queue.Bind(queue=newq, exchange=newx, routing_key="k"), commands.Queue.BindOk),
        ]
        for method, reply in steps:
            t0 = time.monotonic()
            c.send_method(1, method)
            try:
                got = c.expect_method(reply, 1, timeout=10)
            except FrameTimeout:
                pytest.fail(f"{method.name} got no answer within 10 s during the disk alarm")
            print(f"{method.name} answered in {time.monotonic() - t0:.3f} s during the alarm")
            if isinstance(got, commands.Queue.DeclareOk):
                assert got.queue == newq
        c.close_connection()

    volume.unfill()
    assert wait_until(lambda: p.outcome.get(1) is not None, 10), \
        f"the blocked publish was not answered within 10 s of the space coming back: {p.summary()}"
    assert p.outcome[1] == ACK, p.summary()
    assert wait_until(lambda: not p.blocked, 10), f"no connection.unblocked once the space was back: {p.summary()}"
    p.stop()

    b.restart()
    with contextlib.closing(pika.BlockingConnection(b.pika_params())) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(newq, passive=True)  # a 404 here (ChannelClosedByBroker) means it was lost
        ch.basic_publish(newx, "k", b"after-restart", pika.BasicProperties(delivery_mode=2))
        assert ch.basic_get(newq, auto_ack=True)[2] == b"after-restart", "the binding did not survive"
        got = ch.basic_get(pq, auto_ack=True)
        assert got[0] is not None and parse_body(got[2]) == ("P", 1), "the confirmed message was lost"
