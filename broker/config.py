"""Settings: built-in defaults < config file (RabbitMQ's rabbitmq.conf format and key names) < environment
(``LEVERET_<KEY>`` with dots as underscores, upper case) < command line.

The file format is RabbitMQ's "sysctl" style: ``key = value`` lines, ``#`` comments. An unknown key or a bad
value stops start-up with a message naming the key, the line and what is allowed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable


class ConfigError(Exception):
    pass


_UNITS = {"": 1, "kb": 1000, "kib": 1024, "k": 1024, "mb": 1000**2, "mib": 1024**2, "m": 1024**2,
          "gb": 1000**3, "gib": 1024**3, "g": 1024**3, "tb": 1000**4, "tib": 1024**4}


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "yes", "on", "1"):
        return True
    if v in ("false", "no", "off", "0"):
        return False
    raise ValueError("expected true or false")


def parse_int(value: str) -> int:
    n = int(value.strip())
    if n < 0:
        raise ValueError("expected a non-negative integer")
    return n


def parse_bytes(value: str) -> int:
    """An information unit as RabbitMQ writes them: 1000000, 512MB, 1GiB, 2GB."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError("expected a size such as 1048576, 512MiB or 2GB")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_fraction(value: str) -> float:
    f = float(value)
    if not 0 < f <= 1:
        raise ValueError("expected a number between 0 and 1")
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
    if v not in ("debug", "info", "warning", "error", "critical", "none"):
        raise ValueError("expected one of debug, info, warning, error, critical, none")
    return v


@dataclass
class Settings:
    """Every setting the broker reads, with RabbitMQ's defaults where RabbitMQ has the same knob."""

    bind: str = "127.0.0.1"
    port: int = 5672
    data_dir: Path = field(default_factory=lambda: Path("leveret-data"))
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    loopback_users: set[str] = field(default_factory=lambda: {"guest"})
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 * 1024 * 1024
    handshake_timeout: float = 10.0
    vm_memory_high_watermark_relative: float = 0.4
    vm_memory_high_watermark_absolute: int | None = None
    disk_free_limit_absolute: int = 50 * 1000 * 1000
    management_port: int = 15672
    prometheus_port: int = 15692
    log_level: str = "info"
    log_format: str = "auto"
    load_definitions: Path | None = None
    consumer_timeout: int | None = None


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


def _set_listener(s: Settings, key: str, value: str) -> None:
    host, port = parse_listener(value)
    if host is not None:
        s.bind = host
    s.port = port


def _simple(attr: str, parse: Callable[[str], Any]) -> Callable[[Settings, str, str], None]:
    def setter(s: Settings, key: str, value: str) -> None:
        setattr(s, attr, parse(value))
    return setter


_KEYS: dict[str, tuple[Callable[[Settings, str, str], None], str]] = {
    "listeners.tcp.default": (_set_listener, "PORT or ADDRESS:PORT"),
    "default_user": (_simple("default_user", str.strip), "a user name"),
    "default_pass": (_simple("default_pass", str.strip), "a password"),
    "default_vhost": (_simple("default_vhost", str.strip), "a virtual host name"),
    "loopback_users": (_set_loopback, "none"),
    "heartbeat": (_simple("heartbeat", parse_int), "seconds, 0 to disable"),
    "frame_max": (_simple("frame_max", parse_int), "bytes, at least 8192 (0: no limit)"),
    "channel_max": (_simple("channel_max", parse_int), "a number of channels"),
    "max_message_size": (_simple("max_message_size", parse_bytes), "bytes, at most 536870912"),
    "handshake_timeout": (_simple("handshake_timeout", lambda v: parse_int(v) / 1000), "milliseconds"),
    "vm_memory_high_watermark.relative": (_simple("vm_memory_high_watermark_relative", parse_fraction),
                                          "a fraction of RAM, e.g. 0.4"),
    "vm_memory_high_watermark.absolute": (_simple("vm_memory_high_watermark_absolute", parse_bytes),
                                          "a size, e.g. 1GiB"),
    "disk_free_limit.absolute": (_simple("disk_free_limit_absolute", parse_bytes), "a size, e.g. 50MB"),
    "management.tcp.port": (_simple("management_port", parse_int), "a port"),
    "prometheus.tcp.port": (_simple("prometheus_port", parse_int), "a port"),
    "log.console.level": (_simple("log_level", parse_level), "debug, info, warning, error, critical, none"),
    "log.console.format": (_simple("log_format", str.strip), "console, json or auto"),
    "load_definitions": (_simple("load_definitions", lambda v: Path(v.strip())), "a file path"),
    "consumer_timeout": (_simple("consumer_timeout", parse_int), "milliseconds"),
    "leveret.data_dir": (_simple("data_dir", lambda v: Path(v.strip())), "a directory"),
}


def _lookup(key: str) -> tuple[Callable[[Settings, str, str], None], str] | None:
    if key in _KEYS:
        return _KEYS[key]
    if key.startswith("loopback_users."):
        return _set_loopback, "true or false"
    return None


def apply_setting(settings: Settings, key: str, value: str, where: str) -> None:
    entry = _lookup(key)
    if entry is None:
        raise ConfigError(f"{where}: unknown configuration key '{key}'")
    setter, allowed = entry
    try:
        setter(settings, key, value)
    except ValueError as exc:
        raise ConfigError(f"{where}: bad value {value.strip()!r} for '{key}': {exc}; allowed: {allowed}") from None


def load_file(settings: Settings, path: Path) -> None:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()  # only whole-line comments: values such as passwords may contain '#'
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ConfigError(f"{path}:{lineno}: expected 'key = value', got {raw.strip()!r}")
        key, value = line.split("=", 1)
        apply_setting(settings, key.strip(), value, f"{path}:{lineno}")


def load_env(settings: Settings, environ: dict[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    by_env_name = {"LEVERET_" + k.upper().replace(".", "_"): k for k in _KEYS}
    for name, key in by_env_name.items():
        if name in env:
            apply_setting(settings, key, env[name], f"environment variable {name}")
    if "LEVERET_LOG_FORMAT" in env:
        settings.log_format = env["LEVERET_LOG_FORMAT"]


def settings_field_names() -> list[str]:
    return [f.name for f in fields(Settings)]
