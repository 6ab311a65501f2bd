"""The delayed exchange's fast path for its two headers (broker/delayed/delayed_message.py ``raw_delay_headers``):
whenever it answers, it answers what decoding the whole table answers (values and types, the last entry of a
key winning), over random tables of every field type, truncated and with wrong lengths; otherwise it declines
(None) and the publish decodes the table as before."""

from __future__ import annotations

import random
import struct

from broker.delayed.delayed_message import X_DELAY, X_DELIVER_AT, _get, raw_delay_headers
from protocol.properties import decode_field_table

KINDS = list("bBsuUIiflLdTDtVSxFAzq")
KEYS = [b"x-delay", b"x-deliver-at", b"a", b"x-dela", b"\xff\xfe", b"x-delay2", b""]


def _value(rng: random.Random, kind: str) -> bytes:
    if kind in "bB":
        return kind.encode() + bytes([rng.randrange(256)])
    if kind in "suU":
        return kind.encode() + rng.randbytes(2)
    if kind in "Iif":
        return kind.encode() + rng.randbytes(4)
    if kind in "lLdT":
        return kind.encode() + rng.randbytes(8)
    if kind == "D":
        return kind.encode() + rng.randbytes(5)
    if kind == "t":
        return kind.encode() + bytes([rng.randrange(2)])
    if kind == "V":
        return b"V"
    if kind in "Sx":
        b = rng.choice([b"", b"123", b"-5", b"abc", "é".encode(), rng.randbytes(3)])
        return kind.encode() + struct.pack(">I", len(b)) + b
    if kind in "FA":
        return kind.encode() + struct.pack(">I", 0)
    return kind.encode() + rng.randbytes(rng.randrange(4))


def test_the_fast_path_agrees_with_decoding_the_table_whenever_it_answers() -> None:
    rng = random.Random(7)
    answered = declined = 0
    for _ in range(20_000):
        body = b"".join(bytes([len(k)]) + k + _value(rng, rng.choice(KINDS))
                        for k in (rng.choice(KEYS) for _ in range(rng.randrange(5))))
        if rng.random() < 0.1 and body:
            body = body[:rng.randrange(len(body))]
        table = struct.pack(">I", len(body) + (rng.choice([-1, 1]) if rng.random() < 0.03 and body else 0)) + body
        pre, post = rng.randbytes(rng.randrange(3)), rng.randbytes(rng.randrange(3))
        header = pre + table + post
        span = (len(pre), len(pre) + len(table))
        raw = raw_delay_headers(header, span)
        if raw is None:
            declined += 1
            continue
        answered += 1
        decoded = decode_field_table(header, span[0], span[1])  # must not raise when the fast path answered
        expected = (_get(decoded, X_DELIVER_AT), _get(decoded, X_DELAY))
        assert raw == expected and [type(x) for x in raw] == [type(x) for x in expected], (header, raw, expected)
    assert answered > 5_000 and declined > 1_000  # both ways exercised


def test_no_headers_table_means_neither_header() -> None:
    assert raw_delay_headers(b"", None) == (None, None)


def test_an_x_delay_of_another_type_is_left_to_the_ordinary_way() -> None:
    key = b"x-delay"
    body = bytes([len(key)]) + key + b"S" + struct.pack(">I", 4) + b"1500"
    header = struct.pack(">I", len(body)) + body
    assert raw_delay_headers(header, (0, len(header))) is None
