"""``cluster.postgres.dsn``, the key that makes a node a cluster member (issue 15; README "A cluster on
PostgreSQL"), from each place the configuration comes from: a rabbitmq.conf-format file (named on the command
line or by ``LEVERET_CONFIG_FILE``), the environment (``LEVERET_CLUSTER_POSTGRES_DSN``: broker/config.py
``env_name``) and ``--set``, in the precedence broker/config.py's docstring states (file < environment <
command line). It ends up in ``Settings.cluster_dsn``, which broker/server.py hands to the cluster.

A DSN is a URL that may hold ``=`` (query parameters), ``#`` and ``@`` (in a password): each must reach the
setting whole, from every source. test_config.py covers the general precedence with other keys; nothing there
covers this one's sources."""

from __future__ import annotations

import argparse

import pytest

from broker.cli import build_settings
from broker.config import CONFIG_FILE_ENV, ConfigError, Settings, env_name, load_settings

FILE_DSN = "postgresql://leveret:p#ss=w@rd@db-file.example:5433/leveret?sslmode=disable&application_name=a"
ENV_DSN = "postgresql://leveret@db-env.example/leveret?sslmode=require"
CLI_DSN = "postgres://leveret:x@db-cli.example/cluster?target_session_attrs=read-write"
ENV = env_name("cluster.postgres.dsn")


def conf(tmp_path, text: str):
    p = tmp_path / "rabbitmq.conf"
    p.write_text(text)
    return p


def serve_args(config=None, *sets: str) -> argparse.Namespace:
    """What ``leveret serve [--config FILE] [--set KEY=VALUE ...]`` parses to (broker/cli.py)."""
    return argparse.Namespace(config=None if config is None else str(config), set=list(sets), bind=None)


def test_the_environment_name_is_leveret_cluster_postgres_dsn():
    assert ENV == "LEVERET_CLUSTER_POSTGRES_DSN"


def test_no_dsn_is_a_single_node():
    assert Settings().cluster_dsn is None
    assert load_settings(None, environ={}).cluster_dsn is None


def test_from_a_rabbitmq_conf_file_whole(tmp_path):
    """Among other keys and comments, as an operator's file has it; the value keeps its '#', '=' and '@'."""
    p = conf(tmp_path, f"""# the cluster's database
listeners.tcp.default = 5673
cluster.postgres.dsn = {FILE_DSN}
cluster.postgres.lease_seconds = 5
leveret.nodename = a@host
""")
    s = load_settings(p, environ={})
    assert s.cluster_dsn == FILE_DSN
    assert (s.cluster_lease_seconds, s.node_name, s.port) == (5, "a@host", 5673)
    # And named by LEVERET_CONFIG_FILE rather than on the command line.
    assert load_settings(None, environ={CONFIG_FILE_ENV: str(p)}).cluster_dsn == FILE_DSN


def test_from_the_environment(tmp_path):
    assert load_settings(None, environ={ENV: ENV_DSN}).cluster_dsn == ENV_DSN


def test_precedence_file_then_environment_then_command_line(tmp_path):
    p = conf(tmp_path, f"cluster.postgres.dsn = {FILE_DSN}\n")
    assert load_settings(p, environ={}).cluster_dsn == FILE_DSN
    assert load_settings(p, environ={ENV: ENV_DSN}).cluster_dsn == ENV_DSN
    assert load_settings(p, overrides=[("cluster.postgres.dsn", CLI_DSN)], environ={ENV: ENV_DSN}).cluster_dsn \
        == CLI_DSN
    assert load_settings(None, overrides=[("cluster.postgres.dsn", CLI_DSN)], environ={}).cluster_dsn == CLI_DSN


def test_through_leveret_serve_set_and_the_process_environment(tmp_path, monkeypatch):
    """The path ``leveret serve`` takes (broker/cli.py ``build_settings``, reading ``os.environ``): ``--set``
    splits at the first '=', so a DSN's query survives, and wins over the environment and the file."""
    p = conf(tmp_path, f"cluster.postgres.dsn = {FILE_DSN}\n")
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    assert build_settings(serve_args(p)).cluster_dsn == FILE_DSN
    monkeypatch.setenv(ENV, ENV_DSN)
    assert build_settings(serve_args(p)).cluster_dsn == ENV_DSN
    assert build_settings(serve_args(p, f"cluster.postgres.dsn={CLI_DSN}")).cluster_dsn == CLI_DSN
    monkeypatch.setenv(CONFIG_FILE_ENV, str(p))
    monkeypatch.delenv(ENV)
    assert build_settings(serve_args()).cluster_dsn == FILE_DSN


def test_a_value_that_is_not_a_postgresql_url_is_refused_with_its_source(tmp_path):
    p = conf(tmp_path, "cluster.postgres.dsn = mysql://db/leveret\n")
    with pytest.raises(ConfigError, match=r"rabbitmq\.conf:1.*cluster\.postgres\.dsn.*postgresql://"):
        load_settings(p, environ={})
    with pytest.raises(ConfigError, match=f"environment variable {ENV}.*postgresql://"):
        load_settings(None, environ={ENV: "host=db dbname=leveret"})
    with pytest.raises(ConfigError, match="command line.*postgresql://"):
        load_settings(None, overrides=[("cluster.postgres.dsn", "db.example")], environ={})
    # A bad file value is reported even when the environment would have overridden it: every problem is found.
    with pytest.raises(ConfigError, match=r"rabbitmq\.conf:1"):
        load_settings(p, environ={ENV: ENV_DSN})
