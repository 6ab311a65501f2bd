"""One JSON request over HTTP(S) with Basic credentials, answered as (status, body) whatever the status: the
client side of ``leveret ctl import_from_rabbitmq`` (broker/tools/migrate_rabbitmq.py), which talks to two
management APIs, RabbitMQ's and Leveret's, and must read a refusal's reason rather than stop at it.

Only an unreachable server (or a body that is not JSON) raises, as :class:`Unreachable`, so that the caller
can tell "the server said no, because ..." (reported, the import goes on) from "nobody answered" (the
command stops).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any


class Unreachable(Exception):
    """No answer from the server (refused, timed out, TLS failure), or an answer that is not JSON."""


def basic_auth(username: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@dataclass
class JsonHttp:
    """A management API at ``url`` (no trailing slash), with the headers every request carries (Basic
    credentials) and, over HTTPS, the TLS context that checks the server."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    context: ssl.SSLContext | None = None
    timeout: float = 30.0

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, parsed JSON body or None). Raises Unreachable when no answer comes."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, "Content-Type": "application/json"} if data is not None else self.headers
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise Unreachable(f"cannot reach {self.url}: {reason}") from None
        if not raw.strip():
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError:
            if status >= 400:
                return status, {"reason": raw.decode(errors="replace").strip()[:300]}
            raise Unreachable(f"{self.url}{path} did not answer JSON (is it a management API?)") from None


def reason_of(status: int, body: Any) -> str:
    """The one-line reason of a refusal: the API's ``reason`` (RabbitMQ's and Leveret's error bodies), else
    the status."""
    reason = body.get("reason") if isinstance(body, dict) else None
    text = str(reason) if reason else f"HTTP {status}"
    return " ".join(text.replace("Validation failed", "").split()) or f"HTTP {status}"


def quote(value: str) -> str:
    """A path segment: a vhost or object name with every reserved character encoded (``/`` is ``%2F``)."""
    return urllib.parse.quote(value, safe="")
