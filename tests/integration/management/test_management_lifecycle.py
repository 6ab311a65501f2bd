"""Graceful shutdown and the node's metadata across restarts."""

from __future__ import annotations

import signal
import threading
import time

import pika
import pika.exceptions
import pytest

from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only


def test_sigterm_closes_clients_with_320_and_exits_0(tmp_path):
    # A 60 s shutdown timeout: a stop that waited for it (rather than for the clients' close-ok) is told from a
    # prompt one by a bound that leaves a loaded CI machine's slow exit room.
    b, _m, _p = start_mgmt_broker(tmp_path, "--set", "leveret.shutdown_timeout=60000")
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    ch.queue_declare("life.q")
    ch.confirm_delivery()
    ch.basic_publish("", "life.q", b"x")
    started = time.monotonic()
    threading.Timer(0.2, b.process.send_signal, (signal.SIGTERM,)).start()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.process_data_events(time_limit=15)
        conn.process_data_events(time_limit=15)
    assert info.value.reply_code == 320
    assert info.value.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    assert b.process.wait(40) == 0
    assert time.monotonic() - started < 30
    log = b.log_text()
    assert '"signal received, shutting down"' in log and '"stopped"' in log


def test_users_vhosts_permissions_policies_survive_a_restart(tmp_path):
    b, mport, _ = start_mgmt_broker(tmp_path)
    api = Http(mport)
    api("PUT", "/api/vhosts/kept", {"description": "stays"})
    api("PUT", "/api/users/keeper", {"password": "pw", "tags": "monitoring"})
    api("PUT", "/api/permissions/kept/keeper", {"configure": "a", "write": "b", "read": "c"})
    api("PUT", "/api/policies/kept/pol", {"pattern": "^q", "definition": {"max-length": 3}})
    api("DELETE", "/api/users/guest")
    assert b.stop() == 0
    b2, mport2, _ = start_mgmt_broker(tmp_path)
    try:
        api2 = Http(mport2)
        auth = ("keeper", "pw")
        assert api2("GET", "/api/whoami", auth=auth)[1]["tags"] == ["monitoring"]
        assert api2("GET", "/api/vhosts/kept", auth=auth)[1]["description"] == "stays"
        assert api2("GET", "/api/policies/kept/pol", auth=auth)[1]["definition"] == {"max-length": 3}
        assert api2("GET", "/api/whoami")[0] == 401  # guest was deleted and is not re-created
    finally:
        b2.stop()
