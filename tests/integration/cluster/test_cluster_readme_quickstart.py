"""README's quick start for a cluster (two members and a PostgreSQL on one machine) runs as written: the lines
between its quickstart markers are run by bash with only what a test must change (free ports and a folder of
its own instead of 5433/5672/5673/15672.../tmp/leveret-try, ``python -m broker`` for the installed ``leveret``,
``runuser -u postgres`` before PostgreSQL's tools when the suite runs as root, and the background members' pids
written down so the test can stop them), then a quorum queue filled on one member is read on the other."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pika
import pytest
from pg_server import find_bin

from tests.conftest import BrokerProcess, free_port, wait_http

pytestmark = pytest.mark.leveret_only

ROOT = Path(__file__).resolve().parents[3]


def quickstart_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- quickstart-begin", 1)[1].split("<!-- quickstart-end -->", 1)[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    return [x for x in body.splitlines() if x.strip()]


def test_the_readme_quick_start_gives_two_members_serving_one_quorum_queue(tmp_path):
    lines = quickstart_lines()
    assert any("initdb" in x for x in lines) and sum("leveret serve" in x for x in lines) == 2
    folder = Path(tempfile.mkdtemp(prefix="leveret-try-"))  # under /tmp, as README's (postgres must reach it)
    ports = {p: str(free_port()) for p in ("5433", "5672", "5673", "15672", "15673", "15692", "15693")}
    as_root = os.geteuid() == 0
    script = ["set -e"]
    for line in lines:
        line = line.replace("/tmp/leveret-try", str(folder))
        line = re.sub(r"\b(5433|5672|5673|15672|15673|15692|15693)\b", lambda m: ports[m.group(1)], line)
        line = line.replace("leveret serve", f"{sys.executable} -m broker serve")
        if as_root:
            line = re.sub(r"(\$PG/\w+)", r"runuser -u postgres -- \1", line)
        script.append(line)
        if line.startswith("DIR=") and as_root:
            script.append("chown postgres: $DIR")
        if line.endswith("&"):
            script.append(f"echo $! >> {tmp_path}/pids")
    pids: list[int] = []
    try:
        # Output to a file, not a pipe: the members started in the background keep it open.
        with open(tmp_path / "quickstart.log", "w") as out:
            run = subprocess.run(["bash", "-c", "\n".join(script)], check=False, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 timeout=120)
        pids = [int(x) for x in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").exists() else []
        assert run.returncode == 0, (tmp_path / "quickstart.log").read_text()
        assert len(pids) == 2
        members = [BrokerProcess(host="127.0.0.1", port=int(ports[p]), management_port=int(ports[m]))
                   for p, m in (("5672", "15672"), ("5673", "15673"))]
        wait_http(members, 30)
        conn = pika.BlockingConnection(members[0].pika_params())
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("quickstart", durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(10):
            ch.basic_publish("", "quickstart", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()
        conn = pika.BlockingConnection(members[1].pika_params())
        ch = conn.channel()
        got = []
        while (m := ch.basic_get("quickstart", auto_ack=True))[0] is not None:
            got.append(int(m[2]))
        conn.close()
        assert sorted(got) == list(range(10))
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if (folder / "pg" / "postmaster.pid").exists():
            cmd = [find_bin("pg_ctl"), "-D", str(folder / "pg"), "-m", "immediate", "stop"]
            subprocess.run(["runuser", "-u", "postgres", "--", *cmd] if as_root else cmd, check=False,
                           capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
