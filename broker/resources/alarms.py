"""Memory and disk alarms (RabbitMQ's ``rabbit_alarm``, ``vm_memory_monitor``, ``rabbit_disk_monitor``).

A monitor samples the process's resident memory and the free disk space of the data directory about once a
second. When memory goes above ``vm_memory_high_watermark`` (relative to RAM, or absolute) or free disk
below ``disk_free_limit``, an alarm is raised: every connection that publishes is blocked (it is sent
``connection.blocked`` if it supports it, and its socket is no longer read), while connections that only
consume go on. When all alarms have cleared, blocked connections get ``connection.unblocked`` and are read
again. The monitor also hands the memory budget to whoever wants it (the queues' RAM targets).

The alarms sit below the connections that they block: a connection is anything that satisfies
:class:`BlockableConnection` (broker/amqp/reader.py's ``Reader`` does), and whoever wants to hear of alarms
registers an :data:`AlarmListener`. So this module imports nothing above it, as RabbitMQ's readers
register with ``rabbit_alarm`` rather than ``rabbit_alarm`` knowing the reader.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from broker.clock import Clock, LoopClock, TimerHandle
from broker.resources.os_probes import data_dir_free, release_free_memory, resident_memory, total_memory

if TYPE_CHECKING:
    from broker.config import Settings

log = structlog.get_logger("leveret.alarms")


class BlockableConnection(Protocol):
    """What an alarm needs of a client connection (``Reader`` satisfies it): whether it has published
    (only publishers are blocked), and the two calls that block and unblock it."""

    @property
    def has_published(self) -> bool: ...

    def block_for_alarm(self, reason: str) -> None:
        """Stop reading the socket (and send ``connection.blocked`` with ``reason`` if the client takes it);
        the connection adds itself to :attr:`AlarmState.blocked`."""
        ...

    def unblock_after_alarm(self) -> None:
        """Every alarm has cleared: read again (and send ``connection.unblocked``)."""
        ...


# Called with the alarms raised ("memory", "disk") each time that set changes.
AlarmListener = Callable[[set[str]], None]


def configured_memory_limit(settings: Settings) -> int:
    """The memory high watermark the settings give, in bytes: ``vm_memory_high_watermark.absolute`` if set,
    else ``vm_memory_high_watermark.relative`` times the machine's RAM."""
    if settings.vm_memory_high_watermark_absolute:
        return settings.vm_memory_high_watermark_absolute
    return int(settings.vm_memory_high_watermark_relative * total_memory())


def configured_disk_free_limit(settings: Settings) -> int:
    """The free-disk limit the settings give, in bytes: ``disk_free_limit.relative`` times the machine's RAM
    if set (as RabbitMQ's ``{mem_relative, R}``), else ``disk_free_limit.absolute``."""
    if settings.disk_free_limit_relative is not None:
        return int(settings.disk_free_limit_relative * total_memory())
    return settings.disk_free_limit_absolute


class AlarmState:
    """Which alarms are raised, and the connections they hold back."""

    def __init__(self) -> None:
        self.raised: set[str] = set()
        self.blocked: set[BlockableConnection] = set()
        self.listeners: list[AlarmListener] = []

    @property
    def active(self) -> bool:
        return bool(self.raised)

    def reason(self) -> str:
        return " & ".join(sorted(f"low on {kind}" for kind in self.raised))

    def raise_alarm(self, kind: str, connections: Collection[BlockableConnection]) -> None:
        if kind in self.raised:
            return
        self.raised.add(kind)
        log.warning("resource alarm raised", alarm=kind)
        for reader in list(connections):
            if reader.has_published:
                reader.block_for_alarm(self.reason())
        self._notify()

    def clear_alarm(self, kind: str) -> None:
        if kind not in self.raised:
            return
        self.raised.discard(kind)
        log.info("resource alarm cleared", alarm=kind)
        if not self.raised:
            for reader in list(self.blocked):
                reader.unblock_after_alarm()
            self.blocked.clear()
        self._notify()

    def _notify(self) -> None:
        for listener in self.listeners:
            listener(set(self.raised))


# The disk is checked at an interval that shrinks as free space nears the limit (RabbitMQ's disk monitor
# adapts its interval the same way): the time a writer at this rate needs to use up the headroom, within
# [DISK_CHECK_MIN, the monitor's interval]. Writes that the storage reports (``note_written``) trigger a
# check at once when they have used half the headroom seen at the last check, so a fast publisher is
# blocked before the disk is full rather than up to one interval later.
DISK_WRITE_RATE = 1 << 30  # bytes per second assumed when sizing the interval
DISK_CHECK_MIN = 0.02


class ResourceMonitor:
    """Samples memory and disk on timers and raises or clears the alarms.

    The disk alarm is also raised while the storage reports that its writes fail (``storage_failing``,
    e.g. ENOSPC below the free-space limit's radar): publishers are blocked until the held data is written.
    """

    def __init__(self, alarms: AlarmState, connections: Collection[BlockableConnection], data_dir: Path,
                 memory_limit: int, disk_free_limit: int, interval: float = 0.5, clock: Clock | None = None
                 ) -> None:
        self.alarms = alarms
        self.connections = connections
        self.data_dir = data_dir
        self.memory_limit = memory_limit
        self.disk_free_limit = disk_free_limit
        self.interval = interval
        # The checks' timers (broker/clock.py): the event loop's, or a ManualClock in tests.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.memory_used = 0
        self.disk_free = 0
        self.storage_failing = False
        self.disk_checks = 0  # plain counter (tests)
        self._written_since_check = 0
        self._write_budget = 0  # bytes of writes after which the disk is checked again at once
        self._handle: TimerHandle | None = None
        self._disk_handle: TimerHandle | None = None

    def start(self) -> None:
        self.check()

    def stop(self) -> None:
        for handle in (self._handle, self._disk_handle):
            if handle is not None:
                handle.cancel()
        self._handle = self._disk_handle = None

    def check(self) -> None:
        """Check memory now and disk now, and schedule the next checks of both."""
        self.check_memory()
        self.check_disk()

    def check_memory(self) -> None:
        self.memory_used = resident_memory()
        if self.memory_limit and self.memory_used > self.memory_limit:
            release_free_memory()  # freed message memory may still be counted as resident
            self.memory_used = resident_memory()
        if self.memory_limit and self.memory_used > self.memory_limit:
            self.alarms.raise_alarm("memory", self.connections)
        else:
            self.alarms.clear_alarm("memory")
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self.clock.call_later(self.interval, self.check_memory)

    def check_disk(self) -> None:
        self.disk_checks += 1
        self.disk_free = data_dir_free(self.data_dir)
        if self.disk_free < self.disk_free_limit or self.storage_failing:
            self.alarms.raise_alarm("disk", self.connections)
        else:
            self.alarms.clear_alarm("disk")
        headroom = max(0, self.disk_free - self.disk_free_limit)
        self._written_since_check = 0
        self._write_budget = headroom // 2
        delay = min(self.interval, max(DISK_CHECK_MIN, headroom / DISK_WRITE_RATE))
        if self._disk_handle is not None:
            self._disk_handle.cancel()
        self._disk_handle = self.clock.call_later(delay, self.check_disk)

    def note_written(self, nbytes: int) -> None:
        """The storage handed ``nbytes`` to the kernel: check the disk now if they may have used up half of
        the headroom seen at the last check (called once per flush, not per message)."""
        self._written_since_check += nbytes
        if self._written_since_check >= self._write_budget:
            self.check_disk()

    def set_storage_failing(self, failing: bool) -> None:
        """The storage's writes started (True) or stopped (False) failing: re-check the disk alarm now."""
        self.storage_failing = failing
        self.check_disk()
