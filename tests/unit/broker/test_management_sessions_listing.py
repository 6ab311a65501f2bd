"""The web UI's server-side pieces that need no process: the session table (expiry without sleeping,
sliding expiry, bounded size) and the bounded name filter of paged lists (no ReDoS-prone regex)."""

from __future__ import annotations

import pytest
from aiohttp import web

from broker.management import sessions
from broker.management.name_filter import MAX_PATTERN, name_matcher, page_params
from broker.management.sessions import SessionTable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_session_expires_after_idle_timeout_and_use_slides_it() -> None:
    clock = Clock()
    table = SessionTable(timeout_s=10, clock=clock)
    token, session = table.create("alice", "hash")
    assert len(token) >= 40 and session.csrf != token
    clock.now += 9
    assert table.get(token) is session  # used at 9 s: expires 10 s from now
    clock.now += 9
    assert table.get(token) is session
    clock.now += 10.5
    assert table.get(token) is None
    assert table.get(token) is None and len(table) == 0


def test_unknown_tokens_and_logout() -> None:
    table = SessionTable()
    a, _ = table.create("alice", "h")
    b, _ = table.create("bob", "h")
    assert table.get(None) is None and table.get("") is None and table.get("forged") is None
    table.delete(b)
    assert table.get(b) is None and table.get(a) is not None and len(table) == 1


def test_tokens_are_unique_and_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "MAX_SESSIONS", 5)
    clock = Clock()
    table = SessionTable(clock=clock)
    tokens = []
    for _ in range(8):
        clock.now += 1
        tokens.append(table.create("u", "h")[0])
    assert len(set(tokens)) == 8 and len(table) == 5
    assert table.get(tokens[0]) is None and table.get(tokens[-1]) is not None


def test_name_filter_substring_is_case_insensitive_and_literal() -> None:
    match = name_matcher({"name": "Ord.Er"})
    assert match is not None
    assert match("my-ord.ers") and not match("orderer")
    assert name_matcher({}) is None and name_matcher({"name": ""}) is None


def test_regex_filter_works_and_is_bounded() -> None:
    match = name_matcher({"name": "^ord.*-[0-9]+$", "use_regex": "true"})
    assert match is not None and match("orders-12") and not match("orders-x")
    for bad in ("(a+)+$", "(a|aa)*b", "(x*){2,}", "(?:a+)+", "((ab)*)+", "(\\w+\\s?)*$"):
        with pytest.raises(web.HTTPBadRequest):
            name_matcher({"name": bad, "use_regex": "true"})
    with pytest.raises(web.HTTPBadRequest):
        name_matcher({"name": "a" * (MAX_PATTERN + 1), "use_regex": "true"})
    with pytest.raises(web.HTTPBadRequest):
        name_matcher({"name": "([", "use_regex": "true"})
    # The same text without use_regex is a plain substring, never compiled.
    assert name_matcher({"name": "(a+)+$"}) is not None


def test_page_params() -> None:
    assert page_params({}) is None
    assert page_params({"page": "2"}) == (2, 100)
    assert page_params({"page": "1", "page_size": "500"}) == (1, 500)
    for bad in ({"page": "0"}, {"page": "x"}, {"page": "1", "page_size": "501"}, {"page": "1", "page_size": "0"}):
        with pytest.raises(web.HTTPBadRequest):
            page_params(bad)
