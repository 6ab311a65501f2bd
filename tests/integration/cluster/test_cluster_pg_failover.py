"""PostgreSQL fail-over under a cluster (issue 35): a primary with a synchronous streaming standby, both started
here from Debian's PostgreSQL binaries (initdb, pg_basebackup -R, synchronous_standby_names), two members given
a two-host DSN (``target_session_attrs=read-write``), kill -9 of every process of the primary while a publisher
confirms into a quorum queue, the standby promoted with ``pg_ctl promote``: every confirmed message is in the
queue after (0 lost), and publishing resumes by itself. Each round then makes the killed server a standby of the
new primary again (pg_basebackup into its folder, on its port), so the DSN stays the same, and the next round
kills the other one. The time from the kill to the first confirm after it is printed per round.

A few rounds in the default run; ``-m long`` runs more. Real processes throughout: PostgreSQL servers, broker
processes, SIGKILL."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time

import asyncpg
import pika
import pika.exceptions
import pytest
from pg_server import PgServer, find_bin

from tests.conftest import wait_http
from tests.integration.management.test_management_api import wait_for

pytestmark = pytest.mark.leveret_only

QQ = {"x-queue-type": "quorum"}


class ReplicatedPostgres:
    """Two PostgreSQL servers on their own ports: ``primary`` and a synchronous streaming ``standby`` of it
    (``synchronous_standby_names = '*'`` on the primary: a commit returns once the standby has flushed its WAL,
    the default ``synchronous_commit = on``)."""

    def __init__(self) -> None:
        self.primary = PgServer()
        self.standby = PgServer()
        self._pg_ctl = find_bin("pg_ctl")
        self._basebackup = find_bin("pg_basebackup")

    def start(self) -> None:
        self.primary.start()
        self._make_standby(self.standby, self.primary)
        asyncio.run(self._admin(self.primary, "CREATE DATABASE leveret"))

    def dsn(self) -> str:
        """Both servers, the one that takes writes chosen at each connect (libpq's and asyncpg's rule)."""
        a, b = self.primary, self.standby
        return (f"postgresql://{a.user}@127.0.0.1:{a.port},127.0.0.1:{b.port}/leveret"
                "?target_session_attrs=read-write")

    @staticmethod
    def _append(server: PgServer, text: str) -> None:
        with open(server.data / "postgresql.conf", "a") as f:
            f.write(text + "\n")

    @staticmethod
    async def _admin(server: PgServer, sql: str) -> None:
        conn = await asyncpg.connect(server.dsn())
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    @staticmethod
    async def _standbys(server: PgServer, sync_state: str) -> int:
        conn = await asyncpg.connect(server.dsn())
        try:
            return int(await conn.fetchval(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = $1 AND state = 'streaming'",
                sync_state))
        finally:
            await conn.close()

    def _make_standby(self, standby: PgServer, primary: PgServer) -> None:
        """``standby``'s folder becomes a streaming copy of ``primary`` (pg_basebackup -R), on its own port; it
        is started, then made the primary's synchronous standby (only once it streams: a primary that waits for
        a synchronous standby not there yet holds every commit), and this returns once the primary counts it so."""
        if standby.data.exists():
            shutil.rmtree(standby.data)
        if os.geteuid() == 0:
            shutil.chown(standby.root, "postgres", "postgres")
        standby.user = primary.user
        standby._run(self._basebackup, "-D", str(standby.data), "-h", "127.0.0.1", "-p", str(primary.port),
                     "-U", primary.user, "-R", "-X", "stream", "-c", "fast", "--no-sync")
        # The copy's postgresql.conf is the primary's: its own port and socket folder, and no synchronous
        # standby of its own (once promoted, a commit would otherwise wait for a standby that is not there).
        self._append(standby, f"port = {standby.port}\nunix_socket_directories = '{standby.root}'\n"
                              "synchronous_standby_names = ''")
        standby.resume()
        assert wait_for(lambda: asyncio.run(self._standbys(primary, "async")) == 1, 30), "the standby did not attach"
        self._append(primary, "synchronous_standby_names = '*'")
        primary._run(self._pg_ctl, "-D", str(primary.data), "reload")
        assert wait_for(lambda: asyncio.run(self._standbys(primary, "sync")) == 1, 30), "the standby is not synchronous"

    def kill_primary(self) -> None:
        """kill -9 of the primary's postmaster and every process it started: no shutdown, no last WAL sent."""
        for pid in self.primary._pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.primary.running = False

    def promote(self) -> None:
        """``pg_ctl promote`` of the standby; it is the primary from here (the roles swap)."""
        self.standby._run(self._pg_ctl, "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        self.primary, self.standby = self.standby, self.primary

    def rebuild_standby(self) -> None:
        """The killed server's folder made again as a synchronous standby of the new primary, on its port.

        The killed postmaster left its socket's lock file (``.s.PGSQL.<port>.lock``, beside the data folder):
        PostgreSQL refuses to start while the PID written there still exists, and a killed process that init
        has not reaped yet still does (a fresh-clone run met "lock file ... already exists. Is another
        postmaster (PID ...) using socket file"). We killed that server: its socket files go."""
        for stale in self.standby.root.glob(".s.PGSQL.*"):
            stale.unlink(missing_ok=True)
        self._make_standby(self.standby, self.primary)

    def stop(self) -> None:
        for s in (self.primary, self.standby):
            try:
                s.stop()
            except Exception:  # noqa: BLE001 - a killed server: its folder goes anyway
                shutil.rmtree(s.root, ignore_errors=True)


class ConfirmingPublisher(threading.Thread):
    """Publishes numbered persistent messages one at a time with confirms into ``queue`` on ``broker``, for
    ever until stopped, reconnecting after any failure: ``confirmed`` holds (number, sent, acked) of every ack. A nack
    or a broken connection leaves that number unconfirmed (it may still be in the queue: a duplicate, fine)."""

    def __init__(self, broker, queue: str) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.queue = queue
        self.confirmed: list[tuple[int, float, float]] = []
        self.failures = 0
        self.stopping = threading.Event()
        self.next = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                conn = pika.BlockingConnection(self.broker.pika_params(blocked_connection_timeout=30))
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stopping.is_set():
                    n = self.next
                    self.next += 1
                    sent = time.monotonic()
                    try:
                        ch.basic_publish("", self.queue, str(n).encode(),
                                         pika.BasicProperties(delivery_mode=2), mandatory=True)
                    except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                        self.failures += 1
                        time.sleep(0.01)
                        continue
                    self.confirmed.append((n, sent, time.monotonic()))
                conn.close()
            except pika.exceptions.AMQPError:
                self.failures += 1
                time.sleep(0.05)

    def first_confirm_after(self, t: float) -> float | None:
        """When the first message sent after ``t`` was confirmed (a confirm of one sent before the kill, already
        committed, says nothing of the fail-over)."""
        return next((acked for _n, sent, acked in self.confirmed if sent > t), None)


def drain(broker, queue: str) -> set[int]:
    """Every message number left in ``queue``, consumed and acked on ``broker`` until it stays empty for 2 s."""
    got: set[int] = set()
    conn = pika.BlockingConnection(broker.pika_params())
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    for _method, _props, body in ch.consume(queue, inactivity_timeout=2):
        if body is None:
            break
        got.add(int(body))
        ch.basic_ack(_method.delivery_tag)
    ch.cancel()
    conn.close()
    return got


def member(start_broker, dsn: str, name: str):
    """A member on ``dsn``, once its HTTP API answers (30 s: a loaded machine starts slowly)."""
    b = start_broker("--set", f"cluster.postgres.dsn={dsn}", "--set", f"leveret.nodename={name}")
    wait_http([b], 30)
    return b


def run_failover(start_broker, rounds: int) -> None:
    pg = ReplicatedPostgres()
    pg.start()
    try:
        dsn = pg.dsn()
        a = member(start_broker, dsn, "a@failover")
        b = member(start_broker, dsn, "b@failover")
        conn = pika.BlockingConnection(a.pika_params())
        conn.channel().queue_declare("failover-qq", durable=True, arguments=QQ)
        conn.close()
        pub = ConfirmingPublisher(a, "failover-qq")
        pub.start()
        figures: list[float] = []
        try:
            for r in range(rounds):
                before = len(pub.confirmed)
                assert wait_for(lambda before=before: len(pub.confirmed) >= before + 200, 20), \
                    f"round {r}: the publisher is not confirming ({len(pub.confirmed)} confirmed)"
                pg.kill_primary()
                killed_at = time.monotonic()  # after every SIGKILL: whatever is sent from here cannot commit there
                pg.promote()
                first = wait_for(lambda killed_at=killed_at: pub.first_confirm_after(killed_at), 30)
                assert first is not None, f"round {r}: publishing did not resume within 30 s of the kill"
                figures.append((first - killed_at) * 1000)
                print(f"fail-over round {r + 1}: kill -9 of the primary -> first confirm after it: "
                      f"{figures[-1]:.0f} ms ({len(pub.confirmed)} confirmed so far)")
                if r + 1 < rounds:
                    pg.rebuild_standby()
        finally:
            pub.stopping.set()
            pub.join(30)
        confirmed = {n for n, _sent, _acked in pub.confirmed}
        got = drain(b, "failover-qq")
        lost = confirmed - got
        print(f"fail-over: {rounds} rounds, {len(confirmed)} confirmed, {len(lost)} lost, "
              f"{pub.failures} nacked or broken, kill -> first confirm ms: {[round(x) for x in figures]}")
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
    finally:
        pg.stop()


def test_a_postgres_fail_over_under_a_confirming_publisher_loses_nothing_and_publishing_resumes(start_broker):
    run_failover(start_broker, rounds=2)


@pytest.mark.long
@pytest.mark.timeout(900)
def test_many_postgres_fail_overs_lose_nothing(start_broker):
    run_failover(start_broker, rounds=10)
