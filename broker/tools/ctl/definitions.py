"""Definitions (RabbitMQ's JSON of users, vhosts, permissions, policies, queues, exchanges, bindings):
rabbitmqctl's export_definitions and import_definitions, to and from a file or the standard streams, over
/api/definitions."""

from __future__ import annotations

import argparse
import json
import sys

from broker.tools.ctl.api import Api
from broker.tools.ctl.arguments import need
from broker.tools.ctl.errors import CtlError
from broker.tools.ctl.verb import Verb, VerbGroup


def export_definitions(api: Api, args: argparse.Namespace) -> str:
    """To ``-`` the definitions are the output itself, so ``-q`` keeps them."""
    (path,) = need(args, 1, "PATH (- for stdout)")
    data = api.get("/api/definitions")
    text = json.dumps(data, indent=2)
    if path == "-":
        return text
    with open(path, "w") as f:
        f.write(text + "\n")
    return f"Exporting definitions in JSON to a file at \"{path}\" ..."


def import_definitions(api: Api, args: argparse.Namespace) -> str:
    (path,) = need(args, 1, "PATH (- for stdin)")
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path) as f:
                text = f.read()
        data = json.loads(text)
    except OSError as exc:
        raise CtlError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CtlError(f"{path} is not JSON: {exc}") from None
    api.request("POST", "/api/definitions", data)
    return f"Importing definitions in JSON from a file at \"{path}\" ...\nSuccessfully started definition import."


GROUP = VerbGroup({
    "export_definitions": Verb(export_definitions),
    "import_definitions": Verb(import_definitions, only_banner=True),
})
