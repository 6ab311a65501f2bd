"""TLS for AMQP (amqps): the server's ``ssl.SSLContext``, built once at start from RabbitMQ's keys
(``listeners.ssl.default``, ``ssl_options.*``), and what a connection's TLS session is.

As RabbitMQ: ``ssl_options.verify = verify_peer`` asks the client for a certificate and checks it against
``ssl_options.cacertfile``; with ``fail_if_no_peer_cert = true`` a client without one is refused too (else it
may go on without). TLS 1.2 and 1.3 by default (``ssl_options.versions.N`` narrows that; nothing older is
offered), with OpenSSL's default ciphers unless ``ssl_options.ciphers.N`` lists them.

A file that is missing or unreadable, or a combination that cannot work, stops start-up (TLSSetupError, one
line naming the key), before anything else is started: RabbitMQ too refuses to start a TLS listener whose
files it cannot read.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from broker.config import TLS13_CIPHER_SUITES, Settings

_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}
# RabbitMQ's names of the protocol versions (its ssl_protocol field), by Python's.
_PROTOCOL_NAMES = {"TLSv1.3": "tlsv1.3", "TLSv1.2": "tlsv1.2", "TLSv1.1": "tlsv1.1", "TLSv1": "tlsv1"}


class TLSSetupError(Exception):
    """The TLS listener cannot be set up: the text names the key and the file or value."""


def _readable(key: str, path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise TLSSetupError(f"{key} = {path}: cannot read it: {exc.strerror or exc}") from None
    return str(path)


def server_context(s: Settings) -> tuple[ssl.SSLContext, list[str]]:
    """The context of the AMQP-over-TLS listener, and warnings worth logging once (settings Python's ssl
    module cannot honour)."""
    warnings: list[str] = []
    if s.ssl_certfile is None or s.ssl_keyfile is None:
        missing = " and ".join(k for k, v in (("ssl_options.certfile", s.ssl_certfile),
                                              ("ssl_options.keyfile", s.ssl_keyfile)) if v is None)
        raise TLSSetupError(f"listeners.ssl.default is set but {missing} {'is' if ' and ' not in missing else 'are'} "
                            "not: a TLS listener needs the server's certificate and private key")
    if s.ssl_verify == "verify_peer" and s.ssl_cacertfile is None:
        raise TLSSetupError("ssl_options.verify = verify_peer needs ssl_options.cacertfile (the CA certificates "
                            "client certificates are checked against)")
    if s.ssl_fail_if_no_peer_cert and s.ssl_verify != "verify_peer":
        raise TLSSetupError("ssl_options.fail_if_no_peer_cert = true needs ssl_options.verify = verify_peer "
                            "(with verify_none no client certificate is asked for)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted({_VERSIONS[v] for v in s.ssl_versions.values()}) or [ssl.TLSVersion.TLSv1_2,
                                                                          ssl.TLSVersion.TLSv1_3]
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    # No renegotiation (a client could make the server do handshakes at will) and no compression (CRIME).
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    certfile = _readable("ssl_options.certfile", s.ssl_certfile)
    keyfile = _readable("ssl_options.keyfile", s.ssl_keyfile)
    password = s.ssl_password

    def key_password() -> str:  # never the terminal prompt OpenSSL falls back on without one
        if password is None:
            raise TLSSetupError(f"ssl_options.keyfile = {keyfile} is encrypted: give its ssl_options.password")
        return password

    try:
        ctx.load_cert_chain(certfile, keyfile, password=key_password)
    except ssl.SSLError as exc:
        raise TLSSetupError(f"ssl_options.certfile = {certfile} and ssl_options.keyfile = {keyfile}: not a PEM "
                            f"certificate and its private key ({exc.reason or exc})") from None
    if s.ssl_cacertfile is not None:
        cafile = _readable("ssl_options.cacertfile", s.ssl_cacertfile)
        try:
            # Also where OpenSSL finds the intermediates to send after a certfile that holds the server's
            # certificate alone, as Erlang's ssl does with the cacertfile.
            ctx.load_verify_locations(cafile=cafile)
        except ssl.SSLError as exc:
            raise TLSSetupError(f"ssl_options.cacertfile = {cafile}: no PEM certificate in it "
                                f"({exc.reason or exc})") from None
    if s.ssl_verify == "verify_peer":
        ctx.verify_mode = ssl.CERT_REQUIRED if s.ssl_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ciphers = list(s.ssl_ciphers.values())
    tls12 = [c for c in ciphers if c not in TLS13_CIPHER_SUITES]
    if tls12:
        try:
            ctx.set_ciphers(":".join(tls12))
        except ssl.SSLError:
            raise TLSSetupError(f"ssl_options.ciphers: none of {', '.join(tls12)} can be used") from None
    if len(tls12) < len(ciphers) and ssl.TLSVersion.TLSv1_3 in versions:
        warnings.append("ssl_options.ciphers: TLS 1.3 suites are not restricted (Python's ssl module offers "
                        "OpenSSL's TLS 1.3 suites as they are); the list applies to TLS 1.2")
    return ctx, warnings


def _name(rdns: Any) -> str | None:
    """A certificate name as RabbitMQ writes it (RFC 4514 order: the most specific part first), e.g.
    ``CN=client,O=Example``."""
    if not rdns:
        return None
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "localityName": "L", "stateOrProvinceName": "ST", "domainComponent": "DC", "emailAddress": "EMAIL",
             "serialNumber": "SERIALNUMBER", "userId": "UID", "streetAddress": "STREET"}
    parts = ["+".join(f"{short.get(k, k)}={v}" for k, v in rdn) for rdn in rdns]
    return ",".join(reversed(parts))


def connection_tls_info(transport: Any) -> dict[str, Any]:
    """The HTTP API's TLS fields of a connection (RabbitMQ's ``ssl``, ``ssl_protocol``, ``ssl_cipher``,
    ``peer_cert_subject``, ``peer_cert_issuer``, ``peer_cert_validity``): null but ``ssl`` on a plain one."""
    obj = transport.get_extra_info("ssl_object") if transport is not None else None
    info: dict[str, Any] = {"ssl": obj is not None, "ssl_protocol": None, "ssl_cipher": None,
                            "peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None}
    if obj is None:
        return info
    cipher = obj.cipher()
    version = obj.version()
    info["ssl_protocol"] = _PROTOCOL_NAMES.get(version or "", version)
    info["ssl_cipher"] = cipher[0] if cipher else None
    cert = obj.getpeercert()  # {} or None without a verified client certificate
    if cert:
        info["peer_cert_subject"] = _name(cert.get("subject"))
        info["peer_cert_issuer"] = _name(cert.get("issuer"))
        if "notBefore" in cert:
            info["peer_cert_validity"] = f"{cert['notBefore']} - {cert['notAfter']}"
    return info


def peer_login_name(transport: Any, login_from: str) -> str | None:
    """The user name EXTERNAL logs in as (rabbitmq_auth_mechanism_ssl): the verified client certificate's
    subject as a distinguished name (``ssl_cert_login_from = distinguished_name``, RabbitMQ's default: the
    RFC 4514 form of :func:`_name`) or its common name (``common_name``); None without a verified certificate."""
    obj = transport.get_extra_info("ssl_object") if transport is not None else None
    cert = obj.getpeercert() if obj is not None else None  # {} when the certificate was not verified
    if not cert:
        return None
    subject = cert.get("subject")
    if login_from == "common_name":
        names = [v for rdn in subject or () for k, v in rdn if k == "commonName"]
        return names[-1] if names else None
    return _name(subject)
