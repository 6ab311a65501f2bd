"""A real RabbitMQ node for the shovel tests: Debian's rabbitmq-server on free ports (AMQP, HTTP and the
Erlang distribution port), its own node name and data directory owned by the ``rabbitmq`` user, as
tests/rabbitmq/start-rabbitmq.sh starts one. Plugins are chosen per node (``rabbitmq_shovel`` where a test or
the benchmark needs RabbitMQ's own shovel, ``rabbitmq_management`` for its HTTP API).

Without rabbitmq-server installed the start fails with a message saying so: the shovel lane compares with, and
moves messages from and to, a real RabbitMQ; a skip would hide that nothing was tested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from tests.worker_resources import free_port

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


class RabbitMQMissing(RuntimeError):
    """rabbitmq-server is not installed on this machine."""


@dataclass
class RabbitNode:
    """One RabbitMQ node: ``start()``, ``stop()`` (graceful), ``kill9()``, ``ctl(...)``."""

    plugins: list[str] = field(default_factory=list)
    port: int = 0
    http_port: int = 0
    dist_port: int = 0
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="leveret-rmq-")))
    name: str = ""

    def __post_init__(self) -> None:
        if not (os.path.exists(RABBITMQ_SERVER) and shutil.which("su")):
            raise RabbitMQMissing(
                "rabbitmq-server is not installed (Debian's package, RabbitMQ 3.10.8): the shovel tests need a "
                "real RabbitMQ node; install it with `apt-get install rabbitmq-server` (make test-tools)")
        self.port = self.port or free_port()
        self.http_port = self.http_port or free_port()
        self.dist_port = self.dist_port or free_port()
        self.name = self.name or f"leveret-shovel-{self.port}@localhost"
        (self.base / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.base / "log").mkdir(exist_ok=True)
        plugins = list(self.plugins)
        conf = [f"listeners.tcp.default = 127.0.0.1:{self.port}", "loopback_users = none"]
        if "rabbitmq_management" in plugins or "rabbitmq_shovel_management" in plugins:
            conf += [f"management.tcp.port = {self.http_port}", "management.tcp.ip = 127.0.0.1"]
        (self.base / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        (self.base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        env = {
            "RABBITMQ_NODENAME": self.name, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": f"{self.base}/mnesia", "RABBITMQ_LOG_BASE": f"{self.base}/log",
            "RABBITMQ_CONFIG_FILE": f"{self.base}/rabbitmq", "RABBITMQ_ENABLED_PLUGINS_FILE":
            f"{self.base}/enabled_plugins", "RABBITMQ_PID_FILE": f"{self.base}/pid",
            # the Erlang distribution on this node's own port only
            "ERL_EPMD_PORT": os.environ.get("ERL_EPMD_PORT", "4369"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"-kernel inet_dist_listen_min {self.dist_port} "
                                                   f"inet_dist_listen_max {self.dist_port}",
        }
        (self.base / "env").write_text("".join(f"export {k}='{v}'\n" for k, v in env.items()))
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(self.base)], check=True)
        os.chmod(self.base, 0o755)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def url_for(self, vhost: str = "/") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{urllib.parse.quote(vhost, safe='')}"

    def _su(self, command: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["su", "rabbitmq", "-s", "/bin/bash", "-c",
                               f". {self.base}/env; cd {self.base}; HOME=/var/lib/rabbitmq {command}"],
                              check=False, capture_output=True, text=True, **kw)

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
        return self._su(f"{RABBITMQCTL} -n $RABBITMQ_NODENAME {quoted}", timeout=timeout)

    def start(self, timeout: float = 90) -> None:
        subprocess.run(["su", "rabbitmq", "-s", "/bin/bash", "-c",
                        (f". {self.base}/env; cd {self.base}; HOME=/var/lib/rabbitmq nohup {RABBITMQ_SERVER} "
                         f">> {self.base}/log/stdout 2>&1 &")], check=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ctl("await_startup", "--timeout", "5", timeout=30).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError(f"RabbitMQ {self.name} did not start within {timeout}s; see {self.base}/log")

    def pid(self) -> int | None:
        try:
            return int((self.base / "pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        self.ctl("stop", timeout=60)

    def kill9(self) -> None:
        pid = self.pid()
        if pid:
            subprocess.run(["kill", "-9", str(pid)], check=False)

    def cleanup(self) -> None:
        if self.ctl("ping", "-t", "3", timeout=20).returncode == 0:
            self.stop()
        self.kill9()
        shutil.rmtree(self.base, ignore_errors=True)
