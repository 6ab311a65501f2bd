"""atheris (libFuzzer) targets for the sans-IO codec in protocol/, run as a script by
tests/unit/protocol/test_fuzz_codec.py::

    python tests/fuzz_codec_targets.py TARGET -runs=20000 -seed=1 [libFuzzer flags]

Each target takes arbitrary bytes and may raise only the codec's declared errors: :class:`FrameError` (and its
subclasses UnknownMethod, TableTooDeep) and, for the protocol header, :class:`BadProtocolHeader`. Anything else
(IndexError, struct.error, RecursionError, UnicodeDecodeError, a pamqp exception) escapes, and libFuzzer
reports it as a crash with the input that caused it (exit status non-zero, input saved under
``-artifact_prefix``). The frame parser is also checked for split-independence: the same bytes fed whole,
then in two pieces at a fuzzer-chosen point, then one byte at a time, give the same frames or the same error
(h11's discipline).
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from protocol import fastcodec, properties
    from protocol.frames import BadProtocolHeader, FrameError, FrameParser
    from protocol.methods import decode_method

DECLARED = (FrameError,)


def _feed(chunks: list[bytes], expect_header: bool) -> tuple[str, object]:
    parser = FrameParser(8192, expect_header=expect_header)
    frames: list[tuple[int, int, bytes]] = []
    try:
        for chunk in chunks:
            frames += parser.feed(chunk)
    except FrameError as exc:
        return "error", (frames + exc.frames, exc.reply_code)
    except BadProtocolHeader as exc:
        return "header", exc.kind
    return "ok", (frames, parser.buffered)


def target_frames(data: bytes) -> None:
    if not data:
        return
    expect_header = bool(data[0] & 1)
    data = data[1:]
    whole = _feed([data], expect_header)
    cut = data[0] % (len(data) + 1) if data else 0
    halves = _feed([data[:cut], data[cut:]], expect_header)
    if len(data) <= 512:
        one_by_one = _feed([data[i : i + 1] for i in range(len(data))], expect_header)
    else:
        one_by_one = whole
    if whole[0] == "header" or halves[0] == "header" or one_by_one[0] == "header":
        # An HTTP or TLS opening is recognised from 4 octets, before the 8 of a whole header: who says so
        # first may differ, the refusal may not.
        assert whole[0] == halves[0] == one_by_one[0] == "header", (whole, halves, one_by_one)
        return
    if whole[0] == "error":
        # The frames completed before the bad one are the same however the bytes arrived.
        assert halves[0] == one_by_one[0] == "error", (whole, halves, one_by_one)
        assert whole[1] == halves[1] == one_by_one[1], (whole, halves, one_by_one)
        return
    assert whole == halves == one_by_one, (whole, halves, one_by_one)


def target_methods(data: bytes) -> None:
    try:
        decode_method(data)
    except DECLARED:
        pass


def target_fastcodec(data: bytes) -> None:
    for decode in (fastcodec.decode_basic_publish, fastcodec.decode_ack, fastcodec.decode_nack,
                   fastcodec.decode_reject, fastcodec.decode_content_header):
        try:
            decode(data)
        except DECLARED:
            pass


def target_properties(data: bytes) -> None:
    try:
        scanned = properties.scan_properties(data)
    except DECLARED:
        scanned = None
    if scanned is not None and scanned.headers_span is not None and scanned.headers_span[1] <= len(data):
        for call in (lambda: properties.check_nesting(data, *scanned.headers_span),
                     lambda: properties.decode_headers(data, scanned.headers_span)):
            try:
                call()
            except DECLARED:
                pass
    for call in (lambda: properties.decode_properties(data), lambda: properties.decode_properties(
            data, skip_headers=True)):
        try:
            call()
        except DECLARED:
            pass


def target_tables(data: bytes) -> None:
    for call in (lambda: properties.decode_field_table(data), lambda: properties.check_field_table(data),
                 lambda: properties.decode_field_table(data, strict_keys=True),
                 lambda: properties.field_table_entries(data)):
        try:
            call()
        except DECLARED:
            pass


@atheris.instrument_func
def target_canary(data: bytes) -> None:
    """A planted bug (an IndexError behind a 4-octet comparison), to show that the harness finds and reports
    one: the test expects this target to fail."""
    if data[:4] == b"\x01\xce\x02\xce":
        raise IndexError("planted")


TARGETS = {
    "frames": target_frames,
    "methods": target_methods,
    "fastcodec": target_fastcodec,
    "properties": target_properties,
    "tables": target_tables,
}
ALL = tuple(TARGETS.values())


def target_all(data: bytes) -> None:
    """Every target in one process (one start-up): the first octet picks the target."""
    if data:
        ALL[data[0] % len(ALL)](data[1:])


TARGETS["all"] = target_all
TARGETS["canary"] = target_canary


def main() -> None:
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
