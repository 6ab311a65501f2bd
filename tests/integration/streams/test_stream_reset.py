"""``leveret serve --force-reset`` and streams (issue 12): ``streams/`` (the vhosts' stream stores:
storage/stream_store.py) is one of the entries that mark a node's data directory (storage/node_storage.py's
NODE_ENTRIES), so a reset recognises a directory holding only streams and wipes them with the rest; the fresh
node has no stream and none of the old messages.
"""

from __future__ import annotations

import shutil

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from storage.node_storage import reset_data_dir
from tests.integration.durability.test_metadata_loss import files_of, own_broker, stop

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(120)]

STREAM = "reset-stream"
ARGS = {"x-queue-type": "stream"}


def fill_stream(b, n: int) -> None:
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(STREAM, durable=True, arguments=ARGS)
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", STREAM, b"old-%04d" % i + b"x" * 500, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()


def stream_exists(b) -> bool:
    conn = pika.BlockingConnection(b.pika_params())
    try:
        conn.channel().queue_declare(STREAM, passive=True)
        return True
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False
    finally:
        if conn.is_open:
            conn.close()


def stream_bytes(data) -> int:
    return sum((data / f).stat().st_size for f in files_of(data) if f.startswith("streams/"))


def test_force_reset_wipes_streams(start_broker):
    b = own_broker(start_broker)
    fill_stream(b, 200)
    stop(b, "sigterm")
    data = b.data_dir
    assert stream_bytes(data) > 200 * 500  # the stream's messages are on disk

    b2 = own_broker(start_broker, "--force-reset", data_dir=data)
    assert "force_reset" in b2.log_text()
    assert not stream_exists(b2)
    assert stream_bytes(data) == 0  # the old messages are gone
    fill_stream(b2, 3)  # the fresh node keeps streams again
    assert stream_exists(b2)


def test_a_directory_holding_only_streams_is_a_data_directory(start_broker):
    """What --force-reset does first (reset_data_dir): a directory with nothing but ``streams/`` in it (the
    metadata and queues gone) is a node's, so it is wiped rather than refused."""
    b = own_broker(start_broker)
    fill_stream(b, 20)
    stop(b, "sigterm")
    data = b.data_dir
    for entry in list(data.iterdir()):
        if entry.name != "streams":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    assert [p.name for p in data.iterdir()] == ["streams"]
    assert reset_data_dir(str(data)) == ["streams"]
    assert list(data.iterdir()) == []
