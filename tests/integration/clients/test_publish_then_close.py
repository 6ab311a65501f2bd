"""amqplib's "find high watermark" pattern (test/callback_api.test.js), with a raw client that writes as amqplib does.

amqplib's test publishes in a synchronous loop until ``sendToQueue`` returns false and then closes the connection.
Its loop never touches the socket: each channel buffers frames in a stream of its own (1,024 frames), and the
connection's multiplexer writes them on a later turn of node's event loop, channel 0 (where connection.close goes)
before a channel with a backlog. So connection.close reaches the broker ahead of most of the publishes, and the
client goes on writing them after close-ok has come back. Against RabbitMQ that is harmless: its reader answers
close-ok and leaves the socket to the client (``close_connection`` waits for the client, at most 30 s), dropping
every frame but close-ok meanwhile. A broker that closes the socket right after close-ok makes the kernel answer
the client's next bytes with a reset: amqplib emits EPIPE as an unhandled 'error' and the test file hangs until
its timeout, cancelling the 13 tests after it.

The client here writes without ever waiting (a non-blocking socket, until ``send`` would block: the broker's TCP
push-back), then connection.close, then the rest of its publishes after close-ok, as amqplib's multiplexer does.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time

from pamqp import commands
from rawamqp import RawAMQPClient, body_frame, content_header_frame, method_frame

# One publish of the amqplib test: a 28-byte random string to the queue by the default exchange.
BODY = b"x" * 28
# Bound on the "until the socket pushes back" loop: far more than loopback's socket buffers hold.
MAX_UNBLOCKED_BYTES = 512 * 1024 * 1024
PUSHBACK_WITHIN = 20.0


def _publishes(queue: str, count: int) -> bytes:
    one = (method_frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
           + content_header_frame(1, len(BODY)) + body_frame(1, BODY))
    return one * count


def _write_until_blocked(sock: socket.socket, chunk: bytes) -> tuple[int, int]:
    """Write ``chunk`` over and over without waiting until ``send`` would block: the bytes written, and
    where in ``chunk`` the last write stopped (the rest of that publish is still to be written)."""
    sock.setblocking(False)
    written = 0
    deadline = time.monotonic() + PUSHBACK_WITHIN
    view = memoryview(chunk)
    at = 0
    while written < MAX_UNBLOCKED_BYTES and time.monotonic() < deadline:
        try:
            n = sock.send(view[at:])
        except BlockingIOError:
            return written, at
        written += n
        at = (at + n) % len(chunk)
    raise AssertionError(f"the broker took {written:,} bytes of publishes without pushing back")


def _send_all(sock: socket.socket, data: bytes, timeout: float = 10.0) -> None:
    """Write all of ``data`` on the non-blocking socket, waiting for room."""
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    while view:
        _, writable, _ = select.select([], [sock], [], max(0.0, deadline - time.monotonic()))
        assert writable, "the broker stopped reading"
        try:
            n = sock.send(view)
        except BlockingIOError:
            continue
        view = view[n:]


def _read_until_close_ok(sock: socket.socket, timeout: float = 20.0) -> None:
    """Read frames (the broker sends nothing else here) until connection.close-ok."""
    buf = bytearray()
    deadline = time.monotonic() + timeout
    close_ok = method_frame(0, commands.Connection.CloseOk())
    while close_ok not in buf:
        readable, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        assert readable, f"no close-ok within {timeout} s (read {bytes(buf)!r})"
        data = sock.recv(65536)
        assert data, f"the broker closed the socket without close-ok (read {bytes(buf)!r})"
        buf += data


def test_publishes_written_after_close_ok_are_dropped_not_reset(broker, uid):
    client = RawAMQPClient.for_broker(broker, timeout=10.0)
    try:
        client.handshake()
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue=f"{uid}-hwm", exclusive=True))
        client.expect_method(commands.Queue.DeclareOk, 1)
        sock = client.sock
        assert sock is not None
        chunk = _publishes(f"{uid}-hwm", 512)

        # "find high watermark": publish until the socket pushes back. The loop has to end.
        written, at = _write_until_blocked(sock, chunk)
        assert written > 0
        _send_all(sock, chunk[at:])  # the publish the push-back cut in two (amqplib writes whole frames)

        # amqplib's close, written ahead of the publishes still buffered in the channel's stream.
        _send_all(sock, method_frame(0, commands.Connection.Close(reply_code=200, reply_text="Cheers, thanks",
                                                                  class_id=0, method_id=0)))
        _read_until_close_ok(sock)
        # The buffered publishes follow close-ok, over a few turns of the client's loop. Against a broker that
        # had closed its socket the second of these writes fails (EPIPE / ECONNRESET).
        for _ in range(5):
            _send_all(sock, chunk)
            time.sleep(0.05)
        # The client closes its side (amqplib ends the socket on close-ok); then the broker closes its own, at
        # once (RabbitMQ resets it when frames it dropped were still unread: either ends the connection).
        sock.shutdown(socket.SHUT_WR)
        sock.setblocking(True)
        sock.settimeout(10.0)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):
                pass
    finally:
        client.close()
