"""Issue 37: the web UI's Federation page, as RabbitMQ's federation management shows its links. The UI's own
Leveret federates an exchange from another of its vhosts (an ``amqp:///VHOST`` upstream: this node, as in
RabbitMQ); the page shows the link running with its upstream, exchange and URI, and counts a message that
crossed; an unreachable upstream shows ``error`` with the reason and no credentials."""

from __future__ import annotations

import pika
import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def test_the_federation_page_lists_links(page, base, http, amqp, ui_broker, uid) -> None:
    up_vh, ex, queue = f"{uid}-up", f"fed.{uid}", f"{uid}-q"
    http.ok("PUT", f"/api/vhosts/{q(up_vh)}", {})
    http.ok("PUT", f"/api/permissions/{q(up_vh)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    http.ok("PUT", f"/api/exchanges/{q(up_vh)}/{q(ex)}", {"type": "topic", "durable": True})
    ch = amqp.channel()
    ch.exchange_declare(ex, "topic", durable=True)
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, ex, "k.#")
    http.ok("PUT", f"/api/parameters/federation-upstream/%2F/{uid}-local", {"value": {"uri": f"amqp:///{up_vh}"}})
    http.ok("PUT", f"/api/parameters/federation-upstream/%2F/{uid}-gone",
            {"value": {"uri": "amqp://guest:secret@127.0.0.1:1", "reconnect-delay": 30}})
    http.ok("PUT", f"/api/policies/%2F/{uid}", {"pattern": f"^{ex}$", "apply-to": "exchanges",
                                                "definition": {"federation-upstream-set": "all"}})
    assert wait_for(lambda: any(li["upstream"] == f"{uid}-local" and li["status"] == "running"
                                for li in http.ok("GET", "/api/federation-links")), 30)
    b = ui_broker[0]
    with pika.BlockingConnection(pika.ConnectionParameters(b.host, b.port, up_vh,
                                                           pika.PlainCredentials(b.user, b.password))) as conn:
        conn.channel().basic_publish(ex, "k.1", b"hello")

    login(page, base)
    page.select_option("#refresh", "2000")
    page.click("a[data-nav=federation]")
    row = page.locator("#federation-links tbody tr", has=page.locator(f".federation-upstream:text-is('{uid}-local')"))
    row.locator(".state-running").wait_for(timeout=30_000)
    page.wait_for_function(
        "(name) => [...document.querySelectorAll('#federation-links tbody tr')].some((tr) =>"
        " tr.querySelector('.federation-upstream')?.textContent === name"
        " && tr.querySelector('.federation-received')?.textContent === '1')", arg=f"{uid}-local", timeout=30_000)
    assert ex in row.inner_text() and f"amqp:///{up_vh}" in row.inner_text()
    gone = page.locator("#federation-links tbody tr", has=page.locator(f".federation-upstream:text-is('{uid}-gone')"))
    gone.locator(".state-error").wait_for(timeout=30_000)
    assert "could not connect" in gone.inner_text() and "secret" not in gone.inner_text()
    shot(page, "federation-links")
    http.ok("DELETE", f"/api/policies/%2F/{uid}")
    http.ok("DELETE", f"/api/vhosts/{q(up_vh)}")
