"""Admin pages of the web UI: users with tags and permissions (the new user logs in and sees only its
vhost), virtual hosts added and deleted after confirmation, a policy that takes effect, and definitions
exported as a download and imported from a file (a non-JSON file is refused and changes nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pika
import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def test_create_user_set_permission_and_log_in_as_it(page, base, http, uid, browser) -> None:
    vh, user = f"{uid}-vh", f"{uid}-u"
    http.ok("PUT", f"/api/vhosts/{q(vh)}")
    http.ok("PUT", f"/api/permissions/{q(vh)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    http.ok("PUT", f"/api/queues/{q(vh)}/{q(uid + '-inside')}", {"durable": False})
    try:
        login(page, base)
        page.goto(base + "/#/users")
        page.wait_for_selector("#users")
        page.fill("#new-user-name", user)
        page.fill("#new-user-password", "s3cret")
        page.fill("#new-user-tags", "management")
        page.click("#add-user button[type=submit]")
        page.wait_for_selector(f"#users td:has-text('{user}')")
        page.fill("#perm-user", user)
        page.fill("#perm-vhost", vh)
        page.click("#set-permission button[type=submit]")
        page.wait_for_selector(f"#permissions td:has-text('{vh}')")
        shot(page, "users")
        assert http("GET", f"/api/users/{q(user)}")[1]["tags"] == ["management"]
        other = browser.new_context(viewport={"width": 1280, "height": 800})
        p2 = other.new_page()
        login(p2, base, user, "s3cret")
        p2.goto(base + "/#/queues")
        p2.wait_for_selector("#queues a.queue-link")
        assert p2.locator("#queues a.queue-link").all_inner_texts() == [uid + "-inside"]
        other.close()
    finally:
        http("DELETE", f"/api/users/{q(user)}")
        http("DELETE", f"/api/vhosts/{q(vh)}")


def test_add_and_delete_a_vhost_with_confirmation(page, base, http, uid) -> None:
    login(page, base)
    page.goto(base + "/#/vhosts")
    page.wait_for_selector("#vhosts")
    page.fill("#new-vhost-name", uid)
    page.click("#add-vhost button[type=submit]")
    page.wait_for_selector(f"#vhosts td:has-text('{uid}')")
    assert http("GET", f"/api/vhosts/{q(uid)}")[0] == 200
    shot(page, "vhosts")
    page.click(f"button[data-delete='{uid}']")
    page.click("#confirm-cancel")
    assert http("GET", f"/api/vhosts/{q(uid)}")[0] == 200
    page.click(f"button[data-delete='{uid}']")
    page.click("#confirm-ok")
    page.wait_for_selector(f"#vhosts-result:has-text('Deleted virtual host {uid}')")
    assert http("GET", f"/api/vhosts/{q(uid)}")[0] == 404


def test_policy_from_the_ui_takes_effect(page, base, http, amqp, uid) -> None:
    login(page, base)
    page.goto(base + "/#/policies")
    page.wait_for_selector("#policies")
    page.fill("#policy-name", uid)
    page.fill("#policy-pattern", f"^{uid}\\.")
    page.select_option("#policy-apply-to", "queues")
    page.fill("#policy-definition", '{"max-length": 10}')
    page.click("#add-policy button[type=submit]")
    page.wait_for_selector(f"#policies td:has-text('{uid}')")
    shot(page, "policies")
    ch = amqp.channel()
    ch.queue_declare(uid + ".a")
    for i in range(20):
        ch.basic_publish("", uid + ".a", str(i).encode())
    assert wait_for(lambda: http("GET", f"/api/queues/%2F/{q(uid + '.a')}")[1]["messages_ready"] == 10)
    page.goto(base + f"/#/queues/%2F/{q(uid + '.a')}")
    page.wait_for_selector(f"#queue-facts dd[data-field=policy]:has-text('{uid}')")
    ch.queue_delete(uid + ".a")
    http("DELETE", f"/api/policies/%2F/{q(uid)}")


def test_definitions_export_and_import(page, base, http, uid, tmp_path) -> None:
    http.ok("PUT", f"/api/queues/%2F/{q(uid + '-exported')}", {"durable": True})
    login(page, base)
    page.wait_for_selector("#definitions-export")
    with page.expect_download() as dl:
        page.click("#definitions-export")
    exported = json.loads(Path(dl.value.path()).read_text())
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies"):
        assert key in exported
    assert uid + "-exported" in [x["name"] for x in exported["queues"]]
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    page.set_input_files("#definitions-file", str(bad))
    page.click("#definitions-import")
    page.wait_for_selector("#definitions-result:has-text('Not a JSON file')")
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"queues": [{"name": uid + "-imported", "vhost": "/", "durable": True,
                                            "auto_delete": False, "arguments": {}}]}))
    page.set_input_files("#definitions-file", str(good))
    page.click("#definitions-import")
    page.wait_for_selector("#definitions-result:has-text('Definitions imported')")
    assert http("GET", f"/api/queues/%2F/{q(uid + '-imported')}")[0] == 200
    for name in (uid + "-exported", uid + "-imported"):
        http("DELETE", f"/api/queues/%2F/{q(name)}")


def test_monitoring_user_gets_no_admin_menu_and_is_refused_deletes(page, base, http, uid) -> None:
    user = f"{uid}-mon"
    http.ok("PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "monitoring"})
    http.ok("PUT", f"/api/queues/%2F/{q(uid)}", {"durable": False})
    try:
        login(page, base, user, "pw")
        assert not page.is_visible("a[data-nav=users]") and not page.is_visible("a[data-nav=policies]")
        status = page.evaluate("""async (path) => {
            const token = (await (await fetch('/api/login')).json()).csrf_token;
            return (await fetch(path, {method: 'DELETE', headers: {'X-CSRF-Token': token}})).status; }""",
                               f"/api/queues/%2F/{q(uid)}")
        assert status == 401 and http("GET", f"/api/queues/%2F/{q(uid)}")[0] == 200
    finally:
        http("DELETE", f"/api/users/{q(user)}")
        http("DELETE", f"/api/queues/%2F/{q(uid)}")


def test_pika_sees_queue_declared_from_the_ui(page, base, ui_broker, uid) -> None:
    login(page, base)
    page.goto(base + "/#/queues")
    page.wait_for_selector("#add-queue")
    page.wait_for_selector("#new-queue-vhost option[value='/']", state="attached")
    page.fill("#new-queue-name", uid)
    page.click("#add-queue button[type=submit]")
    page.wait_for_selector("#new-queue-result:has-text('declared')")
    conn = pika.BlockingConnection(ui_broker[0].pika_params())
    ch = conn.channel()
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_delete(uid)
    conn.close()
