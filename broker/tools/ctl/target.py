"""Where the broker is and who logs in: the options ``leveret ctl`` and ``leveret diagnostics`` share (URL,
configuration file, credentials, TLS files), and how the ones not given are found after parsing — the
LEVERET_CTL_* variables, else the broker's own configuration, so that in the shell that configured a broker
the clients talk to that broker and not to whatever answers on 15672."""

from __future__ import annotations

import argparse
import os
import ssl

from broker.config import ConfigError, Settings, env_name, load_settings, management_url
from broker.tools.ctl.errors import EX_CONFIG, EX_UNAVAILABLE, CtlError


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the broker is and who logs in (ctl and diagnostics): resolved after parsing by
    :func:`resolve_target`, since the defaults come from the configuration ``--config`` names."""
    parser.add_argument("--url", default=None,
                        help="the broker's HTTP API (default $LEVERET_CTL_URL, else where the broker's "
                             "configuration puts it: management.tcp.port and .ip, or https on management.ssl.port)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="the broker's configuration file, read with the LEVERET_* variables as leveret serve "
                             "reads them, for the defaults of --url, --username and --password (default "
                             "$LEVERET_CONFIG_FILE)")
    parser.add_argument("--username", "-u", default=None,
                        help="default $LEVERET_CTL_USERNAME, else the configuration's default_user (guest)")
    parser.add_argument("--password", default=None,
                        help="default $LEVERET_CTL_PASSWORD, else the configuration's default_pass (guest)")


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of an ``https://`` --url (ctl and diagnostics)."""
    parser.add_argument("--cacert", default=os.environ.get("LEVERET_CTL_CACERT"), metavar="FILE",
                        help="HTTPS: the CA certificates (PEM) the server's certificate is checked against")
    parser.add_argument("--cert", default=None, metavar="FILE", help="HTTPS: a client certificate (PEM)")
    parser.add_argument("--key", default=None, metavar="FILE", help="HTTPS: the client certificate's key")
    parser.add_argument("--insecure", action="store_true",
                        help="HTTPS: do not check the server's certificate or name")


def _configuration_origin(settings: Settings) -> str:
    """How a URL derived from ``settings`` came to be, for the error that names it."""
    env_keys = ("management.tcp.port", "management.tcp.ip", "management.listener.port", "management.listener.ip",
                "management.ssl.port", "management.ssl.ip", "listeners.tcp.default")
    names = [env_name(key) for key in env_keys if env_name(key) in os.environ]
    parts = [str(path) for path in settings.config_files] + names
    return "the broker's configuration: " + (", ".join(parts) if parts else "its defaults")


def resolve_target(args: argparse.Namespace) -> None:
    """Fill in ``args.url``, ``args.username``, ``args.password`` (and, over HTTPS, ``args.cacert``) that were
    not given: the LEVERET_CTL_* variables, else the broker's own settings (the file of ``--config`` or
    LEVERET_CONFIG_FILE, then the LEVERET_* variables), read only when something is missing. Sets
    ``args.origin``, where the URL came from."""
    env = os.environ
    loaded: list[Settings] = []

    def settings() -> Settings:
        if not loaded:
            try:
                loaded.append(load_settings(args.config))
            except ConfigError as exc:
                raise CtlError(f"the broker's configuration, read for the defaults of --url, --username and "
                               f"--password, has an error (or give them): {exc}", EX_CONFIG) from None
        return loaded[0]

    if args.url:
        args.origin = "--url"
    elif env.get("LEVERET_CTL_URL"):
        args.url, args.origin = env["LEVERET_CTL_URL"], "LEVERET_CTL_URL"
    else:
        url = management_url(settings())
        if url is None:
            raise CtlError("the broker's configuration turns its HTTP API off (management.tcp.port = 0 and no "
                           "management.ssl.*), which ctl talks to: give --url", EX_UNAVAILABLE)
        args.url, args.origin = url, _configuration_origin(settings())
        if url.startswith("https:") and args.cacert is None and settings().management_ssl.cacertfile:
            args.cacert = str(settings().management_ssl.cacertfile)
    if args.username is None:
        args.username = env.get("LEVERET_CTL_USERNAME") or settings().default_user
    if args.password is None:
        args.password = env.get("LEVERET_CTL_PASSWORD")
        if args.password is None:
            args.password = settings().default_pass


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The client context of an ``https://`` --url (None for http://); a file that cannot be used is a usage
    error (exit 2) naming it."""
    if not args.url.lower().startswith("https:"):
        return None
    try:
        ctx = ssl.create_default_context(cafile=args.cacert)
        if args.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if args.cert:
            ctx.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as exc:
        raise CtlError(f"cannot use the TLS files given (--cacert / --cert / --key): {exc}", 2) from None
    return ctx
