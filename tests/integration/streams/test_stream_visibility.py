"""Streams and their consumer groups, visible (issue 12): the HTTP API's queue object of a stream (RabbitMQ's
fields, and Leveret's offsets, segments and groups), ``/api/stream-groups``, the per-object Prometheus series
and ``leveret ctl list_stream_groups``. The Spark source (issue 13) reads a stream's ``next_offset`` and its
groups' committed offsets from here.

All Leveret only: the figures come from a Leveret process of its own with its HTTP API and exporter on
(RabbitMQ's management API has no consumer groups, and the reference node runs without its plugin).

The state under test, built once: stream ``vis.s`` (small segments) holds 10 messages; group ``g`` has one
member (prefetch 4) that acked offsets 0 and 1 and holds 2..5; group ``done`` read all 10, acked them and
left; a classic queue ``vis.c`` stands beside them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pika
import pytest
from amqp_helpers import pump, settle
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytest_plugins = ["amqp_helpers"]
pytestmark = [pytest.mark.timeout(90), pytest.mark.leveret_only]

STREAM = "vis.s"
COUNT = 10


class State:
    def __init__(self, api: Http, pport: int, mport: int, amqp_port: int) -> None:
        self.api = api
        self.amqp_port = amqp_port
        self.pport = pport
        self.mport = mport

    def get(self, path: str):
        status, body, _h = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body

    def scrape(self, path: str) -> dict[tuple[str, tuple], float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.pport}{path}", timeout=5).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def help_of(self, path: str, name: str) -> str:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.pport}{path}", timeout=5).read().decode()
        return next(f.documentation for f in text_string_to_metric_families(text) if f.name == name)

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "broker", "ctl", "--url", f"http://127.0.0.1:{self.mport}",
                              *args], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return out


@pytest.fixture(scope="module")
def state():
    tmp = Path(tempfile.mkdtemp(prefix="leveret-streamvis-"))
    b, mport, pport = start_mgmt_broker(tmp)
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream",
                                                          "x-stream-max-segment-size-bytes": 400})
        ch.queue_declare("vis.c")
        ch.confirm_delivery()
        for i in range(COUNT):
            ch.basic_publish("", STREAM, b"%03d" % i + b"x" * 100)
        ch.basic_publish("", "vis.c", b"classic")

        # Group "done": reads everything, acks it, leaves.
        done_ch = conn.channel()
        done_ch.basic_qos(prefetch_count=COUNT)
        done_got: list[int] = []

        def on_done(c, method, props, body):
            done_got.append(props.headers["x-stream-offset"])
            c.basic_ack(method.delivery_tag)

        tag = done_ch.basic_consume(STREAM, on_done, arguments={"x-stream-group": "done",
                                                                  "x-stream-offset": "first"})
        assert pump(conn, lambda: len(done_got) == COUNT, timeout=20)
        done_ch.basic_cancel(tag)

        # Group "g": one member with prefetch 4 acks offsets 0 and 1, then holds what comes (2..5).
        g_ch = conn.channel()
        g_ch.basic_qos(prefetch_count=4)
        held: list[tuple[int, int]] = []

        def on_g(c, method, props, body):
            held.append((props.headers["x-stream-offset"], method.delivery_tag))

        g_ch.basic_consume(STREAM, on_g, arguments={"x-stream-group": "g", "x-stream-offset": "first"})
        assert pump(conn, lambda: len(held) == 4, timeout=20)
        for offset, delivery_tag in held:
            if offset < 2:
                g_ch.basic_ack(delivery_tag)
        assert pump(conn, lambda: len(held) == 6, timeout=20)
        settle(conn, 0.3)
        assert sorted(o for o, _t in held) == list(range(6))
        yield State(Http(mport), pport, mport, b.port)
    finally:
        conn.close()
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_queue_object_of_a_stream(state):
    q = state.get("/api/queues/%2F/vis.s")
    assert q["type"] == "stream"
    # RabbitMQ 3.10's figures for a stream: every retained message counts as ready (rabbitmqctl list_queues).
    assert (q["messages"], q["messages_ready"], q["messages_unacknowledged"]) == (COUNT, COUNT, 0)
    assert q["consumers"] == 1 and q["readers"] == 1
    assert q["leader"] == q["node"] and q["members"] == [q["node"]] and q["online"] == [q["node"]]
    assert (q["first_offset"], q["offset"], q["last_offset"], q["next_offset"]) == (0, COUNT - 1, COUNT - 1, COUNT)
    assert q["committed_offset"] == COUNT - 1
    assert q["segments"] > 1, "400-byte segments: 10 messages of 100+ bytes span several"
    assert q["stream_bytes"] >= COUNT * 103
    groups = {g["name"]: g for g in q["consumer_groups"]}
    assert set(groups) == {"done", "g"}
    assert groups["g"] == {"vhost": "/", "stream": STREAM, "name": "g", "committed_offset": 2, "cursor": 6,
                           "outstanding": 4, "lag": COUNT - 2, "consumers": 1, "next_offset": COUNT}
    assert groups["done"] == {"vhost": "/", "stream": STREAM, "name": "done", "committed_offset": COUNT,
                              "cursor": COUNT, "outstanding": 0, "lag": 0, "consumers": 0, "next_offset": COUNT}


def test_queue_list_shows_types_and_classic_queues_stay_plain(state):
    rows = {r["name"]: r for r in state.get("/api/queues/%2F")}
    assert rows["vis.s"]["type"] == "stream" and rows["vis.s"]["next_offset"] == COUNT
    assert rows["vis.c"]["type"] == "classic"
    assert "next_offset" not in rows["vis.c"] and "consumer_groups" not in rows["vis.c"]
    # The list endpoint's columns option reaches the stream's fields (what a light poller asks for).
    trimmed = state.get("/api/queues/%2F?columns=name,first_offset,next_offset&name=vis.s")
    assert trimmed == [{"name": "vis.s", "first_offset": 0, "next_offset": COUNT}]


def test_stream_groups_endpoint(state):
    everywhere = state.get("/api/stream-groups")
    in_vhost = state.get("/api/stream-groups/%2F")
    of_stream = state.get(f"/api/stream-groups/%2F/{STREAM}")
    assert everywhere == in_vhost == of_stream
    assert [(g["stream"], g["name"]) for g in of_stream] == [(STREAM, "done"), (STREAM, "g")]
    g = of_stream[1]
    assert (g["committed_offset"], g["cursor"], g["outstanding"], g["lag"], g["consumers"]) == (2, 6, 4, 8, 1)
    assert state.api("GET", "/api/stream-groups/%2F/vis.c")[0] == 404, "a classic queue has no groups"
    assert state.api("GET", "/api/stream-groups/%2F/missing")[0] == 404
    assert state.api("GET", "/api/stream-groups/nope")[0] == 404


def test_per_object_metrics(state):
    m = state.scrape("/metrics/per-object")
    q = state.get("/api/queues/%2F/vis.s")
    labels = (("queue", STREAM), ("vhost", "/"))
    assert m[("leveret_stream_first_offset", labels)] == 0
    assert m[("leveret_stream_next_offset", labels)] == COUNT
    assert m[("leveret_stream_segments", labels)] == q["segments"]
    assert m[("leveret_stream_bytes", labels)] == q["stream_bytes"]
    g = (("group", "g"), ("queue", STREAM), ("vhost", "/"))
    done = (("group", "done"), ("queue", STREAM), ("vhost", "/"))
    assert m[("leveret_stream_group_committed_offset", g)] == 2
    assert m[("leveret_stream_group_lag", g)] == COUNT - 2
    assert m[("leveret_stream_group_committed_offset", done)] == COUNT
    assert m[("leveret_stream_group_lag", done)] == 0
    assert not any(name.startswith("leveret_stream") and dict(lv).get("queue") == "vis.c" for name, lv in m)
    assert "consumer group" in state.help_of("/metrics/per-object", "leveret_stream_group_lag")
    assert "segment" in state.help_of("/metrics/per-object", "leveret_stream_segments").lower()


def test_aggregated_metrics_sum_what_adds_up(state):
    m = state.scrape("/metrics")
    q = state.get("/api/queues/%2F/vis.s")
    assert m[("leveret_stream_segments", ())] == q["segments"]
    assert m[("leveret_stream_bytes", ())] == q["stream_bytes"]
    assert not any(name.startswith("leveret_stream_group") or name == "leveret_stream_next_offset"
                   for name, _lv in m)


def test_ctl_list_stream_groups(state):
    out = state.ctl("list_stream_groups").stdout.splitlines()
    assert out[0] == "Listing stream consumer groups for vhost / ..."
    assert out[1].split() == ["stream", "group", "committed_offset", "cursor", "lag", "members"]
    assert [line.split() for line in out[2:]] == [[STREAM, "done", "10", "10", "0", "0"],
                                                  [STREAM, "g", "2", "6", "8", "1"]]
    # RabbitMQ's verb name, other columns and aliases, JSON.
    data = json.loads(state.ctl("-p", "/", "--formatter", "json", "list_stream_consumer_groups", "reference",
                                "committed", "outstanding", "consumers", "next_offset").stdout)
    assert data == [{"reference": "done", "committed": 10, "outstanding": 0, "consumers": 0, "next_offset": 10},
                    {"reference": "g", "committed": 2, "outstanding": 4, "consumers": 1, "next_offset": 10}]


def test_ctl_list_queues_type_and_offsets(state):
    data = json.loads(state.ctl("--formatter", "json", "list_queues", "name", "type", "messages", "first_offset",
                                "next_offset", "segments").stdout)
    rows = {r["name"]: r for r in data}
    assert rows["vis.s"]["type"] == "stream" and rows["vis.s"]["messages"] == COUNT
    assert (rows["vis.s"]["first_offset"], rows["vis.s"]["next_offset"]) == (0, COUNT)
    assert rows["vis.s"]["segments"] > 1
    assert rows["vis.c"]["type"] == "classic" and rows["vis.c"]["next_offset"] is None


def test_an_outside_reader_commits_its_progress_as_a_group(state):
    """``PUT /api/stream-groups/{vhost}/{stream}/{group}`` (the Spark source's commit): creates the group at
    the offset, moves it forward only, refuses a group with consumers (409) and a bad body (400)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", state.amqp_port))
    try:
        ch = conn.channel()
        ch.queue_declare("vis.spark", durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(COUNT):
            ch.basic_publish("", "vis.spark", b"%d" % i)
    finally:
        conn.close()
    path = "/api/stream-groups/%2F/vis.spark/spark-query"
    assert state.api("GET", path)[0] == 404, "no such group yet"
    assert state.api("PUT", path, {"committed_offset": 7})[0] == 204
    g = state.get(path)
    assert (g["committed_offset"], g["cursor"], g["lag"], g["consumers"]) == (7, 7, COUNT - 7, 0)
    assert state.api("PUT", path, {"committed_offset": 4})[0] == 204
    assert state.get(path)["committed_offset"] == 7, "a group never moves back"
    assert state.api("PUT", path, {"committed_offset": 99})[0] == 204
    assert state.get(path)["committed_offset"] == COUNT, "clamped to the stream's next offset"
    assert state.api("PUT", path, {"committed_offset": "x"})[0] == 400
    assert state.api("PUT", path, {})[0] == 400
    assert state.api("PUT", f"/api/stream-groups/%2F/{STREAM}/g", {"committed_offset": 9})[0] == 409, \
        "group g has a consumer: its acks own its progress"
    assert state.get(f"/api/stream-groups/%2F/{STREAM}/g")["committed_offset"] == 2
    assert state.api("PUT", "/api/stream-groups/%2F/vis.c/x", {"committed_offset": 1})[0] == 404
