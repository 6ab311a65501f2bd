"""Every definition is written to the one metadata store by the domain before it takes effect: a write the
disk refuses answers 500 (not 201) and changes nothing, so nothing is half-made and no vhost's durable
queues are orphaned; a restart sees the same node the clients last saw.

The data directory is a small tmpfs the test mounts (skipped, saying why, only where mounting is
impossible), filled up by another "process" (tests/integration/disk_full_helpers.py); the changes tried
on the full disk carry a value of 1 MiB, more than any page SQLite still holds in hand.
"""

from __future__ import annotations

import contextlib
import signal

import pika
import pytest
from disk_full_helpers import MountImpossible, Volume
from old_metadata import api

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(180)]

BIG = "x" * (1 << 20)


@pytest.fixture
def volume(tmp_path):
    v = Volume(tmp_path / "disk", "48m")
    try:
        v.mount()
    except MountImpossible as e:
        pytest.skip(str(e))
    yield v
    v.unmount()


@contextlib.contextmanager
def channel(b, vhost: str):
    params = b.pika_params()
    params.virtual_host = vhost
    conn = pika.BlockingConnection(params)
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            conn.close()


def message_count(b, vhost: str, queue: str) -> int:
    with channel(b, vhost) as ch:
        return ch.queue_declare(queue, passive=True).method.message_count


# (method, path, body) of changes that must fail on the full disk, and the path that must then be 404.
REFUSED = [
    ("PUT", "/api/users/big", {"password": "pw", "tags": BIG}, "/api/users/big"),
    ("PUT", "/api/vhosts/big", {"description": BIG}, "/api/vhosts/big"),
    ("PUT", "/api/global-parameters/big", {"value": BIG}, "/api/global-parameters/big"),
    ("PUT", "/api/policies/keep/big", {"pattern": "^q$", "definition": {"max-length": 1, "x-pad": BIG}},
     "/api/policies/keep/big"),
    ("PUT", "/api/topic-permissions/keep/guest", {"exchange": "amq.topic", "write": BIG, "read": ".*"},
     "/api/topic-permissions/keep/guest"),
]


def test_a_write_the_full_disk_refuses_is_a_500_that_changes_nothing(volume, start_broker):
    b = start_broker(data_dir=volume.path / "data")
    assert api(b, "PUT", "/api/vhosts/keep", {})[0] == 201
    assert api(b, "PUT", "/api/permissions/keep/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    with channel(b, "keep") as ch:  # a durable queue with messages: what a lost vhost would orphan
        ch.queue_declare("q", durable=True)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "q", b"m%d" % i, pika.BasicProperties(delivery_mode=2))

    volume.fill()
    for method, path, body, check in REFUSED:
        status, answer = api(b, method, path, body)
        assert status == 500, (path, status, answer)
        assert api(b, "GET", check)[0] == 404, path  # nothing changed in memory
    assert message_count(b, "keep", "q") == 5
    assert api(b, "GET", "/api/queues/keep/q")[1]["policy"] is None

    volume.unfill()
    assert api(b, "PUT", "/api/users/after", {"password": "pw", "tags": ""})[0] == 201  # space again: it works

    assert b.stop(signal.SIGTERM) == 0
    b.start()
    for _method, path, _body, check in REFUSED:
        assert api(b, "GET", check)[0] == 404, path
    assert api(b, "GET", "/api/users/after")[0] == 200
    assert message_count(b, "keep", "q") == 5  # the vhost and its durable queue are intact


def test_a_vhost_deletion_is_one_commit_and_survives_a_restart(start_broker):
    """The vhost, its queues, exchanges, bindings, permissions and policies go in one transaction; after
    a kill -9 none of it comes back, and the queue files are not left behind as orphans."""
    b = start_broker()
    assert api(b, "PUT", "/api/vhosts/gone", {})[0] == 201
    assert api(b, "PUT", "/api/permissions/gone/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert api(b, "PUT", "/api/policies/gone/p", {"pattern": ".*", "definition": {"max-length": 9}})[0] == 201
    with channel(b, "gone") as ch:
        ch.exchange_declare("x", "direct", durable=True)
        for i in range(20):
            ch.queue_declare(f"q{i}", durable=True)
            ch.queue_bind(f"q{i}", "x", f"k{i}")
        ch.basic_publish("", "q0", b"m", pika.BasicProperties(delivery_mode=2))
    assert api(b, "DELETE", "/api/vhosts/gone")[0] == 204
    b.kill9()
    b.start()
    assert api(b, "GET", "/api/vhosts/gone")[0] == 404
    assert api(b, "GET", "/api/policies/gone")[0] == 404
    assert all(p["vhost"] != "gone" for p in api(b, "GET", "/api/permissions")[1])
    assert api(b, "PUT", "/api/vhosts/gone", {})[0] == 201  # created anew: empty
    assert api(b, "GET", "/api/queues/gone")[1] == []
