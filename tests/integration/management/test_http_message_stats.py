"""``message_stats`` of channels and exchanges, and the rates of /api/overview (issue 16, "HTTP API statistics"),
checked against a Leveret process of the test's own and pika traffic of known size: a channel's publish,
confirm, return_unroutable, drop_unroutable, deliver, deliver_no_ack, get, get_no_ack, get_empty, redeliver,
ack and deliver_get counts (RabbitMQ's fields for a channel), an exchange's publish_in (messages published to
it) and publish_out (one per queue they reached), and the ``*_details.rate`` of these, of the overview's
message_stats, queue_totals and churn_rates and of a vhost's totals, which become > 0 once the sampler
(``collect_statistics_interval``, here 500 ms) has two samples straddling traffic."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from tests.integration.management.test_management_api import Http, q, wait_for

pytestmark = [pytest.mark.leveret_only, pytest.mark.timeout(90)]

CHANNEL_FIELDS = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver_get", "deliver",
                  "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack")




@pytest.fixture
def node(start_broker):
    b = start_broker("--set", "collect_statistics_interval=500")
    api = Http(b.management_port)

    def up():
        try:
            return api("GET", "/api/overview")[0] == 200
        except OSError:
            return False

    assert wait_for(up), "the HTTP API did not come up"
    return b, api


def channel_names(api: Http, conn_name: str) -> dict[int, str]:
    """Channel number -> the channel's name in the HTTP API, for the connection the client named."""
    conns = wait_for(lambda: [c for c in api("GET", "/api/connections")[1]
                              if c.get("user_provided_name") == conn_name])
    assert len(conns) == 1, conns
    name = conns[0]["name"]
    return {ch["number"]: ch["name"] for ch in api("GET", "/api/channels")[1]
            if ch["connection_details"]["name"] == name}


def counts(stats: dict, fields) -> dict:
    return {f: stats[f] for f in fields}


def test_channel_message_stats_count_the_traffic(node, uid):
    b, api = node
    conn_name = f"{uid}-conn"
    conn = pika.BlockingConnection(b.pika_params(client_properties={"connection_name": conn_name}))
    try:
        setup = conn.channel()
        x = f"{uid}-x"
        q1, q2, q3, q4 = (f"{uid}-q{i}" for i in range(1, 5))
        setup.exchange_declare(x, "direct")
        for name in (q1, q2, q3, q4):
            setup.queue_declare(name)
        setup.queue_bind(q1, x, "k")
        setup.queue_bind(q2, x, "k")

        # Publisher: 5 confirmed publishes reaching two queues each, one mandatory and one plain unroutable
        # publish, one to the default exchange.
        pub = conn.channel()
        pub.confirm_delivery()
        for i in range(5):
            pub.basic_publish(x, "k", f"m{i}".encode())
        with pytest.raises(pika.exceptions.UnroutableError):
            pub.basic_publish(x, "nowhere", b"returned", mandatory=True)
        pub.basic_publish(x, "nowhere", b"dropped")
        pub.basic_publish("", q3, b"to-q3")

        # basic.get: one empty, two with acks, one without.
        getter = conn.channel()
        assert getter.basic_get(q4) == (None, None, None)
        tags = []
        for _ in range(2):
            method, _props, _body = getter.basic_get(q1)
            assert method is not None
            tags.append(method.delivery_tag)
        for tag in tags:
            getter.basic_ack(tag)
        assert getter.basic_get(q3, auto_ack=True)[0] is not None

        # A consumer with acks on q2 (5 messages): the first delivery is nacked back and comes again.
        cons = conn.channel()
        cons.basic_qos(prefetch_count=10)
        acked: list[bytes] = []
        nacked: list[bytes] = []

        def on_message(ch, method, _props, body):
            if not nacked:
                nacked.append(body)
                ch.basic_nack(method.delivery_tag, requeue=True)
            else:
                acked.append(body)
                ch.basic_ack(method.delivery_tag)

        cons.basic_consume(q2, on_message)
        # A consumer without acks on q1 (3 messages left).
        auto = conn.channel()
        auto_seen: list[bytes] = []
        auto.basic_consume(q1, lambda ch, m, p, body: auto_seen.append(body), auto_ack=True)
        deadline = time.monotonic() + 10
        while (len(acked) < 5 or len(auto_seen) < 3) and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert (len(acked), len(nacked), len(auto_seen)) == (5, 1, 3)
        conn.process_data_events(time_limit=0.2)  # the last acks reach the broker

        names = channel_names(api, conn_name)
        zero = dict.fromkeys(CHANNEL_FIELDS, 0)
        expected = {
            pub.channel_number: {**zero, "publish": 8, "confirm": 8, "return_unroutable": 1, "drop_unroutable": 1},
            getter.channel_number: {**zero, "get": 2, "get_no_ack": 1, "get_empty": 1, "deliver_get": 3, "ack": 2},
            cons.channel_number: {**zero, "deliver": 6, "redeliver": 1, "ack": 5, "deliver_get": 6},
            auto.channel_number: {**zero, "deliver_no_ack": 3, "deliver_get": 3},
            setup.channel_number: zero,
        }
        listed = {ch["number"]: ch for ch in api("GET", "/api/channels")[1] if ch["name"] in names.values()}
        for number, want in expected.items():
            status, one, _ = api("GET", f"/api/channels/{q(names[number])}")
            assert status == 200
            for info in (one, listed[number]):
                stats = info["message_stats"]
                assert counts(stats, CHANNEL_FIELDS) == want, (number, stats)
                for f in CHANNEL_FIELDS:
                    assert set(stats[f + "_details"]) == {"rate"} and isinstance(stats[f + "_details"]["rate"],
                                                                                 float)
        # The connection's channel list carries them too.
        conn_api_name = listed[pub.channel_number]["connection_details"]["name"]
        per_conn = {ch["number"]: ch for ch in api("GET", f"/api/connections/{q(conn_api_name)}/channels")[1]}
        assert counts(per_conn[pub.channel_number]["message_stats"], CHANNEL_FIELDS) == expected[pub.channel_number]

        # The node's totals agree.
        overview = api("GET", "/api/overview")[1]
        want_node = {"publish": 8, "confirm": 8, "return_unroutable": 1, "drop_unroutable": 1, "get": 2,
                     "get_no_ack": 1, "get_empty": 1, "deliver": 6, "deliver_no_ack": 3, "redeliver": 1,
                     "ack": 7, "deliver_get": 12}
        assert counts(overview["message_stats"], want_node) == want_node
    finally:
        conn.close()


def test_rates_follow_the_traffic(node, uid):
    b, api = node
    conn_name = f"{uid}-conn"
    conn = pika.BlockingConnection(b.pika_params(client_properties={"connection_name": conn_name}))
    try:
        pub = conn.channel()
        pub.confirm_delivery()
        x, q1, q2 = f"{uid}-x", f"{uid}-q1", f"{uid}-q2"
        pub.exchange_declare(x, "fanout")
        for name in (q1, q2):
            pub.queue_declare(name)
            pub.queue_bind(name, x)
        getter = conn.channel()
        cons = conn.channel()
        cons.basic_qos(prefetch_count=50)
        cons.basic_consume(q2, lambda ch, m, p, body: ch.basic_ack(m.delivery_tag))
        names = channel_names(api, conn_name)

        def rates(stats: dict, fields) -> dict:
            return {f: stats[f + "_details"]["rate"] for f in fields}

        last: dict = {}

        def all_positive() -> dict | None:
            """Every rate the traffic below moves, or None while one of them is still 0."""
            ch = {number: api("GET", f"/api/channels/{q(names[number])}")[1]["message_stats"]
                  for number in (pub.channel_number, getter.channel_number, cons.channel_number)}
            ov = api("GET", "/api/overview")[1]
            vh = api("GET", "/api/vhosts/%2F")[1]
            found = {
                "pub": rates(ch[pub.channel_number], ("publish", "confirm")),
                "getter": rates(ch[getter.channel_number], ("get", "deliver_get", "ack")),
                "cons": rates(ch[cons.channel_number], ("deliver", "deliver_get", "ack")),
                "overview": rates(ov["message_stats"], ("publish", "confirm", "deliver", "get", "deliver_get",
                                                        "ack")),
                "queue_totals": rates(ov["queue_totals"], ("messages", "messages_ready")),
                "churn": rates(ov["churn_rates"], ("channel_created", "channel_closed")),
                "vhost": rates(vh, ("messages", "messages_ready")),
            }
            last.update(found)
            return found if all(r > 0 for group in found.values() for r in group.values()) else None

        # Traffic for a few sampling intervals: 20 publishes (to two queues each) per round, one get with an
        # ack, the consumer acking, and a channel opened and closed; q1 grows, so the totals' rates are > 0.
        found = None
        deadline = time.monotonic() + 20
        while found is None and time.monotonic() < deadline:
            round_end = time.monotonic() + 0.25
            while time.monotonic() < round_end:
                for i in range(20):
                    pub.basic_publish(x, "", f"r{i}".encode())
                method, _props, _body = getter.basic_get(q1)
                if method is not None:
                    getter.basic_ack(method.delivery_tag)
                conn.channel().close()
                conn.process_data_events(time_limit=0.01)
            found = all_positive()
        assert found is not None, last
    finally:
        conn.close()


def test_exchange_message_stats_count_publishes(node, uid):
    """publish_in: every message a client published to the exchange, routed or not; publish_out: one per queue
    it reached, exchange-to-exchange hops included, counted on the exchange it was published to (as RabbitMQ
    counts them). A publish over the HTTP API is counted too. Needs VHost.publish to count them."""
    b, api = node
    conn = pika.BlockingConnection(b.pika_params())
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        x, x2, q1, q2, q3 = f"{uid}-x", f"{uid}-x2", f"{uid}-q1", f"{uid}-q2", f"{uid}-q3"
        ch.exchange_declare(x, "direct")
        ch.exchange_declare(x2, "fanout")
        for name in (q1, q2, q3):
            ch.queue_declare(name)
        ch.queue_bind(q1, x, "k")
        ch.queue_bind(q2, x, "k")
        ch.exchange_bind(x, x2)  # x2 -> x (with x2's routing key)
        for i in range(5):
            ch.basic_publish(x, "k", f"m{i}".encode())
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(x, "nowhere", b"returned", mandatory=True)
        ch.basic_publish(x, "nowhere", b"dropped")
        ch.basic_publish("", q3, b"to-q3")
        for i in range(3):
            ch.basic_publish(x2, "k", f"via-x2-{i}".encode())  # through x to q1 and q2

        def stats(path_name: str) -> dict:
            status, info, _ = api("GET", f"/api/exchanges/%2F/{q(path_name)}")
            assert status == 200
            return info["message_stats"]

        xs = stats(x)
        assert counts(xs, ("publish_in", "publish_out")) == {"publish_in": 7, "publish_out": 10}
        for f in ("publish_in", "publish_out"):
            assert set(xs[f + "_details"]) == {"rate"} and isinstance(xs[f + "_details"]["rate"], float)
        assert counts(stats(x2), ("publish_in", "publish_out")) == {"publish_in": 3, "publish_out": 6}
        listed = {e["name"]: e for e in api("GET", "/api/exchanges/%2F")[1]}
        assert counts(listed[x]["message_stats"], ("publish_in", "publish_out")) == {"publish_in": 7,
                                                                                  "publish_out": 10}
        assert counts(listed[""]["message_stats"], ("publish_in", "publish_out")) == {"publish_in": 1,
                                                                                     "publish_out": 1}
        assert counts(stats("amq.default"), ("publish_in", "publish_out")) == {"publish_in": 1, "publish_out": 1}
        assert counts(listed["amq.fanout"]["message_stats"], ("publish_in", "publish_out")) == {
            "publish_in": 0, "publish_out": 0}
        assert all("message_stats" in e for e in api("GET", "/api/exchanges")[1])

        # A publish over the HTTP API goes through the same path.
        status, routed, _ = api("POST", f"/api/exchanges/%2F/{q(x)}/publish",
                                {"routing_key": "k", "payload": "api", "payload_encoding": "string",
                                 "properties": {}})
        assert status == 200 and routed == {"routed": True}
        assert counts(stats(x), ("publish_in", "publish_out")) == {"publish_in": 8, "publish_out": 12}

        # Rates: > 0 once two samples straddle a stream of publishes.
        last: dict = {}

        def positive() -> bool:
            xs = stats(x)
            last.update({f: xs[f + "_details"]["rate"] for f in ("publish_in", "publish_out")})
            return last["publish_in"] > 0 and last["publish_out"] > 0

        deadline = time.monotonic() + 20
        ok = False
        while not ok and time.monotonic() < deadline:
            round_end = time.monotonic() + 0.25
            while time.monotonic() < round_end:
                for i in range(20):
                    ch.basic_publish(x, "k", f"r{i}".encode())
            ok = positive()
        assert ok, last
        assert last["publish_out"] >= last["publish_in"]  # two queues per message
    finally:
        conn.close()
