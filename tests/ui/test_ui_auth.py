"""The web UI's serving and security: the page and its files at / with a strict CSP, login by form into
an HttpOnly SameSite=Strict session cookie (never the credentials on the client), logout, CSRF and
Origin checks on changes made with the cookie, Basic auth still working for tools, and a
`management`-tagged user kept to its own vhosts."""

from __future__ import annotations

import urllib.error
import urllib.request

import pika
import pytest
from ui_support import login, q, shot

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def test_root_serves_the_ui_with_security_headers_and_etags(http) -> None:
    status, raw, headers = http("GET", "/", auth=None)
    body = raw.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert '<script type="module" src="/ui/app.js">' in body and "<script>" not in body and "style=" not in body
    csp = headers["Content-Security-Policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    status, _, js_headers = http("GET", "/ui/app.js", auth=None)
    assert status == 200 and js_headers["Content-Type"].startswith("text/javascript")
    etag = js_headers["ETag"]
    assert http("GET", "/ui/app.js", auth=None, headers={"If-None-Match": etag})[0] == 304
    assert http("GET", "/ui/../app.py", auth=None)[0] == 404
    assert http("GET", "/ui/nothing.js", auth=None)[0] == 404
    # API answers carry the headers too, and Basic auth keeps working for tools (rabbitmqadmin).
    status, _, api_headers = http("GET", "/api/overview")
    assert status == 200 and api_headers["X-Content-Type-Options"] == "nosniff"
    status, _, challenge = http("GET", "/api/overview", auth=None)
    assert status == 401 and "Basic" in challenge["WWW-Authenticate"]
    status, _, ui_refusal = http("GET", "/api/overview", auth=None, headers={"X-Leveret-UI": "1"})
    assert status == 401 and "WWW-Authenticate" not in ui_refusal  # no browser login box over the UI


def test_login_page_then_wrong_password_sets_no_cookie(page, base) -> None:
    page.goto(base + "/")
    page.wait_for_selector("#login-form")
    assert page.is_visible("#login") and not page.is_visible("#nav")
    page.fill("#username", "guest")
    page.fill("#password", "wrong")
    page.click("#login-button")
    page.wait_for_selector("#login-error:has-text('Login failed')")
    assert page.context.cookies() == []
    shot(page, "login")


def test_login_sets_httponly_strict_cookie_and_keeps_no_credentials(page, base) -> None:
    login(page, base)
    cookies = page.context.cookies()
    assert len(cookies) == 1
    c = cookies[0]
    assert c["name"] == "leveret_session" and c["httpOnly"] and c["sameSite"] == "Strict"
    assert "guest" not in c["value"] and len(c["value"]) >= 40
    stored = page.evaluate("JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage),"
                           " document.cookie])")
    assert "guest" not in stored and "Z3Vlc3Q6Z3Vlc3Q" not in stored  # neither the password nor Basic
    assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read it
    page.reload()  # the session survives a reload; the page asks /api/login who it is
    page.wait_for_selector("#whoami:has-text('guest')")
    page.wait_for_selector("#rates-chart")


def test_logout_ends_the_session_on_the_server(page, base) -> None:
    login(page, base)
    token = page.context.cookies()[0]["value"]
    page.click("#logout")
    page.wait_for_selector("#login-error:has-text('Logged out')")
    assert page.context.cookies() == []
    # The old cookie is dead on the server, not just forgotten by the browser.
    req = urllib.request.Request(base + "/api/overview", headers={"Cookie": f"leveret_session={token}",
                                                                   "X-Leveret-UI": "1"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 401
    page.goto(base + "/#/queues")
    page.wait_for_selector("#login-form")
    assert not page.is_visible("#queues")


def test_changes_by_cookie_need_the_csrf_header_and_our_origin(page, base, http, uid) -> None:
    login(page, base)
    path = f"/api/queues/%2F/{q(uid)}"
    status = page.evaluate("""async (path) => (await fetch(path, {method: 'PUT', body: '{}',
        headers: {'Content-Type': 'application/json'}})).status""", path)
    assert status == 403
    assert http("GET", path)[0] == 404
    token = page.evaluate("""async () => (await (await fetch('/api/login')).json()).csrf_token""")
    status = page.evaluate("""async ([path, token]) => (await fetch(path, {method: 'PUT', body: '{}',
        headers: {'Content-Type': 'application/json', 'X-CSRF-Token': token}})).status""", [path, token])
    assert status == 201 and http("GET", path)[0] == 200
    # With the token but from another origin (a forged cross-site request that somehow got it): refused.
    cookie = page.context.cookies()[0]["value"]
    req = urllib.request.Request(base + path, method="DELETE", headers={
        "Cookie": f"leveret_session={cookie}", "X-CSRF-Token": token, "Origin": "http://evil.example"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 403 and http("GET", path)[0] == 200
    page.expected_console_errors.append("403")
    http("DELETE", path)


def test_management_user_sees_only_its_vhosts_and_cannot_change_users(page, base, http, uid, ui_broker) -> None:
    mine, other = f"{uid}-mine", f"{uid}-other"
    user = f"{uid}-mgr"
    for vh in (mine, other):
        http.ok("PUT", f"/api/vhosts/{q(vh)}")
        http.ok("PUT", f"/api/permissions/{q(vh)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
        http.ok("PUT", f"/api/queues/{q(vh)}/{q(vh + '-queue')}", {"durable": False})
    http.ok("PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"})
    http.ok("PUT", f"/api/permissions/{q(mine)}/{q(user)}", {"configure": ".*", "write": ".*", "read": ".*"})
    try:
        login(page, base, user, "pw")
        assert not page.is_visible("a[data-nav=users]") and not page.is_visible("a[data-nav=vhosts]")
        page.goto(base + f"/#/queues?name={q(uid)}")
        page.wait_for_selector(f"#queues a.queue-link:has-text('{mine}-queue')")
        assert page.locator("#queues tbody tr").count() == 1
        assert other not in page.inner_text("#queues")
        # Sending the change by hand, with a valid CSRF token: the server refuses it all the same.
        status = page.evaluate("""async (user) => {
            const token = (await (await fetch('/api/login')).json()).csrf_token;
            return (await fetch('/api/users/' + encodeURIComponent(user), {method: 'PUT',
              headers: {'Content-Type': 'application/json', 'X-CSRF-Token': token},
              body: JSON.stringify({password: 'x', tags: 'administrator'})})).status; }""", user)
        assert status == 401
        status = page.evaluate("""async (vh) => (await fetch('/api/queues/' + encodeURIComponent(vh))).status""",
                               other)
        assert status == 401
        assert http("GET", f"/api/users/{q(user)}")[1]["tags"] == ["management"]
        page.goto(base + "/#/users")
        page.wait_for_selector("#page-error, #login-form")
    finally:
        http("DELETE", f"/api/users/{q(user)}")
        for vh in (mine, other):
            http("DELETE", f"/api/vhosts/{q(vh)}")


def test_a_deleted_users_session_stops_working(page, base, http, uid) -> None:
    user = f"{uid}-gone"
    http.ok("PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "monitoring"})
    login(page, base, user, "pw")
    http.ok("DELETE", f"/api/users/{q(user)}")
    page.goto(base + "/#/connections")
    page.wait_for_selector("#login-error:has-text('session has ended')")


def test_hostile_names_are_shown_as_text(page, base, http, amqp, uid) -> None:
    evil = f"<img src=x onerror=window.__xss=1>{uid}"
    ch = amqp.channel()
    ch.queue_declare(evil, auto_delete=False)
    ch.exchange_declare(evil + "-x", "fanout")
    ch.queue_bind(evil, evil + "-x")
    ch.basic_publish(evil + "-x", "", b"<script>window.__xss=2</script>",
                     pika.BasicProperties(headers={"<b>h</b>": "<img src=x onerror=window.__xss=3>"}))
    try:
        login(page, base)
        page.goto(base + f"/#/queues?name={q(uid)}")
        page.wait_for_selector("#queues a.queue-link")
        assert page.locator("#queues a.queue-link").first.inner_text() == evil
        page.click("#queues a.queue-link")
        page.wait_for_selector("#queue-name")
        assert page.inner_text("#queue-name") == evil
        page.click("#peek")
        page.wait_for_selector("#peek-results .message")
        assert "<script>window.__xss=2</script>" in page.inner_text("#peek-results")
        assert "<img src=x onerror=window.__xss=3>" in page.inner_text("#peek-results")
        page.goto(base + f"/#/exchanges/%2F/{q(evil + '-x')}")
        page.wait_for_selector("#bindings-source a")
        assert page.inner_text("#exchange-name") == evil + "-x"
        page.goto(base + "/#/exchanges")
        page.wait_for_selector("#exchanges")
        assert evil + "-x" in page.inner_text("#exchanges")
        assert page.evaluate("window.__xss") is None
        assert page.locator("#page img").count() == 0
    finally:
        ch.queue_delete(evil)
        ch.exchange_delete(evil + "-x")


def test_ui_sources_never_use_innerhtml_or_inline_code() -> None:
    from pathlib import Path

    static = Path(__file__).resolve().parents[2] / "broker" / "management" / "ui" / "static"
    files = list(static.rglob("*.js"))
    assert len(files) >= 8
    for f in files:
        code = "\n".join(line for line in f.read_text().splitlines() if not line.lstrip().startswith("//"))
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert banned not in code, (f.name, banned)
    html = (static / "index.html").read_text()
    assert "<script>" not in html and " style=" not in html and " on" + "click=" not in html
