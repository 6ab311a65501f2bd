"""Leveret's broker: the AMQP 0-9-1 message path from socket to queue and back (see docs/architecture.md)."""

from importlib.metadata import PackageNotFoundError, version


def _installed_version() -> str:
    """The version of the installed ``leveret`` distribution (pyproject.toml's, through its metadata), so
    ``leveret --version``, the start-up banner, the HTTP API and the definitions export say what pip says; a
    second copy of the number here once could drift from it. A checkout run without an install says so."""
    try:
        return version("leveret")
    except PackageNotFoundError:
        return "0+unknown"


PRODUCT = "Leveret"
VERSION = _installed_version()
