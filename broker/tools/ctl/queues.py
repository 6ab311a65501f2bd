"""Verbs on one queue by name: rabbitmqctl's purge_queue and delete_queue (``--if-empty``, ``--if-unused``),
over /api/queues."""

from __future__ import annotations

import argparse
import urllib.parse

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import need
from broker.tools.ctl.verb import Verb, VerbGroup


def purge_queue(api: Api, args: argparse.Namespace) -> str:
    vhost = args.vhost
    (name,) = need(args, 1, "[-p VHOST] QUEUE")
    api.request("DELETE", f"/api/queues/{q(vhost)}/{q(name)}/contents")
    return f"Purging queue '{name}' in vhost '{vhost}' ..."


def delete_queue(api: Api, args: argparse.Namespace) -> str:
    """Reads the queue first, for rabbitmqctl's "deleted with N ready messages" line."""
    vhost = args.vhost
    (name,) = need(args, 1, "[-p VHOST] [--if-empty] [--if-unused] QUEUE")
    queue = api.get(f"/api/queues/{q(vhost)}/{q(name)}")
    params = urllib.parse.urlencode({k: "true" for k, on in (("if-empty", args.if_empty),
                                                             ("if-unused", args.if_unused)) if on})
    api.request("DELETE", f"/api/queues/{q(vhost)}/{q(name)}" + (f"?{params}" if params else ""))
    return f"Deleting queue '{name}' on vhost '{vhost}' ...\nQueue was successfully deleted with " \
           f"{queue.get('messages', 0)} ready messages"


GROUP = VerbGroup({
    "purge_queue": Verb(purge_queue, only_banner=True),
    "delete_queue": Verb(delete_queue, only_banner=True),
})
