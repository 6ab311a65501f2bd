"""Helpers of the disk-full lane (tests/integration/durability/test_disk_full.py): a tmpfs volume of the test's own, a
publishing application that records what became of every message, and checks of what a queue holds.

* :class:`Volume` is a tmpfs mounted under the test's ``tmp_path``: its size can be changed on the fly
  (``mount -o remount,size=…``), and a filler file can take its free space (another process filling the
  disk). A sampler thread records the lowest free space seen.
* :class:`Publisher` is one application publishing persistent messages with publisher confirms to one durable
  queue, keeping at most ``window`` unconfirmed (``window=1`` is what pika's BlockingConnection does in
  confirm mode). It speaks AMQP over a raw socket (tests/rawamqp.py) so that nothing can block the test: it
  records, per message, whether the broker acked it, nacked it or closed the connection before answering,
  and it records ``connection.blocked`` / ``connection.unblocked`` the moment they arrive. When the broker
  closes its connection, ``reconnect`` continues on a new one with the next sequence numbers.
* Every message body is ``"<publisher>:<seq>:<size>:"`` followed by the sequence number repeated, so a body
  tells which message it is and whether it is intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pika.exceptions
from leftovers import record_mount
from rawamqp import (  # tests/ is on sys.path (rootdir conftest)
    ConnectionClosedError,
    FrameTimeout,
    RawAMQPClient,
    body_frame,
    commands,
    content_header_frame,
    method_frame,
)

MiB = 1 << 20
# Bodies of 2-64 KiB: all but the first go to the message store (queue_index_embed_msgs_below is 4096), the
# first is embedded in the queue index, so both kinds of segment files meet the full disk.
SIZES = (2000, 8 * 1024, 24 * 1024, 64 * 1024, 40 * 1024, 16 * 1024)


# -- the volume -------------------------------------------------------------------------------------------


def _run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


class MountImpossible(Exception):
    """This machine does not let us mount a tmpfs (not root, or EPERM): the caller skips."""


class Volume:
    """A tmpfs mounted at ``path`` for one test."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size
        self.fillers: list[Path] = []
        self.min_free: int | None = None
        self._sampling = False
        self._sampler: threading.Thread | None = None

    def mount(self) -> None:
        if os.geteuid() != 0:
            raise MountImpossible("mounting a tmpfs needs root (the disk-full lane runs as root in CI)")
        if not shutil.which("mount"):
            raise MountImpossible("no mount(8) on this machine")
        self.path.mkdir(parents=True, exist_ok=True)
        record_mount(self.path)  # tests/leftovers.py: unmounted by the next run if this one is killed
        p = _run("mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path))
        if p.returncode != 0:
            text = (p.stdout + p.stderr).strip()
            if re.search(r"permission denied|not permitted|must be superuser|EPERM", text, re.IGNORECASE):
                raise MountImpossible(f"mount -t tmpfs refused here: {text}")
            raise RuntimeError(f"mount -t tmpfs -o size={self.size} failed (rc {p.returncode}): {text}")

    def unmount(self) -> None:
        self.stop_sampling()
        if not os.path.ismount(self.path):
            return
        if _run("umount", str(self.path)).returncode != 0:
            # Still held (a broker not yet killed): detach now, the memory goes with the last user.
            _run("umount", "-l", str(self.path))

    def resize(self, size: str) -> None:
        """Give the volume more (or less) room while it is in use, as an operator would."""
        p = _run("mount", "-o", f"remount,size={size}", str(self.path))
        if p.returncode != 0:
            raise RuntimeError(f"remount,size={size} failed: {p.stdout}{p.stderr}")
        self.size = size

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> int:
        """Take free space with a filler file until at most ``leave`` bytes are left (another process filling
        the disk). Returns the bytes taken."""
        path = self.path / f"filler-{len(self.fillers)}"
        self.fillers.append(path)
        taken = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            chunk = 64 * MiB
            while chunk >= 4096:
                want = min(chunk, self.free() - leave)
                if want < 4096:
                    break
                want -= want % 4096
                try:
                    os.posix_fallocate(fd, taken, want)
                    taken += want
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    chunk //= 2  # someone else took some meanwhile
        finally:
            os.close(fd)
        return taken

    def unfill(self) -> None:
        for p in self.fillers:
            p.unlink(missing_ok=True)
        self.fillers.clear()

    # The lowest free space seen while the sampler runs (every few milliseconds).
    def start_sampling(self, interval: float = 0.003) -> None:
        self.min_free = self.free()
        self._sampling = True

        def sample() -> None:
            while self._sampling:
                with contextlib.suppress(OSError):
                    f = self.free()
                    if self.min_free is None or f < self.min_free:
                        self.min_free = f
                time.sleep(interval)

        self._sampler = threading.Thread(target=sample, name="free-space-sampler", daemon=True)
        self._sampler.start()

    def stop_sampling(self) -> None:
        self._sampling = False
        if self._sampler is not None:
            self._sampler.join(5)
            self._sampler = None


# -- message bodies ---------------------------------------------------------------------------------------

_HEAD = re.compile(rb"([A-Za-z0-9_-]+):(\d{8}):(\d{6}):")


def body_of(name: str, seq: int) -> bytes:
    size = SIZES[seq % len(SIZES)]
    head = b"%s:%08d:%06d:" % (name.encode(), seq, size)
    fill = b"%08d" % seq
    return head + (fill * (size // len(fill) + 1))[: size - len(head)]


def parse_body(body: bytes) -> tuple[str, int] | None:
    """(publisher, seq) of an intact body; None if it is not one of ours or is damaged."""
    m = _HEAD.match(body)
    if not m:
        return None
    name, seq = m.group(1).decode(), int(m.group(2))
    return (name, seq) if body == body_of(name, seq) else None


# -- the publisher ----------------------------------------------------------------------------------------

ACK, NACK, CLOSED = "ack", "nack", "closed"  # what became of a publish (CLOSED: connection lost unanswered)


class _Session:
    """One connection of a Publisher: channel 1 in confirm mode; delivery tag n carries seq ``first + n - 1``."""

    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self.client = RawAMQPClient.for_broker(pub.broker, timeout=10)
        self.client.handshake(heartbeat=0)  # advertises the connection.blocked capability
        self.client.open_channel(1)
        self.client.send_method(1, commands.Queue.Declare(queue=pub.queue, durable=True))
        self.client.expect_method(commands.Queue.DeclareOk, 1)
        self.client.send_method(1, commands.Confirm.Select())
        self.client.expect_method(commands.Confirm.SelectOk, 1)
        self.wsock = self.client.sock.dup()  # the writer's own socket object: its timeout is its own
        self.wsock.settimeout(0.2)
        self.tag_seq: dict[int, int] = {}
        self.next_tag = 1
        self.low_tag = 1  # every tag below is settled
        self.closed = False
        self.stopping = False
        self.reader = threading.Thread(target=self._read, name=f"{pub.name}-reader", daemon=True)
        self.writer = threading.Thread(target=self._write, name=f"{pub.name}-writer", daemon=True)
        self.reader.start()
        self.writer.start()

    # reader thread
    def _read(self) -> None:
        pub = self.pub
        try:
            while not self.stopping:
                try:
                    f = self.client.recv_frame(timeout=0.5)
                except FrameTimeout:
                    continue
                v = getattr(f, "value", None)
                if isinstance(v, (commands.Basic.Ack, commands.Basic.Nack)):
                    self._settle(v.delivery_tag, v.multiple, ACK if isinstance(v, commands.Basic.Ack) else NACK)
                elif isinstance(v, commands.Connection.Blocked):
                    pub._event(f"connection.blocked ({v.reason})", blocked=True)
                elif isinstance(v, commands.Connection.Unblocked):
                    pub._event("connection.unblocked", blocked=False)
                elif isinstance(v, commands.Connection.Close):
                    pub._event(f"connection.close {v.reply_code} {v.reply_text}")
                    with contextlib.suppress(OSError, ConnectionClosedError):
                        self.client.send_method(0, commands.Connection.CloseOk())
                    break
                elif isinstance(v, commands.Channel.Close):
                    pub._event(f"channel.close {v.reply_code} {v.reply_text}")
                    break
        except (ConnectionClosedError, OSError) as e:
            if not self.stopping:
                pub._event(f"connection lost: {e}")
        finally:
            self._close_unanswered()

    def _settle(self, tag: int, multiple: bool, outcome: str) -> None:
        pub = self.pub
        with pub._cond:
            tags = range(self.low_tag, tag + 1) if multiple else (tag,)
            now = time.monotonic()
            for t in tags:
                seq = self.tag_seq.get(t)
                if seq is not None and seq not in pub.outcome:
                    pub.outcome[seq] = outcome
                    pub.settled_at[seq] = now
                    pub.last_progress = now
            while self.tag_seq.get(self.low_tag) in pub.outcome:
                self.low_tag += 1
            pub._cond.notify_all()

    def _close_unanswered(self) -> None:
        pub = self.pub
        with pub._cond:
            self.closed = True
            for seq in self.tag_seq.values():
                if seq not in pub.outcome:
                    pub.outcome[seq] = CLOSED
            pub._cond.notify_all()

    # writer thread
    def _write(self) -> None:
        pub = self.pub
        pub_frame = method_frame(1, commands.Basic.Publish(exchange=pub.exchange, routing_key=pub.routing_key))
        props = commands.Basic.Properties(delivery_mode=2, headers=pub.headers)
        chunk = max(4096, self.client.frame_max - 8)
        while True:
            with pub._cond:
                while not (self.stopping or self.closed) and not (
                        pub.next_seq <= pub.target and pub.unsettled_count() < pub.window):
                    pub._cond.wait(0.2)
                if self.stopping or self.closed:
                    return
                seq = pub.next_seq
                pub.next_seq += 1
                self.tag_seq[self.next_tag] = seq
                self.next_tag += 1
                pub.sent.append(seq)
                pub.sent_at[seq] = time.monotonic()
            body = body_of(pub.name, seq)
            data = bytearray(pub_frame)
            data += content_header_frame(1, len(body), props)
            for i in range(0, len(body), chunk):
                data += body_frame(1, body[i:i + chunk])
            if not self._send(bytes(data)):
                return

    def _send(self, data: bytes) -> bool:
        """Write everything, however long a blocked broker takes to read it; False if the connection went."""
        view = memoryview(data)
        done = 0
        while done < len(data):
            if self.stopping or self.closed:
                return False
            try:
                done += self.wsock.send(view[done:])
            except TimeoutError:
                continue  # the broker is not reading (blocked): keep waiting, the test bounds the wait
            except OSError:
                return False
        return True

    def stop(self) -> None:
        self.stopping = True
        with self.pub._cond:
            self.pub._cond.notify_all()
        self.writer.join(5)
        with contextlib.suppress(OSError):
            self.wsock.close()
        self.client.close()
        self.reader.join(5)


class Publisher:
    """An application publishing persistent messages with confirms to the durable queue ``queue``.

    ``publish(n)`` asks for n more messages; they go out as fast as the window allows. ``outcome[seq]`` is
    ACK, NACK or CLOSED once the broker answered (or the connection went); ``events`` lists connection-level
    happenings with their time. Sequence numbers start at 1 and keep counting across reconnects.
    """

    def __init__(self, broker, name: str, queue: str, *, window: int = 16, exchange: str = "",
                 routing_key: str | None = None, headers: dict | None = None) -> None:
        self.broker = broker
        self.name = name
        self.queue = queue
        # Where it publishes: the default exchange to ``queue`` unless told otherwise (an x-delayed-message
        # exchange bound to ``queue``, with an ``x-delay`` header).
        self.exchange = exchange
        self.routing_key = queue if routing_key is None else routing_key
        self.headers = headers
        self.window = window
        self.next_seq = 1
        self.target = 0
        self.sent: list[int] = []
        self.sent_at: dict[int, float] = {}
        self.settled_at: dict[int, float] = {}
        self.outcome: dict[int, str] = {}
        self.events: list[tuple[float, str]] = []
        self.blocked = False
        self.ever_blocked = False
        self.last_progress = time.monotonic()
        self._cond = threading.Condition()
        self.session: _Session | None = None
        self.sessions = 0

    def connect(self) -> Publisher:
        self.session = _Session(self)
        self.sessions += 1
        return self

    def reconnect_if_closed(self) -> None:
        if self.session is None or self.session.closed:
            if self.session is not None:
                self.session.stop()
            self.blocked = False
            self.connect()

    def _event(self, what: str, blocked: bool | None = None) -> None:
        with self._cond:
            self.events.append((time.monotonic(), what))
            if blocked is not None:
                self.blocked = blocked
                self.ever_blocked |= blocked
            self._cond.notify_all()

    # -- driving ----------------------------------------------------------------------------------------
    def publish(self, n: int) -> None:
        with self._cond:
            self.target = max(self.target, self.next_seq - 1) + n
            self._cond.notify_all()

    def hold(self) -> None:
        """Send nothing more than what is already out."""
        with self._cond:
            self.target = self.next_seq - 1
            self._cond.notify_all()

    def unsettled_count(self) -> int:
        return len(self.sent) - len(self.outcome)

    def unsettled(self) -> list[int]:
        with self._cond:
            return [s for s in self.sent if s not in self.outcome]

    def wait_settled(self, timeout: float, upto: int | None = None) -> bool:
        """Wait until every message sent (or up to ``upto`` and the target) has an outcome."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                want = self.target if upto is None else upto
                done = (self.next_seq - 1 >= want or (self.session is not None and self.session.closed)) and \
                    all(s in self.outcome for s in self.sent)
                if done:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()

    # -- results ----------------------------------------------------------------------------------------
    def with_outcome(self, what: str, seqs=None) -> list[int]:
        with self._cond:
            return sorted(s for s in (self.sent if seqs is None else seqs) if self.outcome.get(s) == what)

    @property
    def acked(self) -> set[int]:
        return set(self.with_outcome(ACK))

    def summary(self) -> str:
        c = Counter(self.outcome.get(s, "unanswered") for s in self.sent)
        ev = "; ".join(what for _, what in self.events[-6:])
        return (f"{self.name}: sent {len(self.sent)}, {dict(c)}, blocked now {self.blocked}, "
                f"connections {self.sessions}, last events [{ev}]")


# -- reading a queue back ---------------------------------------------------------------------------------


def read_queue(b, queue: str, *, idle: float = 2.0, limit: float = 40.0) -> list[bytes]:
    """Every message of ``queue`` in delivery order, read with a consumer and left in the queue (nothing is
    acked: closing the connection requeues them in their order)."""
    conn = pika.BlockingConnection(b.pika_params(blocked_connection_timeout=30))
    try:
        ch = conn.channel()
        expected = ch.queue_declare(queue, passive=True).method.message_count
        if expected == 0:
            return []
        ch.basic_qos(prefetch_count=2000)
        out: list[bytes] = []
        deadline = time.monotonic() + limit
        for method, _props, body in ch.consume(queue, inactivity_timeout=idle):
            if method is None or time.monotonic() > deadline:
                break
            out.append(body)
            if len(out) >= expected:
                break
        return out
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            conn.close()


def check_queue(bodies: list[bytes], pub: Publisher, stage: str) -> list[str]:
    """What is wrong with ``bodies`` (a queue read back) given what ``pub`` published; [] if nothing.

    Promises: every confirmed message is there exactly once, confirmed ones in publish order, every body is
    intact and one this publisher sent. Unconfirmed (nacked, unanswered) ones may be there or not.
    """
    problems = []
    where = f"{stage}, queue {pub.queue}"
    seqs: list[int] = []
    for i, body in enumerate(bodies):
        parsed = parse_body(body)
        if parsed is None or parsed[0] != pub.name:
            problems.append(f"{where}: message #{i} is damaged or not ours: {body[:40]!r}... ({len(body)} bytes)")
            continue
        seqs.append(parsed[1])
    acked = pub.acked
    sent = set(pub.sent)
    missing = sorted(acked - set(seqs))
    if missing:
        problems.append(f"{where}: {len(missing)} of {len(acked)} confirmed messages are missing, "
                        f"first {missing[:12]}")
    counts = Counter(seqs)
    dup_confirmed = sorted(s for s, n in counts.items() if n > 1 and s in acked)
    if dup_confirmed:
        problems.append(f"{where}: confirmed messages delivered more than once: {dup_confirmed[:12]}")
    confirmed_order = [s for s in dict.fromkeys(seqs) if s in acked]
    if confirmed_order != sorted(confirmed_order):
        bad = next(i for i in range(1, len(confirmed_order)) if confirmed_order[i] < confirmed_order[i - 1])
        problems.append(f"{where}: confirmed messages out of publish order near {confirmed_order[max(0, bad - 3):bad + 3]}")
    never = sorted(set(seqs) - sent)
    if never:
        problems.append(f"{where}: messages that were never published: {never[:12]}")
    return problems


_BAD_LOG = re.compile(r"bad record|corrupt|unreadable", re.IGNORECASE)
_WRITE_ERROR = re.compile(r"No space left|ENOSPC|Errno 28|fsync of .* failed|write.* failed", re.IGNORECASE)


def bad_log_lines(log: str) -> list[str]:
    """Lines saying that stored data could not be read back (what issue 9 saw)."""
    return [line[:300] for line in log.splitlines() if _BAD_LOG.search(line)]


def write_error_lines(log: str) -> list[str]:
    """Lines reporting a failed write or fsync (the disk was full)."""
    return [line[:300] for line in log.splitlines() if _WRITE_ERROR.search(line)]
