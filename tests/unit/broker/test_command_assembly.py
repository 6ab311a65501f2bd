"""Command assembly (broker/amqp/command_assembler.py, RabbitMQ's rabbit_command_assembler): basic.publish,
its content header and body frames become one publish, and frames out of order or of the wrong size raise the
errors, reply codes and failing-method ids the channel has always raised."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from pamqp import commands as spec

from broker.amqp.command_assembler import CommandAssembler
from broker.errors import AMQPError
from protocol.constants import PRECONDITION_FAILED, UNEXPECTED_FRAME
from protocol.fastcodec import PublishArgs, build_content_header, shortstr


def publish_payload(exchange: str = "x", routing_key: str = "k", mandatory: bool = False) -> bytes:
    """A basic.publish method payload: class and method id, ticket, exchange, routing key, bits."""
    return (struct.pack(">HHH", 60, 40, 0) + shortstr(exchange) + shortstr(routing_key)
            + bytes([1 if mandatory else 0]))


def header(body_size: int, **props) -> bytes:
    return build_content_header(body_size, spec.Basic.Properties(**props).marshal())


class Assembled:
    def __init__(self, max_message_size: int = 1000) -> None:
        self.commands: list[tuple[PublishArgs, bytes, bytes]] = []
        self.limit = SimpleNamespace(max_message_size=max_message_size)
        self.asm = CommandAssembler(self.limit, lambda a, h, b: self.commands.append((a, h, b)))


@pytest.fixture
def got() -> Assembled:
    return Assembled()


def test_an_empty_body_completes_at_the_header(got):
    got.asm.on_publish(publish_payload("amq.direct", "rk", mandatory=True))
    assert got.asm.expecting_content
    h = header(0, content_type="text/plain")
    got.asm.on_header(h)
    [(args, raw_header, body)] = got.commands
    assert (args.exchange, args.routing_key, args.mandatory, args.immediate) == ("amq.direct", "rk", True, False)
    assert raw_header == h and body == b""
    assert not got.asm.expecting_content


def test_a_body_in_one_frame_is_passed_as_is(got):
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(5))
    frame = b"hello"
    got.asm.on_body(frame)
    [(_, _, body)] = got.commands
    assert body is frame  # no copy for the common single-frame body


def test_a_body_split_across_frames_is_joined_when_the_announced_size_is_reached(got):
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(10))
    got.asm.on_body(b"abc")
    got.asm.on_body(b"defg")
    assert got.commands == []
    assert got.asm.expecting_content
    got.asm.on_body(b"hij")
    assert [c[2] for c in got.commands] == [b"abcdefghij"]
    # The next publish starts clean.
    got.asm.on_publish(publish_payload("", "q2"))
    got.asm.on_header(header(2))
    got.asm.on_body(b"zz")
    assert [(c[0].routing_key, c[2]) for c in got.commands] == [("k", b"abcdefghij"), ("q2", b"zz")]


def test_a_method_without_content_passes_and_one_during_content_is_505(got):
    got.asm.on_method()  # nothing awaited: any method is fine
    got.asm.on_publish(publish_payload())
    with pytest.raises(AMQPError) as err:
        got.asm.on_method()
    assert err.value.reply_code == UNEXPECTED_FRAME
    assert (err.value.class_id, err.value.method_id) == (60, 40)
    assert "expected content frame for basic.publish" in err.value.text
    got.asm.on_header(header(1))
    with pytest.raises(AMQPError) as err:
        got.asm.on_method()
    assert err.value.reply_code == UNEXPECTED_FRAME


def test_a_body_frame_without_a_header_is_505(got):
    with pytest.raises(AMQPError) as err:
        got.asm.on_body(b"x")
    assert err.value.reply_code == UNEXPECTED_FRAME
    assert err.value.text == "expected content header for class 60, got non content header frame instead"
    got.asm.on_publish(publish_payload())
    with pytest.raises(AMQPError) as err:
        got.asm.on_body(b"x")  # the publish arrived, its header did not
    assert err.value.reply_code == UNEXPECTED_FRAME


def test_a_header_after_a_method_that_takes_no_content_is_505(got):
    # queue.declare, channel.flow, ... are dispatched without the assembler: a header then finds no publish.
    with pytest.raises(AMQPError) as err:
        got.asm.on_header(header(3))
    assert err.value.reply_code == UNEXPECTED_FRAME
    assert err.value.text == "expected method frame, got non method frame instead"
    assert err.value.class_id is None  # the reader names the failing method


def test_a_second_header_is_505(got):
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(3))
    with pytest.raises(AMQPError) as err:
        got.asm.on_header(header(3))
    assert err.value.reply_code == UNEXPECTED_FRAME


def test_a_header_of_another_class_is_505_naming_basic_publish(got):
    got.asm.on_publish(publish_payload())
    with pytest.raises(AMQPError) as err:
        got.asm.on_header(struct.pack(">HHQ", 50, 0, 1))
    assert err.value.reply_code == UNEXPECTED_FRAME
    assert (err.value.class_id, err.value.method_id) == (60, 40)
    with pytest.raises(AMQPError) as err:
        got.asm.on_header(b"\x00\x3c")  # too short
    assert err.value.reply_code == UNEXPECTED_FRAME


def test_a_body_larger_than_the_limit_is_406_and_the_publish_is_dropped():
    got = Assembled(max_message_size=100)
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(100))  # at the limit: fine
    got.asm.reset()
    got.asm.on_publish(publish_payload())
    with pytest.raises(AMQPError) as err:
        got.asm.on_header(header(101))
    assert err.value.reply_code == PRECONDITION_FAILED
    assert err.value.text == "message size 101 is larger than configured max size 100"
    assert (err.value.class_id, err.value.method_id) == (60, 40)
    assert not got.asm.expecting_content
    got.limit.max_message_size = 200  # the limit is read per message
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(150))
    assert got.asm.expecting_content


def test_more_body_than_announced_never_completes_and_the_next_non_body_frame_is_505(got):
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(4))
    got.asm.on_body(b"abc")
    got.asm.on_body(b"de")  # 5 > 4: kept back, nothing delivered (as RabbitMQ)
    got.asm.on_body(b"f")
    assert got.commands == []
    with pytest.raises(AMQPError) as err:
        got.asm.on_method()
    assert err.value.reply_code == UNEXPECTED_FRAME
    with pytest.raises(AMQPError) as err:
        got.asm.on_header(header(1))
    assert err.value.reply_code == UNEXPECTED_FRAME


def test_reset_forgets_a_half_received_publish(got):
    got.asm.on_publish(publish_payload())
    got.asm.on_header(header(4))
    got.asm.on_body(b"ab")
    got.asm.reset()
    assert not got.asm.expecting_content
    with pytest.raises(AMQPError):
        got.asm.on_body(b"cd")
    assert got.commands == []
