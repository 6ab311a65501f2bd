"""Every repository path the sources and docs cite exists.

The code explains itself by pointing at other files (``see storage/pg/SCHEMA.md``,
``tests/integration/core/test_basic.py``, ``docs/decisions/delayed-messages.md``). A pointer to a file that was
moved or never committed (the team's private notes, a renamed test) sends the reader nowhere, so this test fails
listing each one with the file and line that cites it. It reads the Python sources, the Markdown files, the
config/ and docker/ folders and pyproject.toml, as git lists them (an uncommitted new file counts as present
once it is on disk).

What counts as a citation: a path that starts at one of the repository's top-level folders (``broker/...``,
``tests/...``, ``docs/...``) and names a file by its extension or a folder by a trailing slash; a
``pytest`` node id (``tests/x.py::test_y``) is its file; a ``*`` is a glob that must match something.
Documents outside the repository (``research/...``, ``seeds/...``, ``shared/...``, a bare ``DESIGN.md``) are
always reported: write the decision down in docs/decisions/ and point there.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SELF = "tests/unit/test_cited_paths.py"

# Top-level folders a citation starts at; a path under another name is prose ("protocol/storage split").
TOP = ("broker", "storage", "protocol", "pipeline", "bench", "tests", "docs", "config", "docker", ".ci")
# Places that are never in the repository: the team's notes and the design seeds.
OUTSIDE = ("research/", "seeds/", "shared/")

_PATH = re.compile(
    r"(?<![\w./~$-])"  # not the middle of a longer path, a URL or an absolute path
    r"((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./*-]*)"
)
_OUTSIDE = re.compile(r"(?<![\w/-])(?:\.\./)*(" + "|".join(re.escape(o) for o in OUTSIDE) + r")[\w./-]*")
_BARE_DOC = re.compile(r"(?<![\w/.-])(DESIGN\.md|REFERENCE\.md|STYLE\.md|RESULTS\.md|SCHEMA\.md)\b")
_EXTENSION = re.compile(r"\.(py|pyx|md|toml|conf|json|yaml|yml|txt|sql|js|css|html|sh|cfg|ini|csv|svg|png)$")


def _scanned() -> list[str]:
    """The files whose citations are checked: what git tracks or is about to (new files on disk)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    keep = []
    for name in out:
        if not (ROOT / name).is_file():
            continue
        if name.endswith((".py", ".pyx", ".md")) or name.startswith(("config/", "docker/")) \
                or name == "pyproject.toml":
            keep.append(name)
    return keep


def _exists(path: str, known: set[str], known_dirs: set[str]) -> bool:
    if "*" in path:
        return any(fnmatch.fnmatchcase(k, path) for k in known) or any(
            fnmatch.fnmatchcase(d, path.rstrip("/")) for d in known_dirs)
    return path in known or path.rstrip("/") in known_dirs or (ROOT / path).exists() or _made_by_a_run(path)


def _made_by_a_run(path: str) -> bool:
    """A path the repository ignores on purpose: made by a run (``tests/ui/artefacts/``: the UI tests'
    screenshots), so a fresh clone lacks it until then, and the check must not depend on which tests ran first."""
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, check=False).returncode == 0


def _cited(text: str) -> list[tuple[int, str]]:
    """(line number, path) of each citation in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _PATH.finditer(line):
            path = match.group(1).split("::")[0].rstrip(".,;:)")
            if path.endswith("/"):
                if path.count("/") < 2 and path.rstrip("/") in TOP:
                    continue  # "tests/", "broker/": the top-level folders themselves
            elif not _EXTENSION.search(path):
                continue  # not a file name: prose, a module path without extension, a placeholder
            if "..." in path or "{" in path:
                continue
            found.append((number, path))
        for match in _OUTSIDE.finditer(line):
            found.append((number, match.group(0)))
        for match in _BARE_DOC.finditer(line):
            found.append((number, match.group(1)))
    return found


def missing_citations() -> list[str]:
    """``file:line: path`` for each cited path that is not in the repository."""
    scanned = _scanned()
    known = set(subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split())
    known_dirs = {str(Path(k).parent) for k in known}
    known_dirs |= {str(p) for d in list(known_dirs) for p in Path(d).parents}
    problems = []
    for name in scanned:
        if name == SELF:
            continue  # its docstring and examples name missing paths on purpose
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        here = Path(name).parent
        for number, path in _cited(text):
            if path.startswith(("research/", "seeds/", "shared/", "../")):
                problems.append(f"{name}:{number}: {path} (outside the repository)")
            elif "/" not in path:
                # A bare document name: the one beside the citing file, or at the top.
                if not ((ROOT / here / path).exists() or (ROOT / path).exists()):
                    problems.append(f"{name}:{number}: {path}")
            elif not _exists(path, known, known_dirs):
                problems.append(f"{name}:{number}: {path}")
    return problems


def test_every_cited_path_exists() -> None:
    problems = missing_citations()
    assert not problems, (f"{len(problems)} cited paths do not exist (fix the citation, or write the "
                          "document in docs/):\n" + "\n".join(problems))


def test_the_checker_sees_a_missing_path_and_passes_a_present_one() -> None:
    assert _cited("see broker/vhost.py and tests/integration/core/test_basic.py::test_x.") == [
        (1, "broker/vhost.py"), (1, "tests/integration/core/test_basic.py")]
    assert _cited("as DESIGN.md and ../shared/research/spark.md say") == [
        (1, "../shared/research/spark.md"), (1, "DESIGN.md")]
    assert _cited("the protocol/storage split; /tmp/broker/x.py; https://x.org/docs/a.md") == []


if __name__ == "__main__":
    print("\n".join(missing_citations()))
