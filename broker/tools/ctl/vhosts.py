"""Virtual hosts: rabbitmqctl's add_vhost and delete_vhost, and trace_on / trace_off, which set the vhost's
``tracing`` flag (the firehose, broker/observability/trace.py), over /api/vhosts."""

from __future__ import annotations

import argparse

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import need
from broker.tools.ctl.errors import CtlError
from broker.tools.ctl.verb import Verb, VerbGroup


def add_vhost(api: Api, args: argparse.Namespace) -> str:
    (name,) = need(args, 1, "VHOST")
    api.request("PUT", f"/api/vhosts/{q(name)}", {"description": args.description or "",
                                                  "tags": args.tags or ""})
    return f"Adding vhost \"{name}\" ..."


def delete_vhost(api: Api, args: argparse.Namespace) -> str:
    (name,) = need(args, 1, "VHOST")
    api.request("DELETE", f"/api/vhosts/{q(name)}")
    return f"Deleting vhost \"{name}\" ..."


def trace(api: Api, args: argparse.Namespace) -> str:
    """trace_on and trace_off."""
    vhost = args.vhost
    need(args, 0, "[-p VHOST]")
    # rabbitmqctl answers "enabled" even for a vhost that does not exist; a PUT would create it here.
    if api.get(f"/api/vhosts/{q(vhost)}", ok_missing=True) is None:
        raise CtlError(f"vhost '{vhost}' does not exist")
    on = args.verb == "trace_on"
    api.request("PUT", f"/api/vhosts/{q(vhost)}", {"tracing": on})
    return (f"Starting tracing for vhost \"{vhost}\" ...\nTrace enabled for vhost {vhost}" if on else
            f"Stopping tracing for vhost \"{vhost}\" ...\nTrace disabled for vhost {vhost}")


GROUP = VerbGroup({
    "add_vhost": Verb(add_vhost, only_banner=True),
    "delete_vhost": Verb(delete_vhost, only_banner=True),
    "trace_on": Verb(trace, only_banner=True),
    "trace_off": Verb(trace, only_banner=True),
})
