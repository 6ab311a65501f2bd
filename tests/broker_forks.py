"""Test brokers forked from a process that imported the broker once, instead of each importing it again.

The suite starts about 700 broker processes. A ``python -m broker serve`` spends ~0.45 s of CPU importing
(aiohttp, structlog, uvloop, asyncpg's and the broker's own modules) before it binds a port: a sixth of the
whole suite's CPU on 2 cores (process accounting of a fresh-clone run, README "Run the tests"). So each pytest
process keeps one *fork server*: a child that imports what ``leveret serve`` imports, then waits. To start a
broker it forks; the fork sets its argv, environment, working directory and output file as ``subprocess.Popen``
would have, and runs ``broker.cli.main`` exactly as ``python -m broker`` does (broker/__main__.py). What the
test talks to is still a separate process running the real broker from its command line: only the imports
were done before the fork (copy-on-write).

The broker must be the *test's* child, as with Popen: tests kill -9 it, SIGSTOP it, wait for it and read its
exit status. So the fork server forks twice (the middle process exits at once) while this process is marked a
*child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4): the orphaned broker is re-parented to it, and
:class:`ForkedBroker` waits for it with ``waitpid`` like Popen. The mark is cleared as soon as the broker is
adopted, so nothing else the test starts is adopted meanwhile.

What a fork cannot change is what was read before it. A fork server is therefore started with one
environment, and a start forks from it when its environment differs only in ``LEVERET_…`` variables the broker
reads at run time (the configuration's; storage/syncer.py's test hook reads its variable when its thread
starts), pytest's ``PYTEST_…`` and ``PYTHONUNBUFFERED`` (set up by the fork). When anything else differs,
which is what a test process does to itself when a fixture sets a variable for good (tests/pipeline/conftest.py
sets ``PYSPARK_PYTHON``), the fork server is replaced by one started with the new environment. Variables the
dynamic loader (``LD_PRELOAD``: libfaketime, which also reads the clock it fakes as it loads), the interpreter
(``PYTHON…``) and imports (``LEVERET_NO_EXTENSIONS``: protocol/__init__.py picks its codec at import) read are
only ever set by a test for its own broker: such a start runs with Popen, as every start does with
``LEVERET_TEST_FORK=0`` (to compare, or to rule the fork server out).
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_READY = b"ready"
_MESSAGE_LIMIT = 1 << 20  # a request: argv, environment, working directory (a few KB)


def enabled() -> bool:
    return os.environ.get("LEVERET_TEST_FORK", "1") != "0" and sys.platform == "linux"


_READ_AT_IMPORT = frozenset({"LEVERET_NO_EXTENSIONS"})


def _read_at_run_time(name: str) -> bool:
    """Whether a forked broker sees variable ``name`` as set for its start (see the module)."""
    return (name == "PYTHONUNBUFFERED" or name.startswith("PYTEST_")  # (pytest's own: PYTEST_CURRENT_TEST)
            or (name.startswith("LEVERET_") and name not in _READ_AT_IMPORT))


def _read_before_the_fork(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not _read_at_run_time(k)}


def _read_by_the_loader_or_interpreter(name: str) -> bool:
    """Whether a start that changes variable ``name`` runs with Popen rather than a new fork server."""
    return name.startswith(("LD_", "PYTHON")) or name in _READ_AT_IMPORT


def _starts_with_popen(env: dict[str, str], server_env: dict[str, str]) -> bool:
    return any(_read_by_the_loader_or_interpreter(k) and env.get(k) != server_env.get(k)
               for k in env.keys() | server_env.keys() if not _read_at_run_time(k))


class ForkedBroker:
    """The part of ``subprocess.Popen`` the tests use, for a broker this process adopted (see the module)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, flags)
                except ChildProcessError:  # reaped elsewhere: it is gone, status unknown
                    self.returncode = 255
                else:
                    if pid == self.pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is not None:
            return self.returncode  # type: ignore[return-value]
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # exited and not yet reaped is still found; gone means reaped
            return self._reap(0)  # type: ignore[return-value]
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                readable, _, _ = select.select([pidfd], [], [], left)
                if readable:
                    return self._reap(0)  # type: ignore[return-value]
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        finally:
            os.close(pidfd)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self.returncode is None:
            try:
                os.waitpid(self.pid, os.WNOHANG)  # no zombie left for an exited broker nobody waited for
            except OSError:
                pass


_environment: dict[str, str] | None = None


def remember_environment() -> None:
    """Take this process's environment now as the fork server's (pytest_configure, before any test sets a
    variable for one start of its own: a fork server started in such a test would keep it for all)."""
    global _environment
    _environment = dict(os.environ)


class _ForkServer:
    """This process's fork server (started at the first broker start; it dies with this process)."""

    def __init__(self, env: dict[str, str]) -> None:
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self.env = dict(env)
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(theirs.fileno())],
            cwd=ROOT, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=self.env)
        theirs.close()
        ours.settimeout(120)
        reply = ours.recv(64)
        if reply != _READY:
            raise RuntimeError(f"the broker fork server did not start (exit {self._process.poll()})")
        ours.settimeout(None)

    def alive(self) -> bool:
        return self._process.poll() is None

    def can_fork(self, env: dict[str, str]) -> bool:
        return _read_before_the_fork(env) == _read_before_the_fork(self.env)

    def close(self) -> None:
        """Retire it: it exits when its end of the socket reads empty (brokers it forked are not its)."""
        self._sock.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, output: IO[bytes]) -> ForkedBroker:
        request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
        libc = ctypes.CDLL(None, use_errno=True)
        with self._lock:
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
            try:
                socket.send_fds(self._sock, [request], [output.fileno()])
                reply = json.loads(self._sock.recv(_MESSAGE_LIMIT) or b'{"error": "the fork server exited"}')
            finally:
                libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        if "error" in reply:
            raise RuntimeError(f"the broker fork server could not start a broker: {reply['error']}")
        return ForkedBroker(int(reply["pid"]), [sys.executable, "-m", "broker", *argv])


_server: _ForkServer | None = None
_server_lock = threading.Lock()


def start_broker_process(argv: list[str], env: dict[str, str], output: IO[bytes]) -> subprocess.Popen | ForkedBroker:
    """``python -m broker ARGV`` in ROOT with ``env``, stdout and stderr to ``output``: forked from this
    process's fork server where it can be (see the module), else with Popen."""
    global _server
    if enabled():
        with _server_lock:
            if _server is None or not _server.alive():
                _server = _ForkServer(os.environ if _environment is None else _environment)
            if not _server.can_fork(env) and not _starts_with_popen(env, _server.env):
                _server.close()  # this process's environment changed for good (see the module)
                _server = _ForkServer(_read_before_the_fork(env))
            server = _server
        if server.can_fork(env):
            return server.start(argv, env, ROOT, output)
    return subprocess.Popen([sys.executable, "-m", "broker", *argv], cwd=ROOT, stdout=output,
                            stderr=subprocess.STDOUT, env=env)


# -- the fork server's side ----------------------------------------------------------------------------------


def _serve_forks(sock: socket.socket) -> dict:
    """Answer start requests until the test process goes away; returns (in a forked broker only) the request
    that broker runs, its process already set up as Popen would have."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_LIMIT, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)  # the test process closed its end: it is done
        request = json.loads(data)
        output = fds[0]
        read_end, write_end = os.pipe()
        try:
            middle = os.fork()
        except OSError as exc:
            os.close(output), os.close(read_end), os.close(write_end)
            sock.send(json.dumps({"error": repr(exc)}).encode())
            continue
        if middle == 0:
            os.close(read_end)
            broker = os.fork()
            if broker == 0:
                os.close(write_end)
                _become_broker(sock, request, output)
                return request
            os.write(write_end, str(broker).encode())
            os._exit(0)
        os.close(write_end)
        os.close(output)
        with os.fdopen(read_end, "rb") as r:
            pid = r.read()
        os.waitpid(middle, 0)  # the broker is the test process's child from here on
        sock.send(json.dumps({"pid": int(pid)} if pid else {"error": "the fork failed"}).encode())


def _become_broker(sock: socket.socket, request: dict, output: int) -> None:
    """What Popen does between fork and exec, and what the interpreter's start does with PYTHONUNBUFFERED."""
    sock.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(devnull)
    os.close(output)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    raw_stdout = io.FileIO(1, "w", closefd=False)
    sys.stdout = io.TextIOWrapper(raw_stdout if unbuffered else io.BufferedWriter(raw_stdout), encoding="utf-8",
                                  errors="backslashreplace", write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.argv = [str(ROOT / "broker" / "__main__.py"), *request["argv"]]


def _main() -> None:
    parent = os.getppid()
    sock = socket.socket(fileno=int(sys.argv[1]))
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the test process, even by kill -9
    if os.getppid() != parent:
        os._exit(0)  # it died before the line above
    sys.path[0] = str(ROOT)  # as `python -m broker` run in ROOT has it (this script's folder is tests/)
    # What `leveret serve` imports (broker/cli.py's _serve), done once here.
    import structlog  # noqa: F401
    import uvloop  # noqa: F401

    import broker.cli
    import broker.config
    import broker.node
    import broker.observability.logs
    import broker.server  # noqa: F401

    sock.send(_READY)
    request = _serve_forks(sock)
    from broker.cli import main

    raise SystemExit(main(request["argv"]))


if __name__ == "__main__":
    _main()
