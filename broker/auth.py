"""Users, their password hashes (RabbitMQ's format) and the SASL mechanisms PLAIN and AMQPLAIN.

A password hash is RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt(4 bytes) + SHA-256(salt +
password)), so a definitions file exported from RabbitMQ imports with its passwords intact.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
from dataclasses import dataclass, field

from pamqp import decode


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash)
    except ValueError:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(hashlib.sha256(salt + password.encode()).digest(), digest)


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)


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
    except Exception:
        raise SaslError("AMQPLAIN response is not a field table") from None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if login is None or password is None:
        raise SaslError("AMQPLAIN response lacks LOGIN or PASSWORD")
    as_str = lambda v: v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)  # noqa: E731
    return as_str(login), as_str(password)


MECHANISMS = {"PLAIN": parse_plain, "AMQPLAIN": parse_amqplain}


def is_loopback(address: str | None) -> bool:
    if not address:
        return True  # a Unix socket
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class UserStore:
    """The broker's users. ``authenticate`` returns the user or the reason for refusing, in RabbitMQ's words."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    def add(self, name: str, password: str, tags: list[str] | None = None) -> User:
        user = User(name, hash_password(password), list(tags or []))
        self.users[name] = user
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
        user = self.users.get(name)
        if user is None or not check_password(password, user.password_hash):
            return f"{mechanism} login refused: user '{name}' - invalid credentials"
        if name in loopback_users and not is_loopback(peer_host):
            return f"{mechanism} login refused: user '{name}' can only connect via localhost"
        return user
