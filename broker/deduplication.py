"""Message deduplication: a message whose ``x-deduplication-header`` value was seen before is dropped, at a queue
(``x-message-deduplication: true``) or at an exchange of type ``x-message-deduplication``; the interface of
RabbitMQ's rabbitmq-message-deduplication plugin and of LavinMQ, which the exactly-once Spark writer relies on
(docs/decisions/spark-pipeline.md). This module is the cache both levels use, what a message's key is, and the declare arguments;
broker/queues/delegate.py makes the queue-level check (one place for every queue type), and
broker/exchanges/deduplication_exchange.py is the exchange type. storage/deduplication_log.py keeps a cache on disk.

Sources, and where they differ:

- The plugin (noxdafox/rabbitmq-message-deduplication, README and ``lib/``, read at 720104d): the exchange type
  needs ``x-cache-size`` (entries; 406 "Missing or invalid argument, 'x-cache-size' must be an integer
  greater than 0"), takes ``x-cache-ttl`` (ms) and ``x-cache-persistence`` (``memory``, the default, or
  ``disk``), and a per-message ``x-cache-ttl`` header; it "acts like a fanout" (its ``route`` matches every
  binding), and a duplicate is routed nowhere, so RabbitMQ answers it as unroutable: basic.return if
  mandatory, then basic.ack. Its *queue* argument means something else: a value is a duplicate while a
  message carrying it is in the queue (forgotten at ack, drop, expiry); no size, no TTL of its own. The
  queue drops the duplicate through the backing queue's ``is_duplicate``, after RabbitMQ has settled
  mandatory (no basic.return), and RabbitMQ nacks it to a confirming publisher (the plugin's queue_SUITE
  ``deduplicate_message_confirm``; its issues #21, #67, #72).
- LavinMQ (``cloudamqp/lavinmq/docs/deduplication.md``, ``src/lavinmq/deduplication.cr``): one cache for both
  levels: at most ``x-cache-size`` entries (default 128), oldest evicted first, ``x-cache-ttl`` ms with the
  per-message ``x-cache-ttl`` header overriding it, expired entries dropped when looked at, the header name
  settable with ``x-deduplication-header``; in memory only. Exchange-level is an argument on any exchange.

What Leveret does:

- **Queues: LavinMQ's cache, for every queue type.** A value is a duplicate if the queue admitted it within
  its cache (``x-cache-size``, default 128; ``x-cache-ttl``), whether or not its message is still in the
  queue. For a stream (nothing leaves) it is the only meaning; one meaning for classic, quorum and stream
  queues lets a queue change type without changing behaviour; an exactly-once producer needs "already
  accepted", not "not yet consumed"; and it costs nothing on the ack, expiry and dead-letter paths. A plugin
  user who re-publishes a value after its message was consumed and expects it enqueued again gets it dropped
  until the entry is evicted or expires.
- **The exchange type is the plugin's**: required ``x-cache-size``, its texts, fanout routing. It checks what
  is published to it (by clients, the HTTP API, dead-lettering); reached through an exchange-to-exchange
  binding or as an alternate exchange it only fans out (the plugin checks there too). LavinMQ's
  ``x-message-deduplication`` argument on an exchange of another type is not offered.
- **Both**: eviction is oldest first; an entry's TTL counts on the wall clock (the vhost's clock,
  broker/clock.py), so it means the same after a restart; ``x-deduplication-header`` names another header.
  Keys are header values by type and value, except that a long string and a byte array with the same bytes
  are one key (the plugin sees both as binaries); a table or an array is not checked (the plugin does not
  handle them either); values longer than :data:`MAX_KEY_BYTES` are keyed by their SHA-256. A cache keeps
  16 bytes of BLAKE2b of each key (:func:`digest_key`), in a ring of about 42 bytes an entry for a large cache
  (broker/deduplication_ring.py: 10 million ids in 396 MB, 41.5 bytes an id measured; Python objects took ~180).
- **A duplicate is acked** to a confirming publisher at both levels: it is accounted for, and a nack would
  only make the publisher retry what is already there (LavinMQ acks too; the plugin's queues nack). Its ack
  waits for the fsync of the entry it matched, so it never promises more than the first publish's own
  confirm did. **Mandatory** follows the plugin: a duplicate dropped by the exchange is unroutable
  (basic.return, then the ack); one dropped by a queue was routed (no basic.return).
- A message a queue refuses (``x-overflow: reject-publish``, nacked) is not admitted, so its re-publish is
  not a duplicate; likewise at the exchange when a target queue refused it.
- **Durability**: a durable queue's, stream's or exchange's cache is kept on disk (storage/
  deduplication_log.py) unless ``x-cache-persistence: memory`` (the plugin's default is memory; the Spark writer, docs/decisions/spark-pipeline.md,
  needs caches to survive a restart, so Leveret's is disk); an entry reaches the disk no later than the
  confirm of the message that brought it, so after a ``kill -9`` a confirmed message re-published is still a
  duplicate. A transient queue's or exchange's cache is in memory.
- Not offered (yet): policy keys (the plugin reads ``x-message-deduplication`` from queue policies and
  ``x-cache-*`` from exchange policies).

Nothing here costs anything to a queue or exchange without deduplication: the publish path reads one
attribute (``Queue.dedup``) per target queue.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.clock import Clock
from broker.deduplication_ring import DIGEST_SIZE, ring_for
from broker.errors import AMQPError
from broker.message import Message
from protocol.constants import PRECONDITION_FAILED
from protocol.frames import FrameError

if TYPE_CHECKING:
    from storage.deduplication_log import DedupLog
    from storage.node_storage import NodeStorage

DEFAULT_HEADER = "x-deduplication-header"
TTL_HEADER = "x-cache-ttl"
# LavinMQ's default cache size for a queue (the exchange type must be given one, as the plugin's).
DEFAULT_QUEUE_CACHE_SIZE = 128
# Header values longer than this are keyed by their digest, so an entry's memory and log record stay small.
MAX_KEY_BYTES = 128
PERSISTENCE = ("disk", "memory")
# The largest x-cache-size taken (neither the plugin nor LavinMQ has one): a large cache reserves its memory
# up front (broker/deduplication_ring.py, ~42 bytes an entry: 4.2 GB of address space here, resident only as
# it fills), and a size beyond what the machine could ever hold is a mistake better refused at declare.
MAX_CACHE_SIZE = 100_000_000


class DedupSettings:
    """A cache's arguments: its size (entries), default TTL (ms, None: entries do not expire), the header it
    reads, and ``x-cache-persistence`` (None when not given: disk for a durable owner)."""

    __slots__ = ("header", "persistence", "size", "ttl_ms")

    def __init__(self, size: int, ttl_ms: int | None = None, header: str = DEFAULT_HEADER,
                 persistence: str | None = None) -> None:
        self.size = size
        self.ttl_ms = ttl_ms
        self.header = header
        self.persistence = persistence


# -- declare arguments ------------------------------------------------------------------------------------------

def _text(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return value


def _positive(value: Any) -> int | None:
    """The plugin's reading of a size or TTL: an integer (any width) or a long string of one, above 0."""
    if isinstance(value, bool):
        return None
    text = _text(value)
    if isinstance(text, str) and text.isascii() and text.isdigit():
        value = int(text)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def exchange_settings(arguments: dict[str, Any]) -> DedupSettings:
    """The exchange type's arguments, or 406 with the plugin's texts (its ``validate/1``; the plugin's source
    wraps the line inside the string, so RabbitMQ's reply has a run of spaces where Leveret's has one)."""
    size = _positive(arguments.get("x-cache-size"))
    if size is None:
        raise AMQPError(PRECONDITION_FAILED,
                        "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0")
    if size > MAX_CACHE_SIZE:
        raise AMQPError(PRECONDITION_FAILED, f"Invalid argument, 'x-cache-size' must be at most {MAX_CACHE_SIZE}")
    ttl = None
    if "x-cache-ttl" in arguments:
        ttl = _positive(arguments["x-cache-ttl"])
        if ttl is None:
            raise AMQPError(PRECONDITION_FAILED,
                            "Invalid argument, 'x-cache-ttl' must be an integer greater than 0")
    persistence = None
    if "x-cache-persistence" in arguments:
        persistence = _text(arguments["x-cache-persistence"])
        if persistence not in PERSISTENCE:
            raise AMQPError(PRECONDITION_FAILED,
                            "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'")
    header = _text(arguments.get("x-deduplication-header", DEFAULT_HEADER))
    if not isinstance(header, str) or not header:
        raise AMQPError(PRECONDITION_FAILED,
                        "Invalid argument, 'x-deduplication-header' must be a non-empty string")
    return DedupSettings(size, ttl, header, persistence)


def _queue_arg_problem(key: str, value: Any) -> str | None:
    """What is wrong with a queue's deduplication argument, in broker/queues/queue_args.py's words (the
    plugin's queue argument has no checks; LavinMQ refuses a value of the wrong type)."""
    if key == "x-message-deduplication":
        return None if isinstance(value, bool) else "{unacceptable_type," + _type_name(value) + "}"
    if key in ("x-cache-size", "x-cache-ttl"):
        if isinstance(value, bool) or not isinstance(value, int):
            return f'"expected integer, got {_type_name(value)}"'
        if value < 1:
            return "{value_zero,0}" if value == 0 else "{value_negative," + str(value) + "}"
        if key == "x-cache-size" and value > MAX_CACHE_SIZE:
            return "{value_too_large," + str(value) + f"}}; at most {MAX_CACHE_SIZE}"
        return None
    if key == "x-cache-persistence":
        text = _text(value)
        return None if text in PERSISTENCE else f"{{unacceptable_value,{text!r}}}; expected one of disk, memory"
    text = _text(value)  # x-deduplication-header
    return None if isinstance(text, str) and text else "{unacceptable_type," + _type_name(value) + "}"


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, (str, bytes, bytearray)):
        return "longstr"
    return {"float": "double", "dict": "table", "list": "array", "NoneType": "void"}.get(type(value).__name__,
                                                                                         type(value).__name__)


QUEUE_ARGUMENTS = ("x-message-deduplication", "x-cache-size", "x-cache-ttl", "x-deduplication-header",
                   "x-cache-persistence")


def queue_settings(arguments: dict[str, Any], queue: str, vhost: str) -> DedupSettings | None:
    """A queue's cache, or None unless ``x-message-deduplication`` is true; 406 for a value it cannot use (the
    other keys are looked at only when deduplication is asked for, as LavinMQ does)."""
    if "x-message-deduplication" not in arguments:
        return None
    for key in QUEUE_ARGUMENTS:
        if key in arguments:
            problem = _queue_arg_problem(key, arguments[key])
            if problem:
                raise AMQPError(PRECONDITION_FAILED,
                                f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {problem}")
    if arguments["x-message-deduplication"] is not True:
        return None
    return DedupSettings(arguments.get("x-cache-size", DEFAULT_QUEUE_CACHE_SIZE), arguments.get("x-cache-ttl"),
                         _text(arguments.get("x-deduplication-header", DEFAULT_HEADER)),
                         _text(arguments.get("x-cache-persistence")))


# -- keys -------------------------------------------------------------------------------------------------------

def encode_key(value: Any) -> bytes | None:
    """A header value as a cache key (type octet first, so 1, 1.0 and "1" differ), None for one not checked."""
    if isinstance(value, str):
        raw = b"S" + value.encode()
    elif isinstance(value, (bytes, bytearray)):
        raw = b"S" + bytes(value)  # a long string that is not UTF-8, or a byte array: one key with its bytes
    elif isinstance(value, bool):
        raw = b"t1" if value else b"t0"
    elif isinstance(value, int):
        raw = b"I" + str(value).encode()
    elif isinstance(value, float):
        raw = b"d" + repr(value).encode()
    elif isinstance(value, decimal.Decimal):
        raw = b"D" + str(value).encode()
    elif isinstance(value, datetime.datetime):
        raw = b"T" + value.isoformat().encode()
    elif value is None:
        raw = b"V"
    else:
        return None  # a table or an array
    return raw if len(raw) <= MAX_KEY_BYTES else b"H" + hashlib.sha256(raw).digest()


# -- the cache --------------------------------------------------------------------------------------------------

def digest_key(key: bytes) -> bytes:
    """What a cache keeps of a key: 16 bytes of BLAKE2b. Two of 10 million keys share one with a probability
    of about 1.5e-25 (the birthday bound at 2^128), far below that of a flipped bit in RAM."""
    return hashlib.blake2b(key, digest_size=DIGEST_SIZE).digest()


# Snapshot entries copied into the log's next file with each admission while it rotates (storage/
# deduplication_log.py): the copy gains one entry per admission on the ring's newest end, so a snapshot of
# ``size`` entries completes within ``size`` admissions, half the records that start the next rotation.
SNAPSHOT_STEP = 2


class DedupCache:
    """The values a queue or exchange has admitted: at most ``size`` (the oldest go first), each until its
    expiry (wall-clock ms; 0: none), kept as digests in a :class:`~broker.deduplication_ring.DigestRing`.
    ``log`` keeps it on disk (None: in memory). Built by :func:`open_cache`.

    The check is two steps so that only an admitted message is remembered: :meth:`seen`, then, once the
    message was taken, :meth:`admit`. Keys are :func:`digest_key` digests (:meth:`key_of` makes them)."""

    __slots__ = ("_clock", "_header", "_header_raw", "_log", "_missed", "_ring", "_rotate_at", "_snapshot_at",
                 "dropped", "replay_now", "size", "ttl_ms")

    def __init__(self, settings: DedupSettings, clock: Clock) -> None:
        self.size = settings.size
        self.ttl_ms = settings.ttl_ms
        self._header = settings.header
        self._header_raw = settings.header.encode()
        self._clock = clock
        self._log: DedupLog | None = None
        self._ring = ring_for(self.size)
        self.dropped = 0  # duplicates dropped (the HTTP API shows it)
        # The log starts its next file (a snapshot of the live entries) past this many records.
        self._rotate_at = 2 * self.size + 1024
        self._snapshot_at = 0  # the ring position the log's rotation copies next
        self.replay_now = 0.0  # the wall clock when the log's replay started (ms)
        self._missed: bytes | None = None  # the key seen() last looked for and did not find

    # -- recovery -------------------------------------------------------------------------------------------
    def replayed(self, key: bytes, expires_at: int, digested: bool) -> None:
        """One entry of the log, oldest first (storage/deduplication_log.py): admitted again, unless expired
        (by the time the replay started: :func:`open_cache` sets ``replay_now``)."""
        if expires_at and expires_at <= self.replay_now:
            return
        digest = bytes(key) if digested else digest_key(bytes(key))
        slot = self._ring.find(digest)
        if slot >= 0:
            self._ring.remove(slot)
        self._ring.append(digest, expires_at)

    def attach(self, log: DedupLog) -> None:
        """Keep the cache on disk from now on (after its entries were replayed from ``log``)."""
        self._log = log

    # -- the check ------------------------------------------------------------------------------------------
    def key_of(self, msg: Message) -> bytes | None:
        """The message's key, or None when it has no such header (it is then not checked)."""
        if self._header_raw not in msg.header:  # a cheap look at the raw properties before decoding them
            return None
        try:
            headers = msg.headers
        except FrameError:
            return None
        if self._header not in headers:
            return None
        raw = encode_key(headers[self._header])
        return None if raw is None else digest_key(raw)

    def seen(self, key: bytes) -> bool:
        """Whether ``key`` was admitted and has not expired (an expired entry is dropped here)."""
        ring = self._ring
        slot = ring.find(key)
        if slot < 0:
            self._missed = key
            return False
        expires_at = ring.expiry(slot)
        if expires_at and expires_at <= self._clock.now_ms():
            ring.remove(slot)
            self._missed = key
            return False
        return True

    def admit(self, key: bytes, msg: Message) -> None:
        """Remember ``key`` (its message was taken), for the message's ``x-cache-ttl`` header or the cache's TTL."""
        ttl = self.ttl_ms
        if TTL_HEADER in msg.headers:
            value = msg.headers[TTL_HEADER]
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                ttl = value
        expires_at = int(self._clock.now_ms()) + ttl if ttl else 0
        ring = self._ring
        if key is not self._missed:  # not what seen() just looked for and missed: it may be there
            slot = ring.find(key)
            if slot >= 0:  # admitted again (two of a batch checked before either was admitted): to the newest end
                ring.remove(slot)
        self._missed = None
        ring.append(key, expires_at)
        log = self._log
        if log is not None:
            log.append(key, expires_at)
            if log.rotating:
                self._copy_snapshot(log, SNAPSHOT_STEP)
            elif log.records >= self._rotate_at:
                log.start_rotation()
                self._snapshot_at = ring.head
                self._copy_snapshot(log, SNAPSHOT_STEP)

    def _copy_snapshot(self, log: DedupLog, count: int) -> None:
        """Copy up to ``count`` live, unexpired entries, oldest first, into the rotating log's next file (those
        the ring dropped meanwhile are skipped); once the copy reaches the newest entry, finish the rotation.
        Each admission adds one entry and copies up to ``count`` > 1, so the copy catches up."""
        ring = self._ring
        now = self._clock.now_ms()
        position = max(self._snapshot_at, ring.head)
        end = ring.tail
        while count and position < end:
            entry = ring.entry_at(position)
            position += 1
            if entry is not None and (not entry[1] or entry[1] > now):
                log.append_snapshot(*entry)
                count -= 1
        self._snapshot_at = position
        if position >= end:
            log.finish_rotation()

    def __len__(self) -> int:
        return len(self._ring)

    # -- confirms ---------------------------------------------------------------------------------------------
    @property
    def durable(self) -> bool:
        """Whether every admitted entry is on disk (always, for a cache in memory)."""
        return self._log is None or self._log.durable

    def confirm_when_durable(self, publisher: Any, seq: int) -> None:
        """Confirm a duplicate's publish (``publisher.confirm_from_queue(seq)``) once the entries admitted so
        far are on disk; nack it if their fsync fails."""
        assert self._log is not None, "a cache in memory is always durable"
        confirm: Callable[[int, bool], None] = publisher.confirm_from_queue
        self._log.call_when_durable(lambda ok: confirm(seq, ok))

    # -- info and lifecycle -------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """For the HTTP API (the plugin's ``cache_info``: entries and size)."""
        return {"entries": len(self._ring), "size": self.size, "ttl": self.ttl_ms,
                "persistence": "memory" if self._log is None else "disk", "dropped": self.dropped}

    def close(self) -> None:
        """The node stops: the log's buffer goes to the kernel (the node's last sync makes it durable)."""
        if self._log is not None:
            self._log.close()

    def delete(self) -> None:
        """Its queue or exchange is deleted: entries and files go."""
        self._ring.clear()
        if self._log is not None:
            self._log.delete()
            self._log = None


def open_cache(settings: DedupSettings, clock: Clock, storage: NodeStorage | None, kind: str, vhost: str,
               name: str, *, durable: bool, recovered: bool) -> DedupCache:
    """The cache of a queue or exchange (``kind``): on disk for a durable owner on a node with storage, unless
    ``x-cache-persistence: memory``; a ``recovered`` one comes back with what it had, a new one starts empty
    (whatever an earlier owner of the name left is removed)."""
    cache = DedupCache(settings, clock)
    if storage is None or not durable or settings.persistence == "memory":
        return cache
    cache.replay_now = clock.now_ms()
    cache.attach(storage.open_dedup_log(kind, vhost, name, fresh=not recovered, replay=cache.replayed))
    return cache
