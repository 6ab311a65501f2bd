"""Users, their tags, their permissions per vhost, their password hashes (RabbitMQ's format) and the SASL
mechanisms PLAIN and AMQPLAIN.

A password hash is RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt(4 bytes) + SHA-256(salt +
password)), so a definitions file exported from RabbitMQ imports with its passwords intact (the SHA-512 and
MD5 variants RabbitMQ can also export are accepted too). Permissions are three regexes per (user, vhost):
configure, write, read; broker/security/permissions.py checks them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
from dataclasses import dataclass, field

from pamqp import decode

SHA256 = "rabbit_password_hashing_sha256"
HASHING_ALGORITHMS = {SHA256: hashlib.sha256, "rabbit_password_hashing_sha512": hashlib.sha512,
                      "rabbit_password_hashing_md5": hashlib.md5}
KNOWN_TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")


def hash_password(password: str, salt: bytes | None = None, algorithm: str = SHA256) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = HASHING_ALGORITHMS[algorithm](salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def check_password(password: str, password_hash: str, algorithm: str = SHA256) -> bool:
    if not password_hash:
        return False  # a user without a password cannot log in with one (RabbitMQ's rule)
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    salt, digest = raw[:4], raw[4:]
    hash_fn = HASHING_ALGORITHMS.get(algorithm)
    if hash_fn is None:
        return False
    return hmac.compare_digest(hash_fn(salt + password.encode()).digest(), digest)


def valid_password_hash(password_hash: str) -> bool:
    if password_hash == "":
        return True
    try:
        return len(base64.b64decode(password_hash, validate=True)) > 4
    except ValueError:
        return False


def compile_permission(pattern: str) -> re.Pattern[str]:
    """RabbitMQ's rule: the empty string means '^$' (matches nothing but the empty name); the regex is
    unanchored (``re.search``). Raises ``re.error`` for a bad pattern."""
    return re.compile(pattern or "^$")


class Permission:
    """configure / write / read regexes of one user in one vhost, compiled once."""

    __slots__ = ("_res", "configure", "read", "write")

    def __init__(self, configure: str, write: str, read: str) -> None:
        self.configure = configure
        self.write = write
        self.read = read
        self._res = {"configure": compile_permission(configure), "write": compile_permission(write),
                     "read": compile_permission(read)}

    def allows(self, perm: str, name: str) -> bool:
        return self._res[perm].search(name) is not None

    def as_dict(self) -> dict[str, str]:
        return {"configure": self.configure, "write": self.write, "read": self.read}


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    hashing_algorithm: str = SHA256
    # vhost name → permissions; no entry means no access to that vhost.
    permissions: dict[str, Permission] = field(default_factory=dict)
    # vhost name → exchange name → (write regex, read regex) on routing keys, checked by
    # broker/security/topic_permissions.py for topic exchanges.
    topic_permissions: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    # RabbitMQ's user limits, "max-connections" and "max-channels" (broker/policies/limits.py enforces them).
    limits: dict[str, int] = field(default_factory=dict)

    def has_tag(self, *tags: str) -> bool:
        return any(t in self.tags for t in tags)


class SaslError(Exception):
    pass


def parse_plain(response: bytes) -> tuple[str, str]:
    """PLAIN: ``authzid \\0 authcid \\0 password``."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise SaslError("PLAIN response is not 'authzid NUL user NUL password'")
    return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")


def parse_amqplain(response: bytes) -> tuple[str, str]:
    """AMQPLAIN (kombu's default): a field table without its length prefix, with LOGIN and PASSWORD."""
    try:
        table = decode.field_table(len(response).to_bytes(4, "big") + response)[1]
    except Exception:  # noqa: BLE001
        raise SaslError("AMQPLAIN response is not a field table") from None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if login is None or password is None:
        raise SaslError("AMQPLAIN response lacks LOGIN or PASSWORD")
    return _as_str(login), _as_str(password)


def _as_str(value: object) -> str:
    """An AMQPLAIN field as text: a byte string (long strings decode as bytes) decoded, anything else str()."""
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


MECHANISMS = {"PLAIN": parse_plain, "AMQPLAIN": parse_amqplain}


def is_loopback(address: str | None) -> bool:
    if not address:
        return True  # a Unix socket
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # an IPv4 client of a dual-stack (::) listener: ::ffff:127.0.0.1 is loopback
    return ip.is_loopback


class UserStore:
    """The broker's users. ``authenticate`` returns the user or the reason for refusing, in RabbitMQ's words."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        # Node-internal AMQP logins, name → (secret, user): a local shovel's connection to this node
        # (broker/shovel/supervisor.py). Only AMQP's PLAIN/AMQPLAIN accept them; never listed or exported.
        self.internal: dict[str, tuple[str, User]] = {}

    def add(self, name: str, password: str, tags: list[str] | None = None) -> User:
        """Create or update a user with a password (existing permissions are kept)."""
        return self.put(name, hash_password(password), tags)

    def put(self, name: str, password_hash: str, tags: list[str] | None = None,
            hashing_algorithm: str = SHA256) -> User:
        """Create or update a user from a password hash (definitions import, the HTTP API)."""
        if hashing_algorithm not in HASHING_ALGORITHMS:
            raise ValueError(f"unknown hashing algorithm '{hashing_algorithm}'")
        user = self.users.get(name)
        if user is None:
            user = self.users[name] = User(name, password_hash, list(tags or []), hashing_algorithm)
        else:
            user.password_hash = password_hash
            user.hashing_algorithm = hashing_algorithm
            user.tags = list(tags or [])
        return user

    def delete(self, name: str) -> bool:
        return self.users.pop(name, None) is not None

    def change_password(self, name: str, password: str) -> None:
        user = self.users[name]
        user.password_hash = hash_password(password)
        user.hashing_algorithm = SHA256

    def set_permissions(self, name: str, vhost: str, configure: str, write: str, read: str) -> None:
        """Raises KeyError for an unknown user and re.error for a bad regex."""
        self.users[name].permissions[vhost] = Permission(configure, write, read)

    def clear_permissions(self, name: str, vhost: str) -> bool:
        user = self.users.get(name)
        return user is not None and user.permissions.pop(vhost, None) is not None

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost takes every permission in it along."""
        for user in self.users.values():
            user.permissions.pop(vhost, None)
            user.topic_permissions.pop(vhost, None)

    def check_credentials(self, name: str, password: str) -> User | None:
        """For HTTP basic auth: the user if the password is right."""
        user = self.users.get(name)
        if user is None or not check_password(password, user.password_hash, user.hashing_algorithm):
            return None
        return user

    def authenticate_external(self, name: str | None, peer_host: str | None, loopback_users: set[str]) -> User | str:
        """EXTERNAL (rabbitmq_auth_mechanism_ssl): the user named by the client's verified certificate
        (``name``, None without one); no password is checked, as in RabbitMQ."""
        if name is None:
            return "EXTERNAL login refused: no peer certificate"
        user = self.users.get(name)
        if user is None:
            return f"EXTERNAL login refused: user '{name}' - invalid credentials"
        if name in loopback_users and not is_loopback(peer_host):
            return f"EXTERNAL login refused: user '{name}' can only connect via localhost"
        return user

    def authenticate(self, mechanism: str, response: bytes, peer_host: str | None,
                     loopback_users: set[str]) -> User | str:
        parse = MECHANISMS.get(mechanism)
        if parse is None:
            return f"unsupported authentication mechanism '{mechanism}'"
        try:
            name, password = parse(response)
        except SaslError as exc:
            return str(exc)
        internal = self.internal.get(name)
        if internal is not None and hmac.compare_digest(internal[0], password):
            return internal[1]
        user = self.check_credentials(name, password)
        if user is None:
            return f"{mechanism} login refused: user '{name}' - invalid credentials"
        if name in loopback_users and not is_loopback(peer_host):
            return f"{mechanism} login refused: user '{name}' can only connect via localhost"
        return user
