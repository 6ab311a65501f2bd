"""Login sessions of the web UI: a random token in an HttpOnly cookie names a server-side entry (user
name, CSRF token, expiry). The browser never holds the credentials (RabbitMQ once kept ``user:password``
in a cookie, GHSA-88vh-gx85-p36m); a stolen cookie alone cannot change anything without the CSRF token,
which the page keeps in memory only."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "leveret_session"
CSRF_HEADER = "X-CSRF-Token"
# RabbitMQ's management.login_session_timeout default, 8 hours: the HTTP app makes its table with the
# key's value (Settings.login_session_timeout, minutes; broker/management/app.py).
DEFAULT_TIMEOUT_S = 480 * 60
MAX_SESSIONS = 10_000  # a flood of logins cannot grow the table without bound


@dataclass(slots=True)
class Session:
    user: str
    csrf: str
    expires: float
    password_hash: str  # the user's at login: a changed password ends the session


class SessionTable:
    """Sessions by token. ``clock`` is injectable so expiry is tested without sleeping. Each use of a
    session slides its expiry forward, as RabbitMQ's UI timeout counts idle time."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def create(self, user: str, password_hash: str) -> tuple[str, Session]:
        self._expire()
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions, key=lambda t: self._sessions[t].expires)
            del self._sessions[oldest]
        token = secrets.token_urlsafe(32)
        session = Session(user, secrets.token_urlsafe(32), self._clock() + self.timeout_s, password_hash)
        self._sessions[token] = session
        return token, session

    def get(self, token: str | None) -> Session | None:
        """The live session of ``token`` (its expiry extended), or None if unknown or expired."""
        if not token:
            return None
        session = self._sessions.get(token)
        if session is None:
            return None
        now = self._clock()
        if session.expires <= now:
            del self._sessions[token]
            return None
        session.expires = now + self.timeout_s
        return session

    def delete(self, token: str | None) -> None:
        if token:
            self._sessions.pop(token, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[token]
