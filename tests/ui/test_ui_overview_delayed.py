"""The overview counts delayed messages: those x-delayed-message exchanges hold (not yet in any queue, so not
among the queued messages), summed over the exchanges the user can see, and the count drops when they go."""

from __future__ import annotations

import pika
import pytest
from ui_support import login, q, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def pending_total(http) -> int:
    return sum(x.get("delayed_pending", 0) for x in http("GET", "/api/exchanges")[1])


def test_overview_counts_delayed_messages(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.exchange_declare(uid, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    before = pending_total(http)
    try:
        for i in range(4):
            ch.basic_publish(uid, "k", f"later-{i}".encode(), pika.BasicProperties(headers={"x-delay": 3_600_000}))
        assert wait_for(lambda: http("GET", f"/api/exchanges/%2F/{q(uid)}")[1]["delayed_pending"] == 4)
        expected = before + 4
        login(page, base)
        page.select_option("#refresh", "2000")
        cell = "#totals dd[data-field=messages_delayed]"
        page.wait_for_selector(f"{cell}:has-text('{expected:,} in ')")
        assert "delayed exchange" in page.inner_text(cell)
        ch.exchange_delete(uid)
        assert wait_for(lambda: pending_total(http) == before)
        page.wait_for_selector(f"{cell}:text-matches('^{before:,}( in |$)')")
    finally:
        if amqp.is_open:
            amqp.channel().exchange_delete(uid)
