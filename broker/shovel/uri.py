"""A shovel's ``amqp://`` / ``amqps://`` URI (RabbitMQ's URI spec, https://www.rabbitmq.com/docs/uri-spec and
uri-query-parameters): user, password, host, port, vhost, ``heartbeat``, ``connection_timeout`` and, for
amqps, ``cacertfile`` / ``certfile`` / ``keyfile`` / ``verify`` (verify_peer or verify_none) /
``server_name_indication``.

``amqp://`` with no host is the local broker, as in RabbitMQ (where it is a direct Erlang connection): here
the worker connects to this node's own AMQP listener as a node-internal user (broker/shovel/supervisor.py).
What the status shows has the credentials taken out, as RabbitMQ's shovel status does.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

TLS_OPTIONS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication", "fail_if_no_peer_cert")


class URIError(ValueError):
    """``str()`` is RabbitMQ's amqp_uri error term."""


@dataclass(frozen=True)
class ShovelURI:
    uri: str
    tls: bool
    host: str | None  # None: the local broker
    port: int
    user: str
    password: str
    vhost: str
    heartbeat: int | None
    connection_timeout: float
    options: dict[str, str]

    @property
    def is_local(self) -> bool:
        return self.host is None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context of an amqps URI (None for amqp): verify_peer unless verify=verify_none."""
        if not self.tls:
            return None
        o = self.options
        ctx = ssl.create_default_context(cafile=o.get("cacertfile"))
        if o.get("verify") == "verify_none":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif "server_name_indication" not in o and o.get("cacertfile"):
            # RabbitMQ's Erlang client checks the chain, not the host name, unless SNI is asked for.
            ctx.check_hostname = False
        if o.get("certfile"):
            ctx.load_cert_chain(o["certfile"], o.get("keyfile"))
        return ctx

    @property
    def server_hostname(self) -> str | None:
        return self.options.get("server_name_indication", self.host) if self.tls else None


def parse_uri(uri: str) -> ShovelURI:
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise URIError(f'{{{{unexpected_uri_scheme,"{parts.scheme}"}},"{uri}"}}')
    tls = scheme == "amqps"
    try:
        port = parts.port
    except ValueError:
        raise URIError(f'{{{{port_not_integer,"{uri}"}},"{uri}"}}') from None
    host = parts.hostname
    path = parts.path.removeprefix("/")
    vhost = unquote(path) if parts.path else "/"
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    heartbeat = None
    if "heartbeat" in query:
        try:
            heartbeat = int(query["heartbeat"])
        except ValueError:
            raise URIError(f'{{{{bad_heartbeat,"{query["heartbeat"]}"}},"{uri}"}}') from None
    timeout = 60.0
    if "connection_timeout" in query:
        try:
            timeout = int(query["connection_timeout"]) / 1000
        except ValueError:
            raise URIError(f'{{{{bad_connection_timeout,"{query["connection_timeout"]}"}},"{uri}"}}') from None
    return ShovelURI(uri=uri, tls=tls, host=host or None, port=port or (5671 if tls else 5672),
                     user=unquote(parts.username) if parts.username is not None else "guest",
                     password=unquote(parts.password) if parts.password is not None else "guest",
                     vhost=vhost, heartbeat=heartbeat, connection_timeout=timeout,
                     options={k: v for k, v in query.items() if k in TLS_OPTIONS})


def redact(uri: str) -> str:
    """The URI without user and password (what GET /api/shovels and the logs show)."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    netloc = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=netloc).geturl()
