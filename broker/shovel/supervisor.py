"""The node's shovels: one :class:`ShovelWorker` per ``shovel`` parameter of any vhost.

The vhosts tell the supervisor when a shovel parameter is set or cleared (VHost.on_parameter, wired by the
node), also while the node recovers its definitions at start; workers start only once the server listens
(:meth:`start`), since ``amqp://`` with no host connects to this node's own listener. A local connection
logs in as a node-internal user made per shovel (auth.UserStore.internal: never listed, exported or
accepted by the HTTP API) with all permissions on the URI's vhost only: the simplest correct way to reach
the local broker with every check a client gets (permissions, limits, alarms, confirms) and without
storing a password, where RabbitMQ uses a direct Erlang connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from broker.shovel.definition import COMPONENT, ShovelDefinition
from broker.shovel.worker import LocalLogin, ShovelWorker

log = structlog.get_logger("leveret.shovel")


class ShovelSupervisor:
    def __init__(self, node_name: str, local: Callable[[str], LocalLogin],
                 clear_parameter: Callable[[str, str], None]) -> None:
        self.node_name = node_name
        self.local = local
        self.clear_parameter = clear_parameter
        self.workers: dict[tuple[str, str], ShovelWorker] = {}
        self.running = False

    def parameter_changed(self, vhost: str, component: str, name: str, value: Any | None) -> None:
        """A vhost's parameter was set (``value``) or cleared (None): (re)start or stop that shovel."""
        if component != COMPONENT:
            return
        old = self.workers.pop((vhost, name), None)
        if old is not None:
            self._stop_soon(old)
        if value is None:
            return
        worker = ShovelWorker(ShovelDefinition.parse(vhost, name, value), self.node_name, self.local,
                              self._finished)
        self.workers[(vhost, name)] = worker
        if self.running:
            worker.start()

    def forget_vhost(self, vhost: str) -> None:
        for key in [k for k in self.workers if k[0] == vhost]:
            self._stop_soon(self.workers.pop(key))

    def start(self, parameters: Iterable[tuple[str, str, str, Any]] = ()) -> None:
        """Start every shovel: those set since the node was made, and those of ``parameters`` (vhost,
        component, name, value), the parameters the node recovered from its store, which are read into
        the vhosts without passing through VHost.set_parameter."""
        for vhost, component, name, value in parameters:
            if component == COMPONENT and (vhost, name) not in self.workers:
                self.parameter_changed(vhost, component, name, value)
        self.running = True
        for worker in self.workers.values():
            worker.start()

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*(w.stop() for w in self.workers.values()))

    def restart(self, vhost: str, name: str) -> bool:
        """DELETE /api/shovels/vhost/{vhost}/{name}/restart: a new worker from the same definition."""
        worker = self.workers.get((vhost, name))
        if worker is None:
            return False
        self._stop_soon(worker)
        fresh = ShovelWorker(worker.d, self.node_name, self.local, self._finished)
        self.workers[(vhost, name)] = fresh
        if self.running:
            fresh.start()
        log.info("shovel restarted", vhost=vhost, shovel=name)
        return True

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [w.status() for (vh, _n), w in sorted(self.workers.items()) if vhost is None or vh == vhost]

    def _finished(self, worker: ShovelWorker) -> None:
        key = (worker.d.vhost, worker.d.name)
        if self.workers.get(key) is worker:
            self.clear_parameter(*key)  # → parameter_changed(None): the worker leaves the table
            self.workers.pop(key, None)

    def _stop_soon(self, worker: ShovelWorker) -> None:
        if worker.task is None:
            return
        if worker.task is asyncio.current_task():
            return
        worker.task.cancel()
