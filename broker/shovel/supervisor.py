"""The node's shovels: one :class:`ShovelWorker` per ``shovel`` parameter of any vhost.

The vhosts tell the supervisor when a shovel parameter is set or cleared (VHost.on_parameter, wired by the
node), also while the node recovers its definitions at start; workers start only once the server listens
(:meth:`start`), since ``amqp://`` with no host connects to this node's own listener. A local connection
logs in as a node-internal user made per shovel (auth.UserStore.internal: never listed, exported or
accepted by the HTTP API) with all permissions on the URI's vhost only: the simplest correct way to reach
the local broker with every check a client gets (permissions, limits, alarms, confirms) and without
storing a password, where RabbitMQ uses a direct Erlang connection.

In a cluster a shovel runs on one member (broker/shovel/placement.py): a worker is made on every member that has
the parameter, and started only where the placement holds the shovel's claim; :meth:`_place` asks for the
missing claims every CLAIM_EVERY seconds, so a shovel whose member went away starts on another within about a
second of its session ending. ``GET /api/shovels`` of a member lists the shovels it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from broker.shovel.definition import COMPONENT, ShovelDefinition
from broker.shovel.placement import CLAIM_EVERY, HERE, ShovelPlacement
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
        # Where shovels run (a cluster member's is set by broker/clustering/cluster.py before start()).
        self.placement: ShovelPlacement = HERE
        self._placing: asyncio.Task[None] | None = None

    def parameter_changed(self, vhost: str, component: str, name: str, value: Any | None) -> None:
        """A vhost's parameter was set (``value``) or cleared (None): (re)start or stop that shovel."""
        if component != COMPONENT:
            return
        old = self.workers.pop((vhost, name), None)
        if old is not None:
            self._stop_soon(old)
        if value is None:
            self._release(vhost, name)
            return
        worker = ShovelWorker(ShovelDefinition.parse(vhost, name, value), self.node_name, self.local,
                              self._finished)
        self.workers[(vhost, name)] = worker
        if self.running:
            self._start_if_held(worker)

    def forget_vhost(self, vhost: str) -> None:
        for key in [k for k in self.workers if k[0] == vhost]:
            self._stop_soon(self.workers.pop(key))
            self._release(*key)

    def start(self, parameters: Iterable[tuple[str, str, str, Any]] = ()) -> None:
        """Start every shovel: those set since the node was made, and those of ``parameters`` (vhost,
        component, name, value), the parameters the node recovered from its store, which are read into
        the vhosts without passing through VHost.set_parameter."""
        for vhost, component, name, value in parameters:
            if component == COMPONENT and (vhost, name) not in self.workers:
                self.parameter_changed(vhost, component, name, value)
        self.running = True
        for worker in self.workers.values():
            self._start_if_held(worker)

    async def stop(self) -> None:
        self.running = False
        if self._placing is not None:
            self._placing.cancel()
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
            self._start_if_held(fresh)
        log.info("shovel restarted", vhost=vhost, shovel=name)
        return True

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """The shovels that run here (in a cluster, each is listed by the member that holds it)."""
        return [w.status() for (vh, _n), w in sorted(self.workers.items())
                if (vhost is None or vh == vhost) and w.task is not None]

    async def cluster_status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every member's shovels, as RabbitMQ's GET /api/shovels lists every node's: those run here, and the
        status the members running the others reported lately (broker/shovel/placement.py), for shovels whose
        parameter this node has."""
        own = self.status(vhost)
        here = {(s["vhost"], s["name"]) for s in own}
        others = [s for s in await self.placement.others()
                  if (vhost is None or s.get("vhost") == vhost) and (s.get("vhost"), s.get("name")) not in here
                  and (s.get("vhost"), s.get("name")) in self.workers]
        return sorted(own + others, key=lambda s: (s["vhost"], s["name"]))

    # -- placement (broker/shovel/placement.py) -------------------------------------------------------------
    def _start_if_held(self, worker: ShovelWorker) -> None:
        if self.placement.holds(_key(worker)):
            worker.start()
        elif self._placing is None or self._placing.done():
            self._placing = asyncio.get_running_loop().create_task(self._place(), name="shovel placement")

    async def _place(self) -> None:
        """While some shovel of this node's table runs nowhere here: stop everything if the claims were lost,
        then claim the shovels not running and start those whose claim this node got."""
        while self.running:
            if self.placement.lost():
                log.warning("shovels: the cluster claims were lost; stopping the shovels run here")
                for key, worker in list(self.workers.items()):
                    if worker.task is not None:
                        self._stop_soon(worker)
                        self.workers[key] = ShovelWorker(worker.d, self.node_name, self.local, self._finished)
            waiting = [w for w in self.workers.values() if w.task is None]
            for worker in waiting:
                if await self.placement.claim(_key(worker)) and self.running \
                        and self.workers.get((worker.d.vhost, worker.d.name)) is worker and worker.task is None:
                    log.info("shovel placed here", vhost=worker.d.vhost, shovel=worker.d.name, node=self.node_name)
                    worker.start()
            await self.placement.report(self.status())  # for the other members' GET /api/shovels
            await asyncio.sleep(CLAIM_EVERY)

    def _release(self, vhost: str, name: str) -> None:
        if self.placement is HERE:
            return
        asyncio.get_running_loop().create_task(self.placement.release(f"{vhost}/{name}"))

    def _finished(self, worker: ShovelWorker) -> None:
        """src-delete-after reached: the shovel removes itself and its parameter (every member then drops it)."""
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


def _key(worker: ShovelWorker) -> str:
    return f"{worker.d.vhost}/{worker.d.name}"
