"""An idle connection's footprint (issue 38: 50,000 idle connections in ≤ 10 KB each, a channel open on each).
As for queues (tests/unit/storage/test_queue_footprint.py, which measures the cliff), CPython 3.11 gives every
instance whose dictionary holds 30 keys or more a key table of its own, 1.6 KB more than below: so a connection
(its GuardedReader) and its channel, through the handshake and idle, keep fewer than 30 instance attributes.
This runs the node's real server on loopback and a real client handshake (in this process, to look at the
objects); the RSS per connection is measured by bench/cost_curves.py."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from broker.config import load_settings
from broker.node import Node
from broker.server import Server
from broker.tools.amqp_client import connect

SHARED_KEYS_MAX = 30  # CPython 3.11's SHARED_KEYS_MAX_SIZE (Objects/dictobject.c)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_idle_connection_and_its_channel_stay_under_the_shared_key_limit(tmp_path: Path) -> None:
    port = _free_port()
    settings = load_settings(None, [("leveret.data_dir", str(tmp_path)),
                                    ("listeners.tcp.default", f"127.0.0.1:{port}"),
                                    ("management.tcp.port", str(_free_port())),
                                    ("prometheus.tcp.port", str(_free_port()))])
    node = Node(settings)

    async def main() -> tuple[dict[str, object], dict[str, object]]:
        server = Server(node)
        task = asyncio.ensure_future(server.run_until_signalled())
        try:
            for _ in range(200):
                try:
                    client = await connect(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the broker did not listen")
            await asyncio.sleep(0.2)  # the handshake's last writes flushed
            (reader,) = node.connections
            attributes = dict(vars(reader)), dict(vars(reader.channels[1]))
            await client.close()
            return attributes
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    reader_attributes, channel_attributes = asyncio.run(main())
    assert len(reader_attributes) < SHARED_KEYS_MAX, sorted(reader_attributes)
    assert len(channel_attributes) < SHARED_KEYS_MAX, sorted(channel_attributes)
