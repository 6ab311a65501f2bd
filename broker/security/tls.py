"""TLS for AMQP (amqps) and HTTPS: a listener's ``ssl.SSLContext``, built once at start from RabbitMQ's keys
(``listeners.ssl.default`` with ``ssl_options.*``; ``management.ssl.*``; ``prometheus.ssl.*``: the same options
under three prefixes), why a handshake failed, and what a connection's TLS session is.

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

from broker.config import TLS13_CIPHER_SUITES, Settings, TLSOptions

AMQP_PREFIX = "ssl_options"

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


def listener_options(s: Settings, prefix: str = AMQP_PREFIX) -> TLSOptions:
    """The TLS keys of one listener by their prefix: ``ssl_options`` (amqps, whose port is
    listeners.ssl.default), ``management.ssl`` or ``prometheus.ssl``."""
    if prefix == AMQP_PREFIX:
        return TLSOptions(configured=s.ssl_port is not None, port=s.ssl_port, bind=s.ssl_bind,
                          cacertfile=s.ssl_cacertfile, certfile=s.ssl_certfile, keyfile=s.ssl_keyfile,
                          password=s.ssl_password, verify=s.ssl_verify,
                          fail_if_no_peer_cert=s.ssl_fail_if_no_peer_cert, versions=s.ssl_versions,
                          ciphers=s.ssl_ciphers)
    if prefix == "management.ssl":
        return s.management_ssl
    if prefix == "prometheus.ssl":
        return s.prometheus_ssl
    raise ValueError(f"no TLS listener keys under {prefix}")


def server_context(s: Settings, prefix: str = AMQP_PREFIX) -> tuple[ssl.SSLContext, list[str]]:
    """The context of the TLS listener whose keys start with ``prefix`` (AMQP's ``ssl_options``, HTTPS's
    ``management.ssl`` and ``prometheus.ssl``: the same options, so one builder), and warnings worth logging
    once (settings Python's ssl module cannot honour)."""
    o = listener_options(s, prefix)
    warnings: list[str] = []
    if o.certfile is None or o.keyfile is None:
        missing = " and ".join(f"{prefix}.{k}" for k, v in (("certfile", o.certfile), ("keyfile", o.keyfile))
                               if v is None)
        what = "listeners.ssl.default" if prefix == AMQP_PREFIX else f"{prefix}.*"
        raise TLSSetupError(f"{what} is set but {missing} {'is' if ' and ' not in missing else 'are'} "
                            "not: a TLS listener needs the server's certificate and private key")
    if o.verify == "verify_peer" and o.cacertfile is None:
        raise TLSSetupError(f"{prefix}.verify = verify_peer needs {prefix}.cacertfile (the CA certificates "
                            "client certificates are checked against)")
    if o.fail_if_no_peer_cert and o.verify != "verify_peer":
        raise TLSSetupError(f"{prefix}.fail_if_no_peer_cert = true needs {prefix}.verify = verify_peer "
                            "(with verify_none no client certificate is asked for)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted({_VERSIONS[v] for v in o.versions.values()}) or [ssl.TLSVersion.TLSv1_2,
                                                                      ssl.TLSVersion.TLSv1_3]
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    # No renegotiation (a client could make the server do handshakes at will) and no compression (CRIME).
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    certfile = _readable(f"{prefix}.certfile", o.certfile)
    keyfile = _readable(f"{prefix}.keyfile", o.keyfile)
    password = o.password

    def key_password() -> str:  # never the terminal prompt OpenSSL falls back on without one
        if password is None:
            raise TLSSetupError(f"{prefix}.keyfile = {keyfile} is encrypted: give its {prefix}.password")
        return password

    try:
        ctx.load_cert_chain(certfile, keyfile, password=key_password)
    except ssl.SSLError as exc:
        raise TLSSetupError(f"{prefix}.certfile = {certfile} and {prefix}.keyfile = {keyfile}: not a PEM "
                            f"certificate and its private key ({exc.reason or exc})") from None
    if o.cacertfile is not None:
        cafile = _readable(f"{prefix}.cacertfile", o.cacertfile)
        try:
            # Also where OpenSSL finds the intermediates to send after a certfile that holds the server's
            # certificate alone, as Erlang's ssl does with the cacertfile.
            ctx.load_verify_locations(cafile=cafile)
        except ssl.SSLError as exc:
            raise TLSSetupError(f"{prefix}.cacertfile = {cafile}: no PEM certificate in it "
                                f"({exc.reason or exc})") from None
    if o.verify == "verify_peer":
        ctx.verify_mode = ssl.CERT_REQUIRED if o.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ciphers = list(o.ciphers.values())
    tls12 = [c for c in ciphers if c not in TLS13_CIPHER_SUITES]
    if tls12:
        try:
            ctx.set_ciphers(":".join(tls12))
        except ssl.SSLError:
            raise TLSSetupError(f"{prefix}.ciphers: none of {', '.join(tls12)} can be used") from None
    if len(tls12) < len(ciphers) and ssl.TLSVersion.TLSv1_3 in versions:
        warnings.append(f"{prefix}.ciphers: TLS 1.3 suites are not restricted (Python's ssl module offers "
                        "OpenSSL's TLS 1.3 suites as they are); the list applies to TLS 1.2")
    return ctx, warnings


def handshake_failure_reason(exc: BaseException) -> str:
    """Why a TLS handshake failed, in a few words for the log: OpenSSL's reason (``tlsv1 alert unknown ca``:
    the client did not trust our certificate; ``unsupported protocol``: TLS 1.1 or older; ``wrong version
    number`` / ``http request``: not TLS at all), or the timeout or the closed socket."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"client certificate refused: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc).replace("_", " ").lower()
    if isinstance(exc, TimeoutError):
        return "handshake timed out"
    if isinstance(exc, (ConnectionError, EOFError)):
        return "connection closed by the client during the handshake"
    return str(exc) or type(exc).__name__


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
