"""Settings: built-in defaults < config file (RabbitMQ's rabbitmq.conf format and key names) < environment
(``LEVERET_<KEY>`` with dots as underscores, upper case) < command line.

The file format is RabbitMQ's "sysctl" style: ``key = value`` lines, ``#`` comments. ``KEYS`` below is the
whole list of keys Leveret reads; ``config/leveret.conf`` shows every key with its default.

Every problem of a file (and of the environment and command line) is found before start-up stops, and all are
reported in one message, each with its line: a bad value, an unknown key (a misspelling: no RabbitMQ version
has it), or a key of a RabbitMQ feature Leveret does not have (RabbitMQ's Erlang clustering, plugins, ...: ``_RABBITMQ_ONLY``,
taken from the configuration schemas of RabbitMQ 3.8 to 4.x). With ``leveret.unsupported_keys = warn`` the
last kind is ignored with one warning listing them, so an existing rabbitmq.conf can be used as is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from protocol.constants import FRAME_MIN_SIZE


class ConfigError(Exception):
    pass


class _Unsupported(Exception):
    """Raised by a setter: the value asks for a RabbitMQ feature Leveret does not have (the text says which)."""


_UNITS = {"": 1, "kb": 1000, "kib": 1024, "k": 1024, "mb": 1000**2, "mib": 1024**2, "m": 1024**2,
          "gb": 1000**3, "gib": 1024**3, "g": 1024**3, "tb": 1000**4, "tib": 1024**4}
MAX_MESSAGE_SIZE_LIMIT = 512 * 1024 * 1024  # RabbitMQ's hard cap


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "yes", "on", "1"):
        return True
    if v in ("false", "no", "off", "0"):
        return False
    raise ValueError("expected true or false")


def parse_int(value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError("expected a non-negative integer") from None
    if n < 0:
        raise ValueError("expected a non-negative integer")
    return n


def _int_range(low: int, high: int, zero_ok: bool = False) -> Callable[[str], int]:
    def parse(value: str) -> int:
        n = parse_int(value)
        if not (low <= n <= high or (zero_ok and n == 0)):
            raise ValueError(f"{n} is out of range")
        return n
    return parse


def parse_bytes(value: str) -> int:
    """An information unit as RabbitMQ writes them: 1000000, 512MB, 1GiB, 2GB."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError("expected a size such as 1048576, 512MiB or 2GB")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _body_size(value: str) -> int:
    n = parse_bytes(value)
    if not 1024 <= n <= 2**40:
        raise ValueError(f"{n} is out of range")
    return n


def parse_consumer_max(value: str) -> int | None:
    """consumer_max_per_channel: a positive integer, or ``infinity`` (RabbitMQ's default) for None."""
    if value.strip() == "infinity":
        return None
    return _int_range(1, 2**31)(value)


def parse_max_message_size(value: str) -> int:
    n = parse_bytes(value)
    if not 0 < n <= MAX_MESSAGE_SIZE_LIMIT:
        raise ValueError(f"{n} is out of range")
    return n


def parse_fraction(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise ValueError("expected a number") from None
    if not 0 < f <= 1:
        raise ValueError("expected a number between 0 and 1")
    return f


def parse_relative(value: str) -> float:
    """disk_free_limit.relative: a multiple of the memory size (RabbitMQ allows e.g. 1.5)."""
    try:
        f = float(value)
    except ValueError:
        raise ValueError("expected a number") from None
    if f <= 0:
        raise ValueError("expected a positive number")
    return f


def parse_listener(value: str) -> tuple[str | None, int]:
    """``5672`` or ``127.0.0.1:5672`` or ``[::1]:5672``."""
    v = value.strip()
    m = re.fullmatch(r"(?:\[?([^\]]*?)\]?:)?(\d+)", v)
    if not m:
        raise ValueError("expected PORT or ADDRESS:PORT")
    port = int(m.group(2))
    if not 0 < port < 65536:
        raise ValueError("port out of range")
    return (m.group(1) or None), port


def parse_level(value: str) -> str:
    v = value.strip().lower()
    if v == "warn":
        v = "warning"
    if v not in ("debug", "info", "warning", "error", "critical", "none"):
        raise ValueError("expected one of debug, info, warning, error, critical, none")
    return v


def parse_log_format(value: str) -> str:
    v = value.strip().lower()
    v = {"plaintext": "console", "text": "console"}.get(v, v)
    if v not in ("console", "json", "auto"):
        raise ValueError("expected console, json or auto")
    return v


def parse_address(value: str) -> str:
    v = value.strip()
    if not re.fullmatch(r"[0-9A-Za-z.:\-_%]+", v):
        raise ValueError("expected an IP address or host name")
    return v


def parse_dsn(value: str) -> str:
    """A PostgreSQL connection URL (libpq's URI form, as asyncpg reads it)."""
    value = value.strip()
    if not value.startswith(("postgresql://", "postgres://")):
        raise ValueError("expected a URL starting with postgresql://")
    return value


def parse_path(value: str) -> Path:
    v = value.strip()
    if not v:
        raise ValueError("expected a path")
    return Path(v)


def parse_nonempty(value: str) -> str:
    v = value.strip()
    if not v:
        raise ValueError("expected a non-empty value")
    return v


def parse_regex(value: str) -> str:
    v = value.strip()
    try:
        re.compile(v)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return v


# log.file.rotation.date: RabbitMQ's (newsyslog's) specs that Leveret follows: $H[MM] hourly at minute MM,
# $D[HH] daily at hour HH, $W<0-6>[D<HH>] weekly (0 is Sunday), $M<1-31|L>[D<HH>] monthly (L: last day).
_ROTATION_DATE = re.compile(r"\$(?:H(\d{1,2})?|D(\d{1,2})?|W([0-6])(?:D(\d{1,2}))?|M(\d{1,2}|[Ll])(?:D(\d{1,2}))?)")


def parse_rotation_date(value: str) -> str | None:
    """``log.file.rotation.date``: a date spec such as ``$D0``, or an empty value (RabbitMQ's "no
    rotation by date"); returned as given (broker/observability/logs.py reads it), or None for none."""
    v = value.strip()
    if v in ("", "none", "false"):
        return None
    m = _ROTATION_DATE.fullmatch(v)
    if not m:
        if v.startswith("$"):
            raise _Unsupported(f"the log rotation date spec {v!r} (Leveret takes $H, $D, $W and $M specs)")
        raise ValueError("expected a date spec such as $D0, $H00, $W0D23 or $M1D0")
    minute, day_hour, _wd, week_hour, mday, month_hour = m.groups()
    if minute is not None and int(minute) > 59:
        raise ValueError(f"minute {minute} is out of range")
    for hour in (day_hour, week_hour, month_hour):
        if hour is not None and int(hour) > 23:
            raise ValueError(f"hour {hour} is out of range")
    if mday is not None and mday.upper() != "L" and not 1 <= int(mday) <= 31:
        raise ValueError(f"day {mday} is out of range")
    return v


def parse_log_file(value: str) -> Path | None:
    v = value.strip()
    if v.lower() == "false":
        return None
    return parse_path(v)


@dataclass
class TLSOptions:
    """The TLS keys of one HTTPS listener (``management.ssl.*`` or ``prometheus.ssl.*``: RabbitMQ's names, the
    same options as ``ssl_options.*``). ``configured``: some key of the prefix was given; as in RabbitMQ that
    alone turns the HTTPS listener on (on its default port when ``port`` is not given)."""

    configured: bool = False
    port: int | None = None
    bind: str | None = None  # None: the plain listener's address
    cacertfile: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    password: str | None = field(default=None, repr=False)  # never in a log line or the environment listing
    verify: str = "verify_none"
    fail_if_no_peer_cert: bool = False
    versions: dict[str, str] = field(default_factory=dict)
    ciphers: dict[str, str] = field(default_factory=dict)


@dataclass
class Settings:
    """Every setting the broker reads, with RabbitMQ's defaults where RabbitMQ has the same knob."""

    bind: str = "127.0.0.1"
    port: int = 5672
    data_dir: Path = field(default_factory=lambda: Path("leveret-data"))
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    default_user_tags: list[str] = field(default_factory=lambda: ["administrator"])
    default_permissions: dict[str, str] = field(
        default_factory=lambda: {"configure": ".*", "write": ".*", "read": ".*"})
    loopback_users: set[str] = field(default_factory=lambda: {"guest"})
    # SASL mechanisms offered, in order (auth_mechanisms.N; EXTERNAL only to a client with a verified certificate)
    # and where EXTERNAL takes the user name from (ssl_cert_login_from).
    auth_mechanisms: list[str] = field(default_factory=lambda: ["AMQPLAIN", "PLAIN"])
    auth_mechanisms_set: bool = False
    ssl_cert_login_from: str = "distinguished_name"
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 * 1024 * 1024
    # RabbitMQ's consumer_max_per_channel: None is its default, infinity (no limit).
    consumer_max_per_channel: int | None = None
    handshake_timeout: float = 10.0
    vm_memory_high_watermark_relative: float = 0.4
    vm_memory_high_watermark_absolute: int | None = None
    disk_free_limit_absolute: int = 50 * 1000 * 1000
    # A multiple of the machine's RAM: when set it is the limit (alarms.py); disk_free_limit.absolute clears it.
    disk_free_limit_relative: float | None = None
    # Off by default (RabbitMQ's is 30 minutes): Celery's ETA tasks stay unacked for long on purpose.
    consumer_timeout: int | None = None
    queue_index_embed_msgs_below: int = 4096
    cluster_name: str | None = None
    # The type of a queue declared without x-queue-type in a vhost that names none (RabbitMQ's
    # default_queue_type; a vhost's own wins; properties the type cannot have fall back to classic).
    default_queue_type: str = "classic"
    # This node's name (RabbitMQ's RABBITMQ_NODENAME; here LEVERET_NODENAME or leveret.nodename): None is
    # leveret@<host name>. Members of one cluster need distinct names, so two on one host must set it.
    node_name: str | None = None
    # cluster.postgres.dsn: the PostgreSQL database a cluster of Leveret nodes shares
    # (broker/clustering/cluster.py); None runs a single node.
    cluster_dsn: str | None = None
    # cluster.postgres.lease_seconds (Leveret's own): how long a member's lease in the cluster lasts without a
    # heartbeat (renewed every third of it). A member that hangs (SIGSTOP, a frozen VM) is fenced by its peers
    # that long after its last heartbeat, and its unacknowledged deliveries go to the other members
    # (storage/pg/SCHEMA.md, "A hung node"); shorter fails over sooner, but a member whose event loop stalls
    # for longer than a lease is fenced and reconnects under a new epoch.
    cluster_lease_seconds: int = 15
    management_bind: str | None = None  # None: the AMQP bind address
    management_port: int = 15672
    prometheus_bind: str | None = None
    prometheus_port: int = 15692
    log_level: str = "info"
    log_format: str = "auto"
    log_console: bool = True
    log_file: Path | None = None
    log_file_level: str | None = None
    # RabbitMQ's log.dir: a relative log.file is in it; alone, it turns on <log.dir>/leveret.log (resolved by
    # load_settings, so log_file is the file written). log_file_off: log.file = false was given.
    log_dir: Path | None = None
    log_file_off: bool = False
    # log.file.rotation.*: rotate the log file on a date spec (None: never by date) and/or past a size in
    # bytes (0: never by size), keeping ``count`` rotated files (0: none), gzipped when ``compress``.
    log_file_rotation_date: str | None = None
    log_file_rotation_size: int = 0
    log_file_rotation_count: int = 5
    log_file_rotation_compress: bool = False
    # How often the HTTP API samples the counters its rates come from, in ms (RabbitMQ's 5000).
    collect_statistics_interval: int = 5000
    # The web UI's session idle timeout in minutes (RabbitMQ's management.login_session_timeout, 8 hours).
    login_session_timeout: int = 480
    # The largest request body an authenticated HTTP API request may send, in bytes (RabbitMQ's
    # management.http.max_body_size and its default, 20 MB); the definitions import included. Requests not yet
    # authenticated (the login) may send a few KiB (broker/management/request_bodies.py).
    management_max_body_size: int = 20_000_000
    # Where `leveret-pipeline traffic --out DIR` writes (traffic.png, _batches.jsonl): the UI's Traffic page shows
    # them (broker/management/traffic.py); None: no such page content.
    traffic_dir: Path | None = None
    # RabbitMQ keys of features Leveret does not have: "error" stops start-up, "warn" ignores them with a warning.
    unsupported_keys: str = "error"
    load_definitions: Path | None = None
    shutdown_timeout: float = 10.0
    # The horizon of x-delayed-message (docs/decisions/delayed-messages.md): a longer delay is refused with 406, never delivered at once.
    delayed_message_max_delay: int = 2 * 365 * 24 * 3_600_000
    # The delay store's time bucket (docs/decisions/delayed-messages.md: UTC, an hour by default): pending messages are kept in one file
    # set per bucket, deleted once drained. A store keeps the length it was made with (storage/delay/store.py).
    delayed_message_bucket_size: int = 3_600_000
    # The AMQP-over-TLS listener (RabbitMQ's listeners.ssl.default, ssl_options.*; broker/security/tls.py builds the
    # context): off (None) unless a port is given; its address defaults to the plain listener's (bind).
    ssl_bind: str | None = None
    ssl_port: int | None = None
    ssl_cacertfile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: str | None = None  # of an encrypted keyfile
    ssl_verify: str = "verify_none"  # or verify_peer: ask for a client certificate and check it
    ssl_fail_if_no_peer_cert: bool = False  # with verify_peer: refuse a client without a certificate
    # ssl_options.versions.N / ciphers.N by N (a later key of the same N replaces it); empty: the defaults
    # (TLS 1.2 and 1.3; OpenSSL's ciphers).
    ssl_versions: dict[str, str] = field(default_factory=dict)
    ssl_ciphers: dict[str, str] = field(default_factory=dict)
    ssl_handshake_timeout: float = 5.0  # seconds (the key is in ms, RabbitMQ's 5000)
    # HTTPS for the HTTP API and Prometheus (management.ssl.*, prometheus.ssl.*). When one is configured and no
    # key of its plain listener was given (management.tcp.* / management.listener.*, prometheus.tcp.*), the
    # plain listener is off, as RabbitMQ does: http_configured names the ones whose plain keys were given.
    management_ssl: TLSOptions = field(default_factory=TLSOptions)
    prometheus_ssl: TLSOptions = field(default_factory=TLSOptions)
    http_configured: set[str] = field(default_factory=set)
    # Failed logins (Leveret's, RabbitMQ has none): after ``login_throttle_after`` failures from one address
    # within ``login_throttle_window`` seconds, each further login from it is answered after a delay doubling
    # from ``login_throttle_delay`` up to ``login_throttle_max_delay``; 0 failures turns it off.
    login_throttle_after: int = 5
    login_throttle_window: float = 60.0
    login_throttle_delay: float = 0.5
    login_throttle_max_delay: float = 5.0
    login_throttle_exempt_loopback: bool = True
    # Connections that have not finished the AMQP handshake (connection.open): at most this many per client
    # address and in all (0: no limit); one more is closed at once.
    handshake_max_per_source: int = 512  # clients open pools of connections at once: 100 at start is common
    handshake_max: int = 4096
    # Bindings that may end at one queue (or one exchange, for exchange-to-exchange bindings): Leveret's own
    # (RabbitMQ has no such limit); one more is refused with 406. 0: no limit (the default, as RabbitMQ).
    max_bindings_per_queue: int = 0
    # Not a setting: what loading the settings found worth a warning, logged once logging is set up.
    startup_warnings: list[str] = field(default_factory=list)
    # Not a setting: the configuration file(s) read (the start-up banner names them).
    config_files: list[Path] = field(default_factory=list)


def _set_auth_mechanism(s: Settings, key: str, value: str) -> None:
    """auth_mechanisms.N: the first one given replaces the default list; the mechanisms are offered in the
    order of their keys' N (as RabbitMQ's cuttlefish list), each once."""
    v = value.strip()
    if not v:
        raise ValueError("expected a value")
    if v not in ("PLAIN", "AMQPLAIN", "EXTERNAL"):
        raise _Unsupported("SASL mechanisms other than PLAIN, AMQPLAIN and EXTERNAL")
    if not s.auth_mechanisms_set:
        s.auth_mechanisms = []
        s.auth_mechanisms_set = True
    if v not in s.auth_mechanisms:
        s.auth_mechanisms.append(v)


def _set_loopback(s: Settings, key: str, value: str) -> None:
    if key == "loopback_users":
        if value.strip().lower() != "none":
            raise ValueError("expected none (or use loopback_users.USER = true|false)")
        s.loopback_users = set()
        return
    user = key.split(".", 1)[1]
    if parse_bool(value):
        s.loopback_users.add(user)
    else:
        s.loopback_users.discard(user)


def _set_user_tag(s: Settings, key: str, value: str) -> None:
    tag = key.split(".", 1)[1]
    tags = [t for t in s.default_user_tags if t != tag]
    if parse_bool(value):
        tags.append(tag)
    s.default_user_tags = tags


def _set_default_permission(s: Settings, key: str, value: str) -> None:
    s.default_permissions = dict(s.default_permissions, **{key.rsplit(".", 1)[1]: parse_regex(value)})


def _set_disk_free_limit(s: Settings, key: str, value: str) -> None:
    """``disk_free_limit.absolute`` and ``.relative`` (a multiple of the machine's RAM, applied at start) are
    two ways of giving one limit: the one given last wins (file order, then environment, then command line)."""
    if key.endswith(".relative"):
        s.disk_free_limit_relative = parse_relative(value)
    else:
        s.disk_free_limit_absolute = parse_bytes(value)
        s.disk_free_limit_relative = None


def _set_listener(s: Settings, key: str, value: str) -> None:
    host, port = parse_listener(value)
    if host is not None:
        s.bind = host
    s.port = port


def _set_ssl_listener(s: Settings, key: str, value: str) -> None:
    if key == "listeners.ssl":  # RabbitMQ's "no TLS listener"
        if value.strip().lower() != "none":
            raise ValueError("expected none (or listeners.ssl.default = PORT or ADDRESS:PORT)")
        s.ssl_bind, s.ssl_port = None, None
        return
    s.ssl_bind, s.ssl_port = parse_listener(value)


TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")
# Versions RabbitMQ (Erlang's ssl) accepts in ssl_options.versions that Leveret refuses: broken or deprecated
# (RFC 8996), and refused by OpenSSL 3's default security level anyway.
_OLD_TLS_VERSIONS = ("tlsv1.1", "tlsv1", "sslv3")


def parse_tls_version(value: str) -> str:
    v = value.strip().lower().replace("'", "")
    if v in _OLD_TLS_VERSIONS:
        raise _Unsupported(f"{v} (Leveret offers TLS 1.2 and 1.3 only)")
    if v not in TLS_VERSIONS:
        raise ValueError("expected tlsv1.2 or tlsv1.3")
    return v


def _set_ssl_version(s: Settings, key: str, value: str) -> None:
    s.ssl_versions[key.rsplit(".", 1)[1]] = parse_tls_version(value)


def parse_cipher(value: str) -> str:
    """One ``ssl_options.ciphers.N``: an OpenSSL cipher name (ECDHE-RSA-AES256-GCM-SHA384), or a TLS 1.3
    suite name (TLS_AES_256_GCM_SHA384)."""
    import ssl

    v = value.strip()
    if v in TLS13_CIPHER_SUITES:
        return v
    if not re.fullmatch(r"[A-Za-z0-9_\-+!@=]+", v):
        raise ValueError("expected one OpenSSL cipher name, e.g. ECDHE-RSA-AES256-GCM-SHA384")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(v)
    except ssl.SSLError:
        raise ValueError("not a cipher this OpenSSL has") from None
    return v


# The TLS 1.3 cipher suites of OpenSSL (Python's ssl module cannot restrict these: broker/security/tls.py warns).
TLS13_CIPHER_SUITES = ("TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256",
                       "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256")


def _set_ssl_cipher(s: Settings, key: str, value: str) -> None:
    s.ssl_ciphers[key.rsplit(".", 1)[1]] = parse_cipher(value)


def _simple(attr: str, parse: Callable[[str], Any]) -> Callable[[Settings, str, str], None]:
    def setter(s: Settings, key: str, value: str) -> None:
        setattr(s, attr, parse(value))  # reflection over the key table: each key names its Settings field
    return setter


def _validate_only(parse: Callable[[str], Any]) -> Callable[[Settings, str, str], None]:
    """A RabbitMQ key whose only accepted value is what Leveret does anyway."""
    def setter(s: Settings, key: str, value: str) -> None:
        parse(value)
    return setter


def _only(allowed: tuple[str, ...], feature: str, case: bool = False) -> Callable[[Settings, str, str], None]:
    """A RabbitMQ key Leveret accepts with the values that ask for what it does anyway (``allowed``); any
    other value asks for ``feature``, which Leveret does not have."""
    def setter(s: Settings, key: str, value: str) -> None:
        v = value.strip() if case else value.strip().lower()
        if not v:
            raise ValueError("expected a value")
        if v not in allowed:
            raise _Unsupported(feature)
    return setter


def _only_false(feature: str) -> Callable[[Settings, str, str], None]:
    """A RabbitMQ switch of a feature Leveret does not have: ``false`` is accepted, ``true`` is not."""
    def setter(s: Settings, key: str, value: str) -> None:
        if parse_bool(value):
            raise _Unsupported(feature)
    return setter


def _set_log_file(s: Settings, key: str, value: str) -> None:
    s.log_file = parse_log_file(value)
    s.log_file_off = s.log_file is None


_HTTP_PORT = "a port number 1-65535, or 0 to turn the listener off"


def _plain_http(setter: Callable[[Settings, str, str], None]) -> Callable[[Settings, str, str], None]:
    """A key of the plain HTTP API or Prometheus listener: given, that listener stays on beside HTTPS."""
    def set_plain(s: Settings, key: str, value: str) -> None:
        setter(s, key, value)
        s.http_configured.add(key.split(".", 1)[0])
    return set_plain


def _https(attr: str, parse: Callable[[str], Any]) -> Callable[[Settings, str, str], None]:
    """One ``management.ssl.*`` / ``prometheus.ssl.*`` key (``versions.N`` and ``ciphers.N`` by N)."""
    def setter(s: Settings, key: str, value: str) -> None:
        opts = s.management_ssl if key.startswith("management.") else s.prometheus_ssl
        # (reflection over the key table: each key names a field of SslOptions)
        if attr in ("versions", "ciphers"):
            getattr(opts, attr)[key.rsplit(".", 1)[1]] = parse(value)
        else:
            setattr(opts, attr, parse(value))
        opts.configured = True
    return setter


def _https_keys(prefix: str) -> dict[str, tuple[Callable[[Settings, str, str], None], str]]:
    return {
        f"{prefix}.port": (_https("port", _int_range(1, 65535)), "a port number 1-65535"),
        f"{prefix}.ip": (_https("bind", parse_address), "an IP address"),
        f"{prefix}.cacertfile": (_https("cacertfile", parse_path), "a PEM file of CA certificates"),
        f"{prefix}.certfile": (_https("certfile", parse_path), "a PEM certificate file"),
        f"{prefix}.keyfile": (_https("keyfile", parse_path), "a PEM private key file"),
        f"{prefix}.password": (_https("password", str.strip), "the password of an encrypted keyfile"),
        f"{prefix}.verify": (_https("verify", lambda v: _choice(v.lower(), ("verify_none", "verify_peer"))),
                             "verify_none or verify_peer"),
        f"{prefix}.fail_if_no_peer_cert": (_https("fail_if_no_peer_cert", parse_bool), "true or false"),
    }
_LEVELS = "debug, info, warning, error, critical, none"

# key → (setter, what is allowed). RabbitMQ's names where RabbitMQ has the knob; Leveret's own under leveret.
KEYS: dict[str, tuple[Callable[[Settings, str, str], None], str]] = {
    "listeners.tcp.default": (_set_listener, "PORT or ADDRESS:PORT"),
    "default_user": (_simple("default_user", parse_nonempty), "a user name"),
    "default_pass": (_simple("default_pass", str.strip), "a password"),
    "default_vhost": (_simple("default_vhost", parse_nonempty), "a virtual host name"),
    "default_permissions.configure": (_set_default_permission, "a regular expression"),
    "default_permissions.write": (_set_default_permission, "a regular expression"),
    "default_permissions.read": (_set_default_permission, "a regular expression"),
    "loopback_users": (_set_loopback, "none"),
    "heartbeat": (_simple("heartbeat", _int_range(0, 65535)), "seconds 0-65535, 0 to disable"),
    "frame_max": (_simple("frame_max", _int_range(FRAME_MIN_SIZE, 2**32 - 1, zero_ok=True)),
                  f"bytes, at least {FRAME_MIN_SIZE} (0: no limit)"),
    "channel_max": (_simple("channel_max", _int_range(0, 65535)), "a number of channels 0-65535 (0: no limit)"),
    "consumer_max_per_channel": (_simple("consumer_max_per_channel", parse_consumer_max),
                                 "a number of consumers, at least 1, or infinity (the default)"),
    "max_message_size": (_simple("max_message_size", parse_max_message_size),
                         f"a size from 1 byte to {MAX_MESSAGE_SIZE_LIMIT} (512MiB)"),
    "handshake_timeout": (_simple("handshake_timeout", lambda v: _int_range(1, 2**31)(v) / 1000),
                          "milliseconds, at least 1"),
    "vm_memory_high_watermark.relative": (_simple("vm_memory_high_watermark_relative", parse_fraction),
                                          "a fraction of RAM above 0 and at most 1, e.g. 0.4"),
    "vm_memory_high_watermark.absolute": (_simple("vm_memory_high_watermark_absolute", parse_bytes),
                                          "a size, e.g. 1GiB"),
    "disk_free_limit.absolute": (_set_disk_free_limit, "a size, e.g. 50MB"),
    "disk_free_limit.relative": (_set_disk_free_limit, "a positive multiple of RAM, e.g. 1.5"),
    "consumer_timeout": (_simple("consumer_timeout", parse_int), "milliseconds"),
    "queue_index_embed_msgs_below": (_simple("queue_index_embed_msgs_below", parse_bytes), "a size in bytes"),
    "cluster_name": (_simple("cluster_name", parse_nonempty), "a name"),
    "leveret.nodename": (_simple("node_name", parse_nonempty), "a node name, e.g. leveret@host-a"),
    "cluster.postgres.dsn": (_simple("cluster_dsn", parse_dsn), "a PostgreSQL URL, postgresql://user@host/db"),
    "cluster.postgres.lease_seconds": (_simple("cluster_lease_seconds", _int_range(1, 3600)),
                                       "seconds 1-3600 (default 15)"),
    "management.tcp.port": (_plain_http(_simple("management_port", _int_range(1, 65535, zero_ok=True))),
                            _HTTP_PORT),
    "management.tcp.ip": (_plain_http(_simple("management_bind", parse_address)), "an IP address"),
    "prometheus.tcp.port": (_plain_http(_simple("prometheus_port", _int_range(1, 65535, zero_ok=True))),
                            _HTTP_PORT),
    "prometheus.tcp.ip": (_plain_http(_simple("prometheus_bind", parse_address)), "an IP address"),
    "log.console": (_simple("log_console", parse_bool), "true or false"),
    "log.console.level": (_simple("log_level", parse_level), _LEVELS),
    "log.console.format": (_simple("log_format", parse_log_format), "console, json or auto"),
    "log.console.formatter": (_simple("log_format", parse_log_format), "plaintext, json or auto"),
    "log.file": (_set_log_file, "a file path (relative: in log.dir), or false"),
    "log.file.level": (_simple("log_file_level", parse_level), _LEVELS),
    "log.dir": (_simple("log_dir", parse_path), "a directory"),
    "log.file.rotation.date": (_simple("log_file_rotation_date", parse_rotation_date),
                               ("a date spec: $D<hour>, $H<minute>, $W<0-6>D<hour> or $M<day|L>D<hour>, "
                                "e.g. $D0 (daily at midnight); empty for none")),
    "log.file.rotation.size": (_simple("log_file_rotation_size", parse_bytes), "a size, e.g. 10485760 (0: none)"),
    "log.file.rotation.count": (_simple("log_file_rotation_count", _int_range(0, 10_000)),
                                "a number of rotated files to keep 0-10000"),
    "log.file.rotation.compress": (_simple("log_file_rotation_compress", parse_bool), "true or false"),
    "log.file.formatter": (_only(("json",), "a plain-text log file (Leveret's log file is JSON lines)"), "json"),
    "log.exchange": (_only_false("logging to the amq.rabbitmq.log exchange"), "false"),
    "log.syslog": (_only_false("logging to syslog"), "false"),
    "log.journald": (_only_false("logging to journald"), "false"),
    "collect_statistics_interval": (_simple("collect_statistics_interval", _int_range(100, 2**31)),
                                    "milliseconds, at least 100"),
    "management.listener.port": (_plain_http(_simple("management_port", _int_range(1, 65535, zero_ok=True))),
                                 _HTTP_PORT),
    "management.listener.ip": (_plain_http(_simple("management_bind", parse_address)), "an IP address"),
    "management.rates_mode": (_only(("basic",), "management rates modes other than basic"), "basic"),
    "management.disable_stats": (_only_false("turning the HTTP API's statistics off"), "false"),
    "management.http.max_body_size": (_simple("management_max_body_size", _body_size),
                                      "a size in bytes, at least 1024 (e.g. 20000000, 64MiB)"),
    "management.login_session_timeout": (_simple("login_session_timeout", _int_range(1, 2**31)),
                                         "minutes of idleness before a web UI session ends, at least 1"),
    "leveret.traffic_dir": (_simple("traffic_dir", parse_path), "the --out directory of leveret-pipeline traffic"),
    "default_queue_type": (_simple("default_queue_type", lambda v: _choice(v.strip().lower(),
                                                                            ("classic", "quorum", "stream"))),
                           "classic, quorum or stream"),
    "listeners.ssl": (_set_ssl_listener, "none"),
    "listeners.ssl.default": (_set_ssl_listener, "PORT or ADDRESS:PORT"),
    "ssl_options.cacertfile": (_simple("ssl_cacertfile", parse_path), "a PEM file of CA certificates"),
    "ssl_options.certfile": (_simple("ssl_certfile", parse_path), "a PEM certificate file"),
    "ssl_options.keyfile": (_simple("ssl_keyfile", parse_path), "a PEM private key file"),
    "ssl_options.password": (_simple("ssl_password", str.strip), "the password of an encrypted keyfile"),
    "ssl_options.verify": (_simple("ssl_verify", lambda v: _choice(v.lower(), ("verify_none", "verify_peer"))),
                           "verify_none or verify_peer"),
    "ssl_options.fail_if_no_peer_cert": (_simple("ssl_fail_if_no_peer_cert", parse_bool), "true or false"),
    "ssl_cert_login_from": (_simple("ssl_cert_login_from",
                                    lambda v: _choice(v.strip().lower(), ("distinguished_name", "common_name"))),
                            "distinguished_name or common_name"),
    "ssl_handshake_timeout": (_simple("ssl_handshake_timeout", lambda v: _int_range(1, 2**31)(v) / 1000),
                              "milliseconds, at least 1"),
    "proxy_protocol": (_only_false("the PROXY protocol"), "false"),
    "reverse_dns_lookups": (_only_false("reverse DNS lookups of client addresses"), "false"),
    "anonymous_login_user": (_only(("none",), "the ANONYMOUS login mechanism"), "none"),
    "anonymous_login_pass": (_only(("none",), "the ANONYMOUS login mechanism"), "none"),
    "load_definitions": (_simple("load_definitions", parse_path), "a file path"),
    "management.load_definitions": (_simple("load_definitions", parse_path), "a file path"),
    "definitions.local.path": (_simple("load_definitions", parse_path), "a file path"),
    "definitions.import_backend": (_validate_only(lambda v: _choice(v, ("local_filesystem",))),
                                   "local_filesystem"),
    "leveret.data_dir": (_simple("data_dir", parse_path), "a directory"),
    "delayed_message.max_delay": (_simple("delayed_message_max_delay", _int_range(1, 2**62)),
                                  "milliseconds, at least 1 (default: two years)"),
    "delayed_message.bucket_size": (_simple("delayed_message_bucket_size", _int_range(1000, 86_400_000)),
                                    "milliseconds 1000-86400000 (default: an hour)"),
    "leveret.shutdown_timeout": (_simple("shutdown_timeout", lambda v: _int_range(1, 2**31)(v) / 1000),
                                 "milliseconds, at least 1"),
    "leveret.unsupported_keys": (_simple("unsupported_keys", lambda v: _choice(v.lower(), ("error", "warn"))),
                                 "error (stop start-up) or warn (ignore them with a warning)"),
}


def _choice(value: str, allowed: tuple[str, ...]) -> str:
    v = value.strip()
    if v not in allowed:
        raise ValueError(f"expected one of {', '.join(allowed)}")
    return v


# HTTPS for the HTTP API and Prometheus, and Leveret's limits on failed logins, unfinished handshakes and
# bindings.
KEYS.update(_https_keys("management.ssl"))
KEYS.update(_https_keys("prometheus.ssl"))
KEYS.update({
    "leveret.login_throttle.after_failures": (_simple("login_throttle_after", _int_range(0, 1_000_000)),
                                              ("failed logins from one address before its logins are "
                                               "delayed (0: never delayed)")),
    "leveret.login_throttle.window": (_simple("login_throttle_window", lambda v: _int_range(1, 2**31)(v) / 1000),
                                      "milliseconds, at least 1"),
    "leveret.login_throttle.delay": (_simple("login_throttle_delay", lambda v: _int_range(1, 2**31)(v) / 1000),
                                     "milliseconds, at least 1"),
    "leveret.login_throttle.max_delay": (_simple("login_throttle_max_delay",
                                                 lambda v: _int_range(1, 2**31)(v) / 1000),
                                         "milliseconds, at least 1"),
    "leveret.login_throttle.exempt_loopback": (_simple("login_throttle_exempt_loopback", parse_bool),
                                               "true or false"),
    "leveret.handshake_max_per_source": (_simple("handshake_max_per_source", _int_range(0, 2**31)),
                                         "a number of connections (0: no limit)"),
    "leveret.handshake_max": (_simple("handshake_max", _int_range(0, 2**31)),
                              "a number of connections (0: no limit)"),
    "leveret.max_bindings_per_queue": (_simple("max_bindings_per_queue", _int_range(0, 2**31)),
                                       "bindings per destination queue or exchange (0: no limit)"),
})


_PATTERNS: list[tuple[str, Callable[[Settings, str, str], None], str]] = [
    ("loopback_users.", _set_loopback, "true or false"),
    ("default_user_tags.", _set_user_tag, "true or false"),
    # listeners.tcp.NAME: any name, as RabbitMQ (listeners.tcp.1 = ...); Leveret listens on one address.
    ("listeners.tcp.", _set_listener, "PORT or ADDRESS:PORT"),
    # listeners.ssl.NAME likewise: one TLS listener.
    ("listeners.ssl.", _set_ssl_listener, "PORT or ADDRESS:PORT"),
    ("ssl_options.versions.", _set_ssl_version, "tlsv1.2 or tlsv1.3"),
    ("ssl_options.ciphers.", _set_ssl_cipher, "an OpenSSL cipher name, e.g. ECDHE-RSA-AES256-GCM-SHA384"),
    ("management.ssl.versions.", _https("versions", parse_tls_version), "tlsv1.2 or tlsv1.3"),
    ("management.ssl.ciphers.", _https("ciphers", parse_cipher), "an OpenSSL cipher name"),
    ("prometheus.ssl.versions.", _https("versions", parse_tls_version), "tlsv1.2 or tlsv1.3"),
    ("prometheus.ssl.ciphers.", _https("ciphers", parse_cipher), "an OpenSSL cipher name"),
    ("auth_backends.", _only(("internal", "rabbit_auth_backend_internal"), "authentication backends other "
                             "than internal"), "internal"),
    ("auth_mechanisms.", _set_auth_mechanism, "PLAIN, AMQPLAIN or EXTERNAL"),
]

# Keys of RabbitMQ (its broker's and its plugins' configuration schemas, 3.8 to 4.x) for features Leveret does
# not have: the feature (as in "a RabbitMQ key for <feature>") → patterns, each matching whole keys.
_RABBITMQ_ONLY_KEYS: list[tuple[str, list[str]]] = [
    # Not "Leveret runs as a single node": Leveret nodes form a cluster through cluster.postgres.dsn (and the
    # message says so, since a user reading it otherwise concludes there is no cluster at all).
    ("RabbitMQ's Erlang clustering (Leveret nodes form a cluster through cluster.postgres.dsn instead)", [
        r"cluster_formation\..+", r"cluster_partition_handling(\..+)?", r"cluster_keepalive_interval",
        r"(cluster|node)_tags\..+", r"mnesia_table_loading_retry_(timeout|limit)", r"queue_(master|leader)_locator",
        r"mirroring_sync_(batch_size|max_throughput)", r"net_ticktime", r"distribution\..+", r"metadata_store\..+",
        r"prevent_startup_if_node_was_reset", r"aws\..+"]),
    ("quorum queue replication (Raft) tuning", [r"quorum_queue\..+", r"raft\..+"]),
    # The AMQP listener's TLS keys Leveret reads are in KEYS and _PATTERNS (found before these).
    ("a TLS option Leveret does not have", [
        r"ssl_options", r"ssl_allow_poodle_attack",
        (r"ssl_options\.(?!(cacertfile|certfile|keyfile|password|verify|fail_if_no_peer_cert"
         r"|versions\.[^.]+|ciphers\.[^.]+)$).+")]),
    ("certificate login from a subject alternative name", [r"ssl_cert_login_san_.+"]),
    # The HTTPS keys Leveret reads (management.ssl.*, prometheus.ssl.*) are in KEYS and _PATTERNS.
    ("an HTTPS listener option Leveret does not have", [
        (r"(management|prometheus)\.ssl\.(?!(port|ip|cacertfile|certfile|keyfile|password|verify"
         r"|fail_if_no_peer_cert|versions\.[^.]+|ciphers\.[^.]+)$).+")]),
    ("the legacy HTTPS listener keys (use management.ssl.*)", [r"management\.listener\.ssl(_opts)?(\..+)?"]),
    ("TLS for definitions, the trust store plugin and syslog", [
        r"definitions\.tls\..+", r"trust_store\..+", r"log\.syslog\.ssl_options\..+"]),
    ("turning the plain AMQP listener off", [r"listeners\.tcp"]),
    ("TCP socket options", [r"tcp_listen_options(\..+)?", r"num_acceptors\.(tcp|ssl)"]),
    ("the MQTT plugin", [r"mqtt\..+"]),
    ("the Web MQTT plugin", [r"web_mqtt\..+"]),
    ("the STOMP plugin", [r"stomp\..+"]),
    ("the Web STOMP plugin", [r"web_stomp\..+"]),
    ("the stream protocol plugin (Leveret serves stream queues over AMQP 0-9-1)", [r"stream\..+"]),
    ("the AMQP 1.0 plugin", [r"amqp1_0\..+"]),
    ("the Erlang AMQP clients of shovels and federation links", [r"amqp_client\..+", r"amqp10_client\..+"]),
    ("the federation plugin", [r"federation\..+"]),
    ("the shovel plugin", [r"shovel\..+"]),
    ("the LDAP authentication backend", [r"auth_ldap\..+"]),
    ("the HTTP authentication backend", [r"auth_http\..+"]),
    ("OAuth 2 authentication", [r"auth_oauth2\..+", r"management\.(oauth|uaa)_.+", r"management\.enable_uaa"]),
    ("the authentication cache plugin", [r"auth_cache\..+"]),
    ("authentication backends and credential validation", [
        r"auth_backends\.\d+\.(authn|authz)", r"http_dispatch\..+", r"credential_validator\..+",
        r"password_hashing_module"]),
    ("the event exchange plugin", [r"event_exchange\..+"]),
    ("the tracing plugin (rabbitmq_tracing)", [r"tracing\..+"]),
    ("the Erlang system monitor", [r"sysmon_handler\..+"]),
    ("the management agent's metrics collector", [r"management_agent\..+"]),
    ("per-category log levels and files", [
        r"log\.(default|channel|connection|federation|mirroring|queue|ra|upgrade|user)\.(level|file)",
        r"log\.(default|channel|connection|federation|mirroring|queue|ra|upgrade|user)\.rotation\..+"]),
    ("logging to syslog, journald or the amq.rabbitmq.log exchange", [r"log\.(syslog|journald|exchange)\..+"]),
    ("log formatting options", [
        r"log\.(console|file|exchange|syslog)\.formatter\..+", r"log\.console\.(stdio|use_colors|color_esc_seqs\..+)",
        r"log\.summarize_process_state", r"log\.error_logger_format_depth"]),
    ("HTTP listener tuning", [
        r"(management|prometheus)\.tcp\.(compress|idle_timeout|inactivity_timeout|max_connections)",
        r"(management|prometheus)\.tcp\.(max_keepalive|request_timeout|shutdown_timeout|listener)",
        r"management\.listener\.server\..+"]),
    ("a management plugin option Leveret's HTTP API does not have", [
        r"management\.(cors|csp|hsts|headers|http|restrictions|sample_retention_policies)\..+",
        r"management\.(path_prefix|http_log_dir|credential_encryption_secret)",
        r"management\.(db_cache_multiplier|delegate_count|disable_basic_auth|enable_queue_totals)",
        r"management\.(require_auth_for_api_reference|definitions\.require_json_extension)"]),
    ("a Prometheus plugin option Leveret does not have", [
        r"prometheus\.(authentication\.enabled|filter_aggregated_queue_metrics_pattern)",
        r"prometheus\.(path|return_per_object_metrics)"]),
    ("importing definitions over HTTPS or only when changed", [
        r"definitions\.(https\.url|skip_if_unchanged|hashing\.algorithm)"]),
    ("default users, policies and limits (Leveret creates default_user only)", [
        r"default_(users|policies|limits)\..+"]),
    ("node-wide limits", [
        r"connection_max", r"max_connections", r"channel_max_per_node", r"session_max_per_connection",
        r"link_max_per_session", r"max_channels_per_connection", r"vhost_max",
        r"ranch_connection_max", r"cluster_(queue|exchange)_limit", r"runtime_parameters\.limits\..+"]),
    ("memory monitor tuning", [
        r"vm_memory_high_watermark_paging_ratio", r"vm_memory_calculation_strategy",
        r"total_memory_available_override_value", r"memory_monitor_interval"]),
    ("statistics collection levels", [r"collect_statistics"]),
    ("switches of RabbitMQ's queue and exchange types and deprecated features", [
        r"classic_queue\..+", r"queue_types\..+", r"deprecated_features\..+", r"exchange_types\..+"]),
    ("message and channel interceptors", [r"message_interceptors\..+", r"channel_interceptor\..+"]),
    ("Erlang runtime tuning", [
        r"background_gc_(enabled|target_interval)", r"hipe_compile", r"erlang\..+", r"delegate_count",
        r"default_worker_pool_size", r"socket_writer\..+", r"message_store_shutdown_timeout",
        r"(lazy_)?queue_explicit_gc_run_operation_threshold", r"initial_frame_max", r"consumer_disconnected_timeout",
        r"vhost_restart_strategy"]),
    ("the product name and message of the day", [r"motd_file", r"product\.(name|version)"]),
]
_RABBITMQ_ONLY = [(re.compile("|".join(patterns)), feature) for feature, patterns in _RABBITMQ_ONLY_KEYS]


def _lookup(key: str) -> tuple[Callable[[Settings, str, str], None], str] | None:
    if key in KEYS:
        return KEYS[key]
    for prefix, setter, allowed in _PATTERNS:
        if key.startswith(prefix) and len(key) > len(prefix):
            return setter, allowed
    return None


def rabbitmq_only_feature(key: str) -> str | None:
    """The RabbitMQ feature ``key`` configures when it is a RabbitMQ key Leveret does not read, else None."""
    for pattern, feature in _RABBITMQ_ONLY:
        if pattern.fullmatch(key):
            return feature
    return None


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# The shipped configuration file, listing every key with its default: config/leveret.conf in a checkout,
# installed beside this module (broker/leveret.conf) so that it travels with a wheel.
SHIPPED_CONFIG = Path(__file__).resolve().with_name("leveret.conf")


@dataclass
class _Problem:
    """One thing wrong with a key: ``text`` names where (file and line), the key and why. ``feature`` is set
    for a RabbitMQ key (or value) of a feature Leveret does not have: the kind leveret.unsupported_keys = warn
    lets through."""

    where: str
    key: str
    text: str
    feature: str | None = None


def _apply(settings: Settings, key: str, value: str, where: str) -> _Problem | None:
    entry = _lookup(key)
    if entry is None:
        feature = rabbitmq_only_feature(key)
        if feature is not None:
            return _Problem(where, key, f"{where}: '{key}' is a RabbitMQ key for {feature}, not supported by "
                                        "Leveret", feature)
        return _Problem(where, key, f"{where}: unknown configuration key '{key}'{_suggest(key)}; "
                                    f"see {SHIPPED_CONFIG} for the keys Leveret knows")
    setter, allowed = entry
    try:
        setter(settings, key, value)
    except _Unsupported as exc:
        return _Problem(where, key, f"{where}: '{key} = {value.strip()}' asks for {exc}, not supported by "
                                    f"Leveret; allowed: {allowed}", str(exc))
    except ValueError as exc:
        return _Problem(where, key, f"{where}: bad value {value.strip()!r} for '{key}': {exc}; allowed: {allowed}")
    return None


_WARN_HINT = "set leveret.unsupported_keys = warn to start with them ignored"


def _error_text(problems: list[_Problem]) -> str:
    unsupported = sum(p.feature is not None for p in problems)
    if len(problems) == 1:
        return problems[0].text + (f" ({_WARN_HINT.replace('them', 'it')})" if unsupported else "")
    text = f"{len(problems)} configuration problems:\n" + "\n".join("  " + p.text for p in problems)
    if unsupported:
        text += (f"\n{unsupported} of them are RabbitMQ features Leveret does not have: {_WARN_HINT}"
                 + ("; unknown keys and bad values still stop start-up" if unsupported < len(problems) else ""))
    return text


def _conclude(settings: Settings, problems: list[_Problem]) -> None:
    """Stop with one message naming every problem, or (leveret.unsupported_keys = warn, and only keys of
    RabbitMQ features Leveret does not have) add one warning naming them all."""
    warn = settings.unsupported_keys == "warn"
    fatal = [p for p in problems if p.feature is None or not warn]
    if fatal:
        raise ConfigError(_error_text(fatal))
    if problems:
        # One file's keys by line ("line 12"), others by where they came from ("command line").
        lines = [re.fullmatch(r"(.+):(\d+)", p.where) for p in problems]
        files = {m.group(1) for m in lines if m}
        one_file = files.pop() if len(files) == 1 else None
        by_feature: dict[str, list[str]] = {}
        for p, m in zip(problems, lines, strict=True):
            where = f"line {m.group(2)}" if m and m.group(1) == one_file else p.where
            by_feature.setdefault(p.feature or "", []).append(f"{p.key} ({where})")
        settings.startup_warnings.append(
            f"ignoring {len(problems)} configuration key{'s' if len(problems) > 1 else ''} of RabbitMQ features "
            f"Leveret does not have{f' in {one_file}' if one_file else ''} (leveret.unsupported_keys = warn): "
            + "; ".join(f"{feature}: {', '.join(keys)}" for feature, keys in by_feature.items()))


def _finish(settings: Settings) -> None:
    """What depends on more than one key: the log file in log.dir."""
    if settings.log_dir is not None and not settings.log_file_off:
        settings.log_file = settings.log_dir / (settings.log_file or "leveret.log")


def apply_setting(settings: Settings, key: str, value: str, where: str) -> None:
    problem = _apply(settings, key, value, where)
    if problem is not None:
        _conclude(settings, [problem])


def _read_file(settings: Settings, path: Path) -> list[_Problem]:
    """Apply every line of ``path``; returns what was wrong with any of them (a file it cannot read raises)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read configuration file {path}: not UTF-8 text") from None
    problems: list[_Problem] = []
    # The first listeners.tcp.NAME (and listeners.ssl.NAME) key of the file, and its line.
    listeners: dict[str, tuple[str, str]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()  # only whole-line comments: values such as passwords may contain '#'
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        key, _, value = line.partition("=")
        key = key.strip()
        if "=" not in line or not key:
            problems.append(_Problem(where, key, f"{where}: expected 'key = value', got {raw.strip()!r}"))
            continue
        kind = key[:14] if key.startswith(("listeners.tcp.", "listeners.ssl.")) and len(key) > 14 else None
        if kind is not None:
            listener = listeners.get(kind)
            if listener is not None and listener[0] != key:
                what = "AMQP" if kind == "listeners.tcp." else "AMQP-over-TLS"
                feature = f"a second {what} listener (Leveret listens on one address, {listener[0]} of line " \
                          f"{listener[1]})"
                problems.append(_Problem(where, key, f"{where}: '{key}' asks for {feature}, not supported by "
                                                     "Leveret", feature))
                continue
            listeners[kind] = (key, str(lineno))
        problem = _apply(settings, key, value, where)
        if problem is not None:
            problems.append(problem)
    return problems


def load_file(settings: Settings, path: Path) -> None:
    _conclude(settings, _read_file(settings, path))
    _finish(settings)


def env_name(key: str) -> str:
    return "LEVERET_" + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


# Environment variables that are not a config key: the file to read, and a short name for the log format.
CONFIG_FILE_ENV = "LEVERET_CONFIG_FILE"
_ENV_ALIASES = {"LEVERET_LOG_FORMAT": "log.console.format", "LEVERET_LOG_LEVEL": "log.console.level",
                "LEVERET_DATA_DIR": "leveret.data_dir", "LEVERET_UNSUPPORTED_KEYS": "leveret.unsupported_keys",
                "LEVERET_NODENAME": "leveret.nodename"}


# LEVERET_* variables that belong to other parts than the broker's settings (the ctl, the container's
# health check, the test suite): not reported as unknown.
_OTHER_ENV_PREFIXES = ("LEVERET_TEST_", "LEVERET_CTL_", "LEVERET_HEALTHCHECK_", "LEVERET_CRASH_",
                       "LEVERET_PAGING_", "LEVERET_POWERCUT_", "LEVERET_CELERY_", "LEVERET_NO_EXTENSIONS")


def load_env(settings: Settings, environ: dict[str, str] | None = None,
             problems: list[_Problem] | None = None) -> list[str]:
    """Apply the ``LEVERET_<KEY>`` variables; returns warnings about LEVERET_* variables that name no
    setting (a misspelling would otherwise be ignored in silence), with a "did you mean" where one is close.
    A bad value is added to ``problems`` when given, else raised at once."""
    env = os.environ if environ is None else environ
    by_env_name = {env_name(k): k for k in KEYS}
    by_env_name.update(_ENV_ALIASES)
    for name, key in by_env_name.items():
        if name in env:
            where = f"environment variable {name}"
            if problems is None:
                apply_setting(settings, key, env[name], where)
            elif (problem := _apply(settings, key, env[name], where)) is not None:
                problems.append(problem)
    known = set(by_env_name) | {CONFIG_FILE_ENV}
    warnings = []
    for name in sorted(env):
        if name.startswith("LEVERET_") and name not in known and not name.startswith(_OTHER_ENV_PREFIXES):
            import difflib

            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(f"environment variable {name} is not a Leveret setting and is ignored{hint}")
    return warnings


def load_settings(config_file: str | Path | None = None, overrides: list[tuple[str, str]] | None = None,
                  environ: dict[str, str] | None = None) -> Settings:
    """Defaults < file (``config_file``, else ``$LEVERET_CONFIG_FILE``) < environment < ``overrides``
    (the command line, as (key, value) pairs). Every problem of the three is reported in one ConfigError."""
    env = os.environ if environ is None else environ
    settings = Settings()
    path = config_file or env.get(CONFIG_FILE_ENV)
    problems = _read_file(settings, Path(path)) if path else []
    settings.config_files = [Path(path)] if path else []
    settings.startup_warnings = load_env(settings, dict(env), problems)
    for key, value in overrides or []:
        if (problem := _apply(settings, key, value, "command line")) is not None:
            problems.append(problem)
    _conclude(settings, problems)  # with leveret.unsupported_keys as the file, environment and command line left it
    _finish(settings)
    return settings


def settings_field_names() -> list[str]:
    return [f.name for f in fields(Settings)]


# The HTTP API's HTTPS port when management.ssl.* is configured without management.ssl.port (RabbitMQ's).
MANAGEMENT_HTTPS_PORT = 15671


def management_url(settings: Settings) -> str | None:
    """The URL where a process on this host reaches the HTTP API that ``settings`` configure, or None when
    it is turned off (management.tcp.port = 0 and no HTTPS). The same choice as broker/server.py's listeners:
    plain HTTP unless only management.ssl.* is configured, then HTTPS on management.ssl.port (15671). A
    wildcard or loopback address is reached at 127.0.0.1.

    The container's health check (broker/tools/healthcheck.py) and ``leveret ctl`` (broker/tools/ctl/target.py) derive their
    defaults from it, so a broker configured on other ports (LEVERET_* variables, the config file) is the one
    they talk to, never whatever else answers on 15672."""
    ssl = settings.management_ssl
    if settings.management_port and ("management" in settings.http_configured or not ssl.configured):
        scheme, port, bind = "http", settings.management_port, settings.management_bind or settings.bind
    elif ssl.configured:
        scheme, port = "https", ssl.port or MANAGEMENT_HTTPS_PORT
        bind = ssl.bind or settings.management_bind or settings.bind
    else:
        return None
    return f"{scheme}://{_connect_host(bind)}:{port}"


def _connect_host(bind: str) -> str:
    """Where to connect to reach a listener bound to ``bind``, as a URL's host part."""
    if bind in ("", "0.0.0.0", "*", "::", "localhost", "127.0.0.1"):
        return "127.0.0.1"
    return f"[{bind}]" if ":" in bind else bind
