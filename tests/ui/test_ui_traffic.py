"""The Traffic page: the picture and last micro-batch that ``leveret-pipeline traffic --out DIR`` leaves,
served from ``leveret.traffic_dir`` (no Spark here: the test writes a small PNG and a _batches.jsonl as the
pipeline would). The picture really loads in the page (through the session cookie and the CSP), a redrawn
picture replaces it, a missing one gives the hint, the endpoints need the monitoring tag, and a broker
without the setting says how to get pictures."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def png(width: int, height: int) -> bytes:
    """A valid RGB PNG of the given size (one colour), made without an imaging library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x30\x60\x90" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def natural_size(page) -> list[int]:
    return page.evaluate("(() => { const i = document.getElementById('traffic-picture');"
                         " return i && i.complete ? [i.naturalWidth, i.naturalHeight] : [0, 0]; })()")


@pytest.fixture(scope="module")
def traffic_broker(launch, tmp_path_factory):
    out = tmp_path_factory.mktemp("traffic-out")
    _, http = launch("--set", f"leveret.traffic_dir={out}")
    return out, http


def test_traffic_page_shows_the_pipelines_picture_and_last_batch(page, traffic_broker, uid) -> None:
    out, http = traffic_broker
    picture = png(40, 30)
    (out / "traffic.png").write_bytes(picture)
    batches = [{"batch": 6, "events": 10, "minutes": 1, "done_ms": 1_767_225_500_000},
               {"batch": 7, "events": 1234, "minutes": 3, "done_ms": 1_767_225_600_000}]
    (out / "_batches.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batches) + '{"batch": 8, "ev')
    login(page, http.base)
    page.click("a[data-nav=traffic]")
    page.wait_for_selector("#traffic-picture")
    assert wait_for(lambda: natural_size(page) == [40, 30]), natural_size(page)  # decoded: served as image/png to the page, CSP allowed it
    assert page.inner_text("#traffic-facts dd[data-field=events]") == "1,234"  # the last whole line
    assert "#7" in page.inner_text("#traffic-facts dd[data-field=batch]")
    assert page.inner_text("#traffic-facts dd[data-field=directory]") == str(out)
    shot(page, "traffic")

    status, body, headers = http("GET", "/api/leveret/traffic.png")
    assert status == 200 and body == picture and headers["Content-Type"] == "image/png"
    assert http("GET", "/api/leveret/traffic.png", auth=None)[0] == 401
    user = uid + "-mgmt"
    http.ok("PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"})
    try:
        assert http("GET", "/api/leveret/traffic", auth=(user, "pw"))[0] == 401
        assert http("GET", "/api/leveret/traffic.png", auth=(user, "pw"))[0] == 401
    finally:
        http("DELETE", f"/api/users/{q(user)}")

    (out / "traffic.png").write_bytes(png(64, 20))  # the pipeline draws again
    page.select_option("#refresh", "2000")
    assert wait_for(lambda: natural_size(page) == [64, 20]), natural_size(page)
    (out / "traffic.png").unlink()
    page.wait_for_selector("#traffic-none")
    assert f"No traffic picture in {out} yet" in page.inner_text("#traffic-none")
    assert http("GET", "/api/leveret/traffic.png")[0] == 404


def test_without_the_setting_the_page_says_how_to_get_pictures(page, base, http) -> None:
    login(page, base)
    page.goto(base + "/#/traffic")
    page.wait_for_selector("#traffic-none")
    text = page.inner_text("#traffic-none")
    assert "run leveret-pipeline traffic --out DIR" in text and "leveret.traffic_dir" in text
    assert page.locator("#traffic-picture").count() == 0
    info = http("GET", "/api/leveret/traffic")[1]
    assert info["configured"] is False and info["picture"] is None
    assert http("GET", "/api/leveret/traffic.png")[0] == 404


def test_session_cookie_leaves_the_idle_timeout_to_the_server(http) -> None:
    """No Max-Age or Expires: a busy session must not end a fixed time after login (the server slides its
    idle timeout, management.login_session_timeout, on every use)."""
    status, body, headers = http("POST", "/api/login", {"username": "guest", "password": "guest"}, auth=None)
    assert status == 200 and body["csrf_token"]
    cookie = headers["Set-Cookie"]
    assert cookie.startswith("leveret_session=") and "HttpOnly" in cookie
    assert "Max-Age" not in cookie and "expires" not in cookie.lower()

