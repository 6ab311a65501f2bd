"""Issue 31, finding 2, in the browser: a page served from another origin, in a browser that holds the
administrator's HTTP Basic credentials for the broker (an operator opened an /api URL), calls ``fetch`` against
the HTTP API, then submits a form to it. Nothing changes: the form's text/plain POST is refused (403, its Origin is
not ours), the no-cors fetch likewise, and the JSON PUT never gets past the CORS preflight.

Before: the form's ``POST /api/definitions`` was accepted (204) and created an administrator."""

from __future__ import annotations

import http.server
import socketserver
import threading
from collections.abc import Iterator

import pytest
from ui_support import wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only

EVIL_PAGE = """<!doctype html>
<html><body>
<form id="f" method="POST" enctype="text/plain" action="{api}/api/definitions">
  <input type="hidden"
         name='{{"users":[{{"name":"{uid}-form","password":"pw","tags":"administrator"}}],"permissions":[],"pad":"'
         value='"}}'>
</form>
<script>
(async () => {{
  const results = [];
  try {{
    await fetch("{api}/api/definitions", {{method: "POST", mode: "no-cors", credentials: "include",
      headers: {{"Content-Type": "text/plain"}},
      body: JSON.stringify({{queues: [{{name: "{uid}-fetch-q", vhost: "/", durable: false, auto_delete: false,
                                        arguments: {{}}}}]}})}});
    results.push("no-cors sent");
  }} catch (e) {{ results.push("no-cors failed " + e); }}
  try {{
    await fetch("{api}/api/users/{uid}-fetch", {{method: "PUT", credentials: "include",
      headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{password: "pw", tags: "administrator"}})}});
    results.push("cors sent");
  }} catch (e) {{ results.push("cors failed"); }}
  document.title = "done: " + results.join("; ");
}})();
</script>
</body></html>
"""


@pytest.fixture
def evil_site(base, uid) -> Iterator[str]:
    """Another origin (another port) serving the attacking page."""
    page = EVIL_PAGE.format(api=base, uid=uid).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = socketserver.TCPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_from_another_origin_changes_nothing_with_cached_basic_credentials(browser, base, http, ui_broker,
                                                                                   evil_site, uid) -> None:
    context = browser.new_context(http_credentials={"username": "guest", "password": "guest", "origin": base})
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        # The operator opened an API URL: the browser now holds Basic credentials for the broker's origin.
        assert page.goto(base + "/api/whoami").status == 200
        assert '"guest"' in page.content()
        page.goto(evil_site)
        page.wait_for_function("document.title.startsWith('done')")
        assert "no-cors sent" in page.title() and "cors failed" in page.title(), page.title()
        # The form's submission navigates to the API's answer: the refusal.
        page.evaluate("document.getElementById('f').submit()")
        page.wait_for_url(base + "/api/definitions")
        assert "cross-site request refused" in page.content()
    finally:
        context.close()
    users = {u["name"] for u in http.ok("GET", "/api/users")}
    assert f"{uid}-form" not in users and f"{uid}-fetch" not in users
    assert http("GET", f"/api/queues/%2F/{uid}-fetch-q")[0] == 404
    # both POSTs reached the broker and were refused there (not merely lost by the browser)
    refused = wait_for(lambda: ui_broker[0].log_text().count("HTTP API change from another site refused") >= 2)
    assert refused
