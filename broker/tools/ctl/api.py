"""The HTTP client both command-line clients talk to the broker with: its management API over urllib (no
dependency beyond the standard library), with Basic credentials, an optional TLS context, and failures turned
into a :class:`CtlError` whose one line names the URL and the status."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from broker.tools.ctl.errors import EX_UNAVAILABLE, CtlError


class Api:
    """The broker's HTTP API at ``url``: ``request`` raises a CtlError on any error status, ``call`` answers
    the status with the body (for health checks, whose failing answer is a 503 with a reason)."""

    def __init__(self, url: str, username: str, password: str, timeout: float = 30.0,
                 context: ssl.SSLContext | None = None, origin: str = "--url") -> None:
        self.url = url.rstrip("/")
        self.origin = origin  # where the URL came from, named when it cannot be reached
        self.context = context  # HTTPS: how the server's certificate is checked (None: the system's CAs)
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                ok_missing: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={**self.headers, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and ok_missing:
                return None
            try:
                detail = json.loads(exc.read()).get("reason", "")
            except (ValueError, AttributeError):
                detail = ""
            raise CtlError(f"{method} {path}: {exc.code} {exc.reason}" + (f": {detail}" if detail else ""),
                           status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self.unreachable(exc) from None
        return json.loads(raw) if raw.strip() else None

    def unreachable(self, exc: OSError) -> CtlError:
        """One line naming the URL and where it came from (a user once listed another broker's queues on
        15672 without noticing which one ctl had talked to)."""
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return CtlError(f"cannot reach the broker's HTTP API at {self.url} (from {self.origin}): {reason}",
                        EX_UNAVAILABLE)

    def get(self, path: str, ok_missing: bool = False) -> Any:
        return self.request("GET", path, ok_missing=ok_missing)

    def call(self, path: str, timeout: float | None = None) -> tuple[int, Any]:
        """GET ``path`` and answer (HTTP status, parsed body) whatever the status (health checks answer 503
        with a reason); an unreachable API is still a CtlError (69)."""
        req = urllib.request.Request(self.url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout, context=self.context) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise self.unreachable(exc) from None
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw.decode(errors="replace")


def q(value: str) -> str:
    """``value`` as one path segment of an API URL (a vhost ``/`` is ``%2F``)."""
    return urllib.parse.quote(value, safe="")


def node_name(api: Api) -> str:
    """The node's name, for the banners that name it (rabbitmqctl's ``... on node NAME``)."""
    return str((api.get("/api/overview") or {}).get("node", "?"))
