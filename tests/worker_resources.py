"""What each pytest-xdist worker may use without meeting another worker's: ports, subnets, names.

The suite runs in parallel (``pytest -n N``; README "Run the tests"). Every worker starts its own brokers,
PostgreSQL servers, network namespaces and Spark session, so what they take from the machine must not
collide. A port the kernel reports free (``bind(("127.0.0.1", 0))``) is free only until somebody binds it:
with several workers each starting brokers, one worker's port could be handed to another worker's broker in
the second before the first broker binds it. So each worker takes ports from a block of its own, below the
kernel's ephemeral range (32768-60999 by default, where clients' own ports come from), and checks each is
bindable before it hands it out.

Outside xdist (``PYTEST_XDIST_WORKER`` unset: a plain ``pytest`` of one file) the process takes the block
after the workers'. Two plain runs at once would share that block; each starts at a random place in it
and still checks that a port is bindable, so they rarely meet.
"""

from __future__ import annotations

import os
import random
import socket

PORT_BASE = 10_000
PORT_LIMIT = 32_000  # below the ephemeral range
MAX_WORKERS = 8
_BLOCK = (PORT_LIMIT - PORT_BASE) // (MAX_WORKERS + 1)


def worker_index() -> int:
    """0..MAX_WORKERS-1 for xdist's workers gw0..; MAX_WORKERS for a run without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]) % MAX_WORKERS
    return MAX_WORKERS


def worker_tag() -> str:
    """A short name part unique to this worker (``gw3``), or ``main`` outside xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "") or "main"


_first = PORT_BASE + worker_index() * _BLOCK
_next = _first + random.randrange(_BLOCK)
_given: set[int] = set()


def free_port() -> int:
    """A port of this worker's block, bindable now and not handed out before in this process (unless the
    whole block went round: by then the ports of long-finished tests are free again)."""
    global _next
    for _ in range(_BLOCK * 2):
        port = _next
        _next = _first + (_next - _first + 1) % _BLOCK
        if port in _given:
            if len(_given) >= _BLOCK - 16:
                _given.clear()
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {_first}..{_first + _BLOCK}")


def subnet_octet(n: int) -> int:
    """The third octet of a test host's 10.231.X.0/30 (tests/netns.py): 27 of them per worker, the n-th
    namespace of this process taking the next."""
    per = 250 // (MAX_WORKERS + 1)
    return worker_index() * per + (os.getpid() + n) % per + 1
