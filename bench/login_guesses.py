"""Password guesses a second from one client address (issue 17's "failed logins" measurement).

    python -m bench.login_guesses --port 5672 [--source 127.0.0.2] [--concurrency 64] [--seconds 10]

Runs ``--concurrency`` connections at a time from one source address, each: protocol header, connection.start,
a PLAIN start-ok with a wrong password, and the answer (connection.close 403, or the socket closed by the
broker's cap on unfinished handshakes); then the next. Prints the answers a second: each is one guess checked.
A guess the broker refused before reading it (closed at once) is counted apart: it tried no password.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

from pamqp import commands, frame

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"


def start_ok(user: str, password: str) -> bytes:
    method = commands.Connection.StartOk(client_properties={"capabilities": {"authentication_failure_close": True}},
                                         mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US")
    return frame.marshal(method, 0)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readexactly(7)
    size = int.from_bytes(header[3:7], "big")
    payload = await reader.readexactly(size + 1)
    return header[0], payload[:-1]


async def one_guess(host: str, port: int, source: str, payload: bytes) -> str:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock)
    except OSError:
        sock.close()
        return "closed"
    try:
        writer.write(PROTOCOL_HEADER)
        await read_frame(reader)  # connection.start
        writer.write(payload)
        kind, body = await read_frame(reader)
        return "refused" if kind == 1 and body[:4] == b"\x00\x0a\x00\x32" else "other"
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"
    finally:
        writer.close()


async def run(host: str, port: int, source: str, concurrency: int, seconds: float, user: str) -> dict[str, int]:
    payload = start_ok(user, "not-the-password")
    counts = {"refused": 0, "closed": 0, "other": 0}
    stop = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < stop:
            counts[await one_guess(host, port, source, payload)] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--source", default="127.0.0.2", help="the client address the guesses come from")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--user", default="guest")
    a = p.parse_args()
    counts = asyncio.run(run(a.host, a.port, a.source, a.concurrency, a.seconds, a.user))
    print(f"{counts['refused'] / a.seconds:.1f} guesses checked a second ({counts['refused']} in {a.seconds:g} s, "
          f"{a.concurrency} at a time from {a.source}); {counts['closed']} connections closed before a guess, "
          f"{counts['other']} other answers")


if __name__ == "__main__":
    main()
