"""Command assembly (RabbitMQ's ``rabbit_command_assembler``): basic.publish, its content header and its body
frames, in that order, become one command, or one of the frame-order and size errors RabbitMQ raises.

Pure: no socket, no channel, no routing. The channel owns one assembler and hands it the publish's frames;
the reader binds the hot calls (``on_header``, ``on_body``) straight to it, so assembling a message costs
what it cost when this lived in the channel. A finished command goes to the ``on_command`` callback given at
construction (the channel's publish), not back through a return value the caller would have to test on every
body frame.

basic.publish is the only client method that carries content in AMQP 0-9-1, so the reader dispatches every
other method itself; while content is awaited it first tells the assembler (``on_method``), which refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.errors import AMQPError
from protocol import fastcodec
from protocol.constants import CLASS_BASIC, PRECONDITION_FAILED, UNEXPECTED_FRAME
from protocol.fastcodec import PublishArgs
from protocol.frames import FrameError

# basic.publish's class and method id: what a close names when a content frame is at fault.
_PUBLISH_IDS = (CLASS_BASIC, 40)


class SizeLimit(Protocol):
    """Where the largest accepted body size is read (the node's settings; read per message, as before)."""

    max_message_size: int


OnCommand = Callable[[PublishArgs, bytes, bytes], None]
"""Called with a finished publish: its arguments, the raw content header (properties undecoded), the body."""


class CommandAssembler:
    """The publish being received on one channel: method, then header, then body frames.

    ``publish`` is the publish awaiting content (None between commands): the reader tests it directly
    rather than through a property, on every method frame."""

    __slots__ = ("_body_parts", "_body_received", "_body_size", "_header", "_limit", "_on_command", "publish")

    def __init__(self, limit: SizeLimit, on_command: OnCommand) -> None:
        self._limit = limit
        self._on_command = on_command
        self.publish: PublishArgs | None = None
        self._header: bytes | None = None
        self._body_size = 0
        self._body_parts: list[bytes] = []
        self._body_received = 0

    @property
    def expecting_content(self) -> bool:
        return self.publish is not None

    def on_publish(self, payload: bytes) -> None:
        """basic.publish (the whole method payload): its content frames follow."""
        self.publish = fastcodec.decode_basic_publish(payload, 4)

    def on_whole_publish(self, method: bytes, header: bytes, body: bytes) -> None:
        """basic.publish, its content header and its one body frame, found together by the frame parser
        (protocol/frames.py's ``combine_publish``, which checked that the body is exactly the size the header
        announces): on_publish, on_header and on_body in one step, with their checks, without the state
        between them. Only called while no publish awaits content (the reader checks)."""
        args = fastcodec.decode_basic_publish(method, 4)
        self.checked_body_size(header)
        self._on_command(args, header, body)

    def checked_body_size(self, header: bytes) -> int:
        """The body size a content header announces, checked: a malformed header is 505, a size above the
        limit 406 (the publish is then dropped)."""
        try:
            body_size = fastcodec.decode_content_header(header)
        except FrameError as exc:
            raise AMQPError(UNEXPECTED_FRAME, exc.text, *_PUBLISH_IDS) from None
        max_size = self._limit.max_message_size
        if body_size > max_size:
            self.publish = None
            raise AMQPError(PRECONDITION_FAILED,
                            f"message size {body_size} is larger than configured max size {max_size}",
                            *_PUBLISH_IDS)
        return body_size

    def on_method(self) -> None:
        """A method frame arrived: an error while a publish awaits its content (505, naming basic.publish)."""
        if self.publish is not None:
            raise AMQPError(UNEXPECTED_FRAME, "expected content frame for basic.publish, got a method frame "
                            "instead", *_PUBLISH_IDS)

    def on_header(self, payload: bytes) -> None:
        """The content header: its body size is checked against the limit; an empty body completes at once."""
        if self.publish is None or self._header is not None:
            raise AMQPError(UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        body_size = self.checked_body_size(payload)
        self._header = payload
        self._body_size = body_size
        if body_size == 0:
            self._complete(b"")

    def on_body(self, payload: bytes) -> None:
        """One body frame; the last one (the announced size reached) completes the command."""
        if self._header is None:
            raise AMQPError(UNEXPECTED_FRAME, "expected content header for class 60, got non content "
                            "header frame instead")
        received = self._body_received + len(payload)
        if received > self._body_size:
            # More body than the header announced. RabbitMQ lets such a message never complete, and the
            # next frame that is not a body frame is unexpected (505): do the same, keeping nothing.
            self._body_parts = []
            self._body_received = self._body_size + 1
            return
        if received == self._body_size and not self._body_parts:
            self._complete(payload)
            return
        self._body_parts.append(payload)
        self._body_received = received
        if received == self._body_size:
            self._complete(b"".join(self._body_parts))

    def _complete(self, body: bytes) -> None:
        args = self.publish
        header = self._header
        assert args is not None and header is not None
        self.publish = None
        self._header = None
        self._body_parts = []
        self._body_received = 0
        self._on_command(args, header, body)

    def reset(self) -> None:
        """Forget a half-received publish (the channel is closing)."""
        self.publish = None
        self._header = None
        self._body_parts = []
        self._body_received = 0
