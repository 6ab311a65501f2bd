"""The UI's files travel in the wheel: pyproject's package-data globs for ``broker.management`` cover every
file the broker serves (a file left out would be served from a checkout and missing from an install), and
the files stay within the UI's size budget with no third-party code."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "broker" / "management"


def test_package_data_covers_every_ui_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["broker.management"]
    files = [p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "ui" / "static").rglob("*") if p.is_file()
             and "__pycache__" not in p.parts]
    assert "ui/static/index.html" in files and "ui/static/pages/queue.js" in files
    # setuptools' package-data "*" does not cross "/": match segment by segment.
    def covered(f: str) -> bool:
        return any(len(g.split("/")) == len(f.split("/")) and fnmatch.fnmatch(f, g) for g in globs)
    assert [f for f in files if not covered(f)] == []


def test_ui_stays_small_and_self_written() -> None:
    static = PACKAGE / "ui" / "static"
    total = sum(p.stat().st_size for p in static.rglob("*") if p.is_file())
    assert total < 150_000, total  # the design's budget for JS and CSS, no bundled libraries
    for p in static.rglob("*.js"):
        text = p.read_text().replace("http://www.w3.org/2000/svg", "")  # the SVG namespace is a name, not a load
        assert "http://" not in text and "https://" not in text, p.name
