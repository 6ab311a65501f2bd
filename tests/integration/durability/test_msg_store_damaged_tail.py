"""A damaged record that the message store first meets while compacting its file (the bit-flip lane's seed
654106558, round 18: ``KeyError: 0`` and a 541 on ``basic.get``).

After a clean stop the store trusts its snapshot and reads nothing at start, so a record damaged on disk is
found only when something reads it: the queue's fetch, or a compaction of its file. Consuming the first half of
a file's messages makes the compaction copy the live records; a damaged one cannot be copied (its id cannot be
trusted), so it is left out, and it must then be dropped from the store's index too: left there, its location
points into the rewritten file (at bytes that may be another record) or, once the other records are consumed and
the file deleted, at a file that is gone, which was the ``KeyError``. The queue index's ``clean.terms`` is damaged
as well, as in the lane's round, so the queue recovers by scanning its segments.

Built by hand rather than by random flips, so that it fails the same way every run before the fix.
"""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import pika
import pika.exceptions
import pytest
from bitflip_helpers import corrupt_counter, reports

from storage.node_storage import queue_dir_name
from storage.segment import HEADER, HEADER_SIZE, scan

pytestmark = pytest.mark.leveret_only

QUEUE = "q-damaged-tail"
COUNT = 20
SIZE = 6000  # above queue_index_embed_msgs_below (4096): every body is in the message store


def _body(i: int) -> bytes:
    head = f"m{i}:".encode()
    return head + hashlib.sha256(head).digest() * (SIZE // 32)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x40]))


def test_damaged_last_record_found_by_compaction_is_dropped_and_reported(start_broker, tmp_path):
    data = tmp_path / "data"
    b = start_broker(data_dir=data)
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUEUE, durable=True)
    for i in range(COUNT):
        ch.basic_publish("", QUEUE, _body(i), pika.BasicProperties(delivery_mode=2, headers={"i": i}),
                         mandatory=True)  # confirmed: raises otherwise
    conn.close()
    assert b.stop(signal.SIGTERM) == 0, b.log_text()[-3000:]
    (data / "leveret.lock").unlink(missing_ok=True)

    # The last record of the first message file: one bit of its body (the file keeps its size, so the store's
    # snapshot still matches it and is trusted; the record fails its CRC when read).
    msgs = data / "msg_store_persistent" / "00000000.msgs"
    records, good_end, _ = scan(msgs.read_bytes(), str(msgs))
    assert len(records) == COUNT and good_end == msgs.stat().st_size, "the test's assumption about the file"
    last_off, last_payload, last_n = records[-1]
    assert HEADER.size == HEADER_SIZE
    _flip(msgs, last_payload + last_n - 100)
    terms = data / "queues" / queue_dir_name("/", QUEUE) / "clean.terms"
    assert terms.exists(), "a clean stop leaves the queue's clean.terms"
    _flip(terms, terms.stat().st_size // 2)

    b = start_broker(data_dir=data)
    got: dict[int, bytes] = {}
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        while True:
            try:
                method, props, body = ch.basic_get(QUEUE, auto_ack=True)
            except pika.exceptions.AMQPError as e:  # the 541 the lane found
                raise AssertionError(f"basic.get failed after {len(got)} messages ({e!r}):\n"
                                     f"{b.log_text()[-4000:]}") from None
            if method is None:
                break
            i = (props.headers or {})["i"]
            assert i not in got, f"message {i} delivered twice"
            got[i] = body
    finally:
        if conn.is_open:
            conn.close()
    log = b.log_text()
    counter = corrupt_counter(b.prometheus_port)
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]
    lost = sorted(set(range(COUNT)) - set(got))
    assert lost == [COUNT - 1], f"lost {lost}, expected only the damaged last message; log:\n{log[-4000:]}"
    for i, body in got.items():
        assert body == _body(i), f"message {i} delivered with wrong bytes"
    found = [(p, o) for p, o, s in reports(log) if s == "msg_store"]
    assert found == [(str(msgs), last_off)], f"reports {found}; log:\n{log[-4000:]}"
    assert counter.get("msg_store") == 1, counter
