"""The resource alarms (broker/resources/alarms.py) over any connection that satisfies ``BlockableConnection``: only
publishers are blocked, every blocked one is unblocked once the last alarm clears, and listeners hear
each change; the monitor checks on the clock it is given. No reader, node or event loop is needed (that is
the point of the Protocol and the clock)."""

from __future__ import annotations

import shutil
from pathlib import Path

from broker.clock import ManualClock
from broker.resources.alarms import AlarmState, BlockableConnection, ResourceMonitor


class FakeConnection:
    def __init__(self, alarms: AlarmState, has_published: bool) -> None:
        self.alarms = alarms
        self.has_published = has_published
        self.calls: list[str] = []

    def block_for_alarm(self, reason: str) -> None:
        self.calls.append(f"block: {reason}")
        self.alarms.blocked.add(self)

    def unblock_after_alarm(self) -> None:
        self.calls.append("unblock")


def test_an_alarm_blocks_publishers_only_and_unblocks_them_when_every_alarm_has_cleared():
    alarms = AlarmState()
    heard: list[set[str]] = []
    alarms.listeners.append(heard.append)
    publisher = FakeConnection(alarms, has_published=True)
    consumer = FakeConnection(alarms, has_published=False)
    connections: set[BlockableConnection] = {publisher, consumer}

    alarms.raise_alarm("memory", connections)
    alarms.raise_alarm("disk", connections)  # asked again with the new reason (Reader ignores it if blocked)
    blocks = ["block: low on memory", "block: low on disk & low on memory"]
    assert publisher.calls == blocks
    assert consumer.calls == []
    assert alarms.active and alarms.reason() == "low on disk & low on memory"

    alarms.clear_alarm("memory")
    assert publisher.calls == blocks  # the disk alarm still holds it
    alarms.clear_alarm("disk")
    assert publisher.calls == [*blocks, "unblock"]
    assert alarms.blocked == set() and not alarms.active
    assert heard == [{"memory"}, {"memory", "disk"}, {"disk"}, set()]


def test_raising_or_clearing_twice_changes_nothing():
    alarms = AlarmState()
    heard: list[set[str]] = []
    alarms.listeners.append(heard.append)
    alarms.clear_alarm("disk")
    alarms.raise_alarm("disk", [])
    alarms.raise_alarm("disk", [])
    assert heard == [{"disk"}]


def test_the_monitor_raises_and_clears_the_disk_alarm_on_its_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    alarms = AlarmState()
    publisher = FakeConnection(alarms, has_published=True)
    free = shutil.disk_usage(tmp_path).free
    monitor = ResourceMonitor(alarms, [publisher], tmp_path, memory_limit=0, disk_free_limit=free * 4,
                              interval=0.5, clock=clock)
    monitor.start()
    assert alarms.raised == {"disk"} and publisher.calls == ["block: low on disk"]
    checks = monitor.disk_checks
    clock.advance(0.5)  # no headroom: the disk is checked again within the interval
    assert monitor.disk_checks > checks

    monitor.disk_free_limit = 0  # as `ctl set_disk_free_limit 0` sets it
    clock.advance(0.5)
    assert alarms.raised == set() and publisher.calls[-1] == "unblock"

    monitor.stop()
    checks = monitor.disk_checks
    clock.advance(5)
    assert monitor.disk_checks == checks and clock.pending == 0
