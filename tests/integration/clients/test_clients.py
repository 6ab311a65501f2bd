"""The Python clients the broker must serve unchanged: aio-pika, aiormq, pika (SelectConnection), kombu,
a real Celery worker, and many connections and channels at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aio_pika
import aiormq
import celery.exceptions
import kombu
import pika
import pytest
from pamqp import commands as pamqp_commands

HERE = Path(__file__).resolve().parent.parent  # tests/integration (celery_app.py)
ROOT = HERE.parent.parent


# -- aio-pika --------------------------------------------------------------------------------------------


async def test_aio_pika_robust_confirms_iterator_ack_nack_get(broker, uid):
    async with asyncio.timeout(30):
        conn = await aio_pika.connect_robust(broker.url, timeout=10)
        async with conn:
            ch = await conn.channel()  # publisher confirms are on by default
            assert ch.publisher_confirms
            ex = await ch.declare_exchange(f"{uid}-x", aio_pika.ExchangeType.DIRECT, auto_delete=True)
            q = await ch.declare_queue(f"{uid}-q", exclusive=True)
            await q.bind(ex, routing_key="rk")

            for i in range(3):
                confirm = await ex.publish(
                    aio_pika.Message(f"m{i}".encode(), message_id=f"id{i}", content_type="text/plain"),
                    routing_key="rk")
                assert isinstance(confirm, pamqp_commands.Basic.Ack)

            acked: list[bytes] = []
            nacked = False
            redelivered_m1 = False
            async with q.iterator() as it:
                async for msg in it:
                    assert msg.content_type == "text/plain"
                    if msg.body == b"m1" and not nacked:
                        nacked = True
                        assert not msg.redelivered
                        await msg.nack(requeue=True)
                        continue
                    if msg.body == b"m1":
                        redelivered_m1 = msg.redelivered
                    await msg.ack()
                    acked.append(msg.body)
                    if len(acked) == 3:
                        break
            assert sorted(acked) == [b"m0", b"m1", b"m2"]
            assert nacked and redelivered_m1

            # basic.get: one message, then an empty queue
            await ch.default_exchange.publish(aio_pika.Message(b"for-get", headers={"k": "v"}), routing_key=q.name)
            msg = await q.get(timeout=5)
            assert msg.body == b"for-get" and msg.headers == {"k": "v"}
            await msg.ack()
            assert await q.get(fail=False, timeout=5) is None

            # a nacked get (requeue) comes back redelivered
            await ch.default_exchange.publish(aio_pika.Message(b"again"), routing_key=q.name)
            msg = await q.get(timeout=5)
            await msg.nack(requeue=True)
            msg = await q.get(timeout=5)
            assert msg.body == b"again" and msg.redelivered
            await msg.ack()
            await ex.delete()


async def test_aio_pika_connect_fanout_and_mandatory_return(broker, uid):
    async with asyncio.timeout(20):
        conn = await aio_pika.connect(broker.url, timeout=10)
        async with conn:
            ch = await conn.channel()
            ex = await ch.declare_exchange(f"{uid}-fan", aio_pika.ExchangeType.FANOUT, auto_delete=True)
            queues = [await ch.declare_queue("", exclusive=True) for _ in range(2)]
            for q in queues:
                assert q.name.startswith("amq.gen-")
                await q.bind(ex)
            await ex.publish(aio_pika.Message(b"to-all"), routing_key="ignored")
            for q in queues:
                msg = await q.get(timeout=5, no_ack=True)
                assert msg.body == b"to-all"

            # unroutable mandatory message: by default publish() returns the returned message
            returned = await ch.default_exchange.publish(
                aio_pika.Message(b"lost", message_id=f"{uid}-lost-1"), routing_key=f"{uid}-nowhere", mandatory=True)
            assert isinstance(returned, aiormq.abc.DeliveredMessage)
            assert returned.body == b"lost"
            assert returned.delivery.reply_code == 312 and returned.delivery.reply_text == "NO_ROUTE"

            # ... and with on_return_raises=True it raises PublishError
            ch_raises = await conn.channel(on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.PublishError) as exc:
                await ch_raises.default_exchange.publish(
                    aio_pika.Message(b"lost2", message_id=f"{uid}-lost-2"), routing_key=f"{uid}-nowhere",
                    mandatory=True)
            assert exc.value.message.body == b"lost2"
            assert exc.value.frame.reply_code == 312
            await ex.delete()


async def test_aio_pika_rpc_over_direct_reply_to(broker, uid):
    async with asyncio.timeout(20):
        conn = await aio_pika.connect(broker.url, timeout=10)
        async with conn:
            server_ch = await conn.channel()
            rpc_q = await server_ch.declare_queue(f"{uid}-rpc", exclusive=True)

            async def serve(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with msg.process():
                    assert msg.reply_to and msg.reply_to.startswith("amq.rabbitmq.reply-to.")
                    await server_ch.default_exchange.publish(
                        aio_pika.Message(msg.body.upper(), correlation_id=msg.correlation_id),
                        routing_key=msg.reply_to)

            await rpc_q.consume(serve)

            client_ch = await conn.channel()
            replies: asyncio.Queue = asyncio.Queue()
            reply_q = await client_ch.get_queue("amq.rabbitmq.reply-to", ensure=False)
            await reply_q.consume(replies.put, no_ack=True)  # must consume (no-ack) before publishing

            for i in range(3):
                corr = str(uuid.uuid4())
                await client_ch.default_exchange.publish(
                    aio_pika.Message(f"ping{i}".encode(), reply_to="amq.rabbitmq.reply-to", correlation_id=corr),
                    routing_key=rpc_q.name)
                reply = await asyncio.wait_for(replies.get(), 5)
                assert reply.body == f"PING{i}".encode()
                assert reply.correlation_id == corr


# -- aiormq ----------------------------------------------------------------------------------------------


async def test_aiormq_publish_consume(broker, uid):
    async with asyncio.timeout(20):
        conn = await aiormq.connect(broker.url)
        try:
            ch = await conn.channel()  # confirms on
            declared = await ch.queue_declare(f"{uid}-q", exclusive=True)
            assert declared.queue == f"{uid}-q" and declared.message_count == 0

            got: asyncio.Queue = asyncio.Queue()

            async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
                await got.put((message.body, message.header.properties.message_id, message.redelivered))
                await message.channel.basic_ack(message.delivery.delivery_tag)

            ok = await ch.basic_consume(declared.queue, on_message)
            assert ok.consumer_tag
            for i in range(5):
                confirm = await ch.basic_publish(
                    f"body{i}".encode(), routing_key=declared.queue,
                    properties=aiormq.spec.Basic.Properties(message_id=f"id{i}", delivery_mode=2))
                assert isinstance(confirm, pamqp_commands.Basic.Ack)
            results = [await asyncio.wait_for(got.get(), 5) for _ in range(5)]
            assert results == [(f"body{i}".encode(), f"id{i}", False) for i in range(5)]

            cancel = await ch.basic_cancel(ok.consumer_tag)
            assert isinstance(cancel, pamqp_commands.Basic.CancelOk)
            await ch.close()
        finally:
            await conn.close()


# -- pika SelectConnection -------------------------------------------------------------------------------


def test_pika_select_connection(broker, uid):
    """The callback-style client: open, channel, confirm mode, declare, consume, publish, ack, close."""
    qname = f"{uid}-q"
    state: dict = {"events": [], "bodies": [], "confirmed": set(), "close_reason": None, "error": None}
    conn_holder: list[pika.SelectConnection] = []

    def fail(msg):
        state["error"] = msg
        conn_holder[0].ioloop.stop()

    def on_open(conn):
        state["events"].append("open")
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["events"].append("channel")
        state["ch"] = ch
        ch.add_on_close_callback(lambda _ch, reason: state["events"].append(("channel-closed", str(reason))))
        ch.confirm_delivery(on_confirm, callback=lambda _f: ch.queue_declare(qname, exclusive=True,
                                                                             callback=on_declared))

    def on_confirm(frame):
        if not isinstance(frame.method, pika.spec.Basic.Ack):
            return fail(f"unexpected confirm {frame.method}")
        tag = frame.method.delivery_tag
        state["confirmed"].update(range(1, tag + 1) if frame.method.multiple else [tag])
        maybe_close()

    def maybe_close():
        # the broker may confirm after delivering to us, and may confirm several at once (multiple=True)
        if len(state["bodies"]) == 3 and state["confirmed"] == {1, 2, 3} and "closing" not in state["events"]:
            state["events"].append("closing")
            state["ch"].close()
            conn_holder[0].close()

    def on_declared(frame):
        state["events"].append("declared")
        assert frame.method.queue == qname
        ch = state["ch"]
        ch.basic_consume(qname, on_message, callback=lambda _f: publish(ch))

    def publish(ch):
        state["events"].append("consuming")
        for i in range(3):
            ch.basic_publish("", qname, f"hello{i}".encode(), pika.BasicProperties(message_id=str(i)))

    def on_message(ch, method, props, body):
        state["bodies"].append(body)
        ch.basic_ack(method.delivery_tag)
        maybe_close()

    def on_open_error(conn, err):
        fail(f"open error: {err!r}")

    def on_closed(conn, reason):
        state["close_reason"] = reason
        conn.ioloop.stop()

    conn = pika.SelectConnection(broker.pika_params(), on_open_callback=on_open,
                                 on_open_error_callback=on_open_error, on_close_callback=on_closed)
    conn_holder.append(conn)
    conn.ioloop.call_later(15, lambda: fail("deadline passed"))
    conn.ioloop.start()
    if not conn.is_closed:  # stopped by the deadline: close and drain so nothing leaks
        conn.close()
        conn.ioloop.start()

    assert state["error"] is None, (state["error"], state["events"])
    assert state["events"][:4] == ["open", "channel", "declared", "consuming"]
    assert state["bodies"] == [b"hello0", b"hello1", b"hello2"]
    assert state["confirmed"] == {1, 2, 3}
    reason = state["close_reason"]
    assert isinstance(reason, pika.exceptions.ConnectionClosedByClient), reason
    assert reason.reply_code == 200


# -- kombu -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("login_method", [None, "AMQPLAIN"])
def test_kombu_producer_simplequeue_consumer(broker, uid, login_method):
    exchange = kombu.Exchange(f"{uid}-x", type="direct", durable=False, auto_delete=True)
    queue = kombu.Queue(f"{uid}-q", exchange, routing_key="rk", durable=False, auto_delete=False)
    with kombu.Connection(broker.url, login_method=login_method, connect_timeout=5) as conn:
        conn.connect()
        if login_method:
            assert [a.mechanism for a in conn.connection.authentication] == [login_method.encode()]
        try:
            producer = conn.Producer()
            producer.publish({"n": 1}, exchange=exchange, routing_key="rk", declare=[queue],
                             serializer="json", retry=False)

            # SimpleQueue get
            sq = conn.SimpleQueue(queue)
            msg = sq.get(block=True, timeout=5)
            assert msg.payload == {"n": 1}
            msg.ack()
            with pytest.raises(sq.Empty):
                sq.get(block=False)
            sq.close()  # cancels its consumer, which would otherwise take the next messages

            # Consumer + drain_events with a timeout
            received: list = []

            def on_message(body, message):
                received.append(body)
                message.ack()

            for i in range(3):
                producer.publish({"n": 10 + i}, exchange=exchange, routing_key="rk", serializer="json")
            with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
                deadline = time.monotonic() + 10
                while len(received) < 3 and time.monotonic() < deadline:
                    conn.drain_events(timeout=1)
                assert received == [{"n": 10}, {"n": 11}, {"n": 12}]
                with pytest.raises(socket.timeout):
                    conn.drain_events(timeout=0.3)
        finally:
            queue(conn.default_channel).delete()
            exchange(conn.default_channel).delete()


# -- celery ----------------------------------------------------------------------------------------------


def _load_celery_app():
    spec = importlib.util.spec_from_file_location("leveret_tests_celery_app", HERE / "celery_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_celery_worker_end_to_end(broker, uid, tmp_path):
    """A real worker process (solo pool) runs add() and a task that retries once; results come back via rpc://.

    Bounded: at most 20 s + 10 s waiting for results and 5 s for the worker to stop."""
    queue = f"{uid}-celery"
    env = dict(os.environ, LEVERET_CELERY_BROKER_URL=broker.url, LEVERET_CELERY_QUEUE=queue,
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    mod = _load_celery_app()
    app = mod.app
    app.conf.broker_url = broker.url
    app.conf.task_default_queue = queue

    log_path = tmp_path / "celery-worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.integration.celery_app", "worker", "--pool=solo",
             "--concurrency=1", "-l", "warning", "-Q", queue, "-n", f"{uid}@%h"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            assert mod.add.delay(2, 3).get(timeout=20) == 5
            assert mod.retry_once.delay("x").get(timeout=10) == {"value": "x", "retries": 1}
        except celery.exceptions.TimeoutError:
            pytest.fail(f"no result in time; worker output:\n{log_path.read_text(errors='replace')}")
        assert worker.poll() is None, f"the worker died:\n{log_path.read_text(errors='replace')}"
    finally:
        worker.terminate()  # warm shutdown
        try:
            worker.wait(5)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        app.close()
        with kombu.Connection(broker.url, connect_timeout=5) as conn:
            conn.default_channel.queue_delete(queue)


# -- many connections and channels -----------------------------------------------------------------------


async def test_100_connections_x_10_channels(broker, uid):
    """All 100 connections and 1000 channels are open at the same time before any is closed."""
    n_conns, n_channels = 100, 10

    async def work(ch, c: int, k: int) -> bytes:
        q = await ch.declare_queue("", exclusive=True)
        body = f"{uid}-{c}-{k}".encode()
        await ch.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
        msg = await q.get(timeout=10)
        await msg.ack()
        return msg.body

    async with asyncio.timeout(60):
        conns = await asyncio.gather(*(aio_pika.connect(broker.url, timeout=20) for _ in range(n_conns)))
        try:
            channels = await asyncio.gather(*(
                asyncio.gather(*(conn.channel() for _ in range(n_channels))) for conn in conns))
            assert sum(1 for chs in channels for ch in chs if not ch.is_closed) == n_conns * n_channels
            bodies = await asyncio.gather(*(
                work(ch, c, k) for c, chs in enumerate(channels) for k, ch in enumerate(chs)))
            assert list(bodies) == [f"{uid}-{c}-{k}".encode() for c in range(n_conns) for k in range(n_channels)]
            await asyncio.gather(*(ch.close() for chs in channels for ch in chs))
            assert all(ch.is_closed for chs in channels for ch in chs)
        finally:
            await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)
        assert all(conn.is_closed for conn in conns)
