"""``python -m bench.flamegraph``: where the broker's CPU goes while one scenario runs, as py-spy flame graphs
of Leveret at one or more commits, side by side (issue 19: "py-spy flame graphs before/after").

For each ``--ref`` (a commit, or ``.`` for this working tree) the scenario's first run is played against a
fresh broker of that commit (a git worktree with its own compiled codec, as ``run_bench --baseline`` does)
while py-spy samples the broker process for the timed part of the run. Written to ``--out`` (default
``bench/flamegraphs/``):

* ``<scenario>-<commit>.svg``: the flame graph (py-spy's own SVG, every thread);
* ``<scenario>-<commit>.txt``: the rates the load generator measured during the recording, and the functions
  of the event-loop thread with the most samples of their own (py-spy's raw stacks, summed here), so that a
  reader can compare two commits without opening the graphs.

py-spy slows the broker while it samples (by a few per cent at 100 Hz), so the rates of a profiled run are not
benchmark figures; compare them only with each other. py-spy is not a dependency of the broker:
``.venv/bin/pip install py-spy`` (it needs ptrace, which root has).

    .venv/bin/python -m bench.flamegraph --only S8 --ref 13a3b24 --ref .
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run_bench import ROOT, BaselineLeveret, Leveret, log
from bench.scenarios import QUICK, scenarios
from broker.tools import perf

TOP = 25  # functions listed in the summary


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def _commit(ref: str) -> str:
    if ref == ".":
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "broker", "protocol", "storage"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def own_samples(raw: str, thread: str = "MainThread") -> tuple[int, list[tuple[int, str]]]:
    """From py-spy's raw output (one ``frame;frame;… count`` line per stack): the samples of ``thread`` and its
    functions with the most samples of their own (the innermost frame), as (count, "function (file)")."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or thread not in frames[0]:
            continue
        n = int(count)
        total += n
        name, _, where = frames[-1].partition(" (")
        own[f"{name} ({where.split(':')[0]})"] += n
    return total, [(n, f) for f, n in own.most_common(TOP)]


def profile(ref: str, scenario_id: str, out_dir: Path, rate: int, port: int) -> Path:
    sc = next(s for s in scenarios(QUICK) if s.id == scenario_id)
    key, kw = next(iter(sc.runs.items()))
    broker: Leveret = Leveret(port) if ref == "." else BaselineLeveret(port, ref)
    commit = _commit(ref)
    svg = out_dir / f"{scenario_id}-{commit}.svg"
    raw_path = Path(tempfile.mkstemp(suffix=".raw")[1])
    try:
        broker.start()
        warmup, duration = kw.get("warmup", 0), kw.get("duration", 10)
        cfg = perf.PerfConfig(url=broker.url, broker_pid=broker.pid, processes=1,
                              queue_prefix=f"perf-{scenario_id.lower()}",
                              exchange=f"perf-{scenario_id.lower()}.fanout", **kw)
        spy = [_py_spy(), "record", "--pid", str(broker.pid), "--rate", str(rate), "--threads",
               "--duration", str(int(duration))]
        # Two recordings of the same window would need two samplers on one process: the SVG is recorded, and
        # the raw stacks for the summary right after it, over the same number of seconds of the same load.
        log(f"{scenario_id} at {commit}: running, py-spy from second {warmup}")
        runner = subprocess.Popen([sys.executable, "-c", _RUN_PERF], stdin=subprocess.PIPE, cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True)
        assert runner.stdin is not None
        runner.stdin.write(repr(dict(cfg.__dict__, duration=warmup + 2 * duration + 2)))
        runner.stdin.close()
        time.sleep(warmup)
        subprocess.run([*spy, "--format", "flamegraph", "--output", str(svg)], check=True, capture_output=True)
        subprocess.run([*spy, "--format", "raw", "--output", str(raw_path)], check=True, capture_output=True)
        assert runner.stdout is not None
        summary_line = runner.stdout.read().strip()
        runner.wait(duration * 3 + 60)
        total, top = own_samples(raw_path.read_text())
        lines = [f"# {sc.id} ({sc.title}), run '{key}', Leveret at {commit}",
                 f"# load generator over the whole run: {summary_line}",
                 (f"# event-loop thread: {total} samples at {rate} Hz over {duration} s "
                  f"({100 * total / (rate * duration):.0f}% busy); functions by their own samples:"), ""]
        lines += [f"{n:6d}  {100 * n / max(total, 1):5.1f}%  {f}" for n, f in top]
        (out_dir / f"{scenario_id}-{commit}.txt").write_text("\n".join(lines) + "\n")
        log(f"{scenario_id} at {commit}: {svg}")
        return svg
    finally:
        broker.stop()
        raw_path.unlink(missing_ok=True)
        if isinstance(broker, BaselineLeveret):
            broker.remove_worktree()


# The load generator in a child process (perf.run blocks, and py-spy must run meanwhile): reads the PerfConfig's
# fields from stdin, prints perf's summary line.
_RUN_PERF = """
import ast, sys
from broker.tools import perf
cfg = perf.PerfConfig(**ast.literal_eval(sys.stdin.read()))
print(perf.summary_line(perf.run(cfg)))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flamegraph", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="S8", help="scenario id (bench/scenarios.py), e.g. S1 or S8")
    ap.add_argument("--ref", action="append", help="commit to profile, repeatable ('.' = this tree; default .)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "flamegraphs"))
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--port", type=int, default=5797)
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for ref in args.ref or ["."]:
        profile(ref, args.only, out_dir, args.rate, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
