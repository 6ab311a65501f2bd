"""Issue 37: the web UI's Shovels page, as RabbitMQ's shovel management shows it. A shovel added through the
"Add a new shovel" form moves messages between two queues of the UI's own Leveret (``amqp://`` with no host
at the source, the same node through its TCP listener with credentials at the destination, which the page
must not show), is seen running with the count it moved, is restarted and deleted with its buttons; each step
is checked through the HTTP API beside the browser."""

from __future__ import annotations

import time

import pika
import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def publish(conn, queue: str, n: int) -> None:
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    ch.close()


def depth(http, queue: str) -> int:
    status, body, _ = http("GET", f"/api/queues/%2F/{q(queue)}")
    return body["messages"] if status == 200 and isinstance(body.get("messages"), int) else -1


def status_of(http, name: str) -> dict | None:
    return next((s for s in http.ok("GET", "/api/shovels") if s["name"] == name), None)


def test_add_watch_restart_and_delete_a_shovel(page, base, http, amqp, ui_broker, uid) -> None:
    src, dst, name = f"{uid}-src", f"{uid}-dst", f"{uid}-shovel"
    publish(amqp, src, 300)
    login(page, base)
    page.select_option("#refresh", "2000")
    page.click("a[data-nav=shovels]")
    page.wait_for_selector("#add-shovel")
    page.wait_for_selector("#new-shovel-vhost option[value='/']", state="attached")

    # A bad URI: rabbitmq_shovel's reason on the form, no parameter written.
    page.fill("#new-shovel-name", name)
    page.fill("#new-shovel-src-uri", "foo://x")
    page.fill("#new-shovel-src-queue", src)
    page.fill("#new-shovel-dest-queue", dst)
    page.click("#add-shovel-button")
    page.wait_for_selector("#new-shovel-result.error:has-text('not a valid URI')")
    page.expected_console_errors.append("Failed to load resource")
    assert http("GET", f"/api/parameters/shovel/%2F/{q(name)}")[0] == 404

    dest_uri = f"amqp://guest:guest@127.0.0.1:{ui_broker[0].port}"
    page.fill("#new-shovel-src-uri", "amqp://")
    page.fill("#new-shovel-dest-uri", dest_uri)
    page.fill("#new-shovel-prefetch", "50")
    page.select_option("#new-shovel-ack-mode", "on-confirm")
    page.select_option("#new-shovel-delete-after", "never")
    page.click("#add-shovel-button")
    page.wait_for_selector(f"#new-shovel-result.ok:has-text('Shovel {name} added.')")
    value = http.ok("GET", f"/api/parameters/shovel/%2F/{q(name)}")["value"]
    assert value == {"src-uri": "amqp://", "src-queue": src, "dest-uri": dest_uri, "dest-queue": dst,
                     "ack-mode": "on-confirm", "src-prefetch-count": 50, "src-delete-after": "never"}

    row = page.locator("#shovels tbody tr", has=page.locator(f".shovel-name:text-is('{name}')"))
    row.locator(".state-running").wait_for(timeout=30_000)
    page.wait_for_function(
        "([name, n]) => [...document.querySelectorAll('#shovels tbody tr')].some((tr) =>"
        " tr.querySelector('.shovel-name')?.textContent === name"
        " && tr.querySelector('.shovel-moved')?.textContent === n)", arg=[name, "300"], timeout=30_000)
    assert wait_for(lambda: depth(http, dst) == 300, 20) and depth(http, src) == 0
    text = row.inner_text()
    assert f"queue {src}" in text and f"queue {dst}" in text and f"127.0.0.1:{ui_broker[0].port}" in text
    assert "guest" not in text  # the destination's credentials are not shown
    shot(page, "shovels-running")

    # Restart: a new worker (its count starts again at 0), which still moves what comes.
    before = status_of(http, name)
    assert before is not None and before["messages_acked"] == 300
    row.locator(f"button[data-restart='{name}']").click()
    page.wait_for_selector(f"#shovels-result.ok:has-text('Shovel {name} restarted.')")
    restarted = wait_for(lambda: (s := status_of(http, name)) and s["state"] == "running"
                         and s["messages_acked"] == 0 and s, 30)
    assert restarted, status_of(http, name)
    publish(amqp, src, 20)
    page.wait_for_function(
        "([name, n]) => [...document.querySelectorAll('#shovels tbody tr')].some((tr) =>"
        " tr.querySelector('.shovel-name')?.textContent === name"
        " && tr.querySelector('.shovel-moved')?.textContent === n)", arg=[name, "20"], timeout=30_000)
    assert wait_for(lambda: depth(http, dst) == 320, 20)

    # Delete, after the confirmation: the parameter and the shovel are gone, nothing more moves.
    row.locator(f"button[data-delete='{name}']").click()
    page.click("#confirm-ok")
    page.wait_for_selector(f"#shovels-result.ok:has-text('Shovel {name} deleted.')")
    page.wait_for_selector(f"#shovels .shovel-name:text-is('{name}')", state="detached")
    assert http("GET", f"/api/parameters/shovel/%2F/{q(name)}")[0] == 404
    assert wait_for(lambda: status_of(http, name) is None, 10)
    publish(amqp, src, 5)
    assert wait_for(lambda: depth(http, src) == 5, 10)
    time.sleep(2)  # a shovel left running would have taken them by now (prefetch 50, local queues)
    assert depth(http, src) == 5 and depth(http, dst) == 320
