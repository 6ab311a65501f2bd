"""The node: the broker's shared state (settings, users, vhosts, connections) and its listeners."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
from typing import TYPE_CHECKING

import structlog

from broker.alarms import AlarmState, ResourceMonitor, total_memory
from broker.auth import UserStore
from broker.config import Settings
from broker.message import Message
from broker.reader import Reader
from broker.vhost import VHost

if TYPE_CHECKING:
    from broker.channel import Channel

log = structlog.get_logger("leveret.node")


class Node:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.users = UserStore()
        self.users.add(settings.default_user, settings.default_pass, ["administrator"])
        self.vhosts: dict[str, VHost] = {settings.default_vhost: VHost(settings.default_vhost)}
        self.connections: set[Reader] = set()
        # Memory and disk alarms (broker/alarms.py); the monitor that raises them starts with the node.
        self.alarm_state = AlarmState()
        self.resource_monitor: ResourceMonitor | None = None
        self._reply_channels: dict[str, "Channel"] = {}
        self._server: asyncio.base_events.Server | None = None

    # -- direct reply-to: amq.rabbitmq.reply-to.<key> names one channel's reply consumer ---------------------
    def register_reply_channel(self, channel: "Channel") -> str:
        key = base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._reply_channels[key] = channel
        return key

    def unregister_reply_channel(self, key: str) -> None:
        self._reply_channels.pop(key, None)

    def deliver_reply(self, msg: Message) -> int:
        """Route a message published to ``amq.rabbitmq.reply-to.<key>``; 0 if that consumer is gone."""
        channel = self._reply_channels.get(msg.routing_key[len("amq.rabbitmq.reply-to."):])
        if channel is None or channel.reply_consumer is None:
            return 0
        channel.deliver_reply(msg)
        return 1

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start_resource_monitor(self) -> None:
        """Memory limit: the absolute watermark if set, else the relative one times the machine's RAM."""
        s = self.settings
        limit = s.vm_memory_high_watermark_absolute or int(s.vm_memory_high_watermark_relative * total_memory())
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self.resource_monitor = ResourceMonitor(self.alarm_state, self.connections, s.data_dir, limit,
                                                s.disk_free_limit_absolute)
        self.resource_monitor.start()

    async def start(self) -> None:
        self.start_resource_monitor()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Reader(self), self.settings.bind, self.settings.port,
                                                reuse_address=True, backlog=1024)
        log.info("listening", protocol="amqp", address=self.settings.bind, port=self.settings.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.force_close("broker shutdown")
        await asyncio.sleep(0.1)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        log.info("stopped")

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
        await self.stop()
