"""broker/delayed/delayed_message.py: how x-delay / x-deliver-at are read (the plugin's coercion, Leveret's horizon)."""

from __future__ import annotations

import datetime

import pytest

from broker.delayed.delayed_message import delivered_header, due_time
from broker.errors import AMQPError
from broker.message import Message
from protocol.properties import build_content_header, with_properties

NOW = 1_700_000_000_000
HORIZON = 10_000


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({"x-delay": 0}, None),
    ({"x-delay": -5}, None),
    ({"x-delay": True}, None),
    ({"x-delay": 1500}, (NOW + 1500, 1500)),
    ({"x-delay": 1500.9}, (NOW + 1500, 1500)),
    ({"x-delay": b"250"}, (NOW + 250, 250)),
    ({"x-delay": " 250 "}, (NOW + 250, 250)),
    ({"x-deliver-at": NOW + 700, "x-delay": 5}, (NOW + 700, 700)),
    ({"x-deliver-at": NOW - 1}, None),
    ({"x-deliver-at": datetime.datetime.fromtimestamp((NOW + 2000) / 1000, tz=datetime.UTC)}, (NOW + 2000, 2000)),
])
def test_due_time(headers, expected):
    assert due_time(headers, NOW, HORIZON) == expected


def test_beyond_the_horizon_or_not_a_number_is_refused():
    with pytest.raises(AMQPError) as e:
        due_time({"x-delay": HORIZON + 1}, NOW, HORIZON)
    assert e.value.reply_code == 406 and "delayed_message.max_delay" in str(e.value.text)
    assert due_time({"x-delay": HORIZON}, NOW, HORIZON) == (NOW + HORIZON, HORIZON)
    with pytest.raises(AMQPError):
        due_time({"x-delay": b"soon"}, NOW, HORIZON)


def test_the_delivered_header_carries_the_delay_negated():
    header = delivered_header(with_properties(build_content_header(3, b"\x00\x00"),
                                              headers={"x-delay": 900, "a": "b"}), 900)
    msg = Message("x", "k", b"", header, b"abc")
    assert msg.headers["x-delay"] == -900 and msg.headers["a"] in ("b", b"b")
