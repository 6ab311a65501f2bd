"""What an operator reads in the log (issue 16, "Logs"), as RabbitMQ logs it: a start-up banner once the
listeners are bound, the client's ``connection_name`` on the connection lines, channel errors at warning
level with their reply code and text. The broker's log is JSON lines here (the fixtures' LEVERET_LOG_FORMAT)."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest
import structlog

from broker.observability.logs import BANNER_EVENT, configure_logging, log_banner

pytestmark = pytest.mark.leveret_only


def _records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _wait_for(b, found: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], what: str,
              timeout: float = 15.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        hits = found(_records(b.log_text()))
        if hits or time.monotonic() > deadline:
            assert hits, f"no {what} in the log:\n{b.log_text()[-3000:]}"
            return hits
        time.sleep(0.05)


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_banner_connection_name_and_channel_errors(start_broker, tmp_path):
    conf = tmp_path / "leveret.conf"
    conf.write_text("vm_memory_high_watermark.relative = 0.3\ndisk_free_limit.absolute = 60MB\n")
    b = start_broker("--config", str(conf))

    # -- the banner: one event, after every listener is bound --------------------------------------------
    [banner] = _wait_for(b, lambda rs: [r for r in rs if r.get("event") == BANNER_EVENT], "start-up banner")
    assert banner["level"] == "info"
    assert banner["version"].startswith("Leveret ")
    assert platform.python_version() in banner["python"] and "uvloop" in banner["python"]
    assert banner["config_files"] == [str(conf)]
    assert banner["data_dir"] == str(b.data_dir.resolve())
    assert banner["log_files"] == ["<stderr>"]
    listeners = {(li["protocol"], li["address"]) for li in banner["listeners"]}
    assert ("amqp", f"127.0.0.1:{b.port}") in listeners
    assert ("http", f"127.0.0.1:{b.management_port}") in listeners
    assert ("http/prometheus", f"127.0.0.1:{b.prometheus_port}") in listeners
    memory = banner["memory_high_watermark"]
    assert memory["relative"] == 0.3 and memory["total_memory"] == _total_memory()
    assert memory["bytes"] == int(0.3 * _total_memory())
    assert banner["disk_free_limit"] == {"bytes": 60_000_000, "relative": None}
    records = _records(b.log_text())
    assert records.index(banner) > max(i for i, r in enumerate(records) if r.get("event") == "listening")

    # -- connection_name on the connection lines; a channel error is a warning ----------------------------
    conn = pika.BlockingConnection(b.pika_params(client_properties={"connection_name": "orders-worker-1"}))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("no-such-queue", passive=True)
    assert info.value.reply_code == 404
    conn.close()
    anonymous = pika.BlockingConnection(b.pika_params())
    anonymous.close()

    def named(event: str) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
        return lambda rs: [r for r in rs if r.get("event") == event and r.get("connection_name") == "orders-worker-1"]

    [opened] = _wait_for(b, named("connection opened"), "connection opened line with the connection_name")
    [closed] = _wait_for(b, named("connection closed"), "connection closed line with the connection_name")
    assert opened["level"] == closed["level"] == "info"
    assert opened["connection"] == closed["connection"] and "->" in opened["connection"]
    [error] = _wait_for(b, named("channel error"), "channel error line")
    assert error["level"] == "warning"
    assert error["reply_code"] == 404
    assert error["reply_text"] == "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"
    assert error["channel"] == 1 and error["connection"] == opened["connection"]
    # A client that gives no name: no connection_name key at all.
    others = _wait_for(b, lambda rs: [r for r in rs if r.get("event") == "connection closed"
                                      and r.get("connection") != opened["connection"]], "second connection")
    assert all("connection_name" not in r for r in others)


def test_console_banner_is_one_block(capsys):
    configure_logging("info", "console")
    try:
        log_banner(structlog.get_logger("leveret.server"), version="Leveret 0.1.0", python="CPython 3.11.7",
                   config_files=[], data_dir="/var/lib/leveret", log_files=["<stderr>"],
                   listeners=[{"protocol": "amqp", "address": "127.0.0.1:5672"},
                              {"protocol": "amqp", "address": "[::1]:5672"}],
                   memory_high_watermark={"bytes": 3 * 1024**3, "relative": 0.4, "total_memory": 8 * 1024**3},
                   disk_free_limit={"bytes": 50_000_000, "relative": None})
    finally:
        structlog.reset_defaults()
    lines = capsys.readouterr().err.splitlines()
    assert BANNER_EVENT in lines[0] and "listeners" not in lines[0]
    block = dict(line.strip().split(" : ", 1) for line in lines[1:])
    block = {k.strip(): v for k, v in block.items()}
    assert block == {
        "version": "Leveret 0.1.0", "Python": "CPython 3.11.7", "config file(s)": "none",
        "data dir": "/var/lib/leveret", "log(s)": "<stderr>", "listeners": "amqp 127.0.0.1:5672, amqp [::1]:5672",
        "memory high watermark": "3.0 GiB (3221225472 bytes), 0.4 of 8.0 GiB RAM",
        "disk free limit": "47.7 MiB (50000000 bytes)"}


def test_the_log_file_rotates_by_size_when_the_broker_writes_it(start_broker, tmp_path):
    """log.file.rotation.size / .count as `leveret serve` reads them: the real broker's file rotates."""
    log_file = tmp_path / "logs" / "leveret.log"
    b = start_broker("--set", f"log.file={log_file}", "--set", "log.file.rotation.size=4000",
                     "--set", "log.file.rotation.count=2")
    for i in range(40):  # each connection logs accepted / opened / closed lines
        conn = pika.BlockingConnection(b.pika_params(client_properties={"connection_name": f"rotation-{i}"}))
        conn.close()
    deadline = time.monotonic() + 10
    while not (log_file.parent / "leveret.log.2").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    names = sorted(p.name for p in log_file.parent.iterdir())
    assert names == ["leveret.log", "leveret.log.1", "leveret.log.2"], names  # count respected
    assert all(p.stat().st_size <= 4000 for p in log_file.parent.iterdir())
