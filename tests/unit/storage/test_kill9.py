"""kill -9 of a real publishing process: every message it confirmed (after fsync) is recovered, once
each, in order, marked delivered (an unclean stop). Several rounds on the same data directory, each
one recovering what the previous crash left and publishing more."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.node_storage import NodeStorage

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def run_round(data_dir: Path, first_id: int, confirms_before_kill: int) -> list[int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(HERE / "kill9_publisher.py"), str(data_dir), str(first_id)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    confirmed: list[int] = []
    deadline = time.monotonic() + 30
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("recovered"), line + proc.stderr.read()
        while len(confirmed) < confirms_before_kill and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            confirmed.append(int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate()
    # Lines printed before the kill were confirmed too (the fsync preceded the print).
    confirmed += [int(x) for x in rest.split()]
    assert len(confirmed) >= confirms_before_kill, err
    return confirmed


@pytest.mark.timeout(120)
def test_confirmed_messages_survive_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    rnd = random.Random(7)
    confirmed: list[int] = []
    for r in range(3):
        confirmed += run_round(data_dir, r * 1_000_000, rnd.randint(500, 4000))
    ns = NodeStorage(str(data_dir))
    vq = ns.open_queue("/", "q", True)
    ns.finish_recovery()
    assert vq.recovered_clean is False
    got = []
    while True:
        f = vq.fetch(False)
        if f is None:
            break
        _, m, delivered = f
        assert delivered
        i = int(m.split(b":")[0])
        assert m == b"%d:" % i + b"x" * (6000 if i % 7 == 0 else 100)
        got.append(i)
    assert got == sorted(got) and len(set(got)) == len(got)  # in order, no duplicates
    missing = set(confirmed) - set(got)
    assert not missing, sorted(missing)[:10]
    ns.close()
