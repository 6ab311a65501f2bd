"""A test host of our own: a network namespace joined to this one by a veth pair, so that a client can
reach the broker from a non-loopback address (as users do) while no traffic leaves the machine.

``network_namespace()`` yields a :class:`TestHost`: the broker listens on ``host_address`` (or on all
addresses), and commands run inside the namespace with :meth:`TestHost.run` see it as another host.
It needs root and iproute2; ``pytest.skip`` says so where they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count

import pytest
from leftovers import record_namespace
from worker_resources import subnet_octet

_serial = count(1)


@dataclass
class TestHost:
    name: str
    host_address: str  # this side of the veth pair: where the broker is reached from the namespace
    address: str  # the namespace's side: the client's address as the broker sees it

    __test__ = False  # not a test class

    def run(self, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run Python ``code`` inside the namespace with this interpreter (and its packages)."""
        return subprocess.run(["ip", "netns", "exec", self.name, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=timeout, check=False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def network_namespace() -> Iterator[TestHost]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2 (ip)")
    n = next(_serial)
    tag = f"{os.getpid() % 10000}{n}"
    name, host_if, ns_if = f"lvt{tag}", f"lvh{tag}", f"lvn{tag}"
    octet = subnet_octet(n)
    host_addr, ns_addr = f"10.231.{octet}.1", f"10.231.{octet}.2"
    try:
        _ip("netns", "add", name)
        record_namespace(name)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create a network namespace here: {e.stderr.strip()}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", name, "addr", "add", f"{ns_addr}/30", "dev", ns_if)
        _ip("-n", name, "link", "set", ns_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield TestHost(name, host_addr, ns_addr)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
