"""Helpers of the bit-flip lane (durability/test_bitflip_lane.py): a data directory holding known messages in every store,
single-bit damage to chosen files of a stopped broker's copy of it, and the accounting of what came back.

Speed: a broker start costs about 1.5 s, so messages are published once into a *template* data directory
(one stopped with SIGTERM, one killed with -9: the clean start and the dirty recovery read different files);
each round copies a template, flips bits in it and starts one broker on the copy. Every round is one start.

What a template holds, with confirms (so every message is acknowledged data the broker owes us):

* ``cq``: a durable classic queue; half the bodies under ``queue_index_embed_msgs_below`` (embedded in the
  queue index), half above (in the message store);
* ``sq``: a stream, the same mix;
* ``dx`` -> ``dq``: an ``x-delayed-message`` exchange and its queue; the messages are pending in the delay
  store when the template stops and due by the time a round starts.

Each body is derived from its id and carries the SHA-256 of itself in a header, so a body delivered with
wrong bytes is caught whatever the damage. The broker's reports are its ``storage: corrupt record in <path>
at offset <n>`` lines (storage/corruption.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions

GROUPS = ("cq", "sq", "dq")
# The stores whose files a round damages, and the message groups a store's damage may cost.
STORE_GROUPS = {
    "msg_store": {"cq"},
    "queue_index": {"cq", "dq"},
    "stream": {"sq"},
    "delay": {"dq"},
    "metadata": {"cq", "sq", "dq"},
}
DELAY_MS = 1500
REPORT = re.compile(r"storage: corrupt record in (?P<path>\S+) at offset (?P<off>\d+) \((?P<store>\w+)\)")
METRIC = re.compile(r'^leveret_storage_corrupt_records_total\{store="(?P<store>\w+)"\} (?P<v>[0-9.e+]+)$', re.MULTILINE)


def body_of(seed: int, mid: str, size: int) -> bytes:
    """The body of message ``mid``: its id, then bytes derived from it (distinct for every message)."""
    head = f"{mid}:".encode()
    out = bytearray(head)
    block = hashlib.sha256(f"{seed}:{mid}".encode()).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


@dataclass
class Template:
    """A stopped broker's data directory and the messages confirmed into it, by group."""

    data_dir: Path
    how: str  # "sigterm" or "kill9"
    seed: int
    sent: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> id -> sha256 of the body
    due_at: float = 0.0  # wall-clock time after which every delayed message is due


def make_template(start_broker, data_dir: Path, how: str, seed: int, per_group: int) -> Template:
    """Publish ``per_group`` confirmed messages per group into a fresh broker and stop it ``how``."""
    rng = random.Random(seed)
    b = start_broker(data_dir=data_dir)
    t = Template(data_dir, how, seed, {g: {} for g in GROUPS})
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("cq", durable=True)
    ch.queue_declare("sq", durable=True, arguments={"x-queue-type": "stream"})
    ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare("dq", durable=True)
    ch.queue_bind("dq", "dx", "k")
    for i in range(per_group):
        for group in GROUPS:
            mid = f"{how}-{group}-{i}"
            size = rng.randint(40, 3000) if i % 2 else rng.randint(5000, 9000)
            body = body_of(seed, mid, size)
            sha = hashlib.sha256(body).hexdigest()
            headers = {"id": mid, "sha": sha}
            if group == "dq":
                headers["x-delay"] = DELAY_MS
                ch.basic_publish("dx", "k", body, pika.BasicProperties(delivery_mode=2, headers=headers))
            else:
                ch.basic_publish("", group, body, pika.BasicProperties(delivery_mode=2, headers=headers))
            t.sent[group][mid] = sha
    t.due_at = time.time() + DELAY_MS / 1000 + 0.2
    conn.close()
    if how == "kill9":
        b.kill9()
    else:
        assert b.stop(signal.SIGTERM) == 0, b.log_text()
    os.unlink(data_dir / "leveret.lock") if (data_dir / "leveret.lock").exists() else None
    return t


@dataclass
class Flip:
    store: str
    path: Path
    offset: int
    bit: int

    def __str__(self) -> str:
        return f"{self.store}:{self.path.name}@{self.offset}^bit{self.bit}"


def files_of(data_dir: Path, store: str) -> list[Path]:
    """The non-empty files of one store in a data directory."""
    if store == "metadata":
        # The database and its write-ahead log (a kill -9 leaves one): the broker checks the log before SQLite
        # replays it (storage/sqlite_wal.py). The -shm index is rebuilt from the log at every start.
        found = [p for p in data_dir.glob("metadata.sqlite*") if not p.name.endswith("-shm")]
    else:
        sub = {"msg_store": "msg_store_persistent", "queue_index": "queues", "stream": "streams",
               "delay": "delayed"}[store]
        found = [p for p in (data_dir / sub).rglob("*") if p.is_file()]
    return sorted(p for p in found if p.stat().st_size > 0)


def flip_bits(data_dir: Path, stores: list[str], rng: random.Random) -> list[Flip]:
    """Flip one bit at a random offset of one random file of each store."""
    flips = []
    for store in stores:
        files = files_of(data_dir, store)
        if not files:
            continue
        path = rng.choice(files)
        offset = rng.randrange(path.stat().st_size)
        bit = rng.randrange(8)
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << bit)]))
        flips.append(Flip(store, path, offset, bit))
    return flips


def reports(log_text: str) -> list[tuple[str, int, str]]:
    """The broker's corruption reports: (path, offset, store)."""
    out = []
    for line in log_text.splitlines():
        try:
            event = json.loads(line).get("event", "")
        except ValueError:
            event = line
        m = REPORT.search(event)
        if m:
            out.append((m["path"], int(m["off"]), m["store"]))
    return out


def corrupt_counter(prometheus_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m["store"]: float(m["v"]) for m in METRIC.finditer(text)}


def drain(b, expected: dict[str, int], due_deadline: float, idle: float = 0.6) -> dict[str, list[tuple[str, str, str]]]:
    """Everything the broker delivers now, per group: (id header, sha header, sha of the body received)."""
    got: dict[str, list[tuple[str, str, str]]] = {g: [] for g in GROUPS}
    conn = pika.BlockingConnection(b.pika_params(blocked_connection_timeout=30))
    try:
        ch = conn.channel()
        for group in ("cq", "dq"):
            deadline = due_deadline if group == "dq" else 0.0
            while True:
                method, props, body = ch.basic_get(group, auto_ack=True)
                if method is None:
                    if len(got[group]) >= expected[group] or time.time() > deadline:
                        break
                    time.sleep(0.05)
                    continue
                h = props.headers or {}
                got[group].append((str(h.get("id")), str(h.get("sha")), hashlib.sha256(body).hexdigest()))
        ch.basic_qos(prefetch_count=500)
        last = [time.monotonic()]

        def on_msg(c, method, props, body):
            h = props.headers or {}
            got["sq"].append((str(h.get("id")), str(h.get("sha")), hashlib.sha256(body).hexdigest()))
            c.basic_ack(method.delivery_tag)
            last[0] = time.monotonic()

        ch.basic_consume("sq", on_msg, arguments={"x-stream-offset": "first"})
        while len(got["sq"]) < expected["sq"] and time.monotonic() - last[0] < idle:
            conn.process_data_events(time_limit=0.05)
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            conn.close()  # the broker may have closed it: what was received is what counts
    return got


def copy_template(t: Template, to: Path) -> Path:
    shutil.copytree(t.data_dir, to)
    return to
