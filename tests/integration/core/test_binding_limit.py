"""Bindings per queue (issue 17, "limits enforced before buffering"): ``leveret.max_bindings_per_queue``, a key
of Leveret's own (RabbitMQ has no such limit; 0, the default, is none). With it at 3, against a broker of its
own:

* a 4th binding to a queue is refused with channel.close 406 ``PRECONDITION_FAILED - queue 'q' in vhost '/'
  has reached its limit of 3 bindings (leveret.max_bindings_per_queue)``; the connection stays usable and the
  refused binding was not made; re-binding an existing binding at the limit is still fine;
* unbinding frees a place; deleting a bound (source) exchange frees its places; deleting the queue frees
  them all (a queue of the same name starts from none);
* an exchange as the destination of exchange-to-exchange bindings has the same limit;
* the HTTP API's POST /api/bindings answers 400 ``bad_request`` with the same reason;
* after a restart, the recovered durable bindings count: the limit holds at once.
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.integration.management.test_management_api import mgmt_node, q  # tests/integration on sys.path

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(60)]

LIMIT = 3


def refused(ch_factory, fn) -> tuple[int, str]:
    """Run ``fn(ch)`` on a fresh channel, expecting the broker to close it; its (reply code, reply text)."""
    ch = ch_factory()
    with pytest.raises(ChannelClosedByBroker) as e:
        fn(ch)
    return e.value.reply_code, e.value.reply_text


def limit_text(kind: str, name: str) -> str:
    return (f"PRECONDITION_FAILED - {kind} '{name}' in vhost '/' has reached its limit of {LIMIT} bindings "
            "(leveret.max_bindings_per_queue)")


def test_bindings_per_queue_are_limited_and_places_come_back(uid):
    with mgmt_node("leveret-binding-limit-", "--set", f"leveret.max_bindings_per_queue={LIMIT}") as (b, api):
        conn = pika.BlockingConnection(b.pika_params())
        try:
            ch = conn.channel()
            qn, x1, x2, x3, dx = f"{uid}.q", f"{uid}.x1", f"{uid}.x2", f"{uid}.x3", f"{uid}.dx"
            ch.queue_declare(qn, durable=True)
            ch.exchange_declare(x1, "direct", durable=True)
            ch.exchange_declare(x2, "fanout", durable=True)
            ch.exchange_declare(x3, "topic", durable=True)
            ch.exchange_declare(dx, "fanout", durable=True)
            ch.queue_bind(qn, x1, "a")
            ch.queue_bind(qn, x1, "b")
            ch.queue_bind(qn, x2)
            ch.queue_bind(qn, x1, "a")  # bound already: still bind-ok at the limit

            # The 4th: 406 on the channel, the connection stays open, the binding was not made.
            assert refused(conn.channel, lambda c: c.queue_bind(qn, x3, "c")) == (406, limit_text("queue", qn))
            assert conn.is_open
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish(x3, "c", b"not bound")
            ch.basic_publish(x1, "a", b"bound")
            assert ch.queue_declare(qn, passive=True).method.message_count == 1
            ch.queue_purge(qn)

            # The HTTP API refuses it the same way: 400 with the reason.
            status, body, _ = api("POST", f"/api/bindings/%2F/e/{q(x3)}/q/{q(qn)}", {"routing_key": "c"})
            assert status == 400, body
            assert body == {"error": "bad_request", "reason": limit_text("queue", qn).split(" - ", 1)[1]}

            # Unbinding frees a place (and only one).
            ch.queue_unbind(qn, x1, "b")
            ch.queue_bind(qn, x3, "c")
            assert refused(conn.channel, lambda c: c.queue_bind(qn, x3, "d"))[0] == 406
            # Deleting a bound exchange frees its places (x1 holds one now: "a"); the HTTP API takes it.
            ch = conn.channel()
            ch.exchange_delete(x1)
            status, body, _ = api("POST", f"/api/bindings/%2F/e/{q(x3)}/q/{q(qn)}", {"routing_key": "d"})
            assert status == 201, body
            assert refused(conn.channel, lambda c: c.queue_bind(qn, x3, "e"))[0] == 406

            # An exchange as the destination: the same limit, its own count.
            ch = conn.channel()
            for src in (x2, x3, "amq.direct"):
                ch.exchange_bind(dx, src, "k")
            assert refused(conn.channel, lambda c: c.exchange_bind(dx, "amq.topic", "k")) == \
                (406, limit_text("exchange", dx))

            # After a restart the recovered durable bindings are counted: the limit holds at once.
            conn.close()
            b.restart()
            conn = pika.BlockingConnection(b.pika_params())
            assert refused(conn.channel, lambda c: c.queue_bind(qn, x3, "f")) == (406, limit_text("queue", qn))
            assert refused(conn.channel, lambda c: c.exchange_bind(dx, "amq.topic", "k"))[0] == 406

            # Deleting the queue frees every place: a queue of the same name starts from none.
            ch = conn.channel()
            ch.queue_delete(qn)
            ch.queue_declare(qn)
            for key in ("1", "2", "3"):
                ch.queue_bind(qn, x3, key)
            assert refused(conn.channel, lambda c: c.queue_bind(qn, x3, "4"))[0] == 406
        finally:
            if conn.is_open:
                conn.close()
