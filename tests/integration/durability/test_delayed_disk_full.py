"""A full disk while publishing to an ``x-delayed-message`` exchange (issue 31): the publisher is blocked by the
disk alarm and resumed once there is room, nothing is lost, and its connection is never closed with 541.

Before, the delay store's checkpoint (started by ``append`` every ``checkpoint_bytes`` of WAL) raised ENOSPC
into the publish path: 541 INTERNAL_ERROR and a traceback. Now a failed checkpoint is retried later and the
record stays in the WAL's buffer for the syncer's retry, as the classic and stream paths keep theirs.

Set-up as tests/integration/durability/test_disk_full.py (its helpers): a 64 MiB tmpfs, ``disk_free_limit``
1MB, one application publishing persistent messages (2-64 KiB) with confirms, 16 unconfirmed at most, here to
a durable x-delayed-message exchange (``x-delay`` 25 s) bound to a durable queue; another process takes the
free space but 20 MiB before it publishes, so the checkpoint ``append`` starts at 16 MiB of WAL meets ENOSPC, so the writes fail with ENOSPC whatever the alarm does; then the volume
is remounted bigger. Needs root; skipped where mounting a tmpfs is impossible.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from disk_full_helpers import ACK, MiB, MountImpossible, Publisher, Volume, check_queue, read_queue

pytestmark = [pytest.mark.leveret_only, pytest.mark.slow]

DELAY_MS = 25_000
# The delay store checkpoints from ``append`` every 16 MiB of WAL (storage/delay/store.py), writing the buckets'
# buffered 16 MiB: with 20 MiB free the WAL fits, the alarm (1MB) is not raised yet, and the checkpoint's
# writes meet ENOSPC (the write that reached the publisher as 541).
LEAVE = 20 * MiB
WINDOW = 16


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Volume]:
    v = Volume(tmp_path / "disk", "64m")
    try:
        v.mount()
    except MountImpossible as e:
        pytest.skip(str(e))
    try:
        yield v
    finally:
        v.unmount()


def wait_until(pred, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


@pytest.mark.timeout(240)
def test_full_disk_under_a_delayed_exchange_blocks_and_loses_nothing(volume, start_broker, uid):
    b = start_broker("--management-port", "0", "--prometheus-port", "0",
                     "--set", "disk_free_limit.absolute=1MB", data_dir=volume.path / "data")
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ex, q = f"{uid}.dx", f"{uid}.dq"
    ch.exchange_declare(ex, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, ex, "k")
    conn.close()
    taken = volume.fill(leave=LEAVE)  # another process took the rest: the checkpoint's writes meet ENOSPC
    p = Publisher(b, "D", q, exchange=ex, routing_key="k", headers={"x-delay": DELAY_MS}, window=WINDOW).connect()
    t0 = time.monotonic()
    p.publish(10**6)

    stuck = wait_until(lambda: p.blocked or (p.unsettled_count() > 0 and time.monotonic() - p.last_progress > 2), 40)
    p.hold()
    print(f"took the last {taken / MiB:.1f} MiB; stuck after {time.monotonic() - t0:.1f} s: {p.summary()}")
    assert stuck, f"the publisher never stopped making progress on a full disk: {p.summary()}"
    time.sleep(1.0)  # the failing writes and checkpoints are retried meanwhile
    closed = [what for _, what in p.events if "close" in what or "lost" in what]
    assert not closed, f"the publisher's connection was closed on a full disk: {closed}; {p.summary()}"

    volume.resize("256m")
    for f in volume.fillers:
        f.unlink()
    t_freed = time.monotonic()
    assert p.wait_settled(15), f"publishes pending when the disk filled got no answer within 15 s: {p.summary()}"
    first = p.next_seq
    p.publish(40)
    assert p.wait_settled(30, upto=first + 39), f"publishes after the remount not answered: {p.summary()}"
    p.stop()
    not_acked = {s: o for s, o in p.outcome.items() if o != ACK}
    print(f"answered {time.monotonic() - t_freed:.1f} s after the remount; {p.summary()}")
    assert not not_acked, f"not every publish was confirmed (nacked or closed): {dict(list(not_acked.items())[:8])}"
    assert p.ever_blocked, f"the disk alarm never blocked the publisher: {p.summary()}"
    assert not p.blocked, f"the publisher is still blocked after space was freed: {p.summary()}"
    assert not any("541" in what for _, what in p.events), p.summary()

    # Everything confirmed comes out of the delayed exchange into the queue, intact, once, in order.
    want = len(p.acked)
    deadline = time.monotonic() + DELAY_MS / 1000 + 60
    count = 0
    while time.monotonic() < deadline:
        c = pika.BlockingConnection(b.pika_params())
        count = c.channel().queue_declare(q, passive=True).method.message_count
        c.close()
        if count >= want:
            break
        time.sleep(0.5)
    bodies = read_queue(b, q)
    problems = check_queue(bodies, p, "delayed, after the full disk")
    log = b.log_text()
    assert "checkpoint failed" in log, "the full disk never met the delay store's checkpoint: the test missed its aim"
    assert "INTERNAL_ERROR" not in log and "Traceback" not in log, log[-3000:]
    assert not problems, "\n".join(problems) + f"\n({count} of {want} in the queue)"
