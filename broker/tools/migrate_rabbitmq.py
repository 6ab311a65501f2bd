"""``leveret ctl import_from_rabbitmq URL``: move in from a RabbitMQ in one command (issue 37; Leveret's own).

    leveret ctl import_from_rabbitmq http://admin:s3cret@rabbit.example:15672
    leveret ctl import_from_rabbitmq https://admin:s3cret@rabbit:15671 --rabbitmq-cacert ca.pem \\
        --amqp-uri 'amqps://admin:s3cret@rabbit:5671?cacertfile=/etc/leveret/ca.pem'

What it does, in the order a person doing it by hand would:

1. reads the RabbitMQ's definitions from its management API (``GET URL/api/definitions``, Basic credentials
   from the URL);
2. imports them into the Leveret ctl talks to through Leveret's own ``POST /api/definitions``, one section
   at a time (users with their password hashes, vhosts, permissions, topic permissions, global parameters,
   parameters, policies, exchanges, queues, bindings). A section Leveret refuses is posted again object by
   object, so that one object Leveret cannot carry (an exchange type of a plugin it does not have, an
   argument it refuses, a parameter of a component it lacks) is dropped and named with Leveret's reason
   while the rest is imported. Users keep their passwords: RabbitMQ's hashing schemes (SHA-256, its
   default, SHA-512, MD5) are Leveret's too (broker/security/auth.py); a user with another
   ``hashing_algorithm`` is refused by the import, so dropped and named, and needs ``change_password``.
   The RabbitMQ's ``cluster_name`` and ``internal_cluster_id`` global
   parameters are not taken: they say which cluster a node is (federation's loop detection reads the
   cluster name), and the Leveret stays itself;
3. for each queue that holds messages (``GET URL/api/queues``) and whose definition was carried over,
   sets a dynamic shovel on the Leveret, in the queue's vhost, named ``import-from-rabbitmq-<queue>``:
   ``src-uri`` the RabbitMQ over AMQP (``--amqp-uri``, default ``amqp://`` + the URL's credentials and host,
   port 5672, + the vhost), ``src-queue`` and ``dest-queue`` the queue, ``ack-mode`` ``on-confirm`` (a
   message leaves the RabbitMQ only once the Leveret confirmed it) and ``src-delete-after``
   ``queue-length`` (the shovel moves the backlog it finds when it starts, then removes itself);
4. reports each move's progress (messages moved and left, from ``GET /api/shovels``) until every shovel
   has finished, or returns at once with ``--no-wait`` (``leveret ctl shovel_status`` follows them).

Running it again changes nothing that is already there: the definitions import is idempotent, a shovel of
that name still at work is left alone, and a queue the first run emptied gets no shovel. What is not moved,
and said so: a stream's messages (a shovel reads a stream from its next message; replay it with a consumer
at ``x-stream-offset`` ``first``), an exclusive queue's (it belongs to a connection), and a queue whose
definition was dropped (a shovel would otherwise declare a plain queue in its place). RabbitMQ's API counts
a queue's messages every 5 seconds (``collect_statistics_interval``): a queue filled within the last few
seconds may be counted empty and skipped; a second run moves it. A queue that RabbitMQ has not counted yet
gets a shovel anyway (one that finds it empty removes itself at once).

Exit codes: 0 done (what was dropped is in the report), 64 usage, 69 RabbitMQ or Leveret unreachable, 1 a
refusal that stops the import (credentials) or moves not finished within ``--move-timeout``.

This module does not import broker/tools/ctl/ (ctl imports it, through broker/tools/ctl/migration.py): ctl
hands over what it resolved (the Leveret's URL, credentials and TLS context, :class:`LeveretTarget`) and its
own error class (:func:`verb`'s ``error``).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.tools.http_json import JsonHttp, Unreachable, basic_auth, quote, reason_of

VERB = "import_from_rabbitmq"
SHOVEL_PREFIX = "import-from-rabbitmq-"
EX_USAGE = 64
EX_UNAVAILABLE = 69

# The sections of a definitions document, in the order they can be applied (a permission needs its user and
# vhost, a binding its exchange and queue).
SECTIONS = ("users", "vhosts", "permissions", "topic_permissions", "global_parameters", "parameters", "policies",
            "exchanges", "queues", "bindings")
# Global parameters that say which cluster a node is: the Leveret keeps its own.
OWN_IDENTITY = {"cluster_name": "the Leveret keeps its own cluster name (federation's loop detection reads it)",
                "internal_cluster_id": "the RabbitMQ cluster's own identifier, not the Leveret's"}
STREAM_NOT_MOVED = ("a stream: a shovel would read it from its next message; replay it into the Leveret with a "
                    "consumer at x-stream-offset 'first'")
PROGRESS_EVERY = 2.0  # seconds between two progress reports of a queue whose count changed
POLL_EVERY = 0.5


class LeveretTarget(Protocol):
    """The Leveret ctl resolved (broker/tools/ctl/api.py's ``Api``): its HTTP API, credentials, TLS context."""

    @property
    def url(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]: ...

    @property
    def context(self) -> ssl.SSLContext | None: ...


ErrorFactory = Callable[[str, int], Exception]
"""ctl's error class: (one line for the operator, exit code) → the exception ctl reports and exits with."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This verb's options, in a group of ctl's parser (``leveret ctl import_from_rabbitmq --help``)."""
    group = parser.add_argument_group(
        f"{VERB} URL", "copy a RabbitMQ's definitions (read from its management API at URL, "
        "http[s]://USER:PASSWORD@HOST:PORT) into this Leveret and move every non-empty queue's messages with "
        "an on-confirm shovel (import-from-rabbitmq-QUEUE), reporting what could not be carried over and "
        "the moves' progress; safe to run again")
    group.add_argument("--amqp-uri", default=None, metavar="URI",
                       help=f"{VERB}: the RabbitMQ's AMQP URI for the shovels, without a vhost (default "
                            "amqp://USER:PASSWORD@HOST:5672 from URL); amqps:// takes cacertfile=... options")
    group.add_argument("--no-wait", action="store_true",
                       help=f"{VERB}: return once the shovels are set (leveret ctl shovel_status follows them)")
    group.add_argument("--move-timeout", type=float, default=None, metavar="SECONDS",
                       help=f"{VERB}: give up waiting for the moves after this long (exit 1; they go on)")
    group.add_argument("--rabbitmq-cacert", default=None, metavar="FILE",
                       help=f"{VERB}: an https URL's CA certificates (PEM)")
    group.add_argument("--rabbitmq-insecure", action="store_true",
                       help=f"{VERB}: an https URL's certificate is not checked")


def verb(error: ErrorFactory) -> Callable[[LeveretTarget, argparse.Namespace], str]:
    """The verb as ctl runs it: ``(target, args) -> the report``; failures raise ``error(line, code)``."""

    def run(target: LeveretTarget, args: argparse.Namespace) -> str:
        if len(args.columns) != 1:
            raise error(f"usage: leveret ctl {VERB} URL [--amqp-uri URI] [--no-wait] [--move-timeout SECONDS]",
                        EX_USAGE)
        try:
            source = rabbitmq_api(args.columns[0], args.rabbitmq_cacert, args.rabbitmq_insecure)
            amqp_base = amqp_uri_base(args.columns[0], args.amqp_uri)
        except ValueError as exc:
            raise error(str(exc), EX_USAGE) from None
        leveret = JsonHttp(target.url, dict(target.headers), target.context)
        as_json = args.formatter == "json"
        progress = _printer(sys.stderr if as_json else sys.stdout, quiet=args.quiet)
        migration = Migration(source, leveret, amqp_base, progress, error)
        try:
            report = migration.run(wait=not args.no_wait, timeout=args.move_timeout)
        except Unreachable as exc:
            raise error(str(exc), EX_UNAVAILABLE) from None
        return json.dumps(report.as_json(), indent=2) if as_json else report.text()

    return run


def _printer(stream: Any, quiet: bool) -> Callable[[str], None]:
    def out(line: str) -> None:
        if not quiet:
            print(line, file=stream, flush=True)

    return out


# -- where the RabbitMQ is ---------------------------------------------------------------------------------------

def rabbitmq_api(url: str, cacert: str | None, insecure: bool) -> JsonHttp:
    """The RabbitMQ's management API from ``http[s]://USER:PASSWORD@HOST:PORT[/PREFIX]`` (guest/guest when
    the URL names no user, as rabbitmqadmin's default). ValueError for a URL that is not one."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{VERB}: URL must be the RabbitMQ's management API, http[s]://USER:PASSWORD@HOST:PORT, "
                         f"not {redact(url)!r}")
    user = urllib.parse.unquote(parts.username) if parts.username is not None else "guest"
    password = urllib.parse.unquote(parts.password) if parts.password is not None else "guest"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host
    context = None
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=cacert)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    return JsonHttp(f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}", basic_auth(user, password), context)


def amqp_uri_base(url: str, amqp_uri: str | None) -> str:
    """The RabbitMQ's AMQP URI without a vhost (each queue's vhost is added to it): ``--amqp-uri``, else the
    management URL's credentials and host on port 5672."""
    if amqp_uri is not None:
        parts = urllib.parse.urlsplit(amqp_uri)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError(f"{VERB}: --amqp-uri must be amqp[s]://USER:PASSWORD@HOST[:PORT], not "
                             f"{redact(amqp_uri)!r}")
        if parts.path not in ("", "/"):
            raise ValueError(f"{VERB}: give --amqp-uri without a vhost: each queue's own vhost is added to it")
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))
    parts = urllib.parse.urlsplit(url)
    creds = ""
    if parts.username is not None:
        creds = parts.username + (f":{parts.password}" if parts.password is not None else "") + "@"
    host = parts.hostname or ""
    return f"amqp://{creds}{f'[{host}]' if ':' in host else host}:5672"


def shovel_uri(base: str, vhost: str) -> str:
    """``base`` (scheme, credentials, host, port, ?query) with ``vhost`` as its path."""
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost), parts.query, ""))


def redact(uri: str) -> str:
    """``uri`` without its password (what reports show)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


# -- what is reported --------------------------------------------------------------------------------------------

def describe(section: str, item: dict[str, Any]) -> str:
    """An object of a definitions section by name, as the report names it."""
    vh = f" in vhost '{item.get('vhost', '/')}'"
    if section == "users":
        return f"user '{item.get('name')}'"
    if section == "vhosts":
        return f"vhost '{item.get('name')}'"
    if section == "permissions":
        return f"permissions of user '{item.get('user')}'{vh}"
    if section == "topic_permissions":
        return f"topic permissions of user '{item.get('user')}' on exchange '{item.get('exchange')}'{vh}"
    if section == "global_parameters":
        return f"global parameter '{item.get('name')}'"
    if section == "parameters":
        return f"parameter '{item.get('name')}' of component '{item.get('component')}'{vh}"
    if section == "policies":
        return f"policy '{item.get('name')}'{vh}"
    if section == "exchanges":
        return f"exchange '{item.get('name')}' of type '{item.get('type')}'{vh}"
    if section == "queues":
        return f"queue '{item.get('name')}'{vh}"
    kind = item.get("destination_type", "queue")
    return (f"binding of exchange '{item.get('source')}' to {kind} '{item.get('destination')}' with routing key "
            f"'{item.get('routing_key', '')}'{vh}")


@dataclass
class Move:
    """One queue's messages moving from the RabbitMQ to the Leveret by a shovel."""

    vhost: str
    queue: str
    messages: int | None  # RabbitMQ's count when the run began (None: not counted yet)
    state: str = "started"  # started, already moving, done, not started
    moved: int = 0
    note: str = ""

    @property
    def shovel(self) -> str:
        return SHOVEL_PREFIX + self.queue

    @property
    def label(self) -> str:
        return f"queue '{self.queue}' in vhost '{self.vhost}'"

    def as_json(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "queue": self.queue, "shovel": self.shovel, "messages": self.messages,
                "state": self.state, "moved": self.moved, **({"note": self.note} if self.note else {})}


@dataclass
class Report:
    source: str
    version: str
    carried: dict[str, int] = field(default_factory=dict)
    offered: dict[str, int] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (object, reason)
    moves: list[Move] = field(default_factory=list)
    not_moved: list[tuple[str, str]] = field(default_factory=list)  # (queue, reason)

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "rabbitmq_version": self.version,
                "imported": {s: {"carried": self.carried.get(s, 0), "offered": n} for s, n in self.offered.items()},
                "dropped": [{"object": what, "reason": why} for what, why in self.dropped],
                "shovels": [m.as_json() for m in self.moves],
                "not_moved": [{"queue": what, "reason": why} for what, why in self.not_moved]}

    def text(self) -> str:
        counts = ", ".join(f"{s.replace('_', ' ')} {self.carried.get(s, 0)}"
                           + (f" of {n}" if self.carried.get(s, 0) != n else "") for s, n in self.offered.items())
        lines = [f"Imported from RabbitMQ {self.version} at {self.source}: {counts or 'nothing to import'}"]
        if self.dropped:
            lines.append(f"Not carried over ({len(self.dropped)}):")
            lines += [f"  {what}: {why}" for what, why in self.dropped]
        if self.moves:
            lines.append(f"Shovels ({len(self.moves)}):")
            for m in self.moves:
                count = "not counted yet" if m.messages is None else f"{m.messages} message(s)"
                lines.append(f"  {m.label} ({count}): {m.state}" + (f", {m.moved} moved" if m.moved else "")
                             + (f" ({m.note})" if m.note else ""))
        if self.not_moved:
            lines.append(f"Messages not moved ({len(self.not_moved)}):")
            lines += [f"  {what}: {why}" for what, why in self.not_moved]
        if not self.moves and not self.not_moved:
            lines.append("No queue holds messages: nothing to move.")
        return "\n".join(lines)


# -- the migration -----------------------------------------------------------------------------------------------

class Migration:
    """One run: definitions, then shovels, then their progress. ``out`` prints a progress line."""

    def __init__(self, source: JsonHttp, leveret: JsonHttp, amqp_base: str, out: Callable[[str], None],
                 error: ErrorFactory) -> None:
        self.source = source
        self.leveret = leveret
        self.amqp_base = amqp_base
        self.out = out
        self.error = error

    def run(self, wait: bool, timeout: float | None) -> Report:
        definitions = self._get(self.source, "/api/definitions", "the RabbitMQ's definitions")
        if not isinstance(definitions, dict):
            raise self.error(f"{self.source.url}/api/definitions is not a definitions document", 1)
        report = Report(self.source.url, str(definitions.get("rabbitmq_version")
                                             or definitions.get("rabbit_version") or "?"))
        carried_queues = self.import_definitions(definitions, report)
        self.start_shovels(carried_queues, report)
        if wait:
            self.follow(report, timeout)
        return report

    def _get(self, api: JsonHttp, path: str, what: str) -> Any:
        status, body = api.request("GET", path)
        if status != 200:
            raise self.error(f"cannot read {what} (GET {api.url}{path}): {reason_of(status, body)}", 1)
        return body

    def import_definitions(self, definitions: dict[str, Any], report: Report) -> set[tuple[str, str]]:
        """Post each section to the Leveret; a refused section object by object. Answers the (vhost, name)
        of the queues that were carried over."""
        queues: set[tuple[str, str]] = set()
        for section in SECTIONS:
            items = [i for i in definitions.get(section) or [] if isinstance(i, dict)]
            kept = []
            for item in items:
                if section == "global_parameters" and item.get("name") in OWN_IDENTITY:
                    report.dropped.append((describe(section, item), OWN_IDENTITY[str(item.get("name"))]))
                else:
                    kept.append(item)
            if not items:
                continue
            report.offered[section] = len(items)
            carried = kept if kept and self._post(section, kept) is None else []
            if kept and not carried:
                self.out(f"Leveret refused part of the {section.replace('_', ' ')}: importing them one by one")
                for item in kept:
                    reason = self._post(section, [item])
                    if reason is None:
                        carried.append(item)
                    else:
                        report.dropped.append((describe(section, item), reason))
            report.carried[section] = len(carried)
            if section == "queues":
                queues = {(str(q.get("vhost", "/")), str(q.get("name"))) for q in carried}
        return queues

    def _post(self, section: str, items: list[dict[str, Any]]) -> str | None:
        """None if the Leveret imported ``items``, else its reason (a 400); other refusals stop the run."""
        status, body = self.leveret.request("POST", "/api/definitions", {section: items})
        if status < 300:
            return None
        if status == 400:
            return reason_of(status, body)
        raise self.error(f"Leveret refused the definitions import (POST {self.leveret.url}/api/definitions): "
                         f"{reason_of(status, body)}", 1)

    def start_shovels(self, carried: set[tuple[str, str]], report: Report) -> None:
        queues = self._get(self.source, "/api/queues?columns=name,vhost,type,exclusive,messages",
                           "the RabbitMQ's queues")
        for q in sorted(queues or [], key=lambda q: (str(q.get("vhost")), str(q.get("name")))):
            vhost, name, messages = str(q.get("vhost", "/")), str(q.get("name")), q.get("messages")
            count = messages if isinstance(messages, int) else None
            if count == 0:
                continue
            label = f"queue '{name}' in vhost '{vhost}'"
            if q.get("type") == "stream":
                report.not_moved.append((label, STREAM_NOT_MOVED))
            elif q.get("exclusive"):
                report.not_moved.append((label, "an exclusive queue belongs to its connection"))
            elif (vhost, name) not in carried:
                report.not_moved.append((label, "its definition was not carried over (see above)"))
            else:
                report.moves.append(self._start(Move(vhost, name, count)))

    def _start(self, move: Move) -> Move:
        path = f"/api/parameters/shovel/{quote(move.vhost)}/{quote(move.shovel)}"
        value = {"src-uri": shovel_uri(self.amqp_base, move.vhost), "src-queue": move.queue,
                 "dest-uri": "amqp:///" + quote(move.vhost), "dest-queue": move.queue,
                 "ack-mode": "on-confirm", "src-delete-after": "queue-length"}
        status, body = self.leveret.request("GET", path)
        if status == 200 and isinstance(body, dict) and body.get("value") == value:
            # A run before this one set it and it is still at work: setting it again would restart it.
            move.state = "already moving"
            return move
        if status == 200:
            move.note = "replaced a shovel of that name with other settings"  # e.g. a corrected --amqp-uri
        status, body = self.leveret.request("PUT", path, {"value": value})
        if status >= 300:
            move.state, move.note = "not started", reason_of(status, body)
        return move

    def follow(self, report: Report, timeout: float | None) -> None:
        """Report each move's progress until every shovel has removed itself (``queue-length`` reached)."""
        pending = {(m.vhost, m.shovel): m for m in report.moves if m.state in ("started", "already moving")}
        if not pending:
            return
        self.out(f"Moving the messages of {len(pending)} queue(s) ...")
        deadline = None if timeout is None else time.monotonic() + timeout
        shown: dict[tuple[str, str], tuple[int, str]] = {}
        last_shown: dict[tuple[str, str], float] = {}
        while True:
            params = self._get(self.leveret, "/api/parameters/shovel", "the Leveret's shovels") or []
            alive = {(str(p.get("vhost")), str(p.get("name"))) for p in params}
            status = {(str(s.get("vhost")), str(s.get("name"))): s
                      for s in self._get(self.leveret, "/api/shovels", "the Leveret's shovels") or []}
            now = time.monotonic()
            for key, move in list(pending.items()):
                row = status.get(key, {})
                move.moved = max(move.moved, int(row.get("messages_acked") or 0))
                if key not in alive:
                    move.state = "done"
                    del pending[key]
                    self.out(f"  {move.label}: done")
                    continue
                state = str(row.get("state", "starting"))
                if state == "terminated":
                    state += f" ({row.get('reason', '')}; it retries)"
                if shown.get(key) != (move.moved, state) and now - last_shown.get(key, 0.0) >= PROGRESS_EVERY:
                    shown[key], last_shown[key] = (move.moved, state), now
                    left = "" if move.messages is None else f", {max(0, move.messages - move.moved)} left"
                    self.out(f"  {move.label}: {move.moved} moved{left} (shovel {state})")
            if not pending:
                return
            if deadline is not None and now >= deadline:
                for move in pending.values():
                    move.note = "still moving"
                raise self.error(f"{len(pending)} move(s) not finished within {timeout:g} s; they go on "
                                 "(leveret ctl shovel_status): " + ", ".join(m.label for m in pending.values()), 1)
            time.sleep(POLL_EVERY)
