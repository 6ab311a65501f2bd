"""Start-up time with many messages on disk (issue 3): fill a durable queue with N persistent messages,
stop the broker cleanly or kill -9 it, and time the restart until the port accepts and the queue reports
all N messages.

    .venv/bin/python -m bench.recovery [--messages 1000000] [--size 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from pamqp import commands

from broker.tools.amqp_client import PublishTemplate, connect

QUEUE = "recovery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, data_dir: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "broker", "serve", "--port", str(port), "--data-dir", data_dir,
                             "--management-port", "0", "--prometheus-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_listening(port: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError("broker did not start")


async def _depth(url: str) -> int:
    conn = await connect(url)
    ok = await conn.rpc(commands.Queue.Declare(queue=QUEUE, passive=True))
    await conn.close()
    return ok.message_count


async def _fill(url: str, n: int, size: int) -> None:
    conn = await connect(url)
    await conn.rpc(commands.Queue.Declare(queue=QUEUE, durable=True))
    template = PublishTemplate("", QUEUE, size, True)
    sent = 0
    while sent < n:
        k = min(1000, n - sent)
        conn.wire.write(template.batch(k))
        sent += k
        while conn.wire.get_write_buffer_size() > (4 << 20):
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)
    while await _depth(url) < n:
        await asyncio.sleep(0.2)
    await conn.close()


def measure(n: int, size: int) -> dict:
    out: dict = {"messages": n, "body_bytes": size}
    tmp = tempfile.mkdtemp(prefix="leveret-recovery-")
    port = _free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    try:
        p = _start(port, tmp)
        _wait_listening(port)
        t = time.monotonic()
        asyncio.run(_fill(url, n, size))
        out["fill_s"] = round(time.monotonic() - t, 2)
        for how in ("clean", "dirty"):
            if how == "clean":
                p.send_signal(signal.SIGTERM)
            else:
                p.send_signal(signal.SIGKILL)
            p.wait(120)
            t = time.monotonic()
            p = _start(port, tmp)
            _wait_listening(port)
            depth = asyncio.run(_depth(url))
            out[f"start_after_{how}_stop_s"] = round(time.monotonic() - t, 2)
            out[f"messages_after_{how}_stop"] = depth
        p.send_signal(signal.SIGTERM)
        p.wait(120)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    print(json.dumps(measure(args.messages, args.size)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
