"""Fuzzing the sans-IO codec (issue 17): arbitrary bytes raise nothing but the codec's declared errors, and
valid methods, frames and field tables round-trip exactly.

* atheris (coverage-guided libFuzzer) runs the targets of tests/fuzz_codec_targets.py in a subprocess,
  seeded with real frames: 25,000 inputs over the five targets here (about 5,000 each, some 3 s),
  1,000,000 per target behind ``-m long``. A crash is reported with the input that caused it; the planted-bug target shows
  the harness does report one.
* hypothesis draws valid values: every method pamqp defines, encoded by protocol.methods.method_frame and
  decoded back by decode_method; frames cut at any points; field tables of every type the encoder writes.

The frame parser and the fast codec have a compiled twin (protocol/_codec.pyx): the 25,000-input run and the
frame round trip go through both (``LEVERET_NO_EXTENSIONS=1`` selects the pure one in the atheris process).
atheris instruments Python code only, so its coverage guidance comes from the pure run; the compiled run
still takes the same corpus and mutations. test_codec_equivalence.py holds the two to each other.
"""

from __future__ import annotations

import decimal
import itertools
import os
import subprocess
import sys
from pathlib import Path

import codec_impls
import pytest
import soak_report
from codec_impls import Codec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from protocol.frames import encode_frame
from protocol.methods import decode_method, method_frame
from protocol.properties import decode_field_table, encode_field_table

ROOT = Path(__file__).resolve().parents[3]
TARGETS = ROOT / "tests" / "fuzz_codec_targets.py"
TARGET_NAMES = ("frames", "methods", "fastcodec", "properties", "tables")  # the order of target_all's octet


@pytest.fixture(scope="module", params=codec_impls.NAMES)
def codec(request: pytest.FixtureRequest) -> Codec:
    return codec_impls.get(request.param)


# -- atheris ------------------------------------------------------------------------------------------------

def seed_corpus(directory: Path) -> Path:
    """Real frames (handshake, declares with arguments, a publish with its content) as seeds, each once per
    target, prefixed with the octet that selects the target."""
    directory.mkdir(parents=True, exist_ok=True)
    methods = [
        method_frame(0, commands.Connection.StartOk, client_properties={"product": "x", "capabilities": {
            "publisher_confirms": True}}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"),
        method_frame(0, commands.Connection.TuneOk, channel_max=2047, frame_max=131072, heartbeat=60),
        method_frame(1, commands.Queue.Declare, queue="q", durable=True, arguments={
            "x-queue-type": "classic", "x-max-length": 10, "x-dead-letter-exchange": "dlx", "nested": {"a": [1]}}),
        method_frame(1, commands.Basic.Publish, exchange="amq.topic", routing_key="a.b.c", mandatory=True),
        method_frame(1, commands.Basic.Ack, delivery_tag=7, multiple=True),
        method_frame(1, commands.Basic.Consume, queue="q", consumer_tag="c", arguments={"x-priority": 5}),
    ]
    table = encode_field_table({"s": "v", "i": 1, "l": 2**40, "f": 1.5, "b": True, "a": [1, "x", {"t": None}],
                                "d": decimal.Decimal("1.25"), "x": b"\x00\xff"})
    header_props = (b"\x00\x3c\x00\x00" + (5).to_bytes(8, "big") + b"\xb0\x00"  # content-type, encoding, headers
                    + b"\x0atext/plain" + b"\x04utf8" + table)
    header = encode_frame(2, 1, header_props)
    seeds: dict[str, list[bytes]] = {
        "frames": [b"\x01AMQP\x00\x00\x09\x01" + methods[0], b"\x00" + b"".join(methods) + header
                   + encode_frame(3, 1, b"hello")],
        "methods": [m[7:-1] for m in methods],
        "fastcodec": [methods[3][11:-1], methods[4][11:-1], header_props],
        "properties": [header_props],
        "tables": [table],
    }
    for number, name in enumerate(TARGET_NAMES):
        for i, seed in enumerate(seeds[name]):
            (directory / f"{name}-{i}").write_bytes(bytes([number]) + seed)
    return directory


def run_target(target: str, runs: int, tmp_path: Path, timeout: float, corpus: Path | None = None,
               codec: str = "compiled") -> subprocess.CompletedProcess[str]:
    """Run a target in its own process, with the compiled codec (if built) or, ``codec="pure"``, without."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(exist_ok=True)
    cmd = [sys.executable, str(TARGETS), target, f"-runs={runs}", "-seed=17", "-timeout=2", "-rss_limit_mb=1024",
           "-max_len=4096", f"-artifact_prefix={artifacts}/"]
    if corpus is not None:
        cmd.append(str(corpus))
    env = {k: v for k, v in os.environ.items() if k != "LEVERET_NO_EXTENSIONS"}
    if codec == "pure":
        env["LEVERET_NO_EXTENSIONS"] = "1"
    return subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def crash_report(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if "Instrumenting" not in line]
    return "\n".join(lines[-40:])


@pytest.mark.timeout(120)
def test_atheris_25k_inputs_raise_only_declared_errors(codec, tmp_path):
    corpus = seed_corpus(tmp_path / "corpus")
    result = run_target("all", 25_000, tmp_path, timeout=110, corpus=corpus, codec=codec.name)
    assert result.returncode == 0, crash_report(result)
    assert "Done 25000 runs" in result.stderr, crash_report(result)


@pytest.mark.timeout(120)
def test_atheris_finds_a_planted_bug(tmp_path):
    result = run_target("canary", 200_000, tmp_path, timeout=110)
    assert result.returncode != 0
    assert "planted" in result.stderr
    assert list((tmp_path / "artifacts").glob("crash-*")), "no crash input saved"


@pytest.mark.long
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_atheris_one_million_inputs(tmp_path, target):
    corpus = seed_corpus(tmp_path / "corpus")
    # The seeds carry target_all's selector octet; the single targets just see one more leading octet.
    result = run_target(target, 1_000_000, tmp_path, timeout=3500, corpus=corpus)
    soak_report.record(f"codec fuzz: {target}", 1_000_000, 0, 0, 0,
                       note="passed" if result.returncode == 0 else "CRASH")
    assert result.returncode == 0, crash_report(result)


# -- hypothesis: valid input round-trips ------------------------------------------------------------------------

_shortstr = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
_key = st.text(min_size=0, max_size=12).filter(lambda s: len(s.encode()) <= 128)
_leaf = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=30),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-(10**6), max_value=10**6),
)
_value = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(_key, inner, max_size=4)), max_leaves=12)
_table = st.dictionaries(_key, _value, max_size=6)

# Method arguments are encoded by pamqp, which writes a float as a 32-bit 'f' and a long-long as signed: the
# values drawn are those it can write exactly (field tables of every type are the next test's).
_method_leaf = st.one_of(st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=20),
                         st.floats(width=32, allow_nan=False, allow_infinity=False))
_method_table = st.dictionaries(_key, st.one_of(_method_leaf, st.lists(_method_leaf, max_size=3),
                                                st.dictionaries(_key, _method_leaf, max_size=3)), max_size=4)
_BY_TYPE = {
    "bit": st.booleans(),
    "octet": st.integers(0, 255),
    "short": st.integers(0, 2**16 - 1),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**63 - 1),
    "shortstr": _shortstr,
    "longstr": st.text(max_size=60),
    "table": _method_table,
}
METHODS = sorted(commands.INDEX_MAPPING.values(), key=lambda cls: cls.index)


@st.composite
def _method_values(draw, cls):
    return {name: draw(_BY_TYPE[cls.amqp_type(name)]) for name in cls.__slots__}


@pytest.mark.parametrize("cls", METHODS, ids=lambda cls: cls.name)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_method_round_trips_exactly(cls, data):
    values = data.draw(_method_values(cls))
    frame = method_frame(3, cls, **values)
    assert frame[0] == 1 and int.from_bytes(frame[1:3], "big") == 3 and frame[-1] == 0xCE
    decoded = decode_method(frame[7:-1])
    assert type(decoded) is cls
    for name, value in values.items():
        assert getattr(decoded, name) == value, name


@settings(max_examples=200, deadline=None)
@given(table=_table)
def test_field_tables_round_trip_exactly(table):
    raw = encode_field_table(table)
    assert decode_field_table(raw) == table


@settings(max_examples=400, deadline=None)
@given(frames=st.lists(st.tuples(st.sampled_from([1, 2, 3, 8]), st.integers(0, 65535), st.binary(max_size=300)),
                       max_size=8),
       cuts=st.lists(st.integers(0, 4000), max_size=10))
def test_frames_round_trip_however_the_bytes_are_cut(codec, frames, cuts):
    frames = [(t, ch, b"" if t == 8 else payload) for t, ch, payload in frames]
    wire = b"".join(encode_frame(*f) for f in frames)
    points = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    parser = codec.FrameParser(0, expect_header=False)
    got = []
    for a, b in itertools.pairwise(points):
        got += parser.feed(wire[a:b])
    assert got == frames
    assert parser.buffered == 0
