"""Fixtures of the federation lane: the shovel lane's real RabbitMQ node (tests/integration/shovel/conftest.py's
``rabbit``, imported, not copied) and helpers to start Leveret nodes with names of their own, define upstreams
and policies, and read the link status."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pika

from tests.conftest import ROOT
from tests.integration.shovel.conftest import api, rabbit, wait_for

__all__ = ["api", "ctl", "federate", "leveret_node", "link_of", "rabbit", "received", "wait_for"]


def leveret_node(start_broker, name: str):
    """A Leveret of the test's own named ``name`` (two on one host would both be leveret@host otherwise, and
    the loop rule tells nodes apart by name)."""
    return start_broker("--set", f"leveret.nodename={name}")


def federate(broker, upstream: str, uri: str, pattern: str, vhost: str = "%2F", **keys) -> None:
    """The upstream parameter and a policy federating exchanges matching ``pattern`` from every upstream."""
    status, body = api(broker, "PUT", f"/api/parameters/federation-upstream/{vhost}/{upstream}",
                       {"value": {"uri": uri, **keys}})
    assert status in (201, 204), body
    status, body = api(broker, "PUT", f"/api/policies/{vhost}/fed-{upstream}",
                       {"pattern": pattern, "apply-to": "exchanges",
                        "definition": {"federation-upstream-set": "all"}})
    assert status in (201, 204), body


def link_of(broker, exchange: str, status: str | None = "running", timeout: float = 60) -> dict:
    def find():
        _, links = api(broker, "GET", "/api/federation-links")
        assert isinstance(links, list)
        return next((li for li in links if li["exchange"] == exchange and
                     (status is None or li["status"] == status)), None)
    return wait_for(find, timeout, f"federation link of {exchange} {status}")


def received(p: pika.ConnectionParameters, queue: str, quiet: float = 1.0, timeout: float = 30,
             at_least: int = 0) -> list[tuple[pika.BasicProperties, bytes]]:
    """Every message of ``queue`` (consumed and acked): at least ``at_least`` within ``timeout``, then until the
    queue stays quiet for ``quiet`` seconds."""
    out: list[tuple[pika.BasicProperties, bytes]] = []
    deadline = time.monotonic() + timeout
    with pika.BlockingConnection(p) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        for method, props, body in ch.consume(queue, inactivity_timeout=quiet):
            if method is None:
                if len(out) >= at_least or time.monotonic() > deadline:
                    break
                continue
            out.append((props, body))
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
    return out


def ctl(broker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "ctl", "--url",
                           f"http://127.0.0.1:{broker.management_port}", *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


def federation_status(broker) -> list[dict]:
    out = ctl(broker, "federation_status", "--formatter", "json")
    assert out.returncode == 0, (out.stdout, out.stderr)
    return json.loads(out.stdout)
