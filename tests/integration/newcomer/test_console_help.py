"""Issue 32, defect 2 (and 7's ``leveret --version``): ``leveret-pipeline traffic --help`` crashed with a
40-line traceback (``%2F`` in an argparse help string). Every console script of both distributions
(pyproject.toml's and pipeline/pyproject.toml's [project.scripts]) and every sub-command each one's help lists
is run with ``--help`` as a user runs it, from the virtual environment's bin directory: exit 0, text on stdout,
no traceback."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent


def console_scripts() -> list[str]:
    scripts: list[str] = []
    for project in (ROOT / "pyproject.toml", ROOT / "pipeline" / "pyproject.toml"):
        scripts += list(tomllib.loads(project.read_text())["project"].get("scripts", {}))
    return scripts


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    exe = BIN / argv[0]
    assert exe.exists(), f"{argv[0]} is not installed in {BIN} (make test installs both distributions)"
    return subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True, timeout=120, check=False)


def subcommands(script: str) -> list[str]:
    """The sub-commands ``SCRIPT --help`` lists in its usage line ({serve,perf,ctl,diagnostics})."""
    found = re.search(r"\{([\w,-]+)\}", run([script, "--help"]).stdout)
    return found.group(1).split(",") if found else []


def assert_help(argv: list[str]) -> str:
    done = run(argv)
    text = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in text, f"{' '.join(argv)}: exit {done.returncode}\n{text}"
    assert "usage:" in done.stdout, f"{' '.join(argv)} printed no usage:\n{text}"
    return done.stdout


def test_every_console_script_and_subcommand_prints_its_help():
    scripts = console_scripts()
    assert {"leveret", "leveret-pipeline"} <= set(scripts)
    seen = []
    for script in scripts:
        assert_help([script, "--help"])
        for command in subcommands(script):
            assert_help([script, command, "--help"])
            seen.append(f"{script} {command}")
    # What the issue names, so that a usage line parsed wrongly cannot make this test pass with nothing run.
    assert {"leveret serve", "leveret ctl", "leveret diagnostics", "leveret perf",
            "leveret-pipeline traffic"} <= set(seen), seen


@pytest.mark.parametrize("script, distribution", [("leveret", "leveret"), ("leveret-pipeline", "leveret-pipeline")])
def test_version_is_the_installed_distributions(script, distribution):
    done = run([script, "--version"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"{script} {version(distribution)}"


def test_ctl_import_from_rabbitmq_help_names_its_argument_and_options():
    # ctl's verbs share one parser: a verb with options of its own (issue 37's import_from_rabbitmq) shows
    # them in a group of that parser's help, which ``leveret ctl VERB --help`` prints.
    text = assert_help(["leveret", "ctl", "import_from_rabbitmq", "--help"])
    assert "import_from_rabbitmq URL:" in text, text
    for option in ("--amqp-uri", "--no-wait", "--move-timeout", "--rabbitmq-cacert", "--rabbitmq-insecure"):
        assert option in text, option
