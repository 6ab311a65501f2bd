"""Leveret's extensions in the web UI: a stream queue's page shows its offsets and consumer groups with
their lag; an x-delayed-message exchange's page lists its pending messages and cancels one."""

from __future__ import annotations

import pika
import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def test_stream_page_shows_offsets_and_group_lag(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(12):
        ch.basic_publish("", uid, f"s{i}".encode())
    assert wait_for(lambda: http("GET", f"/api/queues/%2F/{q(uid)}")[1].get("next_offset") == 12)
    http.ok("PUT", f"/api/stream-groups/%2F/{q(uid)}/billing", {"committed_offset": 4})
    login(page, base)
    page.goto(base + f"/#/queues/%2F/{q(uid)}")
    page.wait_for_selector("#stream-facts dd[data-field=next_offset]:has-text('12')")
    row = page.locator("#stream-groups tbody tr", has_text="billing")
    cells = row.locator("td").all_inner_texts()
    group = http("GET", f"/api/stream-groups/%2F/{q(uid)}/billing")[1]
    assert cells[1] == str(group["committed_offset"]) and cells[2] == str(group["lag"]) and group["lag"] > 0
    shot(page, "stream")
    ch.queue_delete(uid)


def test_delayed_exchange_page_lists_and_cancels_pending_messages(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.exchange_declare(uid, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_declare(uid)
    ch.queue_bind(uid, uid, "k")
    for i in range(3):
        ch.basic_publish(uid, "k", f"later-{i}".encode(), pika.BasicProperties(headers={"x-delay": 3_600_000}))
    path = f"/api/exchanges/%2F/{q(uid)}/delayed"
    assert wait_for(lambda: http("GET", path)[1]["total_count"] == 3)
    login(page, base)
    page.goto(base + f"/#/exchanges/%2F/{q(uid)}")
    page.wait_for_selector("#delayed tbody tr >> nth=2")
    assert "3 pending" in page.inner_text("#delayed-box")
    shot(page, "delayed")
    first = page.locator("#delayed button[data-cancel]").first.get_attribute("data-cancel")
    page.locator("#delayed button[data-cancel]").first.click()
    page.click("#confirm-ok")
    # Both at once, on the refreshed card: the result line used to be drawn on the card the refresh then
    # replaced, so it showed only until the list came back (missed once on a loaded machine).
    page.wait_for_selector("#delayed-box:has-text('2 pending')")
    assert page.inner_text("#delayed-result") == f"Cancelled {first}."
    ids = [m["id"] for m in http("GET", path)[1]["items"]]
    assert len(ids) == 2 and first not in ids
    ch.queue_delete(uid)
    ch.exchange_delete(uid)
