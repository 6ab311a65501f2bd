"""Where the broker is and how to ask it about streams: the ``uri`` option parsed once, and a small HTTP client
of the management API with the same credentials.

Why HTTP for planning: the driver needs "how far does each stream go now" (``next_offset``), where it starts
(``first_offset``, retention) and its size (``stream_bytes``) for every micro-batch; the queue object of
``GET /api/queues/{vhost}/{queue}`` has all three in one cheap call, where an AMQP probe would need a consumer
per stream. The management API is found at option ``managementUri``, by default
``http://<amqp host>:15672`` (the broker's default port); ``amqps://`` makes the default ``https://``.
urllib keeps executors free of another dependency.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from pyspark_leveret.tls import NO_TLS_FILES, TLSFiles, explain

DEFAULT_MANAGEMENT_PORT = 15672
HTTP_TIMEOUT = 10.0


@dataclass(frozen=True)
class Endpoint:
    """The AMQP address, credentials and vhost of a ``uri``, plus the management API's base URL and the TLS
    files of both. Plain data: it travels to executors inside pickled partitions and readers."""

    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool
    management_uri: str
    tls_files: TLSFiles = NO_TLS_FILES

    def ssl_context(self) -> ssl.SSLContext:
        return self.tls_files.context()


@dataclass(frozen=True)
class StreamStats:
    """A stream queue's extent now: offsets ``[first_offset, next_offset)`` are retained, ``stream_bytes``
    payload bytes of them."""

    queue: str
    first_offset: int
    next_offset: int
    stream_bytes: int

    @property
    def messages(self) -> int:
        return self.next_offset - self.first_offset

    @property
    def bytes_per_message(self) -> float:
        """The average retained message size (0 for an empty stream): what turns a byte cap into records."""
        return self.stream_bytes / self.messages if self.messages > 0 else 0.0


class ManagementError(Exception):
    """The management API refused or could not be reached; the message says which call and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def parse_uri(uri: str, management_uri: str | None = None, tls_files: TLSFiles | None = None) -> Endpoint:
    """``amqp[s]://user:pass@host:port/vhost`` (RabbitMQ's URI spec: the vhost is the percent-decoded path,
    ``/`` when the path is empty or a lone slash; guest/guest and port 5672/5671 by default)."""
    u = urllib.parse.urlparse(uri)
    if u.scheme not in ("amqp", "amqps"):
        raise ValueError(f"option uri must be amqp:// or amqps://, got {uri!r}")
    tls = u.scheme == "amqps"
    host = u.hostname or "127.0.0.1"
    port = u.port or (5671 if tls else 5672)
    vhost = urllib.parse.unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    if not management_uri:
        scheme = "https" if tls else "http"
        netloc = f"[{host}]" if ":" in host else host
        management_uri = f"{scheme}://{netloc}:{DEFAULT_MANAGEMENT_PORT}"
    return Endpoint(host=host, port=port, user=urllib.parse.unquote(u.username or "guest"),
                    password=urllib.parse.unquote(u.password or "guest"), vhost=vhost, tls=tls,
                    management_uri=management_uri.rstrip("/"), tls_files=tls_files or NO_TLS_FILES)


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class ManagementAPI:
    """The few management calls the connector makes, with the ``uri``'s credentials (basic auth)."""

    def __init__(self, endpoint: Endpoint, timeout: float = HTTP_TIMEOUT) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        token = base64.b64encode(f"{endpoint.user}:{endpoint.password}".encode()).decode()
        self._auth = f"Basic {token}"
        https = endpoint.management_uri.lower().startswith("https:")
        self._context = endpoint.ssl_context() if https and endpoint.tls_files.given else None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """``(status, decoded JSON or None)``; HTTP errors raise ManagementError with the broker's reason."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.endpoint.management_uri + path, data=data, method=method)
        req.add_header("Authorization", self._auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ManagementError(f"{method} {path}: HTTP {exc.code} {detail}", exc.code) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, ssl.SSLError):
                raise ManagementError(f"{method} {self.endpoint.management_uri}{path}: "
                                      f"{explain(reason, 'the management API')}") from exc
            raise ManagementError(f"{method} {self.endpoint.management_uri}{path}: {exc} "
                                  "(set option managementUri to the broker's HTTP API)") from exc

    def queue(self, name: str) -> dict[str, Any]:
        _, obj = self.request("GET", f"/api/queues/{_quote(self.endpoint.vhost)}/{_quote(name)}")
        if not isinstance(obj, dict):
            raise ManagementError(f"GET /api/queues/.../{name}: not a queue object: {obj!r:.200}")
        return obj

    def stream_stats(self, name: str) -> StreamStats:
        """The stream's extent; a queue that is not a stream is refused (its offsets would mean nothing)."""
        try:
            obj = self.queue(name)
        except ManagementError as exc:
            if exc.status == 404:
                raise ManagementError(f"no queue '{name}' in vhost '{self.endpoint.vhost}'", 404) from exc
            raise
        if obj.get("type") != "stream" or "next_offset" not in obj:
            raise ValueError(f"queue '{name}' in vhost '{self.endpoint.vhost}' is not a stream queue "
                             f"(type {obj.get('type')!r}); declare it with x-queue-type=stream")
        return StreamStats(queue=name, first_offset=int(obj["first_offset"]),
                           next_offset=int(obj["next_offset"]), stream_bytes=int(obj.get("stream_bytes") or 0))

    def commit_group(self, stream: str, group: str, offset: int) -> int:
        """Move consumer group ``group`` of ``stream`` forward to ``offset`` (creating it there if new); the
        broker never moves it back. Returns the HTTP status (204)."""
        path = f"/api/stream-groups/{_quote(self.endpoint.vhost)}/{_quote(stream)}/{_quote(group)}"
        status, _ = self.request("PUT", path, {"committed_offset": offset})
        return status

    def stream_groups(self, stream: str) -> list[dict[str, Any]]:
        _, rows = self.request("GET", f"/api/stream-groups/{_quote(self.endpoint.vhost)}/{_quote(stream)}")
        return list(rows or [])
