"""The patterns of the Python clients' own test suites, run against a real broker process many times over:
connections and channels closed while confirmed publishes are in flight (aio-pika, aiormq), reconnect storms
(aio-pika ``connect_robust`` while the broker drops connections through the HTTP API or restarts), connections
opening channels all at once, channel churn on one connection, pika acks sent from other threads
(``add_callback_threadsafe``), and kombu producers and consumers that reconnect.

Each pattern is repeated a bounded number of times, since what breaks here breaks now and then. Besides what
the clients see, every test checks that the broker logged no traceback for a client going away and that it
still serves a new connection afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import queue as queue_module
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import aio_pika
import aiormq
import kombu
import pika
import pytest
from pamqp import commands as pamqp_commands

from tests.conftest import BrokerProcess, free_port

ROUNDS = 15  # repetitions of a pattern that breaks only now and then


# -- helpers ---------------------------------------------------------------------------------------------


class BrokerLog:
    """The part of a Leveret log written since ``mark()``; empty for a broker we did not start."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.offset = 0
        self.mark()

    def mark(self) -> None:
        path = self.broker.log_path
        self.offset = path.stat().st_size if path is not None and path.exists() else 0

    def text(self) -> str:
        path = self.broker.log_path
        if path is None or not path.exists():
            return ""
        with open(path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def assert_clean(self) -> None:
        """No traceback and nothing logged at error level: a client going away is not a broker error."""
        text = self.text()
        bad = [line for line in text.splitlines()
               if "Traceback" in line or '"level": "error"' in line or line.startswith(("ERROR", "CRITICAL"))
               or "exception" in line.lower() and '"level": "info"' not in line]
        assert not bad, "the broker logged errors:\n" + "\n".join(bad[:20])


@pytest.fixture
def broker_log(broker) -> Iterator[BrokerLog]:
    log = BrokerLog(broker)
    yield log
    log.assert_clean()


class Management:
    """The HTTP API of a Leveret started by the test."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def _call(self, method: str, path: str) -> tuple[int, object]:
        req = urllib.request.Request(self.base + path, method=method, headers={"Authorization": self.auth})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                body = resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        return status, (json.loads(body) if body.strip().startswith((b"[", b"{")) else body)

    def wait_up(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._call("GET", "/api/overview")[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP API did not come up")
            time.sleep(0.05)

    def connection_names(self) -> list[str]:
        status, body = self._call("GET", "/api/connections")
        assert status == 200, body
        return [c["name"] for c in body]  # type: ignore[union-attr]

    def close_connection(self, name: str) -> int:
        return self._call("DELETE", "/api/connections/" + urllib.parse.quote(name, safe=""))[0]

    def close_all(self) -> int:
        closed = 0
        for name in self.connection_names():
            if self.close_connection(name) == 204:
                closed += 1
        return closed


@pytest.fixture
def mgmt_broker(start_broker) -> tuple[BrokerProcess, Management]:
    """A Leveret of the test's own with the HTTP API on, whose connections the test closes (``start_broker``
    skips the test when the suite is pointed at another broker)."""
    port = free_port()
    b = start_broker("--management-port", str(port), "--prometheus-port", "0")
    api = Management(port)
    api.wait_up()
    return b, api


async def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _assert_serves(url: str) -> None:
    """The broker still takes a connection, a queue, a confirmed publish and a get."""
    async with asyncio.timeout(15):
        conn = await aio_pika.connect(url, timeout=10)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            confirm = await ch.default_exchange.publish(aio_pika.Message(b"still here"), routing_key=q.name)
            assert isinstance(confirm, pamqp_commands.Basic.Ack)
            msg = await q.get(timeout=5)
            assert msg.body == b"still here"
            await msg.ack()


def _declare(url: str, *names: str, durable: bool = False) -> None:
    params = pika.URLParameters(url)
    with contextlib.closing(pika.BlockingConnection(params)) as c:
        ch = c.channel()
        for name in names:
            ch.queue_declare(name, durable=durable)


def _delete(url: str, *names: str) -> None:
    params = pika.URLParameters(url)
    with contextlib.closing(pika.BlockingConnection(params)) as c:
        ch = c.channel()
        for name in names:
            ch.queue_delete(name)


def _count(url: str, name: str) -> int:
    params = pika.URLParameters(url)
    with contextlib.closing(pika.BlockingConnection(params)) as c:
        return c.channel().queue_declare(name, passive=True).method.message_count


# -- closing while confirmed publishes are in flight ---------------------------------------------------------


PUBLISHES = 200


def _settled(done: set[asyncio.Future]) -> int:
    """How many publishes were confirmed; every other one must have failed (the clients' error for a closed
    channel, which depends on the point the close reached): a nack or anything else is wrong."""
    acked = 0
    for t in done:
        r = asyncio.CancelledError() if t.cancelled() else (t.exception() or t.result())
        if isinstance(r, pamqp_commands.Basic.Ack):
            acked += 1
        else:
            assert isinstance(r, BaseException), f"a publish ended with {r!r}"
    return acked


def _assert_no_stray_frames(caplog: pytest.LogCaptureFixture) -> None:
    """aiormq logs a frame that comes on a channel after its close-ok, or a confirm for a publish that channel
    never made (the late confirm of a closed channel arriving on the channel that reused its number)."""
    stray = [r.getMessage() for r in caplog.records if r.name.startswith("aiormq")
             and ("closed channel" in r.getMessage() or "Unexpected confirmation" in r.getMessage())]
    assert not stray, stray[:5]


@pytest.mark.parametrize("close", ["connection", "channel"])
async def test_aio_pika_close_with_confirms_in_flight(broker, broker_log, uid, close, caplog):
    """aio-pika's ``test_channel_close``-style pattern: hundreds of confirmed persistent publishes to a durable
    queue (confirmed after the fsync) are outstanding when the connection (or only the channel) is closed.
    Every publish ends, confirmed or failed, within the bound; every confirmed message is in the queue;
    nothing arrives on the channel after its close-ok (its number is reused at once); the broker goes on."""
    name = f"{uid}-q"
    _declare(broker.url, name, durable=True)
    try:
        total_acked = 0
        async with asyncio.timeout(90):
            for rnd in range(ROUNDS):
                conn = await aio_pika.connect(broker.url, timeout=10)
                ch = await conn.channel()
                tasks = [asyncio.ensure_future(ch.default_exchange.publish(
                    aio_pika.Message(b"m%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=name)) for i in range(PUBLISHES)]
                for _ in range(rnd % 5):  # close at a different point of the burst each round
                    await asyncio.sleep(0)
                if close == "channel":
                    await ch.close()
                    other = await conn.channel()  # the connection is still good for new channels
                    assert isinstance(await other.default_exchange.publish(
                        aio_pika.Message(b"after"), routing_key=name), pamqp_commands.Basic.Ack)
                    total_acked += 1
                    await conn.close()
                else:
                    await conn.close()
                done, pending = await asyncio.wait(tasks, timeout=15)
                assert not pending, f"{len(pending)} publishes never ended (round {rnd})"
                total_acked += _settled(done)
        assert _count(broker.url, name) >= total_acked  # nothing confirmed was lost
        _assert_no_stray_frames(caplog)
        await _assert_serves(broker.url)
    finally:
        _delete(broker.url, name)


@pytest.mark.parametrize("close", ["connection", "channel"])
async def test_aiormq_close_with_confirms_in_flight(broker, broker_log, uid, close, caplog):
    """The same with aiormq alone (its ``test_simple`` / ``test_channel_close`` patterns): basic_publish
    futures outstanding while the connection or the channel closes."""
    name = f"{uid}-q"
    _declare(broker.url, name, durable=True)
    try:
        total_acked = 0
        async with asyncio.timeout(90):
            for rnd in range(ROUNDS):
                conn = await aiormq.connect(broker.url)
                ch = await conn.channel()  # publisher confirms on
                tasks = [asyncio.ensure_future(ch.basic_publish(b"m%d" % i, routing_key=name,
                                                                properties=aiormq.spec.Basic.Properties(
                                                                    delivery_mode=2)))
                         for i in range(PUBLISHES)]
                for _ in range(rnd % 5):
                    await asyncio.sleep(0)
                if close == "channel":
                    await ch.close()
                    other = await conn.channel()
                    assert isinstance(await other.basic_publish(b"after", routing_key=name),
                                      pamqp_commands.Basic.Ack)
                    total_acked += 1
                await conn.close()
                done, pending = await asyncio.wait(tasks, timeout=15)
                assert not pending, f"{len(pending)} publishes never ended (round {rnd})"
                total_acked += _settled(done)
        assert _count(broker.url, name) >= total_acked
        _assert_no_stray_frames(caplog)
        await _assert_serves(broker.url)
    finally:
        _delete(broker.url, name)


# -- reconnect storms ---------------------------------------------------------------------------------


async def _closer(api: Management, times: int, pause: float) -> int:
    """Close every connection of the broker through the HTTP API, ``times`` times, ``pause`` s apart."""
    closed = 0
    for _ in range(times):
        await asyncio.sleep(pause)
        closed += await asyncio.to_thread(api.close_all)
    return closed


async def _robust_publisher(ch, name: str, prefix: str, stop: asyncio.Event, confirmed: set[bytes],
                            persistent: bool = False) -> int:
    """Publish with confirms until ``stop``; a publish cut off by a dropped connection is just not counted."""
    i = failed = 0
    mode = aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
    while not stop.is_set():
        body = f"{prefix}-{i}".encode()
        i += 1
        try:
            async with asyncio.timeout(5):
                r = await ch.default_exchange.publish(aio_pika.Message(body, delivery_mode=mode),
                                                      routing_key=name)
            if isinstance(r, pamqp_commands.Basic.Ack):
                confirmed.add(body)
        except Exception:  # noqa: BLE001 - see _settled
            failed += 1
            await asyncio.sleep(0.05)
    return failed


async def test_aio_pika_robust_reconnect_storm_via_http_api(mgmt_broker, uid):
    """``connect_robust`` connections (one consumer, three publishers with confirms) while every connection is
    closed through ``DELETE /api/connections/{name}`` again and again: each reconnects and restores its
    channels, queue and consumer, and every confirmed message reaches the consumer (at least once)."""
    b, api = mgmt_broker
    log = BrokerLog(b)
    name = f"{uid}-q"
    received: set[bytes] = set()
    confirmed: set[bytes] = set()
    stop = asyncio.Event()
    async with asyncio.timeout(100):
        conns = [await aio_pika.connect_robust(b.url, timeout=10, reconnect_interval=0.2) for _ in range(4)]
        try:
            cch = await conns[0].channel()
            await cch.set_qos(prefetch_count=20)
            q = await cch.declare_queue(name, auto_delete=False)

            async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
                received.add(msg.body)
                with contextlib.suppress(Exception):
                    await msg.ack()

            await q.consume(on_message)
            pubs = [await c.channel() for c in conns[1:]]
            tasks = [asyncio.create_task(_robust_publisher(ch, name, f"p{k}", stop, confirmed))
                     for k, ch in enumerate(pubs)]
            closed = await _closer(api, times=ROUNDS, pause=0.4)
            assert closed >= ROUNDS  # the API did close connections each time
            await _wait_for(lambda: all(c.connected.is_set() for c in conns), 30,
                            "the connections to come back")
            await asyncio.sleep(1.0)  # let the publishers confirm some more on the restored channels
            stop.set()
            await asyncio.gather(*tasks)
            assert confirmed, "nothing was confirmed at all"
            await _wait_for(lambda: confirmed <= received, 30,
                            f"{len(confirmed - received)} confirmed messages to reach the consumer")
        finally:
            stop.set()
            for c in conns:
                with contextlib.suppress(Exception):
                    await c.close()
    log.assert_clean()
    await _assert_serves(b.url)


async def test_aio_pika_robust_survives_broker_restarts(start_broker, uid):
    """``connect_robust`` while the broker restarts (SIGTERM, 320 CONNECTION_FORCED, start again): persistent
    messages confirmed into the durable queue survive, and the restored consumer receives them all."""
    b = start_broker("--management-port", "0", "--prometheus-port", "0")
    log = BrokerLog(b)
    name = f"{uid}-q"
    received: set[bytes] = set()
    confirmed: set[bytes] = set()
    stop = asyncio.Event()
    async with asyncio.timeout(150):
        consumer_conn = await aio_pika.connect_robust(b.url, timeout=10, reconnect_interval=0.2)
        publisher_conn = await aio_pika.connect_robust(b.url, timeout=10, reconnect_interval=0.2)
        try:
            cch = await consumer_conn.channel()
            await cch.set_qos(prefetch_count=20)
            q = await cch.declare_queue(name, durable=True)

            async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
                received.add(msg.body)
                with contextlib.suppress(Exception):
                    await msg.ack()

            await q.consume(on_message)
            pch = await publisher_conn.channel()
            task = asyncio.create_task(_robust_publisher(pch, name, "p", stop, confirmed, persistent=True))
            for _ in range(3):
                await asyncio.sleep(0.5)
                await asyncio.to_thread(b.restart)
                await _wait_for(lambda: consumer_conn.connected.is_set()
                                and publisher_conn.connected.is_set(),
                                30, "the connections to come back after a restart")
            n = len(confirmed)
            await _wait_for(lambda: len(confirmed) > n, 15, "a confirm after the last restart")
            stop.set()
            await task
            await _wait_for(lambda: confirmed <= received, 30,
                            f"{len(confirmed - received)} confirmed messages to reach the consumer")
        finally:
            stop.set()
            for c in (consumer_conn, publisher_conn):
                with contextlib.suppress(Exception):
                    await c.close()
    log.assert_clean()
    await _assert_serves(b.url)


async def test_connections_open_channels_at_once_while_dropped(mgmt_broker, uid):
    """Twenty connections open at once and each opens five channels at once, while the broker's connections
    are being closed through the HTTP API: the clients retry (robust), and once the drops stop every
    connection is up and every channel takes a confirmed publish."""
    b, api = mgmt_broker
    log = BrokerLog(b)
    n_conns, n_channels = 20, 5
    stop = asyncio.Event()

    async def chaos() -> None:
        while not stop.is_set():
            await asyncio.to_thread(api.close_all)
            await asyncio.sleep(random.uniform(0.05, 0.3))

    async def open_one() -> tuple[aio_pika.abc.AbstractRobustConnection, list]:
        for _attempt in range(50):
            try:
                conn = await aio_pika.connect_robust(b.url, timeout=5, reconnect_interval=0.1)
            except Exception:  # noqa: BLE001 - see _settled
                await asyncio.sleep(0.05)
                continue
            for _try in range(50):
                try:
                    channels = await asyncio.gather(*(conn.channel() for _ in range(n_channels)))
                    return conn, list(channels)
                except Exception:  # noqa: BLE001 - see _settled
                    await asyncio.sleep(0.05)
            await conn.close()
        raise AssertionError("could not open a connection and its channels in 50 attempts")

    async with asyncio.timeout(120):
        chaos_task = asyncio.create_task(chaos())
        opened: list = []
        try:
            opened = list(await asyncio.gather(*(open_one() for _ in range(n_conns))))
            await asyncio.sleep(1.0)  # more drops with everything open
        finally:
            stop.set()
            await chaos_task
        try:
            await _wait_for(lambda: all(c.connected.is_set() for c, _ in opened), 30, "every connection")
            queue_name = f"{uid}-q"

            async def use(ch) -> None:
                for _attempt in range(20):  # a channel may still be being restored after the last drop
                    try:
                        async with asyncio.timeout(5):
                            await ch.declare_queue(queue_name, auto_delete=False)
                            r = await ch.default_exchange.publish(aio_pika.Message(b"x"),
                                                                  routing_key=queue_name)
                        assert isinstance(r, pamqp_commands.Basic.Ack)
                        return
                    except (aio_pika.exceptions.ChannelInvalidStateError, aiormq.exceptions.ConnectionClosed,
                            TimeoutError):
                        await asyncio.sleep(0.2)
                raise AssertionError("a channel never came back")

            await asyncio.gather(*(use(ch) for _, chs in opened for ch in chs))
            # At least one each (a publish whose confirm was cut off by a drop may have been retried).
            assert _count(b.url, queue_name) >= n_conns * n_channels
        finally:
            for c, _ in opened:
                with contextlib.suppress(Exception):
                    await c.close()
    log.assert_clean()
    await _assert_serves(b.url)


# -- channel churn ------------------------------------------------------------------------------------------


async def test_channel_churn_with_publishes_and_consumes(broker, broker_log, uid):
    """Three hundred channels opened and closed quickly on one connection, ten at a time (numbers reused at
    once): each publishes (two in three with confirms), and every other one consumes and closes while holding
    unacknowledged deliveries, which go back to the queue. Nothing is lost, nothing is left unacked, and the
    connection stays open throughout."""
    to_publish, to_consume = f"{uid}-pub", f"{uid}-con"
    stock = 300
    _declare(broker.url, to_publish, to_consume)
    try:
        async with asyncio.timeout(120):
            conn = await aio_pika.connect(broker.url, timeout=10)
            async with conn:
                filler = await conn.channel()
                for i in range(stock):
                    await filler.default_exchange.publish(aio_pika.Message(b"s%d" % i),
                                                          routing_key=to_consume)
                await filler.close()
                acked = 0
                published = 0

                async def worker(w: int) -> None:
                    nonlocal acked, published
                    for i in range(30):
                        ch = await conn.channel(publisher_confirms=bool(i % 3))
                        for k in range(3):
                            await ch.default_exchange.publish(aio_pika.Message(b"w%d-%d-%d" % (w, i, k)),
                                                              routing_key=to_publish)
                            published += 1
                        if i % 2:
                            await ch.set_qos(prefetch_count=3)
                            q = await ch.get_queue(to_consume, ensure=False)
                            got: list = []

                            async def collect(msg, got=got) -> None:
                                got.append(msg)

                            tag = await q.consume(collect)
                            await _wait_for(lambda got=got: len(got) >= 2, 10, "deliveries")
                            await got[0].ack()
                            acked += 1
                            if i % 4 == 1:
                                await q.cancel(tag)
                        await ch.close()  # with got[1:] unacked: requeued
                    await asyncio.sleep(0)

                await asyncio.gather(*(worker(w) for w in range(10)))
                assert not conn.is_closed
                probe = await conn.channel()
                pub_q = await probe.declare_queue(to_publish, passive=True)
                con_q = await probe.declare_queue(to_consume, passive=True)
                # Unconfirmed channels' publishes are routed before their channel.close-ok, so all are in.
                assert pub_q.declaration_result.message_count == published
                assert con_q.declaration_result.message_count == stock - acked
                assert con_q.declaration_result.consumer_count == 0
        await _assert_serves(broker.url)
    finally:
        _delete(broker.url, to_publish, to_consume)


# -- pika: acks from other threads ------------------------------------------------------------------------


def test_pika_acks_from_worker_threads(broker, broker_log, uid):
    """pika's documented pattern for slow work: the BlockingConnection consumes on the main thread, worker
    threads do the work and hand each ack back with ``connection.add_callback_threadsafe``. Acks arrive out
    of order and in bursts; every message is acked exactly once, nothing is redelivered, and the queue ends
    empty with nothing unacked."""
    name = f"{uid}-q"
    n = 600
    _declare(broker.url, name)
    try:
        conn = pika.BlockingConnection(broker.pika_params())
        try:
            pub = conn.channel()
            pub.confirm_delivery()
            for i in range(n):
                pub.basic_publish("", name, b"m%d" % i)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)
            work: queue_module.Queue = queue_module.Queue()
            acked: list[int] = []
            redelivered: list[int] = []

            def ack(tag: int) -> None:
                ch.basic_ack(tag)
                acked.append(tag)

            def worker() -> None:
                while True:
                    tag = work.get()
                    if tag is None:
                        return
                    time.sleep(random.uniform(0, 0.002))
                    conn.add_callback_threadsafe(functools.partial(ack, tag))

            def on_message(_ch, method, _props, _body) -> None:
                if method.redelivered:
                    redelivered.append(method.delivery_tag)
                work.put(method.delivery_tag)

            threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
            for t in threads:
                t.start()
            ch.basic_consume(name, on_message)
            deadline = time.monotonic() + 60
            while len(acked) < n and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.05)
            for _ in threads:
                work.put(None)
            for t in threads:
                t.join(5)
            assert len(acked) == n and len(set(acked)) == n
            assert not redelivered
            assert ch.is_open and conn.is_open  # no 406 "unknown delivery tag", no connection error
            conn.process_data_events(time_limit=0.3)
            ch.close()  # anything the broker still counted as unacked would be requeued now
            ok = conn.channel().queue_declare(name, passive=True).method
            assert ok.message_count == 0
        finally:
            if conn.is_open:
                conn.close()
        asyncio.run(_assert_serves(broker.url))
    finally:
        _delete(broker.url, name)


# -- kombu: producers and consumers that reconnect ------------------------------------------------------


def test_kombu_producer_and_consumer_reconnect(mgmt_broker, uid):
    """kombu's own recovery: a ``ConsumerMixin`` consumer in a thread and a producer publishing with
    ``retry=True`` and ``confirm_publish``, while the broker's connections are closed through the HTTP API
    again and again. Every publish that returned reaches the consumer (at least once)."""
    from kombu.mixins import ConsumerMixin

    b, api = mgmt_broker
    log = BrokerLog(b)
    name = f"{uid}-q"
    exchange = kombu.Exchange(f"{uid}-x", type="direct", durable=False)
    task_queue = kombu.Queue(name, exchange, routing_key=name, durable=False, auto_delete=False)
    received: set[str] = set()
    errors: list[BaseException] = []

    class Worker(ConsumerMixin):
        def __init__(self, connection: kombu.Connection) -> None:
            self.connection = connection

        def get_consumers(self, consumer_cls, channel):
            return [consumer_cls(queues=[task_queue], callbacks=[self.on_message], accept=["json"],
                                 prefetch_count=10)]

        def on_message(self, body, message) -> None:
            received.add(body["id"])
            message.ack()

    consumer_conn = kombu.Connection(b.url, connect_timeout=5, heartbeat=0)
    worker = Worker(consumer_conn)

    def run_worker() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run_worker, daemon=True)
    thread.start()
    published: list[str] = []
    policy = {"max_retries": 30, "interval_start": 0.05, "interval_step": 0.1, "interval_max": 0.5}
    producer_conn = kombu.Connection(b.url, connect_timeout=5, transport_options={"confirm_publish": True})
    try:
        producer = producer_conn.Producer(serializer="json")
        deadline = time.monotonic() + 12
        next_drop = time.monotonic() + 0.3
        i = 0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_drop:
                api.close_all()
                next_drop = time.monotonic() + 0.6
            msg_id = f"m{i}"
            i += 1
            producer.publish({"id": msg_id}, exchange=exchange, routing_key=name, declare=[task_queue],
                             retry=True, retry_policy=policy)
            published.append(msg_id)
        wait_until = time.monotonic() + 30
        while not set(published) <= received and time.monotonic() < wait_until and thread.is_alive():
            time.sleep(0.05)
        assert not errors, errors
        missing = set(published) - received
        assert not missing, f"{len(missing)} of {len(published)} published messages never arrived"
    finally:
        worker.should_stop = True
        thread.join(10)
        producer_conn.release()
        consumer_conn.release()
    log.assert_clean()
    asyncio.run(_assert_serves(b.url))


# -- connections cut mid-frame (aio-pika's TCP-proxy tests) --------------------------------------------------


class CuttingProxy:
    """A TCP proxy in front of the broker, like aio-pika's test proxy: ``cut_all()`` aborts every proxied
    connection at once, both sockets, with no AMQP close; ``cut_after(direction, n)`` does it once ``n``
    more bytes have gone that way ("up": client → broker, "down": broker → client), forwarding only the
    part of the chunk before the cut, so the broker or the client is left with half a frame."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.listen_port = 0
        self.pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.budget: dict[str, int | None] = {"up": None, "down": None}
        self.cuts = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    def url(self, broker: BrokerProcess, **query: object) -> str:
        q = urllib.parse.urlencode(query)
        base = f"amqp://{broker.user}:{broker.password}@127.0.0.1:{self.listen_port}/%2F"
        return base + (f"?{q}" if q else "")

    def cut_all(self) -> None:
        self.cuts += 1
        for client, server in list(self.pairs):
            client.transport.abort()
            server.transport.abort()
        self.pairs.clear()

    def cut_after(self, direction: str, n: int) -> None:
        self.budget[direction] = n

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut_all()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                sreader, swriter = await asyncio.open_connection(self.host, self.port)
            except OSError:
                cwriter.transport.abort()
                return
            pair = (cwriter, swriter)
            self.pairs.add(pair)
            await asyncio.gather(self._pipe(creader, swriter, "up", pair),
                                 self._pipe(sreader, cwriter, "down", pair))
        finally:
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                budget = self.budget[direction]
                if budget is not None and len(data) >= budget:
                    self.budget[direction] = None
                    writer.write(data[:budget])
                    self.cut_all()
                    return
                if budget is not None:
                    self.budget[direction] = budget - len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, RuntimeError):
            pass
        finally:
            for w in pair:
                w.transport.abort()
            self.pairs.discard(pair)


@pytest.fixture
async def proxy(broker) -> Iterator[CuttingProxy]:
    p = CuttingProxy(broker.host, broker.port)
    await p.start()
    yield p
    await p.close()


async def test_robust_consumer_cut_mid_delivery_stairway(broker, broker_log, proxy, uid):
    """aio-pika's ``test_channel_reconnect_stairway``: a robust consumer (prefetch 1, heartbeat 1 s) behind a
    proxy that cuts its connection after 64, 128, 256 … bytes from the broker, so deliveries and acks are
    cut off mid-frame again and again. All 100 messages of 12 kB are received and acked; the queue ends empty
    with nothing unacked."""
    name = f"{uid}-q"
    _declare(broker.url, name)
    n = 100
    try:
        async with asyncio.timeout(120):
            direct = await aio_pika.connect(broker.url, timeout=10)
            async with direct:
                pch = await direct.channel()
                for i in range(n):
                    await pch.default_exchange.publish(aio_pika.Message(b"%05d" % i + b"x" * 12000),
                                                       routing_key=name)
                conn = await aio_pika.connect_robust(proxy.url(broker, heartbeat=1, reconnect_interval=0.05),
                                                     timeout=10)
                got: set[bytes] = set()
                stair = [64]

                def arm(*_args: object) -> None:  # after each reconnect, cut again twice as late
                    if stair[0] <= 256 * 1024:
                        proxy.cut_after("down", stair[0])
                        stair[0] *= 2

                conn.reconnect_callbacks.add(arm, weak=False)
                arm()
                try:
                    ch = await conn.channel()
                    while len(got) < n:
                        try:
                            async with asyncio.timeout(10):  # one attempt; robust recovery goes on inside
                                await ch.set_qos(prefetch_count=1)
                                q = await ch.declare_queue(name, auto_delete=False)  # restored on reconnect
                                async with q.iterator() as it:
                                    async for message in it:
                                        await message.ack()
                                        got.add(message.body[:5])
                                        if len(got) >= n:
                                            break
                        except Exception:  # noqa: BLE001 - see _settled
                            await asyncio.sleep(0.05)
                    assert proxy.cuts >= 8
                finally:
                    proxy.cut_after("down", None)  # type: ignore[arg-type]
                    await conn.close()
                assert len(got) == n
                check = await direct.channel()

                async def settled() -> bool:
                    q = await check.declare_queue(name, passive=True)
                    result = q.declaration_result
                    return result.message_count == 0 and result.consumer_count == 0

                deadline = time.monotonic() + 10
                while not await settled():
                    assert time.monotonic() < deadline, "messages left in the queue or a consumer left behind"
                    await asyncio.sleep(0.05)
        await _assert_serves(broker.url)
    finally:
        _delete(broker.url, name)


async def test_publishers_cut_mid_frame(broker, broker_log, proxy, uid):
    """Publishers with confirms behind a proxy that cuts their connections part-way through what they send
    (multi-frame 300 kB messages and small ones), many times: the broker drops the half-received message
    and the connection, keeps every message it confirmed, and goes on."""
    name = f"{uid}-q"
    _declare(broker.url, name)
    confirmed: set[bytes] = set()
    try:
        async with asyncio.timeout(120):
            for rnd in range(ROUNDS):
                conn = await aio_pika.connect(proxy.url(broker), timeout=10)
                ch = await conn.channel()
                big = rnd % 2 == 0
                proxy.cut_after("up", random.randint(2000, 900_000 if big else 20_000))

                async def one(i: int, rnd: int = rnd, ch=ch, big: bool = big) -> None:
                    key = b"%03d-%04d" % (rnd, i)
                    body = key + (b"y" * 300_000 if big else b"y" * 100)
                    r = await ch.default_exchange.publish(aio_pika.Message(body), routing_key=name)
                    if isinstance(r, pamqp_commands.Basic.Ack):
                        confirmed.add(key)

                tasks = [asyncio.ensure_future(one(i)) for i in range(8 if big else 300)]
                done, pending = await asyncio.wait(tasks, timeout=15)
                assert not pending, f"{len(pending)} publishes never ended (round {rnd})"
                for t in done:
                    if not t.cancelled():
                        t.exception()
                proxy.cut_after("up", None)  # type: ignore[arg-type]
                with contextlib.suppress(Exception):
                    await conn.close()
            assert proxy.cuts >= ROUNDS // 2
            direct = await aio_pika.connect(broker.url, timeout=10)
            async with direct:
                ch = await direct.channel()
                q = await ch.get_queue(name, ensure=False)
                stored: set[bytes] = set()
                while True:
                    m = await q.get(no_ack=True, fail=False, timeout=5)
                    if m is None:
                        break
                    stored.add(m.body[:8])
                missing = confirmed - stored
                assert not missing, f"{len(missing)} confirmed messages are not in the queue"
        await _assert_serves(broker.url)
    finally:
        _delete(broker.url, name)
