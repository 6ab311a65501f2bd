"""Limits enforced before anything is buffered (issue 17): the refusal is decided from a frame's or a content
header's announced size, so it arrives while the client has sent nothing more, and hostile announcements cost
the broker no memory.

* A frame header announcing more than the negotiated ``frame_max`` (or, before tune-ok, than 8192 octets):
  connection.close 501 FRAME_ERROR, with only the 7-octet frame header sent.
* A content header announcing a body larger than ``max_message_size``: channel.close 406 PRECONDITION_FAILED
  ``message size N is larger than configured max size M`` (RabbitMQ's text), before any body frame.
* Field tables nested 10,000 deep (in method arguments and in message headers): refused at the 100-level limit
  without recursing further (501 for method arguments, 406 for headers; see test_bad_input_limits.py).
* ``consumer_max_per_channel`` (RabbitMQ's key, no limit by default): the next new consumer on a full
  channel is 530 NOT_ALLOWED ``reached maximum (N) of consumers per channel``, a connection error.

The number of channels (``channel_max``) is tested in test_connection.py; bindings per queue (Leveret's
``leveret.max_bindings_per_queue``, no limit by default as in RabbitMQ) in test_binding_limit.py.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest
from rawamqp import (
    FRAME_HEADER,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    RawAMQPClient,
    commands,
    content_header_frame,
    method_frame,
    raw_frame,
)

from tests.conftest import EXTERNAL_URL, BrokerProcess, free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.leveret_only]

MAX_MESSAGE_SIZE = 1 << 20
CONSUMER_MAX = 3


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A broker of this module's own, with a 1 MiB max_message_size and 3 consumers per channel."""
    if EXTERNAL_URL:
        pytest.skip("needs a Leveret process of its own")
    tmp = tmp_path_factory.mktemp("before-buffering")
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log",
                      extra_args=["--set", f"max_message_size={MAX_MESSAGE_SIZE}",
                                  "--set", f"consumer_max_per_channel={CONSUMER_MAX}"])
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(limited):
    clients: list[RawAMQPClient] = []

    def make(channel: int | None = 1) -> RawAMQPClient:
        c = RawAMQPClient.for_broker(limited, timeout=5.0)
        clients.append(c)
        c.handshake(heartbeat=0)
        if channel is not None:
            c.open_channel(channel)
        return c

    yield make
    for c in clients:
        c.close()


def frame_head(frame_type: int, channel: int, size: int) -> bytes:
    """Only the 7 octets that open a frame: what a client sends before the payload it announces."""
    return struct.pack(">BHI", frame_type, channel, size)


# -- frame_max ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [131_072 - 7, 1 << 20, 2**32 - 1], ids=["frame_max+1", "1MiB", "4GiB"])
def test_frame_over_frame_max_is_refused_from_its_header_alone(client, size):
    c = client()
    c.send_raw(frame_head(FRAME_METHOD, 1, size))  # and not one octet of the payload
    started = time.monotonic()
    code, text, class_id, method_id = c.expect_connection_close(30.0)
    # At once (ms), not after waiting for a payload that never comes; 5 s leaves a loaded CI machine room.
    assert time.monotonic() - started < 5.0
    assert code == 501 and text.startswith("FRAME_ERROR")
    assert (class_id, method_id) == (0, 0)


def test_frame_over_8192_before_tune_ok_is_refused_from_its_header_alone(limited):
    # Until tune-ok the limit is 8192 octets (RabbitMQ's initial frame_max): a client that has not even
    # logged in cannot make the broker wait for a megabyte.
    with RawAMQPClient.for_broker(limited, timeout=5.0) as c:
        c.send_protocol_header()
        c.expect_method(commands.Connection.Start, 0)
        c.send_raw(frame_head(FRAME_METHOD, 0, 1 << 20))
        code, text, _class_id, _method_id = c.expect_connection_close(2.0)
        assert code == 501 and text.startswith("FRAME_ERROR")


def test_streams_of_oversized_frames_do_not_grow_the_broker(limited):
    """Twenty connections announce 4 GiB frames and then send 4 MiB each anyway: the broker refuses each
    at its header and drops what follows, so its RSS grows by far less than the 80 MiB sent."""
    before = rss_kb(limited.pid)
    socks = []
    chunk = b"\x78" * 65536  # not a frame type: after the refusal the rest is discarded, never kept
    for _ in range(20):
        s = socket.create_connection((limited.host, limited.port), timeout=5)
        s.sendall(PROTOCOL_HEADER + frame_head(FRAME_METHOD, 0, 2**32 - 1))
        socks.append(s)
    try:
        for _ in range(64):
            for s in socks:
                try:
                    s.sendall(chunk)
                except OSError:
                    pass  # the broker closed it: that is allowed too
        grown = rss_kb(limited.pid) - before
        assert grown < 30 * 1024, f"RSS grew by {grown} KiB"
    finally:
        for s in socks:
            s.close()


# -- max_message_size -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body_size", [MAX_MESSAGE_SIZE + 1, 2**40, 2**64 - 1])
def test_content_header_over_max_message_size_is_refused_before_the_body(client, body_size):
    c = client()
    c.send_raw(method_frame(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
               + content_header_frame(1, body_size))  # no body frame follows
    code, text, class_id, method_id = c.expect_channel_close(1, 2.0)
    assert code == 406
    assert text == (f"PRECONDITION_FAILED - message size {body_size} is larger than configured max size "
                    f"{MAX_MESSAGE_SIZE}")
    assert (class_id, method_id) == (60, 40)
    c.open_channel(2)  # the connection goes on
    c.close_connection()


def test_refused_announcements_cost_no_memory(limited, client):
    """A thousand publishes each announcing 1 GiB bodies: each is refused at its header and nothing of the
    announced 1 TiB is reserved; RSS stays within a few MiB."""
    c = client(channel=None)
    before = rss_kb(limited.pid)
    for round_ in range(10):
        data = b""
        for ch in range(1, 101):
            data += method_frame(ch, commands.Channel.Open())
            data += method_frame(ch, commands.Basic.Publish(exchange="", routing_key="nowhere"))
            data += content_header_frame(ch, 1 << 30)
        c.send_raw(data)
        for ch in range(1, 101):
            code, _text, _c, _m = c.expect_channel_close(ch, 5.0)
            assert code == 406, (round_, ch)
    grown = rss_kb(limited.pid) - before
    assert grown < 20 * 1024, f"RSS grew by {grown} KiB"
    c.close_connection()


# -- nesting ----------------------------------------------------------------------------------------------------

def deep_table(levels: int) -> bytes:
    """A field table (with its length) holding ``levels`` tables nested under key 'n': built by hand, as no
    encoder would recurse that deep."""
    inner = b""
    for _ in range(levels):
        entry = b"\x01n" + b"F" + struct.pack(">I", len(inner)) + inner
        inner = entry
    return struct.pack(">I", len(inner)) + inner


def test_method_arguments_nested_10000_deep_are_a_frame_error(client, uid):
    c = client()
    name = f"{uid}-q".encode()
    payload = (struct.pack(">HHH", 50, 10, 0) + bytes([len(name)]) + name + b"\x00" + deep_table(10_000))
    assert len(payload) < 131_072 - 8
    c.send_raw(raw_frame(FRAME_METHOD, 1, payload))
    code, text, class_id, method_id = c.expect_connection_close(5.0)
    assert code == 501 and "nested more than 100 levels" in text
    assert (class_id, method_id) == (50, 10)


def test_headers_nested_10000_deep_are_refused_at_publish(client):
    c = client()
    headers = deep_table(10_000)
    props = struct.pack(">HHQH", 60, 0, 0, 1 << 13) + headers  # class, weight, body size 0, flags: headers
    c.send_raw(method_frame(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
               + raw_frame(FRAME_HEADER, 1, props))
    code, text, class_id, method_id = c.expect_channel_close(1, 5.0)
    assert code == 406
    assert text == "PRECONDITION_FAILED - message headers nest tables or arrays more than 100 levels deep"
    assert (class_id, method_id) == (60, 40)
    c.open_channel(2)
    c.close_connection()


# -- consumer_max_per_channel -------------------------------------------------------------------------------------

def consume(c: RawAMQPClient, channel: int, queue: str, tag: str) -> None:
    c.send_method(channel, commands.Basic.Consume(queue=queue, consumer_tag=tag))


def test_consumer_max_per_channel(client, uid):
    c = client()
    c.send_method(1, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
    q = c.expect_method(commands.Queue.DeclareOk, 1).queue
    for i in range(CONSUMER_MAX):
        consume(c, 1, q, f"c{i}")
        c.expect_method(commands.Basic.ConsumeOk, 1)
    # A cancelled consumer frees its place.
    c.send_method(1, commands.Basic.Cancel(consumer_tag="c0"))
    c.expect_method(commands.Basic.CancelOk, 1)
    consume(c, 1, q, "c0-again")
    c.expect_method(commands.Basic.ConsumeOk, 1)
    # Other channels have places of their own.
    c.open_channel(2)
    consume(c, 2, q, "other")
    c.expect_method(commands.Basic.ConsumeOk, 2)
    consume(c, 1, q, "one-too-many")
    code, text, class_id, method_id = c.expect_connection_close(5.0)
    assert code == 530
    assert text == f"NOT_ALLOWED - reached maximum ({CONSUMER_MAX}) of consumers per channel"
    assert (class_id, method_id) == (60, 20)


def test_consumer_limit_is_checked_before_the_queue(client, uid):
    # As in RabbitMQ, a full channel refuses even a consume of a queue that does not exist.
    c = client()
    c.send_method(1, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
    q = c.expect_method(commands.Queue.DeclareOk, 1).queue
    for i in range(CONSUMER_MAX):
        consume(c, 1, q, "")
        c.expect_method(commands.Basic.ConsumeOk, 1)
    consume(c, 1, f"{uid}-missing", "")
    code, text, _class_id, _method_id = c.expect_connection_close(5.0)
    assert (code, text) == (530, f"NOT_ALLOWED - reached maximum ({CONSUMER_MAX}) of consumers per channel")
