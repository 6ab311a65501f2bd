"""A throwaway PostgreSQL server for tests: ``initdb`` into a temporary folder, started on a free TCP port of
127.0.0.1 with its unix socket in the same folder, stopped (``-m fast``) and removed at the end.

Why a real server: the PostgreSQL store's guarantees (advisory keys held per session, SKIP LOCKED,
what a killed session releases) are the server's, and only a real one shows them. ``initdb`` refuses to run as
root, so as root the folder is handed to the ``postgres`` user and the tools run through ``runuser``. A missing
PostgreSQL is an error, never a skip: ``make test`` installs it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

_SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sock}'
max_connections = 200
shared_buffers = 128MB
fsync = off  # a throwaway server: the OS cache is enough (synchronous_commit still waits for the WAL write)
synchronous_commit = on
log_min_messages = warning
"""


def find_bin(name: str) -> str:
    """``name`` (initdb, pg_ctl) on PATH, else under Debian's /usr/lib/postgresql/*/bin (newest first)."""
    found = shutil.which(name)
    if found:
        return found
    for cand in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        if os.access(cand, os.X_OK):
            return cand
    raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql); the PostgreSQL "
                       "store's tests need a real server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster in a temporary folder; ``dsn(database)`` addresses it over TCP."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="leveret-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.user = "postgres"
        self._as_root = os.geteuid() == 0
        self._initdb = find_bin("initdb")
        self._pg_ctl = find_bin("pg_ctl")

    def _run(self, *cmd: str) -> None:
        full = ["runuser", "-u", "postgres", "--", *cmd] if self._as_root else list(cmd)
        proc = subprocess.run(full, check=False, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")

    def start(self) -> None:
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        else:
            self.user = os.environ.get("USER") or "postgres"
        self._run(self._initdb, "-D", str(self.data), "-U", self.user, "-E", "UTF8", "--auth=trust", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(_SETTINGS.format(port=self.port, sock=self.root))
        self._run(self._pg_ctl, "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "start")

    def stop(self) -> None:
        try:
            self._run(self._pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"
