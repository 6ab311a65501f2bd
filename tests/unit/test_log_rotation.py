"""Log file rotation (issue 16, "Logs"): RabbitMQ's ``log.file.rotation.date`` / ``.size`` / ``.count`` /
``.compress`` keys, read into the settings and applied by the logging set-up (broker/observability/logs.py) to the JSON log
file. Files are really written and rotated here, through ``configure_logging`` as ``leveret serve`` calls it."""

from __future__ import annotations

import gzip
import json
import time
from datetime import datetime
from pathlib import Path

import pytest
import structlog

from broker.config import ConfigError, load_settings, rabbitmq_only_feature
from broker.observability.logs import FileRotation, RotatingLogFile, configure_logging, next_rotation


@pytest.fixture(autouse=True)
def _restore_structlog():
    yield
    structlog.reset_defaults()


def _log_lines(n: int) -> None:
    log = structlog.get_logger("leveret.test")
    for i in range(n):
        log.info("connection opened", n=i, pad="x" * 60)


def _numbers(text: str) -> list[int]:
    return [json.loads(line)["n"] for line in text.splitlines() if line.strip()]


def _rotated(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if p.name != path.name and p.name.startswith(path.name))


def test_size_rotation_keeps_count_files_each_under_the_size(tmp_path):
    path = tmp_path / "logs" / "leveret.log"
    configure_logging("info", "json", console=False, file=path, rotation=FileRotation(size=2000, count=3))
    _log_lines(300)  # ~130 bytes a line: ~20 rotations, only three kept
    assert [p.name for p in _rotated(path)] == ["leveret.log.1", "leveret.log.2", "leveret.log.3"]
    for p in [path, *_rotated(path)]:
        assert 0 < p.stat().st_size <= 2000, p
    # The newest lines are in leveret.log, the older ones in .1, .2, .3: one run of numbers ending at 299.
    kept = [n for p in (path.with_name("leveret.log.3"), path.with_name("leveret.log.2"),
                        path.with_name("leveret.log.1"), path) for n in _numbers(p.read_text())]
    assert kept == list(range(kept[0], 300))


def test_compress_gzips_the_rotated_files(tmp_path):
    path = tmp_path / "leveret.log"
    configure_logging("info", "json", console=False, file=path,
                      rotation=FileRotation(size=2000, count=2, compress=True))
    _log_lines(200)
    assert [p.name for p in _rotated(path)] == ["leveret.log.1.gz", "leveret.log.2.gz"]
    older = _numbers(gzip.decompress(path.with_name("leveret.log.2.gz").read_bytes()).decode())
    newer = _numbers(gzip.decompress(path.with_name("leveret.log.1.gz").read_bytes()).decode())
    current = _numbers(path.read_text())
    assert older + newer + current == list(range(older[0], 200))


def test_count_zero_keeps_no_rotated_file(tmp_path):
    path = tmp_path / "leveret.log"
    configure_logging("info", "json", console=False, file=path, rotation=FileRotation(size=1000, count=0))
    _log_lines(100)
    assert _rotated(path) == []
    assert 0 < path.stat().st_size <= 1000
    assert _numbers(path.read_text())[-1] == 99


def test_no_rotation_without_a_date_or_a_size(tmp_path):
    path = tmp_path / "leveret.log"
    configure_logging("info", "json", console=False, file=path, rotation=FileRotation(count=1, compress=True))
    _log_lines(100)
    assert _rotated(path) == []
    assert _numbers(path.read_text()) == list(range(100))


def test_date_rotation_when_the_time_comes(tmp_path):
    path = tmp_path / "leveret.log"
    handler = RotatingLogFile(path, FileRotation(date="$H00", count=2))
    try:
        handler.write('{"n": 1}')
        assert handler.next_at is not None and handler.next_at > time.time()
        handler.next_at = time.time() - 1  # the hour has come
        handler.write('{"n": 2}')
        assert path.with_name("leveret.log.1").read_text() == '{"n": 1}\n'
        assert path.read_text() == '{"n": 2}\n'
        assert handler.next_at > time.time()  # the next hour's
    finally:
        handler.close()


@pytest.mark.parametrize(("spec", "now", "expected"), [
    ("$D0", datetime(2024, 5, 10, 13, 5), datetime(2024, 5, 11, 0, 0)),
    ("$D23", datetime(2024, 5, 10, 13, 5), datetime(2024, 5, 10, 23, 0)),
    ("$D23", datetime(2024, 5, 10, 23, 0), datetime(2024, 5, 11, 23, 0)),
    ("$H00", datetime(2024, 5, 10, 13, 5), datetime(2024, 5, 10, 14, 0)),
    ("$H30", datetime(2024, 5, 10, 13, 5), datetime(2024, 5, 10, 13, 30)),
    ("$W0D23", datetime(2024, 5, 10, 13, 5), datetime(2024, 5, 12, 23, 0)),  # a Friday; 0 is Sunday
    ("$W5D16", datetime(2024, 5, 10, 17, 0), datetime(2024, 5, 17, 16, 0)),
    ("$M1D0", datetime(2024, 5, 10, 13, 5), datetime(2024, 6, 1, 0, 0)),
    ("$M31D6", datetime(2024, 6, 10, 13, 5), datetime(2024, 6, 30, 6, 0)),  # June's last day
    ("$ML", datetime(2024, 2, 29, 1, 0), datetime(2024, 3, 31, 0, 0)),
])
def test_date_specs(spec, now, expected):
    assert next_rotation(spec, now) == expected


def test_rotation_keys_are_read_into_the_settings():
    s = load_settings(None, [("log.file.rotation.date", "$D0"), ("log.file.rotation.size", "10MiB"),
                             ("log.file.rotation.count", "7"), ("log.file.rotation.compress", "true")], environ={})
    assert FileRotation.from_settings(s) == FileRotation(date="$D0", size=10 * 1024 * 1024, count=7, compress=True)
    assert FileRotation.from_settings(load_settings(None, [], environ={})) == FileRotation()
    for key in ("log.file.rotation.date", "log.file.rotation.size", "log.file.rotation.count",
                "log.file.rotation.compress"):
        assert rabbitmq_only_feature(key) is None
    assert rabbitmq_only_feature("log.connection.rotation.count") is not None  # per category: still not
    for key, value in (("log.file.rotation.date", "$D24"), ("log.file.rotation.date", "daily"),
                       ("log.file.rotation.size", "ten"), ("log.file.rotation.compress", "maybe")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_settings(None, [(key, value)], environ={})
