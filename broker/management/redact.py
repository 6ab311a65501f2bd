"""The settings as the HTTP API shows them (``/api/leveret/environment``, ``leveret ctl environment``): every
setting, secrets never (docs/decisions/http-api-limits.md: ``ssl_options.password`` was shown).

A setting whose name says it is a secret (a password, a secret) shows ``"[hidden]"`` when set, so an operator
still sees that it is; the default user's password is left out altogether. A PostgreSQL DSN
(``cluster.postgres.dsn``) shows without the password of its user part or a ``password=`` query parameter.
Nested option groups (``management.ssl.*``) are shown by their repr, which leaves the password out
(``TLSOptions.password`` has ``repr=False``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

from broker.clustering.cluster_errors import safe_dsn
from broker.config import Settings

HIDDEN = "[hidden]"
_LEFT_OUT = frozenset({"default_pass", "startup_warnings"})
_SECRET_NAME = re.compile(r"pass(word)?|secret|token", re.IGNORECASE)
_DSN_FIELDS = frozenset({"cluster_dsn"})


def dsn_without_password(dsn: str) -> str:
    """``postgresql://user:pw@host/db?password=pw&sslmode=x`` → ``postgresql://user@host/db?sslmode=x``."""
    head, sep, query = safe_dsn(dsn).partition("?")
    if not sep:
        return head
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if not _SECRET_NAME.search(k)]
    return f"{head}?{urlencode(kept)}" if kept else head


def settings_view(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        if f.name in _LEFT_OUT:
            continue
        value = getattr(settings, f.name)  # reflection over the dataclass's declared fields
        if _SECRET_NAME.search(f.name):
            value = HIDDEN if value else None
        elif f.name in _DSN_FIELDS and isinstance(value, str):
            value = dsn_without_password(value)
        if isinstance(value, set):
            value = sorted(value)
        elif not isinstance(value, (str, int, float, list, dict)) and value is not None:
            value = str(value)  # a Path, an option group, a type a setting may take later: shown, never a 500
        out[f.name] = value
    return out
