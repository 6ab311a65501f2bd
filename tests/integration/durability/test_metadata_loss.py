"""Metadata lost or corrupted at start (issue 9, "Durability defects").

The metadata (``metadata.sqlite``: users, vhosts, permissions, policies, durable exchanges, queues, bindings;
an older node also kept users, vhosts and permissions in ``metadata.json``, which the next start migrates
into the store) is what recovery trusts to say which queue files belong to a live queue; the files of every
queue it does not list are deleted as orphans. So a data directory holding message data without its
metadata must not start: the broker exits non-zero with one line naming the file and what to do, and
changes nothing, byte for byte. Putting the metadata back brings every message back, which proves that
nothing was deleted. ``leveret serve --force-reset`` is the explicit way to start over, like
``rabbitmqctl force_reset``. A metadata file that cannot be read (random bytes, damaged pages, an older
node's JSON of the wrong shape) is one line as well, never a Python traceback.

Each test fills a durable queue through a Leveret of its own (``start_broker``), stops it (SIGTERM or
``kill -9``), damages a metadata file, and then runs ``python -m broker serve`` directly, since the start
is expected to fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
from old_metadata import downgrade, old_document, rabbit_hash
from pika.exceptions import ChannelClosedByBroker

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(240)]

# Not imported from conftest: run next to tests/unit/storage, "conftest" may name that directory's module.
ROOT = Path(__file__).resolve().parents[3]
QUEUE = "metadata-loss"
BIG = 6000  # above queue_index_embed_msgs_below: the persistent message store holds these bodies
SMALL = 100  # embedded in the queue index


# -- helpers ---------------------------------------------------------------------------------------------------


def body_of(i: int) -> bytes:
    """Message ``i``: every third one too big for the queue index, so both the index and the store hold data."""
    size = BIG if i % 3 == 0 else SMALL
    head = b"%06d|" % i
    return head + b"x" * (size - len(head))


def own_broker(start_broker, *args: str, **kw):
    return start_broker("--management-port", "0", "--prometheus-port", "0", *args, **kw)


@contextlib.contextmanager
def channel(b, user: str = "guest", password: str = "guest"):
    params = b.pika_params()
    params.credentials = pika.PlainCredentials(user, password)
    conn = pika.BlockingConnection(params)
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn.close()


def fill(b, n: int) -> None:
    """Declare the durable queue and publish ``n`` persistent messages, each confirmed."""
    with channel(b) as ch:
        ch.queue_declare(QUEUE, durable=True)
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        for i in range(n):
            ch.basic_publish("", QUEUE, body_of(i), props, mandatory=True)


def drain(b) -> list[bytes]:
    """Every message of the queue, in order, acked."""
    out: list[bytes] = []
    with channel(b) as ch:
        while True:
            method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
            if method is None:
                return out
            out.append(body)


def queue_exists(b, name: str) -> bool:
    with channel(b) as ch:
        try:
            ch.queue_declare(name, passive=True)
            return True
        except ChannelClosedByBroker as e:
            assert e.reply_code == 404, e
            return False


def files_of(data_dir: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under ``data_dir`` (relative path → sha256), except names starting with one of ``skip``
    and the lock file (``leveret.lock``, which each start rewrites with its pid)."""
    out = {}
    for path in sorted(data_dir.rglob("*")):
        rel = str(path.relative_to(data_dir))
        if path.is_file() and not rel.startswith(skip) and rel != "leveret.lock":
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def message_files(files: dict[str, str]) -> tuple[list[str], list[str]]:
    """(queue index files, message store segments) among ``files``."""
    return ([f for f in files if f.startswith("queues/") and f.endswith(".idx")],
            [f for f in files if f.startswith("msg_store_persistent/") and f.endswith(".msgs")])


@dataclass
class Run:
    returncode: int
    stderr: str


def free_port() -> int:
    from worker_resources import free_port as worker_port

    return worker_port()


def serve(data_dir: Path, *args: str, timeout: float = 30.0) -> Run:
    """Run ``python -m broker serve`` on ``data_dir`` until it exits. Listening instead is a failure of the
    test (the broker accepted the directory); it is killed then."""
    port = free_port()
    cmd = [sys.executable, "-m", "broker", "serve", "--bind", "127.0.0.1", "--port", str(port),
           "--data-dir", str(data_dir), "--management-port", "0", "--prometheus-port", "0", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", LEVERET_LOG_FORMAT="json")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + timeout
    listening = False
    while p.poll() is None and time.monotonic() < deadline and not listening:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            listening = True
        time.sleep(0.05)
    if p.poll() is None:
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"the broker {'started' if listening else 'neither exited nor listened'} instead of "
                    f"refusing the data directory:\n{err[-3000:]}")
    _, err = p.communicate()
    return Run(p.returncode, err)


def assert_refused(run: Run, path: Path, *fragments: str) -> str:
    """Non-zero exit, no traceback, and one ``leveret:`` line on stderr naming ``path`` (returned)."""
    assert run.returncode != 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("leveret: ")]
    assert len(lines) == 1, run.stderr
    assert str(path) in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def stop(b, how: str) -> None:
    if how == "kill9":
        b.kill9()
    else:
        assert b.stop(signal.SIGTERM) == 0


# -- 1. metadata.sqlite lost ------------------------------------------------------------------------------------

N = 3000


@pytest.mark.parametrize("damage, how", [("truncate", "sigterm"), ("truncate", "kill9"), ("delete", "sigterm")])
def test_lost_metadata_sqlite_stops_the_start_and_keeps_every_message(start_broker, damage, how):
    b = own_broker(start_broker)
    fill(b, N)
    stop(b, how)
    data = b.data_dir
    sqlite_path = data / "metadata.sqlite"
    backup = sqlite_path.read_bytes()
    if damage == "truncate":
        os.truncate(sqlite_path, 0)
    else:
        sqlite_path.unlink()
    before = files_of(data)
    indexes, segments = message_files(before)
    assert indexes and segments, before  # both kinds of message data are at stake

    line = assert_refused(serve(data), sqlite_path, "--force-reset")
    assert ("empty" if damage == "truncate" else "missing") in line
    assert files_of(data) == before  # nothing deleted, nothing written

    sqlite_path.write_bytes(backup)  # (after kill -9 its -wal file was never touched)
    b2 = own_broker(start_broker, data_dir=data)
    assert drain(b2) == [body_of(i) for i in range(N)]


def test_metadata_sqlite_without_definitions_stops_the_start(start_broker):
    b = own_broker(start_broker)
    fill(b, 30)
    stop(b, "sigterm")
    data = b.data_dir
    sqlite_path = data / "metadata.sqlite"
    backup = sqlite_path.read_bytes()
    sqlite_path.unlink()
    db = sqlite3.connect(sqlite_path)  # a valid database with the table and not one row
    db.execute("CREATE TABLE defs (kind TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
               "PRIMARY KEY (kind, key)) WITHOUT ROWID")
    db.commit()
    db.close()
    before = files_of(data, skip=("metadata.sqlite",))

    assert_refused(serve(data), sqlite_path, "no definitions", "--force-reset")
    assert files_of(data, skip=("metadata.sqlite",)) == before

    for side in ("metadata.sqlite-wal", "metadata.sqlite-shm"):
        (data / side).unlink(missing_ok=True)
    sqlite_path.write_bytes(backup)
    b2 = own_broker(start_broker, data_dir=data)
    assert drain(b2) == [body_of(i) for i in range(30)]


def test_force_reset_wipes_the_node_and_starts_fresh(start_broker):
    b = own_broker(start_broker)
    fill(b, 30)
    stop(b, "sigterm")
    data = b.data_dir
    os.truncate(data / "metadata.sqlite", 0)
    assert_refused(serve(data), data / "metadata.sqlite")

    b2 = own_broker(start_broker, "--force-reset", data_dir=data)
    assert "force_reset" in b2.log_text()
    assert not queue_exists(b2, QUEUE)
    indexes, segments = message_files(files_of(data))
    assert indexes == [] and sum((data / s).stat().st_size for s in segments) < BIG  # the old messages are gone
    assert not (data / "metadata.json").exists()  # a new node writes its metadata to the store, at once
    db = sqlite3.connect(data / "metadata.sqlite")
    assert db.execute("SELECT COUNT(*) FROM defs WHERE kind = 'user'").fetchone()[0] == 1
    db.close()
    fill(b2, 5)  # the fresh node works, and its data survives a normal restart (no reset, no refusal)
    stop(b2, "sigterm")
    b3 = own_broker(start_broker, data_dir=data)
    assert drain(b3) == [body_of(i) for i in range(5)]


# -- 2. an older node's metadata.json lost (before its migration into the store) ----------------------------------


def as_older_node(data_dir: Path, *, app_user: bool = False) -> None:
    """The stopped node's directory as an older Leveret left it: users, vhosts and permissions in
    metadata.json, the store recording that the file was written."""
    users = [{"name": "guest", "password_hash": rabbit_hash("guest"), "tags": ["administrator"], "limits": {},
              "hashing_algorithm": "rabbit_password_hashing_sha256"}]
    permissions = [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]
    if app_user:
        users.append({"name": "app", "password_hash": rabbit_hash("app-pw"), "tags": [], "limits": {},
                      "hashing_algorithm": "rabbit_password_hashing_sha256"})
        permissions.append({"user": "app", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"})
    downgrade(data_dir, old_document(users=users, vhosts=[{"name": "/"}], permissions=permissions))


def definitions_with_a_user(tmp_path: Path) -> Path:
    path = tmp_path / "defs.json"
    path.write_text(json.dumps({
        "users": [{"name": "app", "password": "app-pw", "tags": ""}],
        "permissions": [{"user": "app", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
    }))
    return path


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_lost_metadata_json_stops_the_start(start_broker, tmp_path, damage):
    b = own_broker(start_broker, "--load-definitions", str(definitions_with_a_user(tmp_path)))
    fill(b, 30)
    stop(b, "sigterm")
    data = b.data_dir
    as_older_node(data, app_user=True)
    json_path = data / "metadata.json"
    backup = json_path.read_bytes()
    if damage == "delete":
        json_path.unlink()
    else:
        os.truncate(json_path, 0)
    before = files_of(data)

    line = assert_refused(serve(data), json_path, "--force-reset")
    assert ("missing" if damage == "delete" else "empty") in line
    assert files_of(data) == before  # the users were not replaced by guest/guest, nothing else changed

    json_path.write_bytes(backup)
    b2 = own_broker(start_broker, data_dir=data)  # migrated now
    with channel(b2, "app", "app-pw") as ch:
        assert ch.queue_declare(QUEUE, passive=True).method.message_count == 30
    assert not json_path.exists() and (data / "metadata.json.migrated").exists()


def test_metadata_json_without_its_sqlite_stops_the_start(start_broker):
    """No queue data at all, but the node existed: its exchanges and bindings were in the lost database."""
    b = own_broker(start_broker)
    with channel(b) as ch:
        ch.exchange_declare("metadata-loss-x", "topic", durable=True)
    stop(b, "sigterm")
    as_older_node(b.data_dir)
    sqlite_path = b.data_dir / "metadata.sqlite"
    sqlite_path.unlink()
    assert_refused(serve(b.data_dir), sqlite_path, "metadata.json")
    assert not sqlite_path.exists()


# -- 3. corrupted metadata --------------------------------------------------------------------------------------


def damage_sqlite(path: Path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    rnd = random.Random(9)
    if how == "random":  # not a database at all
        raw = bytearray(rnd.randbytes(len(raw)))
    else:  # a valid header, and the pages after the first one garbage
        page = int.from_bytes(raw[16:18], "big") or 65536
        assert len(raw) >= 2 * page, len(raw)
        raw[page:] = rnd.randbytes(len(raw) - page)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["random", "pages"])
def test_corrupt_metadata_sqlite_is_one_line_not_a_traceback(start_broker, how):
    b = own_broker(start_broker)
    fill(b, 30)
    stop(b, "sigterm")
    data = b.data_dir
    sqlite_path = data / "metadata.sqlite"
    backup = sqlite_path.read_bytes()
    damage_sqlite(sqlite_path, how)
    before = files_of(data, skip=("metadata.sqlite-",))

    assert_refused(serve(data), sqlite_path, "--force-reset")
    assert files_of(data, skip=("metadata.sqlite-",)) == before

    for side in ("metadata.sqlite-wal", "metadata.sqlite-shm"):
        (data / side).unlink(missing_ok=True)
    sqlite_path.write_bytes(backup)
    b2 = own_broker(start_broker, data_dir=data)
    assert drain(b2) == [body_of(i) for i in range(30)]


@pytest.mark.parametrize("content", [b"\x8f\x00garbage\xff" * 50, b'{"users": [', b"[1, 2, 3]",
                                     b'{"users": 5}', b"[" * 100_000 + b"]" * 100_000],
                         ids=["binary", "truncated", "array", "wrong-shape", "deeply-nested"])
def test_corrupt_metadata_json_is_one_line_not_a_traceback(start_broker, content):
    b = own_broker(start_broker)
    fill(b, 30)
    stop(b, "sigterm")
    data = b.data_dir
    as_older_node(data)
    json_path = data / "metadata.json"
    backup = json_path.read_bytes()
    json_path.write_bytes(content)
    before = files_of(data)

    assert_refused(serve(data), json_path, "corrupt")
    assert files_of(data) == before

    json_path.write_bytes(backup)
    b2 = own_broker(start_broker, data_dir=data)
    assert drain(b2) == [body_of(i) for i in range(30)]



def test_force_reset_refuses_a_directory_that_is_not_a_data_directory(tmp_path):
    """A wrong --data-dir (a home directory, say) is not wiped: nothing in it is a node's."""
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.txt").write_text("keep me")
    before = files_of(home)
    assert_refused(serve(home, "--force-reset"), home, "does not look like a Leveret data directory")
    assert files_of(home) == before and (home / "projects").is_dir()
