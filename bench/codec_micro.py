"""Micro-benchmark of the wire codec: the pure-Python reference against the compiled extension, in one run.

    .venv/bin/python -m bench.codec_micro            # N = 1000 publish + header + body triples per buffer
    .venv/bin/python -m bench.codec_micro --n 200 --repeat 9

Why: issue 19's first lever is a compiled frame splitter and per-message codec; this says what it buys per
operation, away from the sockets and the event loop that the S1–S7 scenarios also measure. Each figure is
the best of ``--repeat`` timings (the least disturbed), in ns per frame or per call; the ratio is pure time
over compiled time (above 1: the compiled one is faster).

FrameParser.feed is timed on a buffer of N basic.publish + content header + body triples (bodies of 1 KiB
and of 16 B), fed whole and fed in 64 KiB reads (what a socket gives: frames cut across reads).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from typing import Any

from protocol import codec_extension, fastcodec
from protocol.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from protocol.frames import PyFrameParser, encode_frame

READ_SIZE = 64 * 1024
PUBLISH_ARGS = b"\x00\x00" + b"\x00" + b"\x0bbench.queue" + b"\x00"  # default exchange, routing key, no flags
PUBLISH_PAYLOAD = b"\x00\x3c\x00\x28" + PUBLISH_ARGS  # class basic (60), method publish (40)
PROPERTIES = b"\x10\x00\x02"  # delivery-mode 2


def publish_stream(count: int, body_size: int) -> bytes:
    """``count`` publish + header + body triples on channel 1, as a client sends them."""
    body = bytes(range(256)) * (body_size // 256) + bytes(body_size % 256)
    triple = (encode_frame(FRAME_METHOD, 1, PUBLISH_PAYLOAD)
              + encode_frame(FRAME_HEADER, 1, fastcodec.pure.build_content_header(body_size, PROPERTIES))
              + encode_frame(FRAME_BODY, 1, body))
    return triple * count


def best_ns(fn: Callable[[], Any], per_call: int, repeat: int) -> float:
    """The best of ``repeat`` timings of ``fn``, in ns per unit (``per_call`` units per call of ``fn``)."""
    timer = timeit.Timer(fn)
    loops, _ = timer.autorange()
    return min(timer.repeat(repeat, loops)) / loops / per_call * 1e9


def feed_whole(parser_class: type, stream: bytes) -> Callable[[], Any]:
    def run() -> Any:
        return parser_class(0, expect_header=False).feed(stream)
    return run


def feed_reads(parser_class: type, reads: list[bytes]) -> Callable[[], Any]:
    def run() -> Any:
        feed = parser_class(0, expect_header=False).feed
        for read in reads:
            feed(read)
    return run


def cases(n: int, impls: dict[str, Any]) -> list[tuple[str, int, dict[str, Callable[[], Any]]]]:
    """(name, units per call, {implementation: callable}) of every measurement."""
    out: list[tuple[str, int, dict[str, Callable[[], Any]]]] = []
    for body_size in (1024, 16):
        stream = publish_stream(n, body_size)
        reads = [stream[i : i + READ_SIZE] for i in range(0, len(stream), READ_SIZE)]
        label = "1 KiB" if body_size == 1024 else f"{body_size} B"
        out.append((f"FrameParser.feed, whole buffer, {label} bodies (per frame)", 3 * n,
                    {k: feed_whole(v["FrameParser"], stream) for k, v in impls.items()}))
        out.append((f"FrameParser.feed, 64 KiB reads, {label} bodies (per frame)", 3 * n,
                    {k: feed_reads(v["FrameParser"], reads) for k, v in impls.items()}))
    header = fastcodec.pure.build_content_header(1024, PROPERTIES)
    ack = b"\x00\x3c\x00\x50" + (12345).to_bytes(8, "big") + b"\x00"
    tag, names, body = b"\x08consumer", b"\x00\x0bbench.queue", bytes(1024)
    calls: list[tuple[str, Callable[[Any], Callable[[], Any]]]] = [
        ("decode_basic_publish", lambda c: lambda: c.decode_basic_publish(PUBLISH_PAYLOAD, 4)),
        ("decode_content_header", lambda c: lambda: c.decode_content_header(header)),
        ("decode_ack", lambda c: lambda: c.decode_ack(ack, 4)),
        ("encode_basic_deliver", lambda c: lambda: c.encode_basic_deliver(1, tag, 123456, False, names)),
        ("encode_basic_ack", lambda c: lambda: c.encode_basic_ack(1, 123456, False)),
        ("encode_content, 1 KiB body", lambda c: lambda: c.encode_content(1, header, body, 131072)),
        ("build_content_header", lambda c: lambda: c.build_content_header(1024, PROPERTIES)),
    ]
    for name, make in calls:
        out.append((f"{name} (per call)", 1, {k: make(v["codec"]) for k, v in impls.items()}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="publish triples per buffer (default 1000)")
    parser.add_argument("--repeat", type=int, default=5, help="timings per figure, the best kept (default 5)")
    args = parser.parse_args(argv)
    impls: dict[str, Any] = {"pure": {"FrameParser": PyFrameParser, "codec": fastcodec.pure}}
    if codec_extension is None:
        print("the compiled codec is not available (not built, or LEVERET_NO_EXTENSIONS is set): "
              "pure-Python figures only", file=sys.stderr)
    else:
        impls["compiled"] = {"FrameParser": codec_extension.FrameParser, "codec": codec_extension}
    width = 66
    print(f"{'':<{width}} {'pure ns':>9} {'compiled ns':>12} {'ratio':>7}")
    for name, units, fns in cases(args.n, impls):
        pure_ns = best_ns(fns["pure"], units, args.repeat)
        line = f"{name:<{width}} {pure_ns:>9.1f}"
        if "compiled" in fns:
            compiled_ns = best_ns(fns["compiled"], units, args.repeat)
            line += f" {compiled_ns:>12.1f} {pure_ns / compiled_ns:>6.2f}x"
        print(line, flush=True)
    overhead = best_ns(lambda: None, 1, args.repeat)
    print(f"(each per-call figure includes the harness's own call, {overhead:.1f} ns for an empty lambda)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
