"""Operators' view of delayed messages (issue 14): the HTTP API's pages of an ``x-delayed-message`` exchange's
pending messages (``/api/exchanges/{vhost}/{name}/delayed``), showing, cancelling and purging them, the
exchange object's ``delayed_*`` fields, the Prometheus series and ``leveret ctl list_delayed`` /
``cancel_delayed``.

Leveret only: the plugin has no such API, and the reference node runs without it. Each test uses an exchange
of its own on one Leveret process with its HTTP API and exporter on; long delays (minutes) keep messages
pending for the whole test, short ones (0.5 and 1.5 s) show dispatch and that a cancelled message never comes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = [pytest.mark.timeout(90), pytest.mark.leveret_only]

LONG = 600_000  # ms: pending for the whole test


class Node:
    def __init__(self, api: Http, conn: pika.BlockingConnection, mport: int, pport: int) -> None:
        self.api = api
        self.conn = conn
        self.ch = conn.channel()
        self.ch.confirm_delivery()
        self.mport = mport
        self.pport = pport

    def declare(self, name: str) -> None:
        """A durable delayed exchange (direct underneath) with queue ``{name}.q`` bound by key ``k``."""
        self.ch.exchange_declare(name, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        self.ch.queue_declare(f"{name}.q", durable=True)
        self.ch.queue_bind(f"{name}.q", name, "k")

    def publish(self, exchange: str, delay: int, message_id: str, body: bytes = b"") -> None:
        self.ch.basic_publish(exchange, "k", body or message_id.encode(),
                              pika.BasicProperties(headers={"x-delay": delay}, message_id=message_id,
                                                   delivery_mode=2, content_type="text/plain"))

    def get(self, path: str):
        status, body, _h = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body

    def scrape(self, path: str) -> dict[tuple[str, tuple], float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.pport}{path}", timeout=5).read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def ctl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{self.mport}",
                              *args], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        assert (out.returncode == 0) == ok, (out.returncode, out.stdout, out.stderr)
        return out

    def all_pending(self, exchange: str) -> list[dict]:
        return self.get(f"/api/exchanges/%2F/{exchange}/delayed?page_size=500")["items"]


@pytest.fixture(scope="module")
def node():
    tmp = Path(tempfile.mkdtemp(prefix="leveret-delayvis-"))
    b, mport, pport = start_mgmt_broker(tmp)
    conn = pika.BlockingConnection(b.pika_params())
    try:
        yield Node(Http(mport), conn, mport, pport)
    finally:
        conn.close()
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_pages_by_due_time_show_one_and_exchange_fields(node):
    node.declare("dv.list")
    for i in (3, 0, 4, 1, 2):  # published out of order: listed by due time
        node.publish("dv.list", LONG + i * 1000, f"m{i}", b"body-%d" % i)
    base = "/api/exchanges/%2F/dv.list/delayed"
    seen, cursor, pages = [], None, 0
    while True:
        page = node.get(base + "?page_size=2" + (f"&after={cursor}" if cursor else ""))
        pages += 1
        assert page["page_size"] == 2 and page["total_count"] == 5
        assert page["item_count"] == len(page["items"]) <= 2
        seen += page["items"]
        cursor = page["next"]
        if cursor is None:
            break
        assert cursor == page["items"][-1]["id"]
    assert pages == 3
    assert [it["properties"]["message_id"] for it in seen] == ["m0", "m1", "m2", "m3", "m4"]
    dues = [it["due_ms"] for it in seen]
    assert dues == sorted(dues) and dues[4] - dues[0] >= 4000
    first = seen[0]
    assert first["id"] == f"{first['due_ms']}-{first['id'].rsplit('-', 1)[1]}"
    assert first["delay_ms"] == LONG and first["routing_key"] == "k" and first["persistent"] is True
    assert first["payload_bytes"] == 6 and first["size"] > first["payload_bytes"]
    assert first["properties"]["headers"] == {"x-delay": LONG}
    assert first["properties"]["content_type"] == "text/plain"
    assert first["due"].endswith("Z") and "payload" not in first
    assert abs(first["due_ms"] - (time.time() * 1000 + LONG)) < 60_000

    truncated = node.get(base + "?truncate=3&page_size=1")["items"][0]
    assert (truncated["payload"], truncated["payload_encoding"]) == ("bod", "string")
    b64 = node.get(base + "?truncate=2&page_size=1&encoding=base64")["items"][0]
    assert (b64["payload"], b64["payload_encoding"]) == ("Ym8=", "base64")

    one = node.get(f"{base}/{seen[2]['id']}")
    assert (one["payload"], one["payload_encoding"]) == ("body-2", "string")
    assert one["properties"]["message_id"] == "m2" and one["id"] == seen[2]["id"]

    ex = node.get("/api/exchanges/%2F/dv.list")
    assert ex["type"] == "x-delayed-message"
    assert ex["delayed_pending"] == 5
    assert ex["delayed_bytes"] == sum(it["size"] for it in seen)
    assert ex["delayed_next_due_ms"] == first["due_ms"] and ex["delayed_next_due"] == first["due"]
    assert "delayed_pending" not in node.get("/api/exchanges/%2F/amq.direct")

    per = node.scrape("/metrics/per-object")
    labels = (("exchange", "dv.list"), ("vhost", "/"))
    assert per[("leveret_delayed_messages_pending", labels)] == 5
    assert per[("leveret_delayed_bytes_pending", labels)] == ex["delayed_bytes"]
    assert per[("leveret_delayed_next_due_seconds", labels)] == pytest.approx(first["due_ms"] / 1000)

    out = node.ctl("list_delayed", "dv.list").stdout
    assert out.startswith("Listing delayed messages of exchange 'dv.list' in vhost '/' ...")
    assert [line.split()[0] for line in out.splitlines()[2:]] == [it["id"] for it in seen]
    rows = json.loads(node.ctl("--formatter", "json", "list_delayed", "dv.list", "id",
                               "properties.message_id").stdout)
    assert rows == [{"id": it["id"], "properties.message_id": it["properties"]["message_id"]} for it in seen]


def test_cancelled_message_never_comes_and_dispatch_works(node):
    node.declare("dv.cancel")
    before = node.scrape("/metrics")
    t0 = time.monotonic()
    # cancelme is due in 5 s: the DELETE below must come before that, which a loaded CI machine's publishes,
    # listing and HTTP round trips can take more than a second or two to reach.
    node.publish("dv.cancel", 5000, "cancelme")
    node.publish("dv.cancel", 500, "short")
    node.publish("dv.cancel", LONG, "stays")
    items = node.all_pending("dv.cancel")
    victim = next(it for it in items if it["properties"]["message_id"] == "cancelme")
    path = f"/api/exchanges/%2F/dv.cancel/delayed/{victim['id']}"
    assert node.api("DELETE", path)[0] == 204
    assert time.monotonic() - t0 < 4.9, "cancelled before its due time"
    assert node.api("DELETE", path)[0] == 404
    assert node.api("GET", path)[0] == 404

    time.sleep(max(0.0, t0 + 8.0 - time.monotonic()))  # both short delays are past by now (cancelme's by 3 s)
    got = []
    while (m := node.ch.basic_get("dv.cancel.q", auto_ack=True))[0] is not None:
        got.append(m)
    assert [props.message_id for _m, props, _b in got] == ["short"]
    assert got[0][1].headers["x-delay"] == -500
    assert [it["properties"]["message_id"] for it in node.all_pending("dv.cancel")] == ["stays"]

    after = node.scrape("/metrics")
    assert after[("leveret_delayed_messages_dispatched_total", ())] >= \
        before[("leveret_delayed_messages_dispatched_total", ())] + 1
    assert after[("leveret_delayed_messages_cancelled_total", ())] == \
        before[("leveret_delayed_messages_cancelled_total", ())] + 1
    assert after[("leveret_delayed_dispatch_lateness_seconds_count", ())] >= \
        before[("leveret_delayed_dispatch_lateness_seconds_count", ())] + 1
    assert after[("leveret_delayed_dispatch_lateness_seconds_bucket", (("le", "+Inf"),))] == \
        after[("leveret_delayed_dispatch_lateness_seconds_count", ())]
    assert after[("leveret_delayed_messages_pending", ())] >= 1

    stays = node.all_pending("dv.cancel")[0]["id"]
    out = node.ctl("cancel_delayed", "dv.cancel", stays).stdout
    assert f"Cancelling delayed message {stays} of exchange 'dv.cancel'" in out
    assert node.all_pending("dv.cancel") == []
    err = node.ctl("cancel_delayed", "dv.cancel", stays, ok=False).stderr
    assert "404" in err


def test_purge_cancels_all_and_the_exchange_goes_on(node):
    node.declare("dv.purge")
    for i in range(3):
        node.publish("dv.purge", LONG + i, f"p{i}")
    before = node.scrape("/metrics")[("leveret_delayed_messages_cancelled_total", ())]
    assert node.get("/api/exchanges/%2F/dv.purge")["delayed_pending"] == 3
    assert node.api("DELETE", "/api/exchanges/%2F/dv.purge/delayed")[0] == 204
    assert node.all_pending("dv.purge") == []
    ex = node.get("/api/exchanges/%2F/dv.purge")
    assert (ex["delayed_pending"], ex["delayed_bytes"], ex["delayed_next_due"]) == (0, 0, None)
    assert node.scrape("/metrics")[("leveret_delayed_messages_cancelled_total", ())] == before + 3
    # Held after the purge: listed, counted, and the purged ones stay gone.
    node.publish("dv.purge", LONG, "after")
    assert [it["properties"]["message_id"] for it in node.all_pending("dv.purge")] == ["after"]
    per = node.scrape("/metrics/per-object")
    assert per[("leveret_delayed_messages_pending", (("exchange", "dv.purge"), ("vhost", "/")))] == 1


def test_not_found_and_refusals(node):
    node.declare("dv.auth")
    node.publish("dv.auth", LONG, "secret")
    pending = node.all_pending("dv.auth")[0]["id"]
    api = node.api
    for path in ("/api/exchanges/%2F/amq.direct/delayed", "/api/exchanges/%2F/nope/delayed",
                 "/api/exchanges/nohost/dv.auth/delayed", f"/api/exchanges/%2F/amq.direct/delayed/{pending}",
                 "/api/exchanges/%2F/dv.auth/delayed/not-an-id", "/api/exchanges/%2F/dv.auth/delayed/5-99999"):
        assert api("GET", path)[0] == 404, path
    assert api("DELETE", "/api/exchanges/%2F/amq.direct/delayed")[0] == 404
    assert api("GET", "/api/exchanges/%2F/dv.auth/delayed?after=x")[0] == 400
    assert api("GET", "/api/exchanges/%2F/dv.auth/delayed", auth=None)[0] == 401
    assert api("GET", "/api/exchanges/%2F/dv.auth/delayed", auth=("guest", "wrong"))[0] == 401

    users = {"dv-none": None, "dv-noread": ("^dv\\.", "^dv\\.", ""), "dv-readonly": ("", "", "^dv\\.")}
    for name, perms in users.items():
        assert api("PUT", f"/api/users/{name}", {"password": "pw", "tags": "management"})[0] in (201, 204)
        if perms is not None:
            body = dict(zip(("configure", "write", "read"), perms))
            assert api("PUT", f"/api/permissions/%2F/{name}", body)[0] in (201, 204)
    one = f"/api/exchanges/%2F/dv.auth/delayed/{pending}"
    for name, method, path in (("dv-none", "GET", "/api/exchanges/%2F/dv.auth/delayed"),
                               ("dv-noread", "GET", "/api/exchanges/%2F/dv.auth/delayed"),
                               ("dv-noread", "GET", one),
                               ("dv-readonly", "DELETE", one),
                               ("dv-readonly", "DELETE", "/api/exchanges/%2F/dv.auth/delayed")):
        status, body, _h = api(method, path, auth=(name, "pw"))
        assert status == 401, (name, method, path, status, body)
    assert api("GET", one, auth=("dv-readonly", "pw"))[0] == 200
    assert api("DELETE", one, auth=("dv-noread", "pw"))[0] == 204
    assert node.all_pending("dv.auth") == []
