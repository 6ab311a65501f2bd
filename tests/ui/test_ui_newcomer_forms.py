"""Issue 32, defect 6: the web UI next to RabbitMQ's. A newcomer found no form to add an exchange or a binding
(queues only), a stream's page offering Peek/Get/Purge (which the server refuses: 540 over AMQP), and a wrong
password answered "Login failed: Login failed". Each as a user meets it in the browser, checked through the
HTTP API beside it."""

from __future__ import annotations

import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def test_add_a_new_exchange_from_the_exchanges_page(page, base, http, uid) -> None:
    login(page, base)
    page.goto(base + "/#/exchanges")
    page.wait_for_selector("#add-exchange")
    page.wait_for_selector("#new-exchange-vhost option[value='/']", state="attached")
    page.wait_for_selector("#new-exchange-type option[value='topic']", state="attached")
    page.select_option("#new-exchange-vhost", "/")
    page.fill("#new-exchange-name", uid)
    page.select_option("#new-exchange-type", "topic")
    page.select_option("#new-exchange-durable", "true")
    page.fill("#new-exchange-arguments", "alternate-exchange = unrouted")
    page.click("#add-exchange-button")
    page.wait_for_selector(f"#new-exchange-result:has-text('Exchange {uid} declared.')")
    page.wait_for_selector(f"#exchanges a.exchange-link:has-text('{uid}')")
    x = http.ok("GET", f"/api/exchanges/%2F/{q(uid)}")
    assert (x["type"], x["durable"], x["auto_delete"], x["internal"]) == ("topic", True, False, False)
    assert x["arguments"] == {"alternate-exchange": "unrouted"}
    shot(page, "add-exchange")
    # A refusal is said on the form (here: the same name with another type, 406 in AMQP).
    page.select_option("#new-exchange-type", "fanout")
    page.click("#add-exchange-button")
    page.wait_for_selector("#new-exchange-result.error:has-text('Could not declare the exchange')")
    page.expected_console_errors.append("Failed to load resource")


def test_add_binding_from_an_exchange_page(page, base, http, uid) -> None:
    http.ok("PUT", f"/api/exchanges/%2F/{q(uid)}", {"type": "topic", "durable": True})
    http.ok("PUT", f"/api/exchanges/%2F/{q(uid + '.fan')}", {"type": "fanout", "durable": True})
    http.ok("PUT", f"/api/queues/%2F/{q(uid + '.q')}", {"durable": True})
    login(page, base)
    page.goto(base + f"/#/exchanges/%2F/{q(uid)}")
    page.wait_for_selector("#add-binding")
    page.select_option("#new-binding-destination-type", "q")
    page.fill("#new-binding-destination", uid + ".q")
    page.fill("#new-binding-routing-key", "orders.#")
    page.click("#add-binding-button")
    page.wait_for_selector(f"#bindings-source a:has-text('{uid}.q')")
    page.select_option("#new-binding-destination-type", "e")
    page.fill("#new-binding-destination", uid + ".fan")
    page.fill("#new-binding-routing-key", "audit.*")
    page.click("#add-binding-button")
    page.wait_for_selector(f"#bindings-source a:has-text('{uid}.fan')")
    shot(page, "add-binding-exchange")
    to_queue = http.ok("GET", f"/api/bindings/%2F/e/{q(uid)}/q/{q(uid + '.q')}")
    to_exchange = http.ok("GET", f"/api/bindings/%2F/e/{q(uid)}/e/{q(uid + '.fan')}")
    assert [b["routing_key"] for b in to_queue] == ["orders.#"]
    assert [b["routing_key"] for b in to_exchange] == ["audit.*"]


def test_add_binding_from_a_queue_page(page, base, http, uid) -> None:
    http.ok("PUT", f"/api/queues/%2F/{q(uid)}", {"durable": True})
    login(page, base)
    page.goto(base + f"/#/queues/%2F/{q(uid)}")
    page.wait_for_selector("#add-binding")
    page.fill("#new-binding-source", "amq.topic")
    page.fill("#new-binding-routing-key", "invoices.*")
    page.click("#add-binding-button")
    page.wait_for_selector("#queue-bindings td:has-text('amq.topic')")
    assert wait_for(lambda: http.ok("GET", f"/api/bindings/%2F/e/amq.topic/q/{q(uid)}"))[0]["routing_key"] == \
        "invoices.*"
    # An exchange that does not exist: one line on the form.
    page.fill("#new-binding-source", uid + ".no-such-exchange")
    page.click("#add-binding-button")
    page.wait_for_selector("#new-binding-result.error:has-text('Could not bind')")
    page.expected_console_errors.append("Failed to load resource")


def test_a_streams_page_offers_no_peek_get_move_or_purge(page, base, http, uid) -> None:
    http.ok("PUT", f"/api/queues/%2F/{q(uid)}", {"durable": True, "arguments": {"x-queue-type": "stream"}})
    http.ok("PUT", f"/api/queues/%2F/{q(uid + '.classic')}", {"durable": True})
    login(page, base)
    page.goto(base + f"/#/queues/%2F/{q(uid)}")
    page.wait_for_selector("#stream-facts")
    page.wait_for_selector("#delete-queue")
    for refused in ("#peek", "#get-messages", "#move", "#purge"):
        assert page.locator(refused).count() == 0, refused
    shot(page, "stream-actions")
    # A classic queue's page still has them all.
    page.goto(base + f"/#/queues/%2F/{q(uid + '.classic')}")
    page.wait_for_selector("#queue-facts dd[data-field=type]:has-text('classic')")
    for offered in ("#peek", "#get-messages", "#move", "#purge", "#delete-queue"):
        assert page.locator(offered).count() == 1, offered


def test_a_wrong_password_says_so_once(page, base) -> None:
    page.goto(base + "/")
    page.wait_for_selector("#login-form")
    page.fill("#username", "guest")
    page.fill("#password", "not-the-password")
    page.click("#login-button")
    page.wait_for_selector("#login-error:has-text('Login failed')")
    assert page.inner_text("#login-error").strip() == "Login failed: wrong user name or password."
    page.expected_console_errors.append("Failed to load resource")
