"""The ``name`` filter of the HTTP API's list endpoints, bounded (GHSA-rg5q-vcgf-rfh7): a case-insensitive
substring by default; with ``use_regex=true`` a regex of at most ``MAX_PATTERN`` characters with no repeat
nested in a repeat or holding an alternation (``(a+)+``, ``(a|aa)*``), read from the parsed pattern: the
shapes behind catastrophic backtracking in Python's ``re``. A refused or invalid pattern is a 400. Also the
``page`` / ``page_size`` options (RabbitMQ's, at most 500 a page). No import from the rest of the API, so
both ``common`` and ``listing`` can use it."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

# The stdlib's regex parser, for the parsed tree the risky shapes are read from. Private (typeshed has no stub
# for it), so imported by name: its values are untyped.
sre_parse = importlib.import_module("re._parser")

MAX_PATTERN = 256
MAX_PAGE_SIZE = 500  # RabbitMQ's


def _bad_request(reason: str) -> web.HTTPException:
    return web.HTTPBadRequest(text=json.dumps({"error": "bad_request", "reason": reason}),
                              content_type="application/json")


# (platform compatibility: POSSESSIVE_REPEAT exists from Python 3.11)
_REPEATS = (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, getattr(sre_parse, "POSSESSIVE_REPEAT", None))


def _risky(items: Any, inside_repeat: bool) -> bool:
    """True if a repeat (at most more than once) holds another such repeat or an alternation, at any depth."""
    for op, arg in items:
        if op in _REPEATS:
            _lo, hi, sub = arg
            repeats = hi is sre_parse.MAXREPEAT or hi > 1
            if repeats and inside_repeat:
                return True
            if _risky(sub, inside_repeat or repeats):
                return True
        elif op is sre_parse.BRANCH:
            if inside_repeat and len(arg[1]) > 1:
                return True
            if any(_risky(branch, inside_repeat) for branch in arg[1]):
                return True
        elif op is sre_parse.SUBPATTERN:
            if _risky(arg[-1], inside_repeat):
                return True
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            if _risky(arg[1], inside_repeat):
                return True
        elif op is sre_parse.GROUPREF_EXISTS and any(
                _risky(part, inside_repeat) for part in arg[1:] if part is not None):
            return True
    return False


def name_matcher(query: Any) -> Callable[[str], bool] | None:
    """The ``name`` filter of a query: a case-insensitive substring, or with ``use_regex=true`` a bounded
    regex; None without a filter."""
    text = query.get("name") or ""
    if not text:
        return None
    if query.get("use_regex") != "true":
        needle = text.lower()
        return lambda name: needle in name.lower()
    if len(text) > MAX_PATTERN:
        raise _bad_request(f"regex longer than {MAX_PATTERN} characters")
    try:
        tree = sre_parse.parse(text)
        pattern = re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise _bad_request(f"invalid regex: {exc}") from None
    if _risky(tree, False):
        raise _bad_request("regex refused: a repeat inside a repeat or alternation (catastrophic backtracking)")
    return lambda name: pattern.search(name) is not None


def page_params(query: Any) -> tuple[int, int] | None:
    """``(page, page_size)`` when the query asks for a page, else None."""
    if "page" not in query:
        return None
    try:
        page = int(query["page"])
        size = int(query.get("page_size", 100))
    except ValueError:
        raise _bad_request("page and page_size must be integers") from None
    if page < 1 or size < 1:
        raise _bad_request("page and page_size must be at least 1")
    if size > MAX_PAGE_SIZE:
        raise _bad_request(f"page_size must not exceed {MAX_PAGE_SIZE}")
    return page, size
