"""A message as the broker holds it: the bytes it arrived in, with the few fields it acts on decoded lazily."""

from __future__ import annotations

from typing import Any

from protocol.properties import ScannedProperties, decode_headers, scan_properties


class Message:
    """One published message. ``header`` is the content header payload as received (properties raw),
    ``names_raw`` the exchange and routing key as two short strings, reused verbatim in basic.deliver."""

    __slots__ = ("exchange", "routing_key", "names_raw", "header", "body", "_props", "_headers")

    def __init__(self, exchange: str, routing_key: str, names_raw: bytes, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.names_raw = names_raw
        self.header = header
        self.body = body
        self._props: ScannedProperties | None = None
        self._headers: dict[str, Any] | None = None

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

    def replace_header(self, header: bytes) -> None:
        self.header = header
        self._props = None
        self._headers = None
