"""ctl's command line: the verb table (which module serves each verb) and the parser built from it — ctl's
own options, the options a group of verbs adds, the verb and its arguments. A new group of verbs is a module
with a ``VerbGroup`` and one line in ``GROUPS``."""

from __future__ import annotations

import argparse

from broker.tools.ctl import (
    cluster,
    connections,
    definitions,
    delayed,
    limits,
    links,
    listing,
    migration,
    node,
    policies,
    queues,
    users,
    vhosts,
)
from broker.tools.ctl.errors import UsageParser
from broker.tools.ctl.target import add_target_arguments, add_tls_arguments
from broker.tools.ctl.verb import Verb, VerbGroup

CTL_DOC = """``leveret ctl VERB ...``: rabbitmqctl's verbs and info columns, over the broker's HTTP API.

    leveret ctl list_queues name messages_ready messages_unacknowledged consumers
    leveret ctl -p /orders set_permissions app '^app\\.' '^app\\.' '^app\\.'
    leveret ctl --formatter json list_exchanges name type
    leveret ctl -p /orders list_stream_groups stream group committed_offset lag members
    leveret ctl -p /orders list_delayed reminders id due routing_key properties.message_id

``list_stream_groups`` (Leveret's, also as ``list_stream_consumer_groups``, the name of rabbitmq-streams'
verb) lists the consumer groups of the vhost's stream queues; its columns: ``stream``, ``group`` (or
``reference``), ``committed_offset`` (or ``committed``), ``cursor``, ``outstanding``, ``lag``, ``members``
(or ``consumers``) and ``next_offset``. ``list_queues`` shows a stream's ``type`` (stream), ``first_offset``,
``last_offset``, ``next_offset``, ``segments`` and ``stream_bytes`` when asked for those columns.

``list_delayed EXCHANGE [COLUMN ...]`` lists the pending messages of an ``x-delayed-message`` exchange by
due time (columns: ``id``, ``due``, ``due_ms``, ``delay_ms``, ``routing_key``, ``size``, ``payload_bytes``,
``persistent``, ``properties`` or ``properties.NAME``); ``cancel_delayed EXCHANGE ID`` cancels one (the id
as listed), ``purge_delayed EXCHANGE`` all of them.

The API is found at ``--url``, by default ``$LEVERET_CTL_URL``, else where the broker's own configuration puts
it: ctl reads the settings ``leveret serve`` reads (``--config FILE`` or ``$LEVERET_CONFIG_FILE``, then the
``LEVERET_*`` variables: ``management.tcp.port`` / ``.ip``, HTTPS on ``management.ssl.port`` when only
``management.ssl.*`` is set), so in the shell that configured a broker, ctl talks to that broker and not to
whatever answers on 15672. ``--username`` / ``--password`` default to ``$LEVERET_CTL_USERNAME`` /
``$LEVERET_CTL_PASSWORD``, else the configuration's ``default_user`` / ``default_pass`` (guest / guest). When
the API cannot be reached, the one-line error names the URL and where it came from (exit 69). Over HTTPS (an ``https://`` URL: ``management.ssl.*``), the server's certificate is checked
against ``--cacert FILE`` (``$LEVERET_CTL_CACERT``; else the system's CAs), ``--cert`` / ``--key`` give a
client certificate (for ``management.ssl.verify = verify_peer``), ``--insecure`` checks nothing (as curl's
``-k`` and rabbitmqadmin's ``--ssl-insecure``). ``-p`` names the vhost as in rabbitmqctl. Output is an aligned table, or JSON with
``--formatter json``. Exit codes, rabbitmqctl's (sysexits): 0 done, 1 refused by the broker, 64 (EX_USAGE) a
usage error (a missing argument, an unknown option, an info column the verb does not have: the error names
the ones it has), 65 (EX_DATAERR) a bad argument (a vhost that does not exist, given with ``-p`` or as an
argument; a fraction out of range), 67 (EX_NOUSER) no such user, 69 (EX_UNAVAILABLE) broker unreachable (or,
for ``await_startup``, not up in time; for ``rotate_logs``, no on-demand log rotation in Leveret), 78
(EX_CONFIG) the broker's configuration, read for the defaults, has an error.

The verbs operators type daily, with rabbitmqctl's argument shapes: ``list_user_permissions USER``,
``list_topic_permissions [-p VHOST]``, ``list_user_topic_permissions USER``, ``list_vhost_limits [-p VHOST]
[--global]``, ``list_user_limits [USER]``, ``list_parameters [-p VHOST]``, ``environment`` (the settings in
force), ``cluster_status`` (the node and its cluster's other members), ``set_cluster_name NAME`` (the
cluster's, kept in its database), ``forget_cluster_node NODE``, ``await_startup [-t SECONDS]``, ``close_all_connections [-p VHOST]
[--global] [--per-connection-delay MS] [--limit N] EXPLANATION``, ``close_all_user_connections USER
EXPLANATION``, ``set_vm_memory_high_watermark FRACTION | absolute SIZE``, ``set_disk_free_limit SIZE |
mem_relative MULTIPLE``. rabbitmq-diagnostics' health checks are ``leveret diagnostics ...``
(``leveret diagnostics --help``).
"""

# Every verb, by the group that serves it, in the order `leveret ctl --help` lists them. A new group: its module
# (a VerbGroup of its verbs, and its options hook if its verbs read options of their own) and one line at the
# end of this tuple. Some modules appear more than once only so that the list reads as it did before ctl.py was
# split by job (the help's verb list and argparse's "choose from" error are unchanged).
GROUPS: tuple[VerbGroup, ...] = (
    listing.GROUP,
    users.USERS,
    vhosts.GROUP,
    policies.POLICIES,
    queues.GROUP,
    connections.CLOSE_ONE,
    definitions.GROUP,
    node.STATUS,
    limits.SET_LIMITS,
    users.TOPIC_PERMISSIONS,
    delayed.GROUP,
    users.PERMISSION_LISTS,
    limits.LIMIT_LISTS,
    policies.PARAMETERS,
    links.GROUP,
    node.ENVIRONMENT,
    cluster.GROUP,
    node.STARTUP_AND_LOGS,
    connections.CLOSE_ALL,
    migration.GROUP,
)


def verb_table(groups: tuple[VerbGroup, ...]) -> dict[str, Verb]:
    """The groups' verbs in one table; a verb two groups declare is a mistake, refused here."""
    table: dict[str, Verb] = {}
    for group in groups:
        for name, verb in group.verbs.items():
            if name in table:
                raise ValueError(f"ctl verb {name} is declared twice")
            table[name] = verb
    return table


VERBS = verb_table(GROUPS)


def build_parser(groups: tuple[VerbGroup, ...] = GROUPS) -> argparse.ArgumentParser:
    """``leveret ctl``'s parser: options may come before or after the verb (parse_intermixed_args), as with
    rabbitmqctl. The options below are ctl's common ones, each named by the verbs that read it; then each
    group's own, and the verbs of ``groups`` as the choices."""
    ctl = UsageParser(prog="leveret ctl", description=CTL_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(ctl)
    add_tls_arguments(ctl)
    ctl.add_argument("-p", "--vhost", default=None, help="virtual host (default /)")
    ctl.add_argument("--formatter", choices=("table", "json"), default="table")
    ctl.add_argument("-q", "--quiet", action="store_true", help="no informational header line")
    ctl.add_argument("--priority", type=int, default=0, help="set_policy: priority")
    ctl.add_argument("--apply-to", default="all", help="set_policy: all, queues, exchanges, ...")
    ctl.add_argument("--description", help="add_vhost: description")
    ctl.add_argument("--tags", help="add_vhost: comma-separated tags")
    ctl.add_argument("--if-empty", action="store_true", help="delete_queue: only if empty")
    ctl.add_argument("--if-unused", action="store_true", help="delete_queue: only if it has no consumers")
    ctl.add_argument("--global", dest="global_", action="store_true",
                     help="close_all_connections: every vhost; list_vhost_limits: every vhost's limits")
    ctl.add_argument("--per-connection-delay", type=int, default=0, metavar="MS",
                     help="close_all_connections: pause between two connections")
    ctl.add_argument("--limit", type=int, default=0, help="close_all_connections: at most N (0: all)")
    ctl.add_argument("-t", "--timeout", type=float, default=None, metavar="SECONDS",
                     help="await_startup: how long to wait (default 300)")
    for group in groups:
        group.add_options(ctl)
    names = tuple(verb_table(groups))
    ctl.add_argument("verb", choices=names, metavar="VERB", help=", ".join(names))
    ctl.add_argument("columns", nargs="*", metavar="ARG", help="info columns of list_* verbs, or the verb's "
                     "arguments")
    return ctl
