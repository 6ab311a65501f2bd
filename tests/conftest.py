"""Shared fixtures: a real Leveret broker process on a free port, or a real RabbitMQ given by URL.

Set ``LEVERET_TEST_AMQP_URL`` (for example ``amqp://guest:guest@127.0.0.1:5673/%2F``) to run the integration
tests against another broker; tests marked ``leveret_only`` are then skipped, since they cover behaviour
RabbitMQ does not have. Without it, one Leveret process is started for the session (``broker``), and tests
that need their own process (custom settings, kill -9) use ``start_broker``.

Set ``LEVERET_TEST_CLUSTER=N`` (N >= 2) to run the integration tests against a Leveret cluster instead: a
throwaway PostgreSQL (tests/pg_server.py) and N members on it (``cluster.postgres.dsn``). ``broker`` is then
a :class:`ClusterBroker` whose ``pika_params()`` and ``url`` name the members in turn, so a test that opens
two connections has its clients on different members; ``start_broker`` starts N members of the test's own
(a fresh database) with the arguments given. ``make test`` runs the quorum-queue tests so
(``LEVERET_TEST_CLUSTER=2 pytest -m quorum tests/integration``): RabbitMQ's quorum queues are the type a
Leveret cluster serves from every member.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# tests/integration/amqp_helpers.py holds fixtures and helpers with asserts (loaded by the test modules
# through ``pytest_plugins``): rewrite them like a test module's.
pytest.register_assert_rewrite("amqp_helpers")

EXTERNAL_URL = os.environ.get("LEVERET_TEST_AMQP_URL")
CLUSTER_NODES = int(os.environ.get("LEVERET_TEST_CLUSTER") or 0)
if CLUSTER_NODES == 1 or CLUSTER_NODES < 0:
    raise ValueError("LEVERET_TEST_CLUSTER is a number of members: 2 or more (or 0: no cluster)")
ROOT = Path(__file__).resolve().parent.parent


import broker_forks
from broker_forks import ForkedBroker, start_broker_process
from worker_resources import free_port


@dataclass
class BrokerProcess:
    """A broker the tests talk to: where it listens and, for a Leveret we started, its process."""

    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    process: subprocess.Popen | ForkedBroker | None = None
    data_dir: Path | None = None
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    # The HTTP API and Prometheus ports of a Leveret we started: free ports of their own (a taken port
    # stops the start, so brokers started side by side must not share the defaults). Arguments in
    # ``extra_args`` come later on the command line and win.
    management_port: int = 0
    prometheus_port: int = 0
    own_http_ports: bool = True  # False: leave the HTTP ports to the configuration (a test of it)

    @property
    def url(self) -> str:
        vhost = urllib.parse.quote(self.vhost, safe="")
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.port}/{vhost}"

    @property
    def is_leveret(self) -> bool:
        return self.process is not None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def pika_params(self, **kw):
        import pika

        return pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=self.vhost,
            credentials=pika.PlainCredentials(self.user, self.password),
            **kw,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    # -- lifecycle of a broker we started ---------------------------------------------------------------
    # 30 s: a start costs about a second of CPU (imports), and with three xdist workers on two cores a member
    # of a cluster test once took over 20 s to listen while a kill -9 round ran beside it.
    def start(self, timeout: float = 30.0) -> None:
        assert self.data_dir is not None and self.log_path is not None
        ports: list[str] = []
        if self.own_http_ports:
            self.management_port = self.management_port or free_port()
            self.prometheus_port = self.prometheus_port or free_port()
            ports = ["--management-port", str(self.management_port), "--prometheus-port", str(self.prometheus_port)]
        argv = [
            "serve", "--bind", self.host, "--port", str(self.port), "--data-dir", str(self.data_dir),
            *ports, *self.extra_args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1", LEVERET_LOG_FORMAT="json")
        with open(self.log_path, "ab") as log:
            # `python -m broker ARGV`, forked from a process that imported the broker once (tests/broker_forks.py)
            self.process = start_broker_process(argv, env, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.log_text()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"broker did not listen on {self.port} within {timeout}s:\n{self.log_text()}")
        # The HTTP listeners open just after the AMQP one: a test that asked its next question over HTTP met
        # "connection refused" in that moment under CI load. Started means every port of ours listens.
        for port in self._own_http_ports_to_wait_for():
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.log_text()}")
                try:
                    with socket.create_connection((self.host, port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"broker did not listen on HTTP port {port} within {timeout}s:\n"
                                           f"{self.log_text()}") from None
                    time.sleep(0.05)

    def _own_http_ports_to_wait_for(self) -> list[int]:
        """The HTTP ports this fixture chose and the test's arguments did not override (or turn off)."""
        if not self.own_http_ports:
            return []
        chosen = {"--management-port": self.management_port, "--prometheus-port": self.prometheus_port}
        return [port for flag, port in chosen.items() if port and flag not in self.extra_args]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class ClusterBroker(BrokerProcess):
    """The members of a Leveret cluster, seen as one broker (``LEVERET_TEST_CLUSTER``): each call of
    ``pika_params()`` or ``url`` names the next member, so consecutive connections go to different members.
    ``host``/``port``/``management_port`` (and raw clients, the HTTP API) are the first member's; ``stop``,
    ``kill9``, ``start`` act on every member."""

    nodes: list[BrokerProcess] = field(default_factory=list)
    turn: int = 0

    @classmethod
    def of(cls, nodes: list[BrokerProcess]) -> ClusterBroker:
        first = nodes[0]
        c = cls(host=first.host, port=first.port, process=first.process, data_dir=first.data_dir,
                log_path=first.log_path, extra_args=first.extra_args, management_port=first.management_port,
                prometheus_port=first.prometheus_port, nodes=nodes)
        return c

    def next_node(self) -> BrokerProcess:
        node = self.nodes[self.turn % len(self.nodes)]
        self.turn += 1
        return node

    @property
    def url(self) -> str:
        return self.next_node().url

    def pika_params(self, **kw):
        return self.next_node().pika_params(**kw)

    def log_text(self) -> str:
        return "\n".join(f"--- {n.log_path}\n{n.log_text()}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> None:
        for n in self.nodes:
            n.start(timeout)
        wait_http(self.nodes)
        first = self.nodes[0]
        self.process, self.management_port, self.prometheus_port = (first.process, first.management_port,
                                                                    first.prometheus_port)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        codes = [n.stop(sig, timeout) for n in self.nodes if n.process is not None]
        return codes[0] if codes else 0


def wait_http(nodes: list[BrokerProcess], timeout: float = 15.0) -> None:
    """Wait until every member's HTTP API answers (it starts just after the AMQP listener)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    for n in nodes:
        if not n.own_http_ports:
            continue
        while True:
            try:
                urllib.request.urlopen(f"http://{n.host}:{n.management_port}/api/overview", timeout=1).close()
                break
            except OSError as e:  # URLError (refused) and HTTPError (401: it answers) are OSErrors
                if getattr(e, "code", None) is not None:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{n.log_path}: the HTTP API did not answer:\n{n.log_text()}") from e
                time.sleep(0.05)


def start_cluster(dsn: str, folder: Path, *extra_args: str, own_http_ports: bool = True,
                  prefix: str = "") -> ClusterBroker:
    """``CLUSTER_NODES`` Leveret members on the PostgreSQL database ``dsn``; returned once all answer."""
    nodes = [BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=folder / f"{prefix}data-m{i}",
                           log_path=folder / f"{prefix}member{i}.log", own_http_ports=own_http_ports,
                           extra_args=["--set", f"cluster.postgres.dsn={dsn}",
                                       "--set", f"leveret.nodename=m{i}{prefix}@test", *extra_args])
             for i in range(CLUSTER_NODES)]
    cluster = ClusterBroker.of(nodes)
    try:
        cluster.start()
    except BaseException:
        cluster.stop(signal.SIGKILL)
        raise
    return cluster


@pytest.fixture(scope="session")
def cluster_postgres():
    """The PostgreSQL server of the cluster run (``LEVERET_TEST_CLUSTER``), one per session."""
    from pg_fixtures import running_server

    yield from running_server()


def _external_broker() -> BrokerProcess:
    u = urllib.parse.urlparse(EXTERNAL_URL)
    vhost = urllib.parse.unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return BrokerProcess(host=u.hostname or "127.0.0.1", port=u.port or 5672,
                         user=urllib.parse.unquote(u.username or "guest"),
                         password=urllib.parse.unquote(u.password or "guest"), vhost=vhost)


@pytest.fixture(scope="session")
def broker(request) -> Iterator[BrokerProcess]:
    """The broker shared by the session's integration tests. Tests must use names of their own."""
    if EXTERNAL_URL:
        yield _external_broker()
        return
    tmp = Path(tempfile.mkdtemp(prefix="leveret-test-"))
    if CLUSTER_NODES:
        from pg_fixtures import create_database

        cluster = start_cluster(create_database(request.getfixturevalue("cluster_postgres")), tmp)
        try:
            yield cluster
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return
    b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=tmp / "data", log_path=tmp / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def start_broker(request, tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start a Leveret process of the test's own, with extra command-line arguments (Leveret only). With
    ``LEVERET_TEST_CLUSTER``, tests marked ``quorum`` get a cluster of their own instead (a fresh database)."""
    if EXTERNAL_URL:
        pytest.skip("needs a Leveret process of its own")
    started: list[BrokerProcess] = []
    as_cluster = bool(CLUSTER_NODES) and request.node.get_closest_marker("quorum") is not None

    def start(*extra_args: str, data_dir: Path | None = None, own_http_ports: bool = True) -> BrokerProcess:
        n = len(started)
        if as_cluster:
            from pg_fixtures import create_database

            assert data_dir is None, "a cluster run starts fresh members"
            dsn = create_database(request.getfixturevalue("cluster_postgres"))
            c = start_cluster(dsn, tmp_path, *extra_args, own_http_ports=own_http_ports, prefix=f"c{n}-")
            started.append(c)
            return c
        b = BrokerProcess(host="127.0.0.1", port=free_port(), data_dir=data_dir or tmp_path / f"data{n}",
                          log_path=tmp_path / f"broker{n}.log", extra_args=list(extra_args),
                          own_http_ports=own_http_ports)
        b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop(signal.SIGKILL)


@pytest.fixture
def raw(broker):
    """Factory of raw AMQP clients (tests/rawamqp.py) connected to the broker; all closed at teardown."""
    from rawamqp import RawAMQPClient

    clients: list[RawAMQPClient] = []

    def make(**kw) -> RawAMQPClient:
        c = RawAMQPClient.for_broker(broker, timeout=kw.pop("timeout", 5.0), **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def uid(request) -> str:
    """A name prefix unique to this test, so tests sharing a broker never see each other's objects."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:60]
    return f"t-{base}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def pytest_configure(config):
    import leftovers

    leftovers.mark_owner()
    leftovers.install_interrupt_handler()
    broker_forks.remember_environment()  # the fork server's, before any test changes it (tests/broker_forks.py)
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist), before any worker starts
        for line in leftovers.clean_up_after_dead_runs():
            print(f"leftover of a killed test run: {line}")


def pytest_unconfigure(config):
    import leftovers

    leftovers.forget_own_records()


def _lane(nodeid: str) -> str:
    """The lane of a test: ``unit``, ``integration/<area>``, ``ui``, ``pipeline``."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[1] == "integration":
        return f"integration/{parts[2]}" if len(parts) > 3 else "integration"
    return parts[1] if len(parts) > 2 else parts[0]


# Session-wide resources some tests share inside one worker: the local SparkSession (a JVM of ~500 MB and ~25 s
# to start), the Spark standalone cluster (a master and two workers) and the UI lane's broker and browser. The
# tests of each go to one worker (xdist's ``loadgroup``), so a parallel run starts each of them once, as a serial
# run does, and the two Spark groups run beside each other on different workers.
_SHARED_FIXTURES = {"spark": "spark-session", "standalone": "spark-standalone"}


def _xdist_group(item) -> str | None:
    lane = _lane(item.nodeid)
    if lane == "ui":
        return "ui-session"
    for fixture, group in _SHARED_FIXTURES.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    # A module- or class-scoped fixture (a broker of the module's own, say) is set up once per worker that
    # runs one of the module's tests: keep such a module's tests together.
    defs = getattr(item, "_fixtureinfo", None)
    for fixturedefs in (defs.name2fixturedefs.values() if defs is not None else ()):
        if any(d.scope in ("module", "class", "package") for d in fixturedefs):
            return item.nodeid.split("::", 1)[0]
    return None


def _slow_first(items: list) -> None:
    """Under xdist, the tests marked ``slow`` (kill -9 rounds, paging, installs: 15-70 s each) first among the
    tests that are not in a group. xdist hands out groups by size, then single tests in collection order, and a
    worker that draws a 60 s test among the last ones keeps the run waiting while the others sit idle; started
    first, the long tests overlap the thousands of short ones. Grouped tests keep their place (a group's module-
    scoped fixtures need its tests together), and so does everything in a run without workers."""
    slow = [item for item in items
            if item.get_closest_marker("slow") is not None and item.get_closest_marker("xdist_group") is None]
    if slow:
        moved = set(map(id, slow))
        items[:] = slow + [item for item in items if id(item) not in moved]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the markers into the groups it schedules
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _xdist_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _slow_first(items)
    if not EXTERNAL_URL:
        return
    skip = pytest.mark.skip(reason="Leveret-only behaviour; the suite is pointed at another broker")
    for item in items:
        if "leveret_only" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Time and count per lane (``make test`` prints it at the end of every run; README "Run the tests"):
    which lane grew is the first question when the suite's time does. Durations are summed over set-up, call
    and tear-down, across workers (so with ``-n 4`` they add up to about four times the wall time)."""
    seconds: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(key, []):
            nodeid = getattr(rep, "nodeid", "")
            if not nodeid:
                continue
            lane = _lane(nodeid)
            seconds[lane] = seconds.get(lane, 0.0) + float(getattr(rep, "duration", 0.0) or 0.0)
            tests.setdefault(lane, set()).add(nodeid)
    if not seconds:
        return
    terminalreporter.write_sep("=", "time per lane (set-up + call + tear-down, summed over workers)")
    for lane in sorted(seconds, key=seconds.__getitem__, reverse=True):
        terminalreporter.write_line(f"{seconds[lane]:9.1f} s  {len(tests[lane]):5d} tests  {lane}")
