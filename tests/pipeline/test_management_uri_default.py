"""Issue 32, defect 4: the worked example needed ``--management-uri`` whenever the broker's HTTP API was not on
15672, and nothing said so. ``leveret-pipeline traffic`` now derives it as ``leveret ctl`` does: the AMQP URI's
host, on the HTTP API port (and scheme) of the broker's own configuration (LEVERET_* variables,
LEVERET_CONFIG_FILE) in the environment it runs in; the connector's default (15672) when nothing is set."""

from __future__ import annotations

from pathlib import Path

from leveret_pipeline.cli import default_management_uri

URI = "amqp://guest:guest@broker.example:5673/%2F"


def test_the_http_port_comes_from_the_brokers_environment() -> None:
    assert default_management_uri(URI, {"LEVERET_MANAGEMENT_TCP_PORT": "15673"}) == "http://broker.example:15673"


def test_the_http_port_comes_from_the_brokers_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "leveret.conf"
    conf.write_text("management.ssl.port = 15699\nmanagement.ssl.certfile = /etc/leveret/cert.pem\n")
    assert default_management_uri(URI, {"LEVERET_CONFIG_FILE": str(conf)}) == "https://broker.example:15699"


def test_nothing_configured_is_the_default_port() -> None:
    assert default_management_uri(URI, {}) == "http://broker.example:15672"
    assert default_management_uri("amqp://[::1]:5672/%2F", {"LEVERET_MANAGEMENT_TCP_PORT": "1"}) == "http://[::1]:1"
