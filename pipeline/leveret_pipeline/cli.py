"""``leveret-pipeline``: Leveret's shipped Spark jobs, from the command line.

    leveret-pipeline traffic --uri amqp://guest:guest@127.0.0.1:5672/%2F --stream trace --out traffic-out --once

``traffic`` runs traffic.py's Structured Streaming job over a stream bound to ``amq.rabbitmq.trace``: with
``--once`` it takes what the stream holds now and stops (trigger availableNow); without, it runs a micro-batch
every ``--trigger`` seconds until Ctrl-C / SIGTERM (or ``--duration``). Either way it ends by printing a
summary of the minutes it touched and drawing OUT/traffic.png. Run it again with the same ``--out`` (and
``--checkpoint``) and it goes on where it stopped, counting nothing twice.

Spark runs in this process (``--master``, default ``local[2]``); its Python workers use this interpreter, so the
connector (pyspark_leveret) is importable there. A SparkSession already running in the process (a test's) is
used as it is, and left running.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leveret-pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("traffic", help="per-queue, per-minute traffic and latency from the trace stream")
    # argparse %-formats help strings: the URI's %2F must be written %%2F (it once crashed --help).
    t.add_argument("--uri", default=os.environ.get("LEVERET_URI", DEFAULT_URI),
                   help="the broker (its vhost is the trace stream's), default $LEVERET_URI or "
                        + DEFAULT_URI.replace("%", "%%"))
    t.add_argument("--management-uri",
                   help="the broker's HTTP API, where the trace stream's offsets are read (default: the host of "
                        "--uri, on the HTTP API port of the broker's own configuration as this shell sets it: "
                        "LEVERET_MANAGEMENT_TCP_PORT, $LEVERET_CONFIG_FILE's management.tcp.port, https on "
                        "management.ssl.port when only that is set; else 15672). Give it when the broker's "
                        "HTTP API is configured elsewhere.")
    t.add_argument("--stream", default="trace", help="the stream queue bound to amq.rabbitmq.trace")
    t.add_argument("--out", type=Path, required=True,
                   help="output directory (local): traffic/ and parts/ parquet, traffic.png")
    t.add_argument("--checkpoint", type=Path, help="Spark checkpoint directory (default OUT/_checkpoint)")
    t.add_argument("--once", action="store_true", help="process what the stream holds now, then stop")
    t.add_argument("--trigger", type=float, default=10.0, metavar="SECONDS", help="micro-batch interval")
    t.add_argument("--duration", type=float, metavar="SECONDS", help="stop a continuous run after this long")
    t.add_argument("--lookback", type=float, default=300.0, metavar="SECONDS",
                   help="longest latency measured (how far back a delivery looks for its publish)")
    t.add_argument("--keep-events", action="store_true",
                   help="also write every trace event with its latency to OUT/events/ (one more Spark job a "
                        "micro-batch)")
    t.add_argument("--starting-offsets", default="earliest",
                   help="where a new checkpoint starts in the stream: earliest, latest or an offset")
    t.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                   help='another option of format("leveret"), e.g. maxRecordsPerTrigger=200000')
    t.add_argument("--picture", type=Path, help="where to draw the PNG (default OUT/traffic.png)")
    t.add_argument("--no-picture", action="store_true")
    t.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    return parser


def _version() -> str:
    """The installed distribution's version (its metadata, so it never disagrees with pip's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leveret-pipeline")
    except PackageNotFoundError:
        return "(not installed)"


def default_management_uri(uri: str, environ: dict[str, str] | None = None) -> str | None:
    """The HTTP API for ``--uri`` when ``--management-uri`` is not given: the AMQP host, on the port (and
    scheme) the broker's configuration gives its HTTP API, read as the broker reads it (LEVERET_* variables,
    $LEVERET_CONFIG_FILE) when the broker (the ``leveret`` distribution) is installed beside this one, as in the
    worked example; else from LEVERET_MANAGEMENT_TCP_PORT alone. None: nothing configured, and the connector
    takes its default (port 15672 of the AMQP host). A worked example whose broker ran on another HTTP port
    once needed --management-uri without saying so."""
    import urllib.parse

    env = dict(os.environ if environ is None else environ)
    host = urllib.parse.urlsplit(uri).hostname or "127.0.0.1"
    netloc = f"[{host}]" if ":" in host else host
    try:
        from broker.config import ConfigError, load_settings, management_url
    except ImportError:
        port = env.get("LEVERET_MANAGEMENT_TCP_PORT", "").strip()
        return f"http://{netloc}:{port}" if port.isdigit() and port != "0" else None
    try:
        configured = management_url(load_settings(environ=env))
    except ConfigError:
        return None  # the broker reports its own configuration's problems; the connector's default here
    if configured is None:
        return None
    parts = urllib.parse.urlsplit(configured)
    return f"{parts.scheme}://{netloc}:{parts.port}"


def _session(master: str) -> tuple[Any, bool]:
    """(SparkSession, whether this call started it)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: bind loopback, not the first NIC
    session = (
        SparkSession.builder.master(master).appName("leveret-pipeline-traffic")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")  # small batches: 200 tiny tasks per shuffle cost more
        # an hour of events is up to 360 batch directories (10 s trigger): list them here, not in a Spark job
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session, True


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """Ctrl-C or SIGTERM sets the event: the run stops its query once the running micro-batch is done, and
    still prints the summary and draws the picture. A second signal interrupts at once (the batch cut short
    is not committed: the next run does it again). Raising from the handler instead would land inside a py4j call (and py4j logs a
    traceback for it)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print("stopping after the running micro-batch (again: at once)", file=sys.stderr)
        stop.set()

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield stop
        return
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _minute(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _ms(value: Any) -> str:
    return "-" if value is None else str(int(value))


def format_summary(table: pa.Table) -> str:
    """The summary as aligned text: one line per (vhost, queue)."""
    header = ["vhost", "queue", "published", "delivered", "redeliv", "acked", "dead-lettered", "MB in",
              "pub→deliver p50/p95/p99 ms", "deliver→ack p50/p95/p99 ms"]
    lines = [header]
    for r in table.to_pylist():
        reasons = ",".join(f"{k[len('dead_lettered_'):]}={v}" for k, v in r.items()
                           if k.startswith("dead_lettered_") and v)
        dead = f"{r['dead_lettered']}" + (f" ({reasons})" if reasons else "")
        lines.append([
            r["vhost"], r["queue"], str(r["published"]), str(r["delivered"]), str(r["redelivered"]),
            str(r["acked"]), dead, f"{r['published_bytes'] / 1e6:.2f}",
            "/".join(_ms(r[f"publish_to_deliver_p{q}_ms"]) for q in (50, 95, 99)),
            "/".join(_ms(r[f"deliver_to_ack_p{q}_ms"]) for q in (50, 95, 99)),
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def traffic(args: argparse.Namespace) -> int:
    from leveret_pipeline import picture
    from leveret_pipeline.traffic import TrafficJob, read_traffic, run, summarize

    options = []
    for item in args.source_option:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"--source-option wants KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        options.append((key, value))
    management_uri = args.management_uri or default_management_uri(args.uri)
    job = TrafficJob(uri=args.uri, stream=args.stream, out=args.out, management_uri=management_uri,
                     source_options=tuple(options), checkpoint=args.checkpoint, once=args.once,
                     trigger_seconds=args.trigger, lookback_seconds=args.lookback, duration=args.duration,
                     starting_offsets=args.starting_offsets, keep_events=args.keep_events)
    spark, owned = _session(args.master)
    try:
        with _stop_on_signals() as stop:
            sink = run(spark, job, until=lambda _: stop.is_set())
        if sink.first_minute is None or sink.last_minute is None:
            print("no new trace events in this run")
        else:
            print(f"{sink.batches} micro-batches, {sink.events} events; minutes "
                  f"{_minute(sink.first_minute)} – {_minute(sink.last_minute)} UTC")
            print(format_summary(summarize(args.out, sink.first_minute, sink.last_minute)))
        print(f"table: {args.out / 'traffic'}")
        if not args.no_picture:
            drawn = picture.draw(read_traffic(args.out), args.picture or args.out / "traffic.png")
            if drawn is not None:
                print(f"picture: {drawn}")
    finally:
        if owned:
            spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return traffic(args)
    except Exception as exc:  # one line for the operator; the traceback with LEVERET_PIPELINE_DEBUG=1
        if os.environ.get("LEVERET_PIPELINE_DEBUG"):
            raise
        print(f"leveret-pipeline: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
