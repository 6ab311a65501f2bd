"""The web UI's settings: ``management.login_session_timeout`` (RabbitMQ's key, in minutes) reaches the
HTTP app's session table as seconds and ends a session idle that long (a fake clock: no sleeping), and
``leveret.traffic_dir`` names the pipeline's output directory."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.config import ConfigError, Settings, load_settings
from broker.management.app import make_app
from broker.management.sessions import DEFAULT_TIMEOUT_S, SessionTable


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_login_session_timeout_is_rabbitmqs_key_in_minutes(tmp_path: Path) -> None:
    assert Settings().login_session_timeout * 60 == DEFAULT_TIMEOUT_S == 8 * 3600  # RabbitMQ's default
    conf = tmp_path / "leveret.conf"
    conf.write_text("management.login_session_timeout = 15\n")  # a rabbitmq.conf line, taken as is
    assert load_settings(conf, environ={}).login_session_timeout == 15
    env = {"LEVERET_MANAGEMENT_LOGIN_SESSION_TIMEOUT": "20"}
    assert load_settings(None, environ=env).login_session_timeout == 20
    for bad in ("0", "-3", "soon"):
        with pytest.raises(ConfigError, match="'management.login_session_timeout'"):
            load_settings(None, overrides=[("management.login_session_timeout", bad)], environ={})


def test_the_http_app_uses_the_configured_timeout() -> None:
    app = make_app(SimpleNamespace(settings=Settings(login_session_timeout=15)))  # type: ignore[arg-type]
    table = app["sessions"]
    assert isinstance(table, SessionTable) and table.timeout_s == 15 * 60


def test_a_session_idle_past_the_configured_minutes_ends() -> None:
    clock = Clock()
    settings = load_settings(None, overrides=[("management.login_session_timeout", "15")], environ={})
    table = SessionTable(settings.login_session_timeout * 60, clock=clock)
    busy, _ = table.create("alice", "h")
    idle, _ = table.create("bob", "h")
    for _ in range(4):  # an hour of use, every 14 minutes: the idle timeout slides each time
        clock.now += 14 * 60
        assert table.get(busy) is not None
    assert table.get(idle) is None
    clock.now += 15 * 60 + 1
    assert table.get(busy) is None


def test_traffic_dir_setting_is_a_path(tmp_path: Path) -> None:
    assert load_settings(None, overrides=[("leveret.traffic_dir", str(tmp_path))],
                         environ={}).traffic_dir == tmp_path
    assert load_settings(None, environ={}).traffic_dir is None
    with pytest.raises(ConfigError, match="'leveret.traffic_dir'"):
        load_settings(None, overrides=[("leveret.traffic_dir", " ")], environ={})
