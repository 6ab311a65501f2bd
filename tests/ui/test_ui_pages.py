"""Each page of the web UI renders live data made by pika in the test, without a script error, a console
error or a CSP violation (the ``page`` fixture checks), and is kept as a 1280x800 screenshot artefact.
The overview draws the server's sampled publish rate; connections can be closed with a reason."""

from __future__ import annotations

import threading
import time

import pika
import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


@pytest.fixture
def traffic(ui_broker, uid):
    """Two named connections: one consumer holding 10 unacked messages with prefetch 10, one publisher."""
    b = ui_broker[0]
    consumer = pika.BlockingConnection(b.pika_params(client_properties={"connection_name": uid + "-consumer"}))
    publisher = pika.BlockingConnection(b.pika_params(client_properties={"connection_name": uid + "-publisher"}))
    cch, pch = consumer.channel(), publisher.channel()
    pch.queue_declare(uid, durable=True)
    for i in range(30):
        pch.basic_publish("", uid, f"m{i}".encode())
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume(uid, lambda *a: None)
    consumer.process_data_events(time_limit=0.3)
    yield consumer, publisher
    for c in (consumer, publisher):
        if c.is_open:
            c.close()
    cleanup = pika.BlockingConnection(b.pika_params())
    cleanup.channel().queue_delete(uid)
    cleanup.close()


def test_overview_shows_totals_node_and_listeners(page, base, http, traffic) -> None:
    login(page, base)
    page.wait_for_selector("#totals dd[data-field=connections]")
    ov = http("GET", "/api/overview")[1]
    shown = int(page.inner_text("#totals dd[data-field=connections]").replace(",", ""))
    assert shown == ov["object_totals"]["connections"] >= 2
    assert page.inner_text("#alarms") == "No alarms"
    assert "MiB" in page.inner_text("#node dd[data-field=memory]")
    assert "amqp" in page.inner_text("#listeners")
    shot(page, "overview")


def test_overview_chart_draws_the_sampled_publish_rate(page, base, ui_broker, uid) -> None:
    """A publisher at about 200 msg/s: the chart's publish series reaches that rate (the server samples
    every second here; the page polls every 2 s)."""
    stop = threading.Event()

    def publish() -> None:
        conn = pika.BlockingConnection(ui_broker[0].pika_params())
        ch = conn.channel()
        ch.queue_declare(uid, auto_delete=False)
        while not stop.is_set():
            for _ in range(20):
                ch.basic_publish("", uid, b"x")
            conn.process_data_events(time_limit=0.1)
        ch.queue_delete(uid)
        conn.close()

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    try:
        page.goto(base + "/")
        page.evaluate("localStorage.setItem('leveret.refresh', '2000')")
        login(page, base)
        path = page.locator("#rates-chart path[data-series=publish]")

        def rate() -> float:
            value = path.get_attribute("data-last-value")
            return float(value) if value else 0.0
        def points() -> int:
            return int(path.get_attribute("data-points") or 0)
        assert wait_for(lambda: points() >= 2 and rate() >= 60, timeout=15), (points(), rate())
        assert rate() <= 400  # about 200/s, with room for a slow 2-core machine
        shot(page, "overview-rates")
    finally:
        stop.set()
        t.join(10)


def test_queues_page_lists_live_queue(page, base, traffic, uid) -> None:
    login(page, base)
    page.goto(base + f"/#/queues?name={q(uid)}")
    row = page.locator("#queues tbody tr").first
    row.locator("a.queue-link").wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == uid and cells[4] == "20" and cells[5] == "10" and cells[6] == "30"
    shot(page, "queues")


def test_queue_page_shows_consumer_and_bindings(page, base, traffic, uid) -> None:
    login(page, base)
    page.goto(base + f"/#/queues/%2F/{q(uid)}")
    page.wait_for_selector("#consumers tbody tr td:has-text('10')")
    assert page.inner_text("#queue-facts dd[data-field=messages_unacknowledged]") == "10"
    assert "(default exchange)" in page.inner_text("#queue-bindings")
    shot(page, "queue")


def test_connections_list_detail_and_close_with_reason(page, base, http, traffic, uid) -> None:
    consumer, _publisher = traffic
    login(page, base)
    page.goto(base + "/#/connections")
    page.wait_for_selector(f"#connections td:has-text('{uid}-consumer')")
    shot(page, "connections")
    row = page.locator("#connections tbody tr", has_text=f"{uid}-consumer")
    row.locator("a.connection-link").click()
    page.wait_for_selector("#connection-facts dd[data-field=client-connection_name]")
    assert page.inner_text("#connection-facts dd[data-field=client-connection_name]") == f"{uid}-consumer"
    assert page.inner_text("#connection-facts dd[data-field=channels]") == "1"
    shot(page, "connection")
    page.fill("#close-reason", "maintenance window")
    page.click("#close")
    page.click("#confirm-ok")
    page.wait_for_url("**/#/connections")
    closed = []
    try:
        for _ in range(50):
            consumer.process_data_events(time_limit=0.1)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        closed.append(exc)
    assert closed and closed[0].reply_code == 320 and "maintenance window" in closed[0].reply_text


def test_channels_page_shows_prefetch_and_unacked(page, base, traffic, uid) -> None:
    login(page, base)
    page.goto(base + "/#/channels")
    page.wait_for_selector("#channels tbody tr")
    rows = page.locator("#channels tbody tr").all_inner_texts()
    assert any("\t10\t10\t" in r for r in rows), rows
    shot(page, "channels")


def test_exchanges_page_lists_the_standard_exchanges(page, base) -> None:
    login(page, base)
    page.goto(base + "/#/exchanges")
    page.wait_for_selector("#exchanges a.exchange-link:has-text('amq.topic')")
    assert "(AMQP default)" in page.inner_text("#exchanges")
    shot(page, "exchanges")


def test_refresh_updates_a_page_in_place(page, base, http, amqp, uid) -> None:
    ch = amqp.channel()
    ch.queue_declare(uid)
    page.goto(base + "/")
    page.evaluate("localStorage.setItem('leveret.refresh', '2000')")
    login(page, base)
    page.goto(base + f"/#/queues/%2F/{q(uid)}")
    page.wait_for_selector("#queue-facts dd[data-field=messages_ready]:has-text('0')")
    for _ in range(7):
        ch.basic_publish("", uid, b"x")
    start = time.monotonic()
    page.wait_for_selector("#queue-facts dd[data-field=messages_ready]:has-text('7')", timeout=8000)
    assert time.monotonic() - start < 8
    ch.queue_delete(uid)


@pytest.mark.parametrize(("route", "ready"), [
    ("#/", "#rates-chart"), ("#/connections", "#connections"), ("#/channels", "#channels"),
    ("#/exchanges", "#exchanges"), ("#/exchanges/%2F/amq.topic", "#exchange-facts"), ("#/queues", "#queues"),
    ("#/users", "#users"), ("#/vhosts", "#vhosts"), ("#/policies", "#policies"),
])
def test_every_page_renders_cleanly(page, base, route, ready) -> None:
    """No script error, console error or CSP violation on any page (checked by the ``page`` fixture)."""
    login(page, base)
    page.goto(base + "/" + route)
    page.wait_for_selector(ready)
    assert page.locator("#page-error").count() == 0
    assert page.locator("#nav a.active").count() == 1
    shot(page, "page-" + (route.strip("#/").replace("/", "_").replace("%2F", "") or "overview"))
