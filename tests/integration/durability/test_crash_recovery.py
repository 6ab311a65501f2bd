"""Crash recovery beyond ``kill -9`` (issue 3, "Power cuts" and "Torn and corrupted files").

* Power cuts: ``kill -9`` cannot show a missing fsync, because the page cache outlives the process. Here the
  data directory lives on an ext4 image loop-mounted from a file; while a publisher with confirms runs,
  the image *file* is copied. The loop device writes into that file only what ext4 sent to its "disk"
  (fsynced data, journal commits, writeback), never the dirty pages still held by the mounted file
  system, so the copy is what a power cut would have left. The copy is fsck'd, mounted and served by a
  second broker: every message confirmed before the copy began must be there, once, in order, intact.
  (The copy is not one instant: blocks written while ``cp`` runs may be half in. A sparse copy of a
  256 MiB image from the page cache takes tens of milliseconds, and what was fsynced before it began is
  not rewritten meanwhile; e2fsck repairs the rest, as after a real power cut.)
* Torn and corrupted files: after a clean stop or a ``kill -9``, a message-store segment is cut in the
  middle of its last record, or bytes are flipped in the middle of a store segment or of a queue index
  segment. The broker must start, log what it cut or skipped (naming the file), deliver every intact
  message in order, leave out exactly the damaged one (never garbage), and take new publishes that
  survive a further crash.

Power cuts need root (mount, losetup, mkfs.ext4, e2fsck); without them the test fails with a message
saying what is missing rather than skipping, since CI is expected to run it. The default run has 8 rounds
(``LEVERET_POWERCUT_ROUNDS``) within a 45 s budget (``LEVERET_POWERCUT_BUDGET``); the long lane (marker
``long``, ``make soak``) 100 rounds (``LEVERET_POWERCUT_LONG_ROUNDS``) with no budget, and records its rounds,
confirmed, lost and duplicated in the soak table (tests/soak_report.py).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pika
import pytest
import soak_report
from leftovers import record_mount

from storage.node_storage import queue_dir_name
from tests.integration.durability.test_durability import (  # tests/integration on sys.path
    PipelinedPublisher,
    body_of,
    channel,
    own_broker,
    seq_of,
)

pytestmark = pytest.mark.leveret_only

# -- shared helpers ------------------------------------------------------------------------------------------


def drain_bodies(b, queue: str, *, idle: float = 1.5, limit: float = 60.0) -> list[tuple[bytes, bool]]:
    """Consume and ack everything in ``queue``: ``[(body, redelivered), ...]`` in delivery order."""
    out: list[tuple[bytes, bool]] = []
    with channel(b) as ch:
        ch.basic_qos(prefetch_count=200)
        deadline = time.monotonic() + limit
        last_tag = acked_tag = 0
        for method, _props, body in ch.consume(queue, inactivity_timeout=idle):
            if method is None or time.monotonic() > deadline:
                break
            out.append((body, bool(method.redelivered)))
            last_tag = method.delivery_tag
            if len(out) % 100 == 0:
                ch.basic_ack(last_tag, multiple=True)
                acked_tag = last_tag
        if last_tag > acked_tag:  # acking a tag twice is a 406 (when the count was a multiple of 100, it was)
            ch.basic_ack(last_tag, multiple=True)
        ch.cancel()
        ch.queue_declare(queue, passive=True)  # a round-trip: the acks have been processed
    return out


def storage_complaints(log: str) -> list[str]:
    """The storage warnings and errors in a JSON-lines broker log (one message per line)."""
    out = []
    for line in log.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            if "storage:" in line and re.search(r"warn|error|critical", line, re.IGNORECASE):
                out.append(line)
            continue
        if not isinstance(rec, dict):
            continue
        level = str(rec.get("level") or rec.get("levelname") or "").lower()
        msg = str(rec.get("msg") or rec.get("message") or "")
        if "storage" in msg and level in ("warning", "warn", "error", "critical"):
            out.append(f"{level}: {msg}")
    return out


# -- 1. power cuts -------------------------------------------------------------------------------------------

POWERCUT_ROUNDS = int(os.environ.get("LEVERET_POWERCUT_ROUNDS", "8"))
POWERCUT_BUDGET = float(os.environ.get("LEVERET_POWERCUT_BUDGET", "45"))  # no new round after this (s)
# The long lane's rounds (marker ``long``, left out of the default run; ``make soak`` runs it), with no budget.
POWERCUT_LONG_ROUNDS = int(os.environ.get("LEVERET_POWERCUT_LONG_ROUNDS", "100"))
IMAGE_SIZE = "256M"


def run(*cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p


def umount(mnt: Path) -> None:
    """Unmount, lazily if something still holds it (the loop device goes with the last user: autoclear)."""
    if not os.path.ismount(mnt):
        return
    if run("umount", str(mnt), check=False, timeout=30).returncode != 0:
        run("umount", "-l", str(mnt), check=False, timeout=30)


def mount_loop(image: Path, mnt: Path) -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    # commit=60: no periodic journal commit during a round, so only the broker's own fsyncs (and not a
    # timer of the file system) put its data on the "disk".
    record_mount(mnt)  # tests/leftovers.py: unmounted by the next run if this one is killed
    run("mount", "-o", "loop,commit=60", str(image), str(mnt))


def make_image(image: Path) -> None:
    run("truncate", "-s", IMAGE_SIZE, str(image))
    # Initialise inode tables and journal now, so no lazy-init thread writes to the image meanwhile.
    run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))


def require_loop_mounts(tmp: Path) -> str:
    """Check that this machine can loop-mount an ext4 image; fail (not skip) with the reason if not.
    Returns a note of what was needed, for the report."""
    notes = []
    if os.geteuid() != 0:
        pytest.fail("power-cut test needs root (mount -o loop, losetup); run the suite as root as CI does")
    missing = [t for t in ("mount", "umount", "losetup", "mkfs.ext4", "e2fsck", "truncate") if not shutil.which(t)]
    if missing:
        pytest.fail(f"power-cut test needs these tools: {missing} (apt-get install e2fsprogs mount util-linux)")
    if not Path("/dev/loop-control").exists() and not any(Path("/dev").glob("loop[0-9]*")):
        if shutil.which("modprobe"):
            p = run("modprobe", "loop", check=False)
            notes.append(f"modprobe loop: rc={p.returncode} {p.stderr.strip()}")
        else:
            notes.append("no /dev/loop* and no modprobe")
    p = run("losetup", "-f", check=False)
    notes.append(f"losetup -f: rc={p.returncode} {p.stdout.strip()}{p.stderr.strip()}")
    if p.returncode != 0:
        pytest.fail("no free loop device: " + "; ".join(notes))
    probe_img, probe_mnt = tmp / "probe.img", tmp / "probe"
    try:
        run("truncate", "-s", "16M", str(probe_img))
        run("mkfs.ext4", "-q", "-F", str(probe_img))
        mount_loop(probe_img, probe_mnt)
        (probe_mnt / "x").write_bytes(b"x")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"cannot loop-mount an ext4 image here ({e}); " + "; ".join(notes))
    finally:
        umount(probe_mnt)
        probe_img.unlink(missing_ok=True)
    return "; ".join(notes)


def copy_image(src: Path, dst: Path, broker_pid: int | None = None) -> None:
    """Copy the backing file as it is now: what the loop device has written to it.

    A copy that takes a while while blocks change is no power cut: its blocks come from different
    moments (a journal older than an inode table it then rolls back), a state no real power cut leaves,
    and e2fsck may then lose files the broker never touched during the copy (seen once under heavy load:
    the metadata database's write-ahead log, so a queue declared long before was gone). So the broker
    is stopped (SIGSTOP: its writes and fsyncs finish, no new ones start) and the copy waits until the
    loop device has no write in flight: then every block is from one moment. No data is flushed that the
    broker did not fsync itself, so what it had not made durable is still not on the "disk"."""
    if broker_pid is not None:
        os.kill(broker_pid, signal.SIGSTOP)
    try:
        if broker_pid is not None:
            wait_loop_idle(src)
        run("cp", "--sparse=always", str(src), str(dst), timeout=120)
    finally:
        if broker_pid is not None:
            os.kill(broker_pid, signal.SIGCONT)


def wait_loop_idle(image: Path, timeout: float = 10.0) -> None:
    """Until the loop device over ``image`` has had no request in flight for five reads in a row."""
    out = run("losetup", "-j", str(image), check=False).stdout
    m = re.match(r"(/dev/loop\d+):", out)
    if m is None:
        return
    inflight = Path(f"/sys/block/{Path(m.group(1)).name}/inflight")
    if not inflight.exists():
        return
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 5 and time.monotonic() < deadline:
        quiet = quiet + 1 if inflight.read_text().split() == ["0", "0"] else 0
        time.sleep(0.01)


def powercut_rounds(start_broker, uid: str, tmp_path: Path, rounds: int, budget: float | None) -> None:
    """``rounds`` power cuts (each on a fresh image): every message confirmed before the copy began is served
    by a broker on the copy, once, in order, intact. ``budget``: no new round after that many seconds (at
    least two rounds run); None runs them all (the long lane).

    A round that loses, duplicates, reorders or garbles does not stop the run: each round is counted, the soak
    report's row is written (tests/soak_report.py), and the asserts come after it. A round that cannot run
    (no confirms, a nack, an e2fsck that cannot repair) stops the run at once, its row still written."""
    loop_note = require_loop_mounts(tmp_path)
    seed = os.environ.get("LEVERET_CRASH_SEED", uid)
    rng = random.Random(seed)
    t_start = time.monotonic()
    report: list[dict] = []
    problems: list[str] = []
    confirmed_total = lost_total = dup_total = 0
    note = ""
    mounts: list[Path] = []
    try:
        for rnd in range(rounds):
            if budget is not None and rnd >= 2 and time.monotonic() - t_start > budget:
                note = f"time budget of {budget:.0f} s reached"
                break
            t_round = time.monotonic()
            image, copy = tmp_path / f"r{rnd}.img", tmp_path / f"r{rnd}.copy.img"
            mnt, mnt2 = tmp_path / f"r{rnd}.mnt", tmp_path / f"r{rnd}.copy.mnt"
            make_image(image)
            mount_loop(image, mnt)
            mounts.append(mnt)
            b = own_broker(start_broker, data_dir=mnt / "data")
            q = f"{uid}.r{rnd}"
            with channel(b) as ch:
                ch.queue_declare(q, durable=True)
            n = 20000
            # Small messages are embedded in the queue index, big ones go to the message store.
            pub = PipelinedPublisher(b, q, n, window=rng.choice((20, 100, 300)), sizes=(64, 700, 6000, 40000))
            pub.start()
            try:
                target = rng.randint(50, 6000)  # beyond 4096: an index segment boundary
                assert pub.wait_confirmed(target, timeout=30), \
                    f"round {rnd}: only {len(pub.acked)} of {target} confirms within 30 s"
                time.sleep(rng.random() * 0.05)
                with pub._cond:  # a consistent view of the acks
                    confirmed = set(pub.acked)
                    nacked = set(pub.nacked)
                t0 = time.monotonic()
                copy_image(image, copy, b.pid)
                copy_s = time.monotonic() - t0
                confirmed_after_copy = len(pub.acked)
            finally:
                pub.stop()
                b.kill9()
                umount(mnt)
                image.unlink(missing_ok=True)
            assert pub.error is None, pub.error
            assert not nacked, f"round {rnd}: nacks {sorted(nacked)[:10]}"
            assert confirmed, f"round {rnd}: nothing confirmed before the copy"

            fsck = run("e2fsck", "-fy", str(copy), check=False, timeout=120)
            assert fsck.returncode in (0, 1, 2), \
                f"round {rnd}: e2fsck could not repair the copy (rc {fsck.returncode}):\n{fsck.stdout}{fsck.stderr}"
            mount_loop(copy, mnt2)
            mounts.append(mnt2)
            try:
                b2 = own_broker(start_broker, data_dir=mnt2 / "data")
                got = drain_bodies(b2, q)
                log2 = b2.log_text()
                b2.kill9()
            finally:
                umount(mnt2)
                copy.unlink(missing_ok=True)

            seqs = [seq_of(body) for body, _ in got]
            missing = sorted(confirmed - set(seqs))
            dups = len(seqs) - len(set(seqs))
            confirmed_total += len(confirmed)
            lost_total += len(missing)
            dup_total += dups
            if missing:
                problems.append(
                    f"round {rnd}: {len(missing)} of {len(confirmed)} messages confirmed before the copy are lost "
                    f"after the power cut, first {missing[:10]} (recovered {len(seqs)}, sent {pub.sent}); "
                    f"storage log: {storage_complaints(log2)[:10]}")
            if dups:
                problems.append(f"round {rnd}: {dups} messages delivered twice")
            if seqs != sorted(seqs):
                problems.append(f"round {rnd}: out of order: {seqs[:50]}")
            if not all(1 <= s <= pub.sent for s in seqs):
                problems.append(f"round {rnd}: messages never published")
            # Unconfirmed ones may be there or not, but never damaged.
            garbled = [seq_of(body) for body, _ in got
                       if body != body_of(seq_of(body), pub.sizes[seq_of(body) % len(pub.sizes)])]
            if garbled:
                problems.append(f"round {rnd}: messages {garbled[:10]} garbled")
            # A power cut is a dirty stop: every recovered message counts as possibly delivered.
            if not all(r for _, r in got):
                problems.append(f"round {rnd}: recovered messages not marked redelivered")
            report.append({"round": rnd, "confirmed_before_copy": len(confirmed),
                           "confirmed_after_copy": confirmed_after_copy, "sent": pub.sent,
                           "recovered": len(seqs), "copy_s": round(copy_s, 3), "fsck_rc": fsck.returncode,
                           "round_s": round(time.monotonic() - t_round, 2)})
    except BaseException as e:
        note = f"stopped after {len(report)} rounds: {str(e).splitlines()[0][:80] if str(e) else type(e).__name__}"
        raise
    finally:
        for m in reversed(mounts):
            umount(m)
        soak_report.record(f"power cut, loop-mounted ext4 ({rounds} rounds)", len(report), confirmed_total,
                           lost_total, dup_total, note)
    print(f"power cuts (seed {seed!r}; {loop_note}; {time.monotonic() - t_start:.1f} s):")
    for r in report:
        print("  ", r)
    assert len(report) >= min(2, rounds), f"only {len(report)} power-cut rounds ran"
    if budget is None:
        assert len(report) == rounds, f"{len(report)} of {rounds} power-cut rounds ran"
    assert not problems, f"{len(problems)} round(s) failed: {problems[:10]}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_confirmed_messages_survive_a_power_cut(start_broker, uid, tmp_path):
    powercut_rounds(start_broker, uid, tmp_path, POWERCUT_ROUNDS, POWERCUT_BUDGET)


@pytest.mark.long
@pytest.mark.timeout(max(900, POWERCUT_LONG_ROUNDS * 60))
def test_confirmed_messages_survive_a_power_cut_long(start_broker, uid, tmp_path):
    """The long lane (``make soak``): 100 rounds unless ``LEVERET_POWERCUT_LONG_ROUNDS`` says otherwise, and no
    time budget: every round runs."""
    powercut_rounds(start_broker, uid, tmp_path, POWERCUT_LONG_ROUNDS, None)


# -- 2. torn and corrupted files -----------------------------------------------------------------------------

HEADER = struct.Struct("<III")  # magic, payload length, CRC32 (storage/segment.py's framing)
MAGIC = 0x5445564C
SEQ_RE = re.compile(rb"(\d{10})\|x")
# Sizes: embedded in the queue index (< 4096) or in the message store; the big ones fill more than one
# 16 MiB store segment, so there is a "last" segment and an earlier one.
SIZES = (300, 9000, 1500, 700_000)
N_MSGS = 128


def records(path: Path) -> list[tuple[int, int]]:
    """``(record offset, payload length)`` of each record of an undamaged segment file."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos + HEADER.size <= len(data):
        magic, n, _crc = HEADER.unpack_from(data, pos)
        assert magic == MAGIC, f"{path} is not a segment file of the expected format at {pos}"
        out.append((pos, n))
        pos += HEADER.size + n
    assert pos == len(data), f"{path}: trailing bytes"
    return out


def seq_in(payload: bytes) -> int | None:
    m = SEQ_RE.search(payload)
    return int(m.group(1)) if m else None


def store_files(data_dir: Path) -> list[Path]:
    """The persistent store's non-empty segment files, oldest first."""
    files = sorted((data_dir / "msg_store_persistent").glob("*.msgs"))
    return [f for f in files if f.stat().st_size > 0]


def store_seq_by_id(data_dir: Path) -> dict[bytes, int]:
    """The message store's records: message id (16 bytes) -> the seq its body carries."""
    out = {}
    for f in store_files(data_dir):
        data = f.read_bytes()
        for off, n in records(f):
            payload = data[off + HEADER.size: off + HEADER.size + n]
            out[payload[:16]] = seq_in(payload[16:])
    return out


def flip(path: Path, at: int, n: int = 8) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(n)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))


def cut_last_store_record(data_dir: Path) -> tuple[Path, set[int]]:
    """Truncate the newest store segment in the middle of its last record; returns the file and the
    seq of the message it held (as a set, like the other kinds of damage)."""
    f = store_files(data_dir)[-1]
    off, n = records(f)[-1]
    payload = f.read_bytes()[off + HEADER.size: off + HEADER.size + n]
    os.truncate(f, off + HEADER.size + n // 2)
    return f, {seq_in(payload[16:])}


def flip_in_store_segment(data_dir: Path) -> tuple[Path, set[int]]:
    """Flip bytes in the middle of the record that spans the middle of the oldest store segment (one with
    more records after it, so the damage is in the middle of the file, not its tail)."""
    f = store_files(data_dir)[0]
    recs = records(f)
    assert len(recs) >= 3, f"{f}: only {len(recs)} records"
    mid = f.stat().st_size // 2
    off, n = next((o, n) for o, n in recs if o <= mid < o + HEADER.size + n)
    if (off, n) == recs[-1]:
        off, n = recs[-2]
    payload = f.read_bytes()[off + HEADER.size: off + HEADER.size + n]
    flip(f, off + HEADER.size + n // 2)
    return f, {seq_in(payload[16:])}


def flip_in_index_segment(data_dir: Path, queue: str) -> tuple[Path, set[int]]:
    """Flip bytes in the middle of two publish records in the middle of the queue's first index segment:
    one with the message embedded, one pointing into the message store."""
    qdir = data_dir / "queues" / queue_dir_name("/", queue)
    f = min(qdir.glob("*.idx"))
    data = f.read_bytes()
    recs = records(f)
    assert len(recs) >= 6, f"{f}: only {len(recs)} records"
    by_id = store_seq_by_id(data_dir)
    damaged: dict[bool, int] = {}  # embedded? -> seq
    for off, n in recs[len(recs) // 2: -1]:
        payload = data[off + HEADER.size: off + HEADER.size + n]
        assert payload[0] == 1, "expected only publish records"  # kind 1 (storage/queue_index.py)
        seq = seq_in(payload)
        embedded = seq is not None
        if embedded in damaged:
            continue
        if not embedded:  # the store holds it: its msg id follows the kind byte and the seq_id
            seq = by_id[payload[9:25]]
        flip(f, off + HEADER.size + n // 2)
        damaged[embedded] = seq
        if len(damaged) == 2:
            return f, set(damaged.values())
    raise AssertionError(f"{f}: no embedded and store-held publish records next to each other")


def cut_last_index_record(data_dir: Path, queue: str) -> tuple[Path, set[int]]:
    """Truncate the queue's newest index segment in the middle of its last (publish) record."""
    qdir = data_dir / "queues" / queue_dir_name("/", queue)
    f = max(qdir.glob("*.idx"))
    off, n = records(f)[-1]
    payload = f.read_bytes()[off + HEADER.size: off + HEADER.size + n]
    assert payload[0] == 1, "expected a publish record"
    seq = seq_in(payload)
    if seq is None:
        seq = store_seq_by_id(data_dir)[payload[9:25]]
    os.truncate(f, off + HEADER.size + n // 2)
    return f, {seq}


DAMAGE = {
    "truncated-index-tail": cut_last_index_record,
    "truncated-store-tail": lambda d, q: cut_last_store_record(d),
    "flipped-store-middle": lambda d, q: flip_in_store_segment(d),
    "flipped-index-middle": flip_in_index_segment,
}


def publish_confirmed(b, queue: str, seqs, sizes=SIZES) -> None:
    with channel(b, confirm=True) as ch:
        for s in seqs:
            ch.basic_publish("", queue, body_of(s, sizes[s % len(sizes)]), pika.BasicProperties(delivery_mode=2))


@pytest.mark.parametrize("stop", ["clean", "kill9"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.timeout(120)
def test_broker_serves_the_rest_after_torn_or_corrupted_files(start_broker, uid, damage, stop):
    b = own_broker(start_broker)
    q = f"{uid}.q"
    with channel(b) as ch:
        ch.queue_declare(q, durable=True)
    seqs = list(range(1, N_MSGS + 1))
    publish_confirmed(b, q, seqs)
    if stop == "clean":
        b.stop()
    else:
        b.kill9()

    path, damaged = DAMAGE[damage](b.data_dir, q)
    assert damaged and damaged <= set(seqs), f"could not tell which messages {path} held: {damaged}"
    before = len(b.log_text())
    b.start()  # raises if the broker exits instead of listening
    got = drain_bodies(b, q)
    log = b.log_text()[before:]

    expected = [s for s in seqs if s not in damaged]
    got_seqs = [seq_of(body) for body, _ in got]
    assert got_seqs == expected, (
        f"{damage} after a {stop} stop (messages {sorted(damaged)} damaged in {path.name}): delivered {got_seqs}; "
        f"storage log: {storage_complaints(log)}")
    for body, _ in got:
        s = seq_of(body)
        assert body == body_of(s, SIZES[s % len(SIZES)]), f"message {s} garbled"
    complaints = storage_complaints(log)
    named = str(path) if path.suffix == ".msgs" else str(path.parent)  # the file, or the queue's directory
    assert any(named in c for c in complaints), \
        f"no storage warning or error names {named}; storage log: {complaints}; full log tail:\n{log[-3000:]}"

    # Everything is consumed and acked: the queue's index segments are gone, as for any drained queue,
    # including the entries the damage made unreadable (checked at the end, after the rest).
    qdir = b.data_dir / "queues" / queue_dir_name("/", q)
    left_behind = {p.name: p.stat().st_size for p in qdir.glob("*.idx")}
    print(f"{damage}/{stop}: messages {sorted(damaged)} damaged in {path.name}; logged: {complaints}")

    # New publishes work, and survive another crash next to the repaired files.
    more = list(range(N_MSGS + 1, N_MSGS + 41))
    publish_confirmed(b, q, more)
    b.kill9()
    b.start()
    got = drain_bodies(b, q)
    assert [seq_of(body) for body, _ in got] == more
    for body, _ in got:
        s = seq_of(body)
        assert body == body_of(s, SIZES[s % len(SIZES)]), f"message {s} garbled"
    with channel(b) as ch:
        assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert not left_behind, (
        f"{damage} after a {stop} stop: the queue was drained and every delivery acked, yet its index "
        f"segments {left_behind} stayed on disk (they go only at the next dirty start)")
