"""A verb's arguments, checked as rabbitmqctl checks them: how many, JSON, sizes and bounded numbers, and the
look-ups that turn a vhost or user that does not exist into rabbitmqctl's exit code (65, 67) and words."""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.config import parse_bytes
from broker.tools.ctl.api import Api, q
from broker.tools.ctl.errors import EX_DATAERR, EX_NOUSER, CtlError


def need(args: argparse.Namespace, n: int, usage: str) -> list[str]:
    """Exactly ``n`` positional arguments after the verb, else its usage line (exit 64)."""
    if len(args.columns) != n:
        raise CtlError(f"usage: leveret ctl {args.verb} {usage}", 2)
    return list(args.columns)


def json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not JSON: {exc}", 2) from None


def bytes_arg(text: str) -> int:
    """A size as the configuration file writes one (``50000000``, ``2GB``)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise CtlError(f"bad size {text!r}: {exc}", 2) from None


def number_arg(text: str, what: str, above: float, at_most: float | None) -> float:
    """A number ``above < n <= at_most`` (rabbitmqctl refuses others as a bad argument: EX_DATAERR, 65)."""
    try:
        n = float(text)
    except ValueError:
        n = float("nan")
    if not (n > above and (at_most is None or n <= at_most)):
        bound = f" and at most {at_most}" if at_most is not None else ""
        raise CtlError(f"{what} must be a number above {above}{bound}, got {text!r}", EX_DATAERR)
    return n


def existing_user(api: Api, name: str) -> dict[str, Any]:
    """The user as the API has it (its tags, its hash), or the error the verbs that change a user give (1)."""
    user: dict[str, Any] | None = api.get(f"/api/users/{q(name)}", ok_missing=True)
    if user is None:
        raise CtlError(f"user '{name}' does not exist")
    return user


def vhost_exists(api: Api, vhost: str) -> None:
    if api.get(f"/api/vhosts/{q(vhost)}", ok_missing=True) is None:
        raise CtlError(f"Virtual host '{vhost}' does not exist", EX_DATAERR)


def user_exists(api: Api, name: str) -> None:
    if api.get(f"/api/users/{q(name)}", ok_missing=True) is None:
        raise CtlError(f"User '{name}' does not exist", EX_NOUSER)
