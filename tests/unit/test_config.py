"""Configuration: rabbitmq.conf-format files, every kind of bad file, and precedence
(defaults < file < LEVERET_ environment < command line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import ConfigError, Settings, env_name, load_file, load_settings


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "leveret.conf"
    p.write_text(text)
    return p


def test_defaults_are_rabbitmqs():
    s = Settings()
    assert (s.port, s.heartbeat, s.frame_max, s.channel_max) == (5672, 60, 131072, 2047)
    assert (s.management_port, s.prometheus_port) == (15672, 15692)
    assert s.default_user == "guest" and s.loopback_users == {"guest"}


def test_good_file(tmp_path):
    p = write(tmp_path, """
# a comment
listeners.tcp.default = 0.0.0.0:5673
default_user = admin
default_pass = p#ss=word
default_user_tags.administrator = true
default_user_tags.monitoring = true
default_permissions.write = ^amq\\.
loopback_users = none
heartbeat = 30
frame_max = 65536
max_message_size = 64MiB
vm_memory_high_watermark.relative = 0.5
vm_memory_high_watermark.absolute = 2GB
disk_free_limit.absolute = 1GB
management.tcp.port = 15000
prometheus.tcp.port = 15001
log.console.level = debug
log.console.formatter = json
load_definitions = /etc/leveret/defs.json
leveret.data_dir = /var/lib/leveret
""")
    s = Settings()
    load_file(s, p)
    assert (s.bind, s.port) == ("0.0.0.0", 5673)
    assert s.default_pass == "p#ss=word"
    assert s.default_user_tags == ["administrator", "monitoring"]
    assert s.default_permissions["write"] == "^amq\\."
    assert s.loopback_users == set()
    assert (s.heartbeat, s.frame_max, s.max_message_size) == (30, 65536, 64 * 1024 * 1024)
    assert s.vm_memory_high_watermark_relative == 0.5 and s.vm_memory_high_watermark_absolute == 2 * 10**9
    assert (s.management_port, s.prometheus_port) == (15000, 15001)
    assert (s.log_level, s.log_format) == ("debug", "json")
    assert s.load_definitions == Path("/etc/leveret/defs.json") and s.data_dir == Path("/var/lib/leveret")


def test_shipped_config_file_loads():
    s = Settings()
    load_file(s, Path(__file__).resolve().parents[2] / "config" / "leveret.conf")
    assert s == Settings()  # it only shows the defaults


@pytest.mark.parametrize("text, fragments", [
    ("heartbeat = 10\nno_such_key = 1\n", [":2:", "unknown configuration key 'no_such_key'"]),
    ("hearbeat = 10\n", [":1:", "unknown configuration key 'hearbeat'", "did you mean 'heartbeat'"]),
    ("\nheartbeat = soon\n", [":2:", "'heartbeat'", "'soon'", "allowed: seconds 0-65535"]),
    ("frame_max = 100\n", [":1:", "'frame_max'", "at least 8192"]),
    ("max_message_size = 1TB\n", ["'max_message_size'", "512MiB"]),
    ("management.tcp.port = 70000\n", ["'management.tcp.port'", "out of range", "1-65535"]),
    ("listeners.tcp.default = localhost\n", ["'listeners.tcp.default'", "PORT or ADDRESS:PORT"]),
    ("vm_memory_high_watermark.relative = 2\n", ["between 0 and 1"]),
    ("log.console.level = loud\n", ["'log.console.level'", "debug, info, warning"]),
    ("loopback_users.guest = maybe\n", ["'loopback_users.guest'", "true or false"]),
    ("default_permissions.read = (\n", ["'default_permissions.read'", "regular expression"]),
    ("just some words\n", [":1:", "expected 'key = value'"]),
    ("= 5\n", [":1:", "expected 'key = value'"]),
])
def test_bad_files_name_the_key_line_and_what_is_allowed(tmp_path, text, fragments):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_file(Settings(), p)
    message = str(info.value)
    assert str(p) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration file .*missing.conf"):
        load_file(Settings(), tmp_path / "missing.conf")
    (tmp_path / "bin.conf").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_file(Settings(), tmp_path / "bin.conf")


def test_precedence_defaults_file_env_command_line(tmp_path):
    p = write(tmp_path, "heartbeat = 10\nchannel_max = 100\nframe_max = 65536\n")
    env = {"LEVERET_CHANNEL_MAX": "200", "LEVERET_FRAME_MAX": "32768"}
    s = load_settings(p, overrides=[("frame_max", "16384")], environ=env)
    assert s.heartbeat == 10          # file over default
    assert s.channel_max == 200       # environment over file
    assert s.frame_max == 16384       # command line over environment
    assert s.prometheus_port == 15692  # default


def test_env_names_and_config_file_from_env(tmp_path):
    assert env_name("vm_memory_high_watermark.relative") == "LEVERET_VM_MEMORY_HIGH_WATERMARK_RELATIVE"
    p = write(tmp_path, "management.tcp.port = 16000\n")
    s = load_settings(None, environ={"LEVERET_CONFIG_FILE": str(p), "LEVERET_PROMETHEUS_TCP_PORT": "16001",
                                     "LEVERET_LOG_FORMAT": "json"})
    assert (s.management_port, s.prometheus_port, s.log_format) == (16000, 16001, "json")
    with pytest.raises(ConfigError, match="environment variable LEVERET_HEARTBEAT: bad value 'x'"):
        load_settings(None, environ={"LEVERET_HEARTBEAT": "x"})
    with pytest.raises(ConfigError, match="command line: unknown configuration key 'nope'"):
        load_settings(None, overrides=[("nope", "1")], environ={})


def test_a_misspelled_environment_variable_is_reported_with_a_suggestion():
    s = load_settings(None, environ={"LEVERET_LISTENERS_TCP_DEFAUT": "5673", "LEVERET_MANAGEMENT_TCP_PORT": "1"})
    assert s.port == 5672  # the misspelled one did nothing
    assert s.startup_warnings == [("environment variable LEVERET_LISTENERS_TCP_DEFAUT is not a Leveret setting "
                                   "and is ignored (did you mean LEVERET_LISTENERS_TCP_DEFAULT?)")]


def test_other_tools_leveret_variables_are_not_reported():
    s = load_settings(None, environ={"LEVERET_CTL_URL": "http://x", "LEVERET_TEST_AMQP_URL": "amqp://",
                                     "LEVERET_CONFIG_FILE": "", "LEVERET_LOG_FORMAT": "json"})
    assert s.startup_warnings == []


def test_disk_free_limit_relative_is_applied_and_the_last_given_form_wins(tmp_path):
    from broker.resources.alarms import configured_disk_free_limit, total_memory

    assert configured_disk_free_limit(Settings()) == 50 * 1000 * 1000
    p = tmp_path / "l.conf"
    p.write_text("disk_free_limit.absolute = 1GB\ndisk_free_limit.relative = 1.5\n")
    s = load_settings(p, environ={})
    assert configured_disk_free_limit(s) == int(1.5 * total_memory())
    s = load_settings(p, overrides=[("disk_free_limit.absolute", "2GB")], environ={})
    assert s.disk_free_limit_relative is None and configured_disk_free_limit(s) == 2 * 10**9
    p.write_text("disk_free_limit.relative = 1.5\ndisk_free_limit.absolute = 1GB\n")
    assert configured_disk_free_limit(load_settings(p, environ={})) == 10**9


def test_cluster_lease_seconds(tmp_path):
    """cluster.postgres.lease_seconds (Leveret's own): 15 s by default, whole seconds 1-3600."""
    assert Settings().cluster_lease_seconds == 15
    s = Settings()
    load_file(s, write(tmp_path, "cluster.postgres.lease_seconds = 3\n"))
    assert s.cluster_lease_seconds == 3
    s = load_settings(None, environ={"LEVERET_CLUSTER_POSTGRES_LEASE_SECONDS": "5"})
    assert s.cluster_lease_seconds == 5
    for bad in ("0", "3601", "soon", "2.5"):
        with pytest.raises(ConfigError, match="'cluster.postgres.lease_seconds'.*seconds 1-3600"):
            load_file(Settings(), write(tmp_path, f"cluster.postgres.lease_seconds = {bad}\n"))
