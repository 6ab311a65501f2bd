"""Fixtures of the web UI's browser tests (a plugin: each test module names it in ``pytest_plugins``): one Leveret process for the session (rates sampled every
second), Debian's chromium driven by Playwright (never a downloaded browser; a missing chromium fails the
run, since `make test` installs it), and a fresh browser context per test whose page fails the test on a
script error, a console error or a CSP violation."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_support import CHROMIUM, Http

pytestmark = pytest.mark.leveret_only

# Page-side recorder of CSP violations: Playwright's init scripts run outside the page's CSP.
_CSP_RECORDER = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture(scope="session")
def launch(request) -> Iterator[Callable[..., tuple[Any, Http]]]:
    """Start a Leveret process (tests/conftest.py's BrokerProcess) with extra arguments, its HTTP side
    answering; all stopped at the end of the session. The root conftest is found among pytest's plugins:
    ``from conftest import`` would get whichever conftest.py pytest loaded last."""
    root = next(p for p in request.config.pluginmanager.get_plugins()
                if Path(getattr(p, "__file__", None) or "/").resolve() == ROOT_CONFTEST)
    started: list[tuple[Any, Path]] = []

    def start(*extra_args: str, prefix: str = "leveret-ui-") -> tuple[Any, Http]:
        tmp = Path(tempfile.mkdtemp(prefix=prefix))
        b = root.BrokerProcess(host="127.0.0.1", port=root.free_port(), data_dir=tmp / "data",
                               log_path=tmp / "broker.log", extra_args=list(extra_args))
        b.start()
        started.append((b, tmp))
        http = Http(b.management_port)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the HTTP listener starts just after the AMQP one
            try:
                urllib.request.urlopen(http.base + "/", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        return b, http

    yield start
    for b, tmp in started:
        if b.process is not None and b.process.poll() is None:
            b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def ui_broker(launch) -> tuple[Any, Http]:
    """The UI tests' shared broker: rates sampled every second, so the charts move within a test."""
    return launch("--set", "collect_statistics_interval=1000")


class _Chromium:
    """One Playwright driver and one chromium for a run of consecutive UI tests (a worker's whole UI lane: the
    lane is one xdist group, tests/conftest.py), closed as soon as the next test is not a UI test. Not a
    session fixture: Playwright's sync API keeps an event loop running on the main thread while it is open,
    and every later test that calls asyncio.run (the unit tests run after tests/ui/) would then fail with
    "cannot be called from a running event loop". Not a module fixture either: started once per module, the
    lane launched chromium 14 times, ~50 s of CPU of a run on 2 cores. Each test still gets a fresh browser
    context (``page``): no cookie, storage or page is shared between tests."""

    def __init__(self) -> None:
        self._playwright: Any = None
        self._browser: Any = None

    def browser(self) -> Any:
        if self._browser is None:
            from playwright.sync_api import sync_playwright

            path = os.environ.get("LEVERET_CHROMIUM", CHROMIUM)
            assert Path(path).exists(), f"{path} missing: `make test-tools` installs Debian's chromium"
            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=path, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        return self._browser

    def close(self) -> None:
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        try:
            if browser is not None:
                browser.close()
        finally:
            if playwright is not None:
                playwright.stop()


_CHROMIUM = _Chromium()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's fixtures are torn down: close the browser unless the next test is a UI test too."""
    try:
        return (yield)
    finally:
        if nextitem is None or not nextitem.nodeid.startswith("tests/ui/"):
            _CHROMIUM.close()


@pytest.fixture
def browser() -> Any:
    return _CHROMIUM.browser()


@pytest.fixture
def base(ui_broker) -> str:
    return ui_broker[1].base


@pytest.fixture
def http(ui_broker) -> Http:
    return ui_broker[1]


@pytest.fixture
def amqp(ui_broker):
    import pika

    conn = pika.BlockingConnection(ui_broker[0].pika_params())
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    context.add_init_script(_CSP_RECORDER)
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error"
          and not _expected_console(msg.text) else None)
    pg.expected_console_errors = []  # type: ignore[attr-defined]
    yield pg
    csp = pg.evaluate("window.__csp || []") if not pg.is_closed() else []
    context.close()
    errors = [e for e in errors if not any(x in e for x in pg.expected_console_errors)]  # type: ignore[attr-defined]
    assert errors == [] and csp == [], (errors, csp)


def _expected_console(text: str) -> bool:
    # Chromium logs every non-2xx fetch answer as a console error ("Failed to load resource"); tests that
    # provoke one (a refused login, a 400 filter) expect it. Anything else is a failure.
    return "Failed to load resource" in text
