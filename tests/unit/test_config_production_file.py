"""An operator's existing rabbitmq.conf (tests/data/production-rabbitmq.conf, a RabbitMQ 3.13 production file):
every key Leveret cannot use is named in one message, with its line; ``leveret.unsupported_keys = warn`` turns the
RabbitMQ-feature ones into one warning, and the keys Leveret has take effect. A misspelled key (no RabbitMQ
version has it) and a bad value stop start-up either way."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.config import ConfigError, Settings, load_file, load_settings, rabbitmq_only_feature

PRODUCTION = Path(__file__).resolve().parents[1] / "data" / "production-rabbitmq.conf"

# line → key of every key in the file for a RabbitMQ feature Leveret does not have (its TLS listener's keys,
# lines 6 and 12-15, are Leveret's too: check_supported_keys_took_effect)
UNSUPPORTED = {
    7: "tcp_listen_options.backlog", 8: "tcp_listen_options.nodelay",
    40: "vm_memory_high_watermark_paging_ratio",
    45: "cluster_formation.peer_discovery_backend", 46: "cluster_formation.classic_config.nodes.1",
    47: "cluster_formation.classic_config.nodes.2", 48: "cluster_formation.classic_config.nodes.3",
    49: "cluster_partition_handling",
    65: "mqtt.listeners.tcp.default", 66: "mqtt.allow_anonymous", 67: "mqtt.vhost", 68: "mqtt.exchange",
}


def test_the_fixture_lines_are_where_the_test_says():
    lines = PRODUCTION.read_text().splitlines()
    for lineno, key in UNSUPPORTED.items():
        assert lines[lineno - 1].split("=", 1)[0].strip() == key


def test_every_unsupported_key_is_named_in_one_error_with_its_line():
    with pytest.raises(ConfigError) as info:
        load_settings(PRODUCTION, environ={})
    message = str(info.value)
    assert message.startswith(f"{len(UNSUPPORTED)} configuration problems:\n")
    for lineno, key in UNSUPPORTED.items():
        assert f"{PRODUCTION}:{lineno}: '{key}' is a RabbitMQ key for " in message, key
    named = re.findall(r":(\d+): '", message)
    assert sorted(map(int, named)) == sorted(UNSUPPORTED)  # nothing else, each once
    assert "unknown configuration key" not in message
    assert "clustering" in message and "TCP socket options" in message and "the MQTT plugin" in message
    assert "ssl" not in message
    assert "set leveret.unsupported_keys = warn" in message.splitlines()[-1]


def check_supported_keys_took_effect(s: Settings) -> None:
    assert (s.bind, s.port) == ("0.0.0.0", 5672)
    assert s.handshake_timeout == 15.0
    assert (s.default_vhost, s.default_user, s.default_pass) == ("orders", "orders-admin", "S3cr3t#2024=ok")
    assert s.default_user_tags == ["administrator"]
    assert s.default_permissions == {"configure": ".*", "write": ".*", "read": ".*"}
    assert s.loopback_users == set()  # loopback_users.guest = false
    assert (s.heartbeat, s.frame_max, s.channel_max) == (30, 131072, 128)
    assert s.max_message_size == 64 * 1024 * 1024
    assert s.consumer_timeout == 3_600_000
    assert s.vm_memory_high_watermark_relative == 0.6
    assert s.disk_free_limit_absolute == 2 * 10**9 and s.disk_free_limit_relative is None
    assert s.cluster_name == "orders-prod"
    assert s.log_file == Path("/var/log/rabbitmq/rabbit.log")  # log.file in log.dir
    assert (s.log_file_level, s.log_console, s.log_level) == ("info", False, "warning")
    assert (s.log_file_rotation_date, s.log_file_rotation_count) == ("$D0", 7)
    assert (s.management_port, s.management_bind, s.prometheus_port) == (15672, "0.0.0.0", 15692)
    assert s.collect_statistics_interval == 10_000
    # The TLS listener: port 5671 on the plain listener's address, verify_peer with the file's certificates
    # (files that do not exist here: reading them is start-up's, tests/integration/management/test_config_production_file_start.py)
    assert (s.ssl_bind, s.ssl_port) == (None, 5671)
    assert (s.ssl_cacertfile, s.ssl_certfile, s.ssl_keyfile) == (
        Path("/etc/rabbitmq/tls/ca_certificate.pem"), Path("/etc/rabbitmq/tls/server_certificate.pem"),
        Path("/etc/rabbitmq/tls/server_key.pem"))
    assert (s.ssl_verify, s.ssl_fail_if_no_peer_cert) == ("verify_peer", False)
    assert s.ssl_versions == {} and s.ssl_ciphers == {} and s.ssl_handshake_timeout == 5.0


@pytest.mark.parametrize("how", ["command line", "environment", "short environment", "file"])
def test_with_warn_the_file_is_used_as_is(tmp_path, how):
    path, overrides, env = PRODUCTION, [], {}
    if how == "command line":
        overrides = [("leveret.unsupported_keys", "warn")]
    elif how == "environment":
        env = {"LEVERET_LEVERET_UNSUPPORTED_KEYS": "warn"}
    elif how == "short environment":
        env = {"LEVERET_UNSUPPORTED_KEYS": "warn"}
    else:  # at the end of the file: it still covers the lines above it
        path = tmp_path / "rabbitmq.conf"
        path.write_text(PRODUCTION.read_text() + "leveret.unsupported_keys = warn\n")
    s = load_settings(path, overrides=overrides, environ=env)
    check_supported_keys_took_effect(s)
    assert s.unsupported_keys == "warn"
    [warning] = s.startup_warnings
    assert warning.startswith(f"ignoring {len(UNSUPPORTED)} configuration keys of RabbitMQ features Leveret "
                              f"does not have in {path} (leveret.unsupported_keys = warn): ")
    for lineno, key in UNSUPPORTED.items():
        assert f"{key} (line {lineno})" in warning


def test_a_misspelling_and_a_bad_value_are_reported_with_the_unsupported_keys(tmp_path):
    p = tmp_path / "rabbitmq.conf"
    p.write_text("heartbeat = 30\ncluster_formation.peer_discovery_backend = k8s\nhearbeat = 30\n"
                 "channel_max = lots\nmqtt.vhost = /\nnot a key value line\n")
    with pytest.raises(ConfigError) as info:
        load_settings(p, environ={})
    lines = str(info.value).splitlines()
    assert lines[0] == "5 configuration problems:"
    assert lines[1] == (f"  {p}:2: 'cluster_formation.peer_discovery_backend' is a RabbitMQ key for RabbitMQ's "
                        "Erlang clustering (Leveret nodes form a cluster through cluster.postgres.dsn instead), not "
                        "supported by Leveret")
    assert lines[2].startswith(f"  {p}:3: unknown configuration key 'hearbeat' (did you mean 'heartbeat'?)")
    assert lines[3].startswith(f"  {p}:4: bad value 'lots' for 'channel_max'")
    assert lines[4] == f"  {p}:5: 'mqtt.vhost' is a RabbitMQ key for the MQTT plugin, not supported by Leveret"
    assert lines[5] == f"  {p}:6: expected 'key = value', got 'not a key value line'"
    assert lines[6].startswith("2 of them are RabbitMQ features Leveret does not have: set leveret.unsupported_keys"
                               " = warn") and "unknown keys and bad values still stop start-up" in lines[6]
    # warn lets the RabbitMQ keys through, not the others
    with pytest.raises(ConfigError) as info:
        load_settings(p, overrides=[("leveret.unsupported_keys", "warn")], environ={})
    message = str(info.value)
    assert message.startswith("3 configuration problems:\n")
    assert "'hearbeat'" in message and "'channel_max'" in message and "not a key value line" in message
    assert "cluster_formation" not in message and "mqtt" not in message


def test_one_problem_is_one_line_as_before(tmp_path):
    p = tmp_path / "rabbitmq.conf"
    p.write_text("cluster_partition_handling = autoheal\n")
    with pytest.raises(ConfigError) as info:
        load_file(Settings(), p)
    assert str(info.value) == (f"{p}:1: 'cluster_partition_handling' is a RabbitMQ key for RabbitMQ's Erlang "
                               "clustering (Leveret nodes form a cluster through cluster.postgres.dsn instead), not "
                               "supported by Leveret (set leveret.unsupported_keys = warn to start with it ignored)")
    with pytest.raises(ConfigError, match=r"^command line: 'stomp.listeners.tcp.1' is a RabbitMQ key for the STOMP"):
        load_settings(None, overrides=[("stomp.listeners.tcp.1", "61613")], environ={})
    with pytest.raises(ConfigError, match="'leveret.unsupported_keys'.*error .stop start-up. or warn"):
        load_settings(None, overrides=[("leveret.unsupported_keys", "ignore")], environ={})


@pytest.mark.parametrize("line, supported", [
    ("default_queue_type = classic", True),
    ("default_queue_type = quorum", True),
    ("auth_backends.1 = internal", True),
    ("auth_backends.1 = rabbit_auth_backend_internal", True),
    ("auth_backends.1 = ldap", False),
    ("auth_mechanisms.1 = AMQPLAIN", True),
    ("auth_mechanisms.1 = EXTERNAL", True),
    ("auth_mechanisms.1 = ANONYMOUS", False),
    ("listeners.ssl = none", True),
    ("listeners.tcp = none", False),
    ("log.syslog = false", True),
    ("log.syslog = true", False),
    ("log.exchange = false", True),
    ("log.file.formatter = json", True),
    ("log.file.formatter = plaintext", False),
    ("proxy_protocol = false", True),
    ("proxy_protocol = true", False),
    ("anonymous_login_user = none", True),
    ("anonymous_login_user = guest", False),
    ("management.rates_mode = basic", True),
    ("management.rates_mode = detailed", False),
])
def test_keys_accepted_with_the_values_leveret_does_anyway(tmp_path, line, supported):
    p = tmp_path / "rabbitmq.conf"
    p.write_text(line + "\n")
    if supported:
        assert load_settings(p, environ={}).startup_warnings == []
        return
    key, value = (part.strip() for part in line.split("="))
    asks = f":1: '{re.escape(key)}( = {re.escape(value)})?' (asks for|is a RabbitMQ key for) .*not supported by Leveret"
    with pytest.raises(ConfigError, match=asks):
        load_settings(p, environ={})
    [warning] = load_settings(p, overrides=[("leveret.unsupported_keys", "warn")], environ={}).startup_warnings
    assert f"{key} (line 1)" in warning


def test_a_listener_under_any_name_and_a_second_listener(tmp_path):
    p = tmp_path / "rabbitmq.conf"
    p.write_text("listeners.tcp.1 = 10.0.0.5:5673\n")
    s = load_settings(p, environ={})
    assert (s.bind, s.port) == ("10.0.0.5", 5673)
    p.write_text("listeners.tcp.1 = 10.0.0.5:5673\nlisteners.tcp.2 = [::1]:5673\n")
    with pytest.raises(ConfigError, match=r":2: 'listeners.tcp.2' asks for a second AMQP listener"):
        load_settings(p, environ={})
    s = load_settings(p, overrides=[("leveret.unsupported_keys", "warn"), ("listeners.tcp.default", "5680")],
                      environ={})
    assert (s.bind, s.port) == ("10.0.0.5", 5680)  # the first one, and the command line over it


def test_log_dir(tmp_path):
    p = tmp_path / "rabbitmq.conf"
    p.write_text(f"log.dir = {tmp_path}/logs\n")
    assert load_settings(p, environ={}).log_file == tmp_path / "logs" / "leveret.log"
    p.write_text(f"log.file = node.log\nlog.dir = {tmp_path}/logs\n")
    assert load_settings(p, environ={}).log_file == tmp_path / "logs" / "node.log"
    p.write_text(f"log.dir = {tmp_path}/logs\nlog.file = /elsewhere/node.log\n")
    assert load_settings(p, environ={}).log_file == Path("/elsewhere/node.log")
    p.write_text(f"log.dir = {tmp_path}/logs\nlog.file = false\n")
    assert load_settings(p, environ={}).log_file is None
    assert load_settings(None, environ={}).log_file is None


def test_collect_statistics_interval_sets_the_http_apis_sampling():
    from broker.management.app import make_app

    app = make_app(SimpleNamespace(settings=Settings(collect_statistics_interval=2500)))  # type: ignore[arg-type]
    assert app["sampler"].interval == 2.5
    with pytest.raises(ConfigError, match="'collect_statistics_interval'.*at least 100"):
        load_settings(None, overrides=[("collect_statistics_interval", "5")], environ={})


@pytest.mark.parametrize("key", [
    "cluster_formation.k8s.host", "cluster_formation.node_cleanup.only_log_warning", "cluster_keepalive_interval",
    "queue_leader_locator", "web_stomp.tcp.port", "web_mqtt.tcp.port", "stream.listeners.tcp.1",
    "auth_ldap.servers.1", "auth_oauth2.resource_server_id", "management.path_prefix", "management.ssl.depth",
    "prometheus.return_per_object_metrics", "log.connection.level", "log.default.rotation.count",
    "quorum_queue.compute_checksums", "default_users.alice.password", "deprecated_features.permit.global_qos",
    "federation.queues.shutdown.timeout", "shovel.operating_mode", "tracing.dir", "ssl_options.depth",
    "ssl_options.honor_cipher_order", "ssl_cert_login_san_type", "prometheus.ssl.honor_cipher_order", "num_acceptors.ssl",
    "num_acceptors.tcp", "connection_max", "total_memory_available_override_value", "collect_statistics",
])
def test_documented_rabbitmq_keys_are_known_as_such(key):
    assert rabbitmq_only_feature(key) is not None


@pytest.mark.parametrize("key, hint", [
    ("log.file.levle", "log.file.level"), ("management.tcp.prot", "management.tcp.port"),
    ("heartbeats", "heartbeat"), ("vm_memory_high_watermark.relativ", "vm_memory_high_watermark.relative"),
])
def test_misspellings_are_unknown_not_rabbitmq_features(key, hint):
    assert rabbitmq_only_feature(key) is None
    with pytest.raises(ConfigError, match=re.escape(f"unknown configuration key '{key}' (did you mean '{hint}'?)")):
        load_settings(None, overrides=[(key, "1"), ("leveret.unsupported_keys", "warn")], environ={})
