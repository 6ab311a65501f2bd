"""A message as the broker holds it: the bytes it arrived in, with the few fields it acts on decoded lazily."""

from __future__ import annotations

from typing import Any

from protocol.properties import ScannedProperties, decode_headers, scan_properties


class Message:
    """One published message. ``header`` is the content header payload as received (properties raw),
    ``names_raw`` the exchange and routing key as two short strings, reused verbatim in basic.deliver."""

    __slots__ = (
        "_headers",
        "_props",
        "body",
        "exchange",
        "expiration_ms",
        "extra_keys",
        "header",
        "msg_id",
        "names_raw",
        "published_at",
        "routing_key",
    )

    def __init__(self, exchange: str, routing_key: str, names_raw: bytes, header: bytes, body: bytes,
                 published_at: float = 0.0) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.names_raw = names_raw
        self.header = header
        self.body = body
        self._props: ScannedProperties | None = None
        self._headers: dict[str, Any] | None = None
        # Wall-clock ms at publish, stamped by VHost.publish: per-message and queue TTLs count from here (a
        # requeue keeps it).
        self.published_at = published_at
        # The ``expiration`` property in ms, once broker/publish.py's check_properties has parsed it (None: no
        # per-message TTL).
        self.expiration_ms: int | None = None
        # CC/BCC routing keys (sender-selected distribution): routed to as well as ``routing_key``.
        self.extra_keys: list[str] | None = None
        # The message store's id, shared by every durable queue a persistent message was routed to (so it
        # is stored once); None lets each queue number its own copy.
        self.msg_id: int | None = None

    @classmethod
    def from_wire(cls, names_raw: bytes, header: bytes, body: bytes, published_at: float = 0.0) -> Message:
        """The message whose exchange and routing key are ``names_raw`` (two short strings, as basic.deliver
        carries them): a stored message read back."""
        ex_end = 1 + names_raw[0]
        return cls(names_raw[1:ex_end].decode(), names_raw[ex_end + 1:].decode(), names_raw, header, body,
                   published_at)

    @property
    def props(self) -> ScannedProperties:
        p = self._props
        if p is None:
            p = self._props = scan_properties(self.header)
        return p

    @property
    def headers(self) -> dict[str, Any]:
        h = self._headers
        if h is None:
            h = self._headers = decode_headers(self.header, self.props.headers_span)
        return h

    @property
    def size(self) -> int:
        return len(self.body)

    def with_header(self, header: bytes) -> Message:
        """A copy carrying different properties (the body is shared, not copied)."""
        m = Message(self.exchange, self.routing_key, self.names_raw, header, self.body, self.published_at)
        m.expiration_ms = self.expiration_ms
        return m

    def replace_header(self, header: bytes) -> None:
        self.header = header
        self._props = None
        self._headers = None
