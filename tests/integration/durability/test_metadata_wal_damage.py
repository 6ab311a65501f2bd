"""Damage in the metadata database's write-ahead log is refused, not silently cut (issue 31; storage/sqlite_wal.py).

A broker declares queues and bindings one by one (one commit each) and is killed with -9, so that
``metadata.sqlite-wal`` holds their frames. One bit flipped in an early frame's page made SQLite stop replaying
at that frame: every definition committed after it was gone, without a word (the bit-flip lane lost a queue and
its binding that way). The start is now refused with one line naming the file and the offset; a log cut in its
last frame (a crash mid-write) still starts, with every definition committed before it."""

from __future__ import annotations

import shutil
import struct

import pika
import pytest

pytestmark = pytest.mark.leveret_only

QUEUES = [f"wal-q{i}" for i in range(8)]


def _crashed(start_broker, tmp_path):
    data = tmp_path / "data"
    b = start_broker(data_dir=data)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.exchange_declare("wal-x", "direct", durable=True)
    for q in QUEUES:
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, "wal-x", q)
    conn.close()
    b.kill9()
    (data / "leveret.lock").unlink(missing_ok=True)
    wal = data / "metadata.sqlite-wal"
    raw = wal.read_bytes()
    assert len(raw) > 32 and struct.unpack(">I", raw[:4])[0] in (0x377F0682, 0x377F0683), "no WAL was left"
    page = struct.unpack(">I", raw[8:12])[0]
    assert (len(raw) - 32) // (24 + page) >= 10, "the WAL should hold the declarations' frames"
    return data, page


def _declared(b) -> set[str]:
    conn = pika.BlockingConnection(b.pika_params())
    found = set()
    for q in QUEUES:
        ch = conn.channel()
        try:
            ch.queue_declare(q, passive=True)
            found.add(q)
        except pika.exceptions.ChannelClosedByBroker:
            pass
    conn.close()
    return found


def test_a_flipped_bit_in_an_early_wal_frame_refuses_the_start(start_broker, tmp_path):
    data, page = _crashed(start_broker, tmp_path)
    copy = tmp_path / "flipped"
    shutil.copytree(data, copy)
    wal = copy / "metadata.sqlite-wal"
    frame = 32 + 4 * (24 + page)  # the fifth frame: the table and some definitions are in the frames before
    at = frame + 24 + page // 2  # inside its page
    with open(wal, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x20]))
    with pytest.raises(RuntimeError) as exc:
        b = start_broker(data_dir=copy)
        missing = set(QUEUES) - _declared(b)
        b.kill9()
        pytest.fail(f"the broker started on a damaged WAL; definitions lost silently: {sorted(missing)}")
    text = str(exc.value)
    assert f"storage: corrupt record in {wal} at offset {frame} (metadata)" in text, text[-2000:]
    assert f"{wal} is damaged at offset {frame}" in text and "restore" in text and "--force-reset" in text


def test_a_wal_cut_in_its_last_frame_starts_with_what_was_committed_before(start_broker, tmp_path):
    data, page = _crashed(start_broker, tmp_path)
    wal = data / "metadata.sqlite-wal"
    raw = wal.read_bytes()
    wal.write_bytes(raw[:len(raw) - page // 2])  # the last frame cut short, as a crash mid-write leaves it
    b = start_broker(data_dir=data)
    try:
        assert _declared(b) >= set(QUEUES[:-1])
        assert "corrupt record" not in b.log_text()
    finally:
        b.kill9()
