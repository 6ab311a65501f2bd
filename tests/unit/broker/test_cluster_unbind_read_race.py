"""An unbind made on one cluster member of a binding of another member's queue (broker/clustering/cluster_forwarding.py
VHostLink.unbind_remote) against a read of the directory in flight (ClusterForwarding.reload): a read whose
snapshot was taken before the directory row's removal committed, applied after the unbind was answered, made
the member route and list the binding again until its next read (2 s later at most): the HTTP API's DELETE had
answered 204 and the member still routed what it was sent after it to the other member's queue
(tests/integration/cluster/test_cluster_equivalence.py's HTTP test, about 1 run in 8). The PostgreSQL side is a
fake here, so the order of the read and the unbind is the test's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.clustering.cluster_forwarding import ClusterForwarding
from broker.errors import AMQPError
from broker.exchanges.exchange import QUEUE
from broker.message import Message
from broker.persistence import table_of
from broker.vhost import VHost
from storage.pg.forwarding import BindingRow, DirectoryUnavailable, QueueRow

HEADER = bytes.fromhex("003c00000000000000000000") + b"\x00\x00"  # class 60, weight 0, body size 0, no properties


def msg(exchange: str, key: str) -> Message:
    ex, rk = exchange.encode(), key.encode()
    return Message(exchange, key, bytes([len(ex)]) + ex + bytes([len(rk)]) + rk, HEADER, b"body")


BOUND = BindingRow("/", "hx", "hq", "k", table_of({}), "direct", "a@x")


class Tables:
    """The directory's rows in PostgreSQL as this test has them: a@x's queue hq, bound from hx with k."""

    def __init__(self) -> None:
        self.queues = [QueueRow("/", "hq", "a@x", True, False)]
        self.bindings = [BOUND]


class Pg:
    """PgForwarding's read of the other members' rows: the snapshot is taken when the read starts, and handed
    back once ``gate`` (if any) is open."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.gate: asyncio.Event | None = None

    async def others(self) -> tuple[list[QueueRow], list[BindingRow]]:
        snapshot = list(self.tables.queues), list(self.tables.bindings)
        gate = self.gate
        if gate is not None:
            await gate.wait()
        return snapshot


class Directory:
    """PgDirectory's unbind of another member's queue: the row goes in a transaction that commits (and the
    owner takes the request) once the loop runs, or fails (``fail``) as when PostgreSQL does not answer."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.fail = False

    def unbind_for(self, owner: str, vhost: str, source: str, queue: str, routing_key: str, args_hash: str,
                   request_queues: list[str], request: bytes, wait: float = 2.0,
                   committed: Any = None) -> asyncio.Future[bool]:
        async def run() -> bool:
            await asyncio.sleep(0)
            if self.fail:
                raise DirectoryUnavailable("PostgreSQL did not answer within 3 s")
            self.tables.bindings = [b for b in self.tables.bindings
                                    if (b.source, b.queue, b.routing_key) != (source, queue, routing_key)]
            if committed is not None:
                committed()
            return True

        return asyncio.ensure_future(run())


@pytest.fixture
async def member():
    """Member b@x of a cluster: the vhost with the durable exchange hx, its forwarding over the fakes."""
    vh = VHost("/")
    vh.declare_exchange("hx", "direct", False, True, False, False, {})
    node = SimpleNamespace(name="b@x", vhosts={"/": vh})
    fw = ClusterForwarding(node, "postgresql://unused")  # (its directory never connects: replaced below)
    tables = Tables()
    fw.directory = Directory(tables)  # type: ignore[assignment]
    fw.pg = Pg(tables)  # type: ignore[assignment]
    fw.attach(vh)
    await fw.reload()
    yield vh, fw, tables
    vh.use_topology(None)


def routed(vh: VHost) -> set[str]:
    return {q.name for q in vh.route(vh.exchanges["hx"], msg("hx", "k"))}


def listed(vh: VHost) -> list[str]:
    return [b.routing_key for b in vh.remote.bindings_to("hx", "hq")]


async def test_a_read_in_flight_does_not_bring_an_unbound_binding_back(member) -> None:
    vh, fw, tables = member
    assert routed(vh) == {"hq"} and listed(vh) == ["k"]
    fw.pg.gate = asyncio.Event()
    stale = asyncio.ensure_future(fw.reload())  # the poll's read: it has the row
    await asyncio.sleep(0)
    unbinding = vh.unbind("hx", "hq", QUEUE, "k", {})
    assert unbinding is not None
    await unbinding  # the HTTP API's 204, the channel's unbind-ok
    assert tables.bindings == []
    fw.pg.gate.set()
    await stale  # applied after the answer
    assert routed(vh) == set()  # was {"hq"}: routed to a@x's queue until the next read
    assert listed(vh) == []  # was ["k"]
    fw.pg.gate = None
    await fw.reload()  # a read started after the removal: it has it right, and nothing is left out anymore
    assert routed(vh) == set()
    tables.bindings = [BOUND]  # a@x binds again
    await fw.reload()
    assert routed(vh) == {"hq"} and listed(vh) == ["k"]


async def test_an_unbind_that_was_not_committed_leaves_the_binding_to_the_next_read(member) -> None:
    vh, fw, _tables = member
    fw.directory.fail = True
    unbinding = vh.unbind("hx", "hq", QUEUE, "k", {})
    assert unbinding is not None
    with pytest.raises(AMQPError) as err:
        await unbinding
    assert err.value.reply_code == 541
    await fw.reload()  # the row is still there: so is the binding
    assert routed(vh) == {"hq"} and listed(vh) == ["k"]


async def test_a_read_older_than_one_applied_is_dropped(member) -> None:
    vh, fw, tables = member
    gate = fw.pg.gate = asyncio.Event()
    older = asyncio.ensure_future(fw.reload())  # has the binding
    await asyncio.sleep(0)
    tables.bindings = []  # a@x unbinds
    fw.pg.gate = None
    await fw.reload()  # started later, done first
    assert routed(vh) == set()
    gate.set()
    await older
    assert routed(vh) == set() and listed(vh) == []
