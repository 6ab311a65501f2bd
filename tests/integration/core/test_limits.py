"""max_message_size: a publish whose header announces a larger body is refused with RabbitMQ's 406
(a channel error), and the connection and the broker go on serving. Leveret-only: it needs a broker
configured with a small limit (RabbitMQ's default is 128 MiB in 3.x, 16 MiB in 4.x)."""

from __future__ import annotations

import pika
import pytest

pytestmark = pytest.mark.leveret_only


def test_message_larger_than_max_message_size_is_406(start_broker, tmp_path, uid):
    conf = tmp_path / "leveret.conf"
    conf.write_text("max_message_size = 1024\n")
    b = start_broker("--config", str(conf))
    conn = pika.BlockingConnection(b.pika_params())
    ch = conn.channel()
    q = ch.queue_declare(f"{uid}-q").method.queue
    ch.basic_publish("", q, b"x" * 1024)  # exactly the limit is allowed
    ch.basic_publish("", q, b"x" * 1025)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - message size 1025 is larger than configured max size 1024"
    ch2 = conn.channel()
    assert ch2.queue_declare(q, passive=True).method.message_count == 1
    _method, _props, body = ch2.basic_get(q, auto_ack=True)
    assert body == b"x" * 1024
    conn.close()
