"""RabbitMQ's stock Grafana dashboard "RabbitMQ-Overview" against Leveret, through a real Prometheus.

The dashboard's expressions (tests/data/grafana_rabbitmq_overview_queries.json: every panel's ``expr`` of the
current revision and of the last one reading the ``rabbitmq_channel_*`` families, with the commits they were
taken from) are evaluated by Debian's ``prometheus`` (started here, scraping the broker's aggregated /metrics
every second, as docker/prometheus.yml does every 15 s) after known pika traffic; each must return data (at
least one series, no NaN), as each panel then shows something. The template variables are resolved as Grafana
resolves them: ``label_values(...)`` through Prometheus' label API, first value in alphabetical order (the
dashboard's ``sort: 1``), an empty string when there is none (``namespace``: no Kubernetes here).
``$__rate_interval`` and ``$__range`` get what Grafana would compute for the dashboard's time range with the
data source's scrape interval set to Prometheus' 1 s.

The Leveret dashboard provisioned by docker/ is evaluated the same way, and the docker/ files are checked:
the Prometheus configuration with ``promtool``, the compose file and Grafana provisioning as YAML.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from broker.observability.counters import GlobalCounters
from tests.conftest import free_port
from tests.integration.management.test_management_api import start_mgmt_broker

pytestmark = pytest.mark.leveret_only

ROOT = Path(__file__).resolve().parents[3]
QUERIES = json.loads((ROOT / "tests" / "data" / "grafana_rabbitmq_overview_queries.json").read_text())
CURRENT, CHANNEL_ERA = QUERIES["revisions"]
DOCKER = ROOT / "docker"
SCRAPE_S = 1
# Grafana's built-ins for a panel over the dashboard's time range ("now-1h" for the current revision):
# $__range is the range in seconds; $__interval is range / ~1000 points, rounded to 5s; $__rate_interval is
# max($__interval + scrape interval, 4 * scrape interval).
BUILTINS = {"__range": "3600s", "__rate_interval": "6s", "__interval": "5s"}


class Prom:
    """Prometheus' HTTP API."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> object:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.get("/api/v1/query", query=expr)
        assert isinstance(data, dict)
        return data["result"]

    def label_values(self, selector: str, label: str) -> list[str]:
        values = self.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
        assert isinstance(values, list)
        return sorted(values)


@contextlib.contextmanager
def prometheus(tmp: Path, metrics_port: int) -> Iterator[Prom]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("needs Debian's prometheus (make test installs it: apt-get install -y prometheus)")
    config = tmp / "prometheus.yml"
    config.write_text(f"""\
global:
  scrape_interval: {SCRAPE_S}s
  evaluation_interval: {SCRAPE_S}s
scrape_configs:
  - job_name: leveret
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}"]
""")
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    prom = Prom(port)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{prom.base}/-/ready", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("prometheus did not start:\n" + (tmp / "prometheus.log").read_text()[-3000:])
                time.sleep(0.1)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def drive_traffic(params: pika.ConnectionParameters) -> pika.BlockingConnection:
    """Publishes (confirmed, unroutable mandatory and not) bodies of 10 B to 200 kB, basic.get (auto, manual,
    empty), consumers with auto and manual acks, a redelivery, queues and channels opened and closed. The
    connection it returns stays open (connections, channels, consumers, unacked messages)."""
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.confirm_delivery()
    for q in ("dash.work", "dash.auto", "dash.manual", "dash.temp"):
        ch.queue_declare(q)
    for size in (10, 500, 5_000, 50_000, 200_000):
        for _ in range(3):
            ch.basic_publish("", "dash.work", b"x" * size)
    for q in ("dash.auto", "dash.manual"):
        for i in range(5):
            ch.basic_publish("", q, f"m{i}".encode())
    with contextlib.suppress(pika.exceptions.UnroutableError):
        ch.basic_publish("", "nowhere", b"returned", mandatory=True)
    ch.basic_publish("", "nowhere", b"dropped")
    ch.basic_get("dash.work", auto_ack=True)
    method, _props, _body = ch.basic_get("dash.work")
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=True)  # redelivered on the next get
    method, _props, _body = ch.basic_get("dash.work")
    assert method is not None
    ch.basic_ack(method.delivery_tag)
    ch.basic_get("dash.work")  # left unacknowledged
    ch.basic_get("dash.temp")  # empty
    ch.queue_delete("dash.temp")
    ch.basic_consume("dash.auto", lambda *a: None, auto_ack=True)
    ch.basic_consume("dash.manual", lambda c, m, p, b: c.basic_ack(m.delivery_tag))
    other = conn.channel()
    other.close()
    conn.process_data_events(time_limit=0.5)
    return conn


@contextlib.contextmanager
def scraped_broker(prefix: str, traffic, seen: str, at_least: float,
                   timeout: float = 30) -> Iterator[tuple[Prom, int]]:
    """A broker of its own scraped by a real Prometheus, after ``traffic(pika params)`` (which returns the
    connection it keeps open) has been seen: ``seen`` (a PromQL query) reaching ``at_least`` in a scrape that
    came after at least 4 of them. Yields (Prometheus, the broker's metrics port).

    A first scrape comes before the traffic, so that increase() over a histogram sees it grow (a series first
    seen with its final value has grown by nothing); then enough scrapes after it for rate() and increase()
    (two samples at least), and the last one after all of it."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    broker, _mport, pport = start_mgmt_broker(tmp)
    try:
        with prometheus(tmp, pport) as p:
            deadline = time.monotonic() + 15
            while not p.query("up == 1") and time.monotonic() < deadline:
                time.sleep(0.2)
            conn = traffic(broker.pika_params())
            try:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    conn.process_data_events(time_limit=0.2)
                    got = p.query(f"{seen} and on() count_over_time(up[10s]) >= 4")
                    if got and float(got[0]["value"][1]) >= at_least:
                        break
                else:
                    pytest.fail(f"prometheus did not see the traffic ({seen} >= {at_least}) in {timeout:g} s")
                conn.process_data_events(time_limit=2 * SCRAPE_S + 0.5)
                yield p, pport
            finally:
                conn.close()
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def prom() -> Iterator[Prom]:
    with scraped_broker("leveret-grafana-", drive_traffic, "max(rabbitmq_global_messages_received_total)",
                        15 + 10 + 2) as (p, _port):
        yield p


def resolve(prom: Prom, revision: dict) -> dict[str, str]:
    """The dashboard's template variables, in order, as Grafana sets them: label_values(selector, label),
    each query seeing the variables before it; the first value (sort 1: alphabetical), or "" if none."""
    values = dict(BUILTINS)
    for var in revision["variables"]:
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"], re.DOTALL)
        assert m, var
        selector, label = substitute(m[1], values), m[2]
        found = prom.label_values(selector, label)
        values[var["name"]] = found[0] if found else ""
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: values[m[1]], expr)


def evaluate(prom: Prom, queries: list[dict], values: dict[str, str]) -> list[str]:
    """The panels whose expression returns no series, or a NaN, each with its substituted expression."""
    failed = []
    for q in queries:
        expr = substitute(q["expr"], values)
        result = prom.query(expr)
        values_seen = [float(s["value"][1]) for s in result]
        if not result or any(math.isnan(v) for v in values_seen):
            failed.append(f"{q['panel']} [{q['refId']}] -> {values_seen or 'no series'}: {expr}")
    return failed


def is_message_size(q: dict) -> bool:
    return "rabbitmq_message_size_bytes" in q["expr"]


def test_variables_resolve_to_the_broker_and_its_aggregated_endpoint(prom):
    values = resolve(prom, CURRENT)
    (identity,) = prom.query("rabbitmq_identity_info")
    assert values["namespace"] == ""
    assert values["rabbitmq_cluster"] == identity["metric"]["rabbitmq_cluster"]
    assert values["endpoint"] == "aggregated"


def test_current_overview_panels_return_data(prom):
    queries = [q for q in CURRENT["queries"] if not is_message_size(q)]
    assert len(queries) == 40
    failed = evaluate(prom, queries, resolve(prom, CURRENT))
    assert failed == [], f"{len(failed)} of {len(queries)} expressions returned nothing:\n" + "\n".join(failed)


def test_current_overview_message_size_panels_return_data(prom):
    queries = [q for q in CURRENT["queries"] if is_message_size(q)]
    assert len(queries) == 10
    failed = evaluate(prom, queries, resolve(prom, CURRENT))
    assert failed == [], f"{len(failed)} of {len(queries)} expressions returned nothing:\n" + "\n".join(failed)


def test_channel_era_overview_panels_return_data(prom):
    queries = CHANNEL_ERA["queries"]
    assert len(queries) == 41
    failed = evaluate(prom, queries, resolve(prom, CHANNEL_ERA))
    assert failed == [], f"{len(failed)} of {len(queries)} expressions returned nothing:\n" + "\n".join(failed)


def test_the_summed_panels_match_the_broker(prom):
    # One scrape job of the aggregated endpoint: the sums are the broker's figures, not doubled.
    values = resolve(prom, CURRENT)
    by_panel = {q["panel"]: substitute(q["expr"], values) for q in CURRENT["queries"] if q["refId"] == "A"}
    figures = {title: float(prom.query(by_panel[title])[0]["value"][1])
               for title in ("Connections", "Queues", "Consumers", "Unacknowledged messages", "Nodes")}
    assert figures == {"Connections": 1, "Queues": 3, "Consumers": 2, "Unacknowledged messages": 1, "Nodes": 1}


def test_the_leveret_dashboard_panels_return_data(prom):
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "leveret.json").read_text())
    queries = [{"panel": p["title"], "refId": t["refId"], "expr": t["expr"]}
               for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 10
    failed = evaluate(prom, queries, dict(BUILTINS))
    assert failed == [], "\n".join(failed)


def test_docker_prometheus_config_is_valid():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("needs promtool (Debian's prometheus package)")
    result = subprocess.run([promtool, "check", "config", str(DOCKER / "prometheus.yml")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (DOCKER / "prometheus.yml").read_text()
    active = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert "/metrics/per-object" not in "\n".join(active), "the per-object job is opt-in (commented out)"


def _load_yaml(path: Path) -> object:
    """PyYAML from this interpreter, else from the system's python3 (Debian's python3-yaml)."""
    try:
        import yaml
    except ImportError:
        python = shutil.which("python3", path="/usr/bin")
        if python is None or python == sys.executable:
            pytest.skip("no YAML parser (PyYAML) available")
        code = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
        result = subprocess.run([python, "-c", code, str(path)], capture_output=True, text=True, check=False)
        if "No module named 'yaml'" in result.stderr:
            pytest.skip("no YAML parser (PyYAML) available")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)
    return yaml.safe_load(path.read_text())


def test_docker_compose_brings_up_leveret_prometheus_and_a_provisioned_grafana():
    compose = _load_yaml(DOCKER / "compose.yaml")
    assert isinstance(compose, dict)
    services = compose["services"]
    assert {"leveret", "prometheus", "grafana"} <= set(services)
    mounts = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    for source in mounts:
        if source.startswith("./"):
            assert (DOCKER / source).is_dir(), source
    datasources = _load_yaml(DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    assert isinstance(datasources, dict)
    (ds,) = datasources["datasources"]
    assert ds["url"] == "http://prometheus:9090" and ds["uid"] == "prometheus"
    providers = _load_yaml(DOCKER / "grafana" / "provisioning" / "dashboards" / "leveret.yaml")
    assert isinstance(providers, dict)
    (provider,) = providers["providers"]
    assert provider["options"]["path"] == mounts["./grafana/dashboards"]
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "leveret.json").read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {"prometheus"}


def test_channel_families_read_declared_counters():
    from broker.prometheus import metrics

    declared = set(GlobalCounters().as_dict())
    assert {field for field, _help in metrics.CHANNEL_COUNTER_METRICS.values()} <= declared
