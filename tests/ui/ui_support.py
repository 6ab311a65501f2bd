"""Helpers of the web UI's browser tests: a Basic-auth client of the HTTP API (to make and check data
beside the browser), and logging in through the UI's form."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARTEFACTS = Path(__file__).resolve().parent / "artefacts"
CHROMIUM = "/usr/bin/chromium"


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Http:
    """The HTTP API with Basic auth (as rabbitmqadmin talks to it)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def __call__(self, method: str, path: str, body: Any = None, auth: tuple[str, str] | None = ("guest", "guest"),
                 headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json", **(headers or {})}
        if auth is not None:
            h["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, text, hdrs = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as exc:
            status, text, hdrs = exc.code, exc.read(), exc.headers
        payload = json.loads(text) if text.strip() and "json" in (hdrs.get("Content-Type") or "") else text
        return status, payload, hdrs

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, payload, _ = self(method, path, body)
        assert status in (200, 201, 204), (method, path, status, payload)
        return payload


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``predicate()``'s first truthy result within ``timeout`` seconds (polled), else its last result."""
    deadline = time.monotonic() + timeout
    result = predicate()
    while not result and time.monotonic() < deadline:
        time.sleep(0.05)
        result = predicate()
    return result


def login(page: Any, base: str, user: str = "guest", password: str = "guest") -> None:
    page.goto(base + "/")
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login-button")
    page.wait_for_selector(f"#whoami:has-text('{user}')")


def shot(page: Any, name: str) -> Path:
    """A 1280x800 screenshot kept as a test artefact (git-ignored)."""
    ARTEFACTS.mkdir(exist_ok=True)
    path = ARTEFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
