"""A throwaway PostgreSQL server for tests: ``initdb`` into a temporary folder, started on a free TCP port of
127.0.0.1 with its unix socket in the same folder, stopped (``-m fast``) and removed at the end. A test may
``halt`` it (``pg_ctl stop -m immediate``: a crash, or ``fast``) and ``resume`` it on the same port and data,
or ``freeze`` it (SIGSTOP: a server that no longer answers) and ``thaw`` it.

Why a real server: the PostgreSQL store's guarantees (advisory keys held per session, SKIP LOCKED,
what a killed session releases) are the server's, and only a real one shows them. ``initdb`` refuses to run as
root, so as root the folder is handed to the ``postgres`` user and the tools run through ``runuser``. A missing
PostgreSQL is an error, never a skip: ``make test`` installs it.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
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
    from worker_resources import free_port

    return free_port()


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
        self.running = False

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
        self.resume()

    def halt(self, mode: str = "immediate") -> None:
        """Stop the server and keep its data folder and port (``resume`` starts it again): every session
        ends. ``immediate`` is a crash (no checkpoint: the restart replays the WAL), ``fast`` a clean stop
        that still disconnects every client."""
        self._run(self._pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def resume(self) -> None:
        """Start the server (again) on the same port and data folder; returns once it accepts connections."""
        try:
            self._run(self._pg_ctl, "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                      "start")
        except RuntimeError as e:  # pg_ctl says only "Examine the log output": the reason is in the log
            raise RuntimeError(f"{e}\n{self.root / 'server.log'} ends:\n{self._log_tail()}") from None
        self.running = True

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(unreadable: {e})"

    def _pids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, walwriter...)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(stat.split("/")[2]))
        return pids

    def freeze(self) -> None:
        """SIGSTOP the whole server: connections stay open and nothing answers (a hung server, or a link
        that drops packets without a reset). ``thaw`` lets it go on."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        # The postmaster first: once it goes on it reaps the children that ended meanwhile, so a child listed a
        # moment ago may be gone by its turn (a thaw under load met ProcessLookupError): nothing left to signal.
        for pid in self._pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop the server and delete its folder. ``immediate``: nothing of it is read again, and a fast stop's
        shutdown checkpoint of a session's hundreds of test databases took 6-9 s at the end of each worker."""
        try:
            if self.running:
                self._run(self._pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"
