"""`leveret perf` speaks PerfTest (docs/decisions/operator-surface.md): its letters with PerfTest's meanings, a progress line a second in
PerfTest's shape, the summary at the end, and -C/-D message counts that end the run."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROGRESS = re.compile(r"^id: (?P<id>[\w-]+), time (?P<t>[\d.]+) s, sent: (?P<sent>[\d.]+) msg/s, "
                      r"received: (?P<recv>[\d.]+) msg/s, min/median/75th/95th/99th consumer latency: "
                      r"(?P<lat>\d+/\d+/\d+/\d+/\d+) µs$", re.MULTILINE)
SENDING = re.compile(r"^id: [\w-]+, sending rate avg: (\d+) msg/s$", re.MULTILINE)
RECEIVING = re.compile(r"^id: [\w-]+, receiving rate avg: (\d+) msg/s$", re.MULTILINE)
LATENCY = re.compile(r"^id: [\w-]+, consumer latency min/median/75th/95th/99th (\d+)/(\d+)/(\d+)/(\d+)/(\d+) µs$",
                     re.MULTILINE)


def perf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "perf", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_progress_every_second_and_a_perftest_summary(broker, tmp_path):
    out = tmp_path / "r.json"
    run = perf("-h", broker.url, "-x", "1", "-y", "1", "-s", "100", "-z", "3", "-r", "1000", "-q", "100",
               "-u", "q-perf-cli-progress", "-d", "cli-test", "--text", "--json-out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = list(PROGRESS.finditer(run.stdout))
    assert len(lines) >= 2, run.stdout
    assert {m["id"] for m in lines} == {"cli-test"}
    times = [float(m["t"]) for m in lines]
    assert all(0.8 < b - a < 1.2 for a, b in itertools.pairwise(times)), times
    assert any(float(m["sent"]) > 0 and float(m["recv"]) > 0 for m in lines), run.stdout
    for m in lines:
        mn, med, p75, p95, p99 = map(int, m["lat"].split("/"))
        assert mn <= med <= p75 <= p95 <= p99, m.group(0)
    sent, received = int(SENDING.search(run.stdout)[1]), int(RECEIVING.search(run.stdout)[1])
    assert sent > 0 and abs(sent - received) <= 0.05 * sent, run.stdout
    lat = LATENCY.search(run.stdout)
    assert lat and int(lat[1]) <= int(lat[2]) <= int(lat[5]), run.stdout
    result = json.loads(out.read_text())
    assert result["config"]["queue"] == "q-perf-cli-progress" and result["config"]["manual_ack"] is True
    assert result["published"] > 0 and abs(result["published"] - result["consumed"]) <= 0.05 * result["published"]
    assert not result["errors"], result["errors"]


def test_pmessages_ends_the_run_once_everything_is_received(broker, tmp_path):
    """-C N: each producer publishes N (confirmed, with -c) and the run ends when the consumer has them all,
    without -z. Stdout is a pipe here: it gets the JSON result (as scripts read it), the lines go to stderr."""
    t0 = time.monotonic()
    run = perf("-h", broker.url, "-x", "2", "-y", "1", "-s", "64", "-C", "500", "-c", "50", "-r", "1000",
               "-u", "q-perf-cli-pmessages", timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert time.monotonic() - t0 < 30
    result = json.loads(run.stdout)
    assert result["published"] == 1000 and result["confirmed"] == 1000, result
    assert result["consumed"] == 1000, result
    assert SENDING.search(run.stderr) and RECEIVING.search(run.stderr), run.stderr


def test_cmessages_stops_each_consumer_at_its_count(broker, tmp_path):
    out = tmp_path / "r.json"
    run = perf("-h", broker.url, "-x", "1", "-y", "2", "-s", "64", "-D", "300", "-r", "1000", "-a",
               "-u", "q-perf-cli-cmessages", "--json-out", str(out), timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    c = result["consumers"]
    assert c["count"] == 2 and c["min"] >= 300, c
    assert result["config"]["manual_ack"] is False  # -a: auto ack
    assert result["window_s"] < 9, result["window_s"]  # ended by the counts, not by a time limit


def test_unknown_or_reassigned_letters_are_errors():
    for args in (["-Z", "1"], ["-P", "2"], ["-f"], ["-f", "bogus"], ["-t", "headers"]):
        run = perf(*args, timeout=30)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert "leveret perf: error:" in run.stderr, (args, run.stderr)


def test_help_lists_perftest_letters():
    run = perf("--help", timeout=30)
    assert run.returncode == 0, run.stderr
    for flag in ("-h URL, --uri URL", "-x PRODUCERS", "-y CONSUMERS", "-s SIZE", "-u QUEUE", "-a, --autoack",
                 "-q PREFETCH", "-c CONFIRM", "-f {persistent,mandatory}", "-r RATE", "-R CONSUMER_RATE",
                 "-z DURATION", "-C PMESSAGES", "-D CMESSAGES", "-e EXCHANGE", "-k ROUTING_KEY",
                 "-p, --predeclared"):
        assert flag in run.stdout, flag
    assert perf("-?", timeout=30).stdout == run.stdout


def _signal_state(pid: int) -> str:
    """How SIGINT (signal 2, bit 1) stands in the process ``pid`` and its threads, and in this test's own
    process: what a run that ignored a Ctrl-C needs explained."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        status = (task / "status").read_text().splitlines()
        lines.append(f"{task.name}: " + " ".join(x for x in status if x.startswith(("Name", "SigBlk", "SigIgn",
                                                                                       "SigCgt", "SigPnd", "ShdPnd"))))
    return (f"child threads: {lines}; this process: SIGINT handler {signal.getsignal(signal.SIGINT)!r}, "
            f"blocked {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}")


def test_ctrl_c_ends_an_unlimited_run_with_the_summary(broker):
    # A terminal's Ctrl-C reaches a process whose SIGINT is not ignored. A test run started in the background by
    # a shell without job control (`make test &`, nohup) has SIGINT ignored, which a child inherits and Python then
    # leaves alone (no KeyboardInterrupt): two runs failed so. Popen while a handler is set gives the child the
    # default action (exec resets handled signals), as a terminal's shell would; this process's own is put back.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "broker", "perf", "-h", broker.url, "-x", "1", "-y", "1",
                                 "-r", "500", "-z", "0", "-u", "q-perf-cli-interrupt", "--text"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first progress line: the run is under way
        assert PROGRESS.match(first.rstrip("\n")), first
        proc.send_signal(signal.SIGINT)
        try:
            rest, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"perf ran on 60 s after SIGINT; {_signal_state(proc.pid)}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert int(SENDING.search(rest)[1]) > 0 and int(RECEIVING.search(rest)[1]) > 0, rest
