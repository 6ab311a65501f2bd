"""Fixtures of the Spark side (pipeline/): one SparkSession for the whole run, with the small configuration
of docs/decisions/spark-pipeline.md (local[2], serial GC, C1 only, no UI), and the broker fixtures of
tests/conftest.py.

Spark starts once per pytest process (about 25 s on 2 cores before the first query); tests that need it take
the ``spark`` fixture and are marked ``spark``. Tests of the connector without a JVM (offset planning,
pickling, Arrow conversion, column mapping) drive its classes directly against a real broker.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark side needs `pip install -e pipeline` (make test does it)")


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """A local[2] SparkSession shared by every Spark test; workers run this interpreter (PYSPARK_PYTHON),
    the driver binds loopback (SPARK_LOCAL_IP), and temporary files stay under one directory."""
    if shutil.which("java") is None:
        pytest.fail("Spark needs Java 17 (make test installs openjdk-17-jre-headless when java is missing)")
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="leveret-spark-")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2, 4]")  # 2 threads; a failed task is retried (up to 4 attempts)
        .appName("leveret-tests")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))
        .config("spark.driver.extraJavaOptions",
                f"-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.io.tmpdir={tmp}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def standalone() -> Iterator:
    """A Spark standalone cluster for the whole run (tests/pipeline/standalone.py): a master and two workers of
    one core and 1 GiB each on 127.0.0.1, started once (about 10 s) and stopped at the end."""
    from standalone import start_cluster

    root = tempfile.mkdtemp(prefix="leveret-standalone-")
    cluster = start_cluster(Path(root))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
