"""TLS material of an ``amqps://`` (or ``https://`` management) connection: options ``caFile`` (the CA, PEM, that
signed the broker's certificate: Kafka's truststore), ``certFile`` and ``keyFile`` (a client certificate
and its key, PEM, for a broker that asks for one: Kafka's keystore). Without ``caFile`` the system's CAs are
trusted; the broker's name (the ``uri``'s host) is always checked against its certificate.

The files are read once, on the driver, when the read or write is set up (a missing file fails there, naming
the option), and their text travels with the plan to the executors as the ``uri``'s password does: they
need not exist on the executors' machines, unlike Kafka's store locations. A client key is handed to
``ssl`` through a private temporary file (``load_cert_chain`` takes paths only), removed at once.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CA_HINT = "give the CA that signed the broker's certificate with option caFile"
CERT_HINT = "a broker that asks for a client certificate needs options certFile and keyFile"


def _read(options: Mapping[str, str], name: str) -> str | None:
    path = next((v for k, v in options.items() if k.lower() == name.lower()), None)
    if path is None or not path.strip():
        return None
    try:
        with open(os.path.expanduser(path.strip()), encoding="ascii") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"option {name}: cannot read {path!r}: {exc}") from None


@dataclass(frozen=True)
class TLSFiles:
    """The PEM texts of options caFile, certFile and keyFile (None when not given). Plain data."""

    ca_pem: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TLSFiles:
        files = cls(_read(options, "caFile"), _read(options, "certFile"), _read(options, "keyFile"))
        if files.key_pem is not None and files.cert_pem is None:
            raise ValueError("option keyFile needs certFile (the client certificate it belongs to)")
        files.context()  # a file that is no certificate or key fails here, on the driver
        return files

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.ca_pem, self.cert_pem, self.key_pem))

    def context(self) -> ssl.SSLContext:
        """A client context: certificate and host name checked, trusting ``caFile`` (else the system's CAs),
        presenting the client certificate when given."""
        try:
            ctx = ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else ssl.create_default_context()
        except ssl.SSLError as exc:
            raise ValueError(f"option caFile: no CA certificate in it ({exc})") from None
        if self.cert_pem is not None:
            # One private file holds the certificate and its key (keyFile, or the key inside certFile).
            fd, path = tempfile.mkstemp(prefix="leveret-client-", suffix=".pem")
            try:
                with os.fdopen(fd, "w", encoding="ascii") as f:
                    f.write(self.cert_pem.rstrip() + "\n" + (self.key_pem or ""))
                ctx.load_cert_chain(path)
            except ssl.SSLError as exc:
                raise ValueError(f"options certFile / keyFile: not a certificate and its key ({exc})") from None
            finally:
                os.unlink(path)
        return ctx


NO_TLS_FILES = TLSFiles()


def explain(exc: BaseException, where: str) -> str:
    """A TLS failure told with what to do about it."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS with {where}: the broker's certificate was not accepted ({exc.verify_message}): {CA_HINT}"
    return f"TLS with {where} failed ({exc}): {CERT_HINT}"


def pika_parameters(uri: str, files: TLSFiles) -> Any:
    """pika's parameters of ``uri``, using ``files`` for an ``amqps://`` one (pika's own default trusts the
    system's CAs only)."""
    import pika

    params = pika.URLParameters(uri)
    if params.ssl_options is not None and files.given:
        params.ssl_options = pika.SSLOptions(files.context(), params.host)
    return params
