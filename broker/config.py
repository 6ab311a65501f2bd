"""Settings: built-in defaults < config file (RabbitMQ's rabbitmq.conf format and key names) < environment
(``LEVERET_<KEY>`` with dots as underscores, upper case) < command line.

The file format is RabbitMQ's "sysctl" style: ``key = value`` lines, ``#`` comments. An unknown key or a bad
value stops start-up with one message naming the key, the line and what is allowed. ``KEYS`` below is the
whole list; ``config/leveret.conf`` shows every key with its default.
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


def parse_log_file(value: str) -> Path | None:
    v = value.strip()
    if v.lower() == "false":
        return None
    return parse_path(v)


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
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 * 1024 * 1024
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
    management_bind: str | None = None  # None: the AMQP bind address
    management_port: int = 15672
    prometheus_bind: str | None = None
    prometheus_port: int = 15692
    log_level: str = "info"
    log_format: str = "auto"
    log_console: bool = True
    log_file: Path | None = None
    log_file_level: str | None = None
    load_definitions: Path | None = None
    shutdown_timeout: float = 10.0
    # The horizon of x-delayed-message (issue 14): a longer delay is refused with 406, never delivered at once.
    delayed_message_max_delay: int = 2 * 365 * 24 * 3_600_000
    # The delay store's time bucket (issue 14: UTC, an hour by default): pending messages are kept in one file
    # set per bucket, deleted once drained. A store keeps the length it was made with (storage/delay/store.py).
    delayed_message_bucket_size: int = 3_600_000
    # Not a setting: what loading the settings found worth a warning, logged once logging is set up.
    startup_warnings: list[str] = field(default_factory=list)


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


def _simple(attr: str, parse: Callable[[str], Any]) -> Callable[[Settings, str, str], None]:
    def setter(s: Settings, key: str, value: str) -> None:
        setattr(s, attr, parse(value))
    return setter


def _validate_only(parse: Callable[[str], Any]) -> Callable[[Settings, str, str], None]:
    """A RabbitMQ key whose only accepted value is what Leveret does anyway."""
    def setter(s: Settings, key: str, value: str) -> None:
        parse(value)
    return setter


_HTTP_PORT = "a port number 1-65535, or 0 to turn the listener off"
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
    "management.tcp.port": (_simple("management_port", _int_range(1, 65535, zero_ok=True)), _HTTP_PORT),
    "management.tcp.ip": (_simple("management_bind", parse_address), "an IP address"),
    "prometheus.tcp.port": (_simple("prometheus_port", _int_range(1, 65535, zero_ok=True)), _HTTP_PORT),
    "prometheus.tcp.ip": (_simple("prometheus_bind", parse_address), "an IP address"),
    "log.console": (_simple("log_console", parse_bool), "true or false"),
    "log.console.level": (_simple("log_level", parse_level), _LEVELS),
    "log.console.format": (_simple("log_format", parse_log_format), "console, json or auto"),
    "log.console.formatter": (_simple("log_format", parse_log_format), "plaintext, json or auto"),
    "log.file": (_simple("log_file", parse_log_file), "a file path, or false"),
    "log.file.level": (_simple("log_file_level", parse_level), _LEVELS),
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
}


def _choice(value: str, allowed: tuple[str, ...]) -> str:
    v = value.strip()
    if v not in allowed:
        raise ValueError(f"expected one of {', '.join(allowed)}")
    return v


_PATTERNS: list[tuple[str, Callable[[Settings, str, str], None], str]] = [
    ("loopback_users.", _set_loopback, "true or false"),
    ("default_user_tags.", _set_user_tag, "true or false"),
]


def _lookup(key: str) -> tuple[Callable[[Settings, str, str], None], str] | None:
    if key in KEYS:
        return KEYS[key]
    for prefix, setter, allowed in _PATTERNS:
        if key.startswith(prefix) and len(key) > len(prefix):
            return setter, allowed
    return None


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# The shipped configuration file, listing every key with its default: config/leveret.conf in a checkout,
# installed beside this module (broker/leveret.conf) so that it travels with a wheel.
SHIPPED_CONFIG = Path(__file__).resolve().with_name("leveret.conf")


def apply_setting(settings: Settings, key: str, value: str, where: str) -> None:
    entry = _lookup(key)
    if entry is None:
        raise ConfigError(f"{where}: unknown configuration key '{key}'{_suggest(key)}; "
                          f"see {SHIPPED_CONFIG} for the keys Leveret knows")
    setter, allowed = entry
    try:
        setter(settings, key, value)
    except ValueError as exc:
        raise ConfigError(f"{where}: bad value {value.strip()!r} for '{key}': {exc}; allowed: {allowed}") from None


def load_file(settings: Settings, path: Path) -> None:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read configuration file {path}: not UTF-8 text") from None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()  # only whole-line comments: values such as passwords may contain '#'
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ConfigError(f"{path}:{lineno}: expected 'key = value', got {raw.strip()!r}")
        key, value = line.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"{path}:{lineno}: expected 'key = value', got {raw.strip()!r}")
        apply_setting(settings, key, value, f"{path}:{lineno}")


def env_name(key: str) -> str:
    return "LEVERET_" + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


# Environment variables that are not a config key: the file to read, and a short name for the log format.
CONFIG_FILE_ENV = "LEVERET_CONFIG_FILE"
_ENV_ALIASES = {"LEVERET_LOG_FORMAT": "log.console.format", "LEVERET_LOG_LEVEL": "log.console.level",
                "LEVERET_DATA_DIR": "leveret.data_dir"}


# LEVERET_* variables that belong to other parts than the broker's settings (the ctl, the container's
# health check, the test suite): not reported as unknown.
_OTHER_ENV_PREFIXES = ("LEVERET_TEST_", "LEVERET_CTL_", "LEVERET_HEALTHCHECK_", "LEVERET_CRASH_",
                       "LEVERET_PAGING_", "LEVERET_POWERCUT_", "LEVERET_CELERY_", "LEVERET_NO_EXTENSIONS")


def load_env(settings: Settings, environ: dict[str, str] | None = None) -> list[str]:
    """Apply the ``LEVERET_<KEY>`` variables; returns warnings about LEVERET_* variables that name no
    setting (a misspelling would otherwise be ignored in silence), with a "did you mean" where one is close."""
    env = os.environ if environ is None else environ
    by_env_name = {env_name(k): k for k in KEYS}
    by_env_name.update(_ENV_ALIASES)
    for name, key in by_env_name.items():
        if name in env:
            apply_setting(settings, key, env[name], f"environment variable {name}")
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
    (the command line, as (key, value) pairs)."""
    env = os.environ if environ is None else environ
    settings = Settings()
    path = config_file or env.get(CONFIG_FILE_ENV)
    if path:
        load_file(settings, Path(path))
    settings.startup_warnings = load_env(settings, dict(env))
    for key, value in overrides or []:
        apply_setting(settings, key, value, "command line")
    return settings


def settings_field_names() -> list[str]:
    return [f.name for f in fields(Settings)]
