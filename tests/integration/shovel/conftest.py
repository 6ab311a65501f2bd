"""Fixtures of the shovel lane: a real RabbitMQ node (rabbit_node.py) shared by the module's tests, and
helpers to publish and drain numbered messages with pika."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator

import pytest

from tests.conftest import BrokerProcess
from tests.integration.shovel.rabbit_node import RabbitNode
from tests.worker_resources import free_port


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitNode]:
    """RabbitMQ 3.10.8 with its management API (no shovel plugin: Leveret runs the shovels)."""
    node = RabbitNode(plugins=["rabbitmq_management"])
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


@pytest.fixture(scope="module")
def leveret(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One Leveret for the module's tests that only talk to its HTTP API (the validation answers): 13 broker
    starts less, each of them seconds on a loaded 2-core machine. Tests that kill or restart a Leveret, or
    need its queues to themselves, take ``start_broker``."""
    tmp = tmp_path_factory.mktemp("shovel-leveret")
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.stop(signal.SIGKILL)


def api(broker, method: str, path: str, body: object | None = None) -> tuple[int, object]:
    """One HTTP API request to a Leveret we started (guest)."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.management_port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode(),
                                          "content-type": "application/json"})
    deadline = time.monotonic() + 15  # the HTTP listener comes up just after the AMQP one
    while True:
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read()
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as exc:
            text = exc.read()
            return exc.code, json.loads(text) if text else None
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout}s")
