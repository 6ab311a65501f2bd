"""Which codec runs: the compiled one where it was built, the pure-Python one with ``LEVERET_NO_EXTENSIONS=1``
(or where no compiler was found), decided once by protocol/__init__.py for every importer, and named in the
broker's start-up banner. Each check runs in a fresh interpreter: the choice is made at import time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import codec_impls
import pytest

ROOT = Path(__file__).resolve().parents[3]

# Every module that picks up the codec at import, and what it must see (run in a subprocess).
CHECK = """
import sys, json
import protocol, protocol.frames as frames, protocol.fastcodec as fastcodec
import broker.amqp.reader, broker.amqp.channel, broker.amqp.command_assembler
compiled = protocol.codec_extension
names = {name: getattr(fastcodec, name) for name in fastcodec.ACCELERATED}
print(json.dumps({
    "active": protocol.EXTENSIONS_ACTIVE,
    "codec": protocol.CODEC,
    "loaded": "protocol._codec" in sys.modules,
    "reader_parser": broker.amqp.reader.FrameParser.__module__,
    "parser_is_pure": frames.FrameParser is frames.PyFrameParser,
    "fastcodec": sorted({f.__module__ for f in names.values()}),
    "pure_untouched": all(getattr(fastcodec.pure, n).__module__ == "protocol.fastcodec" for n in names),
    "publish_args": broker.amqp.channel.PublishArgs.__module__,
    "assembler": broker.amqp.command_assembler.fastcodec.decode_basic_publish.__module__,
}))
"""


def run_check(no_extensions: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "LEVERET_NO_EXTENSIONS"}
    if no_extensions is not None:
        env["LEVERET_NO_EXTENSIONS"] = no_extensions
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_compiled_codec_is_built_where_a_compiler_is() -> None:
    """A broken or missing build fails here (not skipped) wherever a C compiler could have built it; a build
    older than its source means a stale editable install (`make` rebuilds it)."""
    module = codec_impls.compiled_module()
    source = ROOT / "protocol" / "_codec.pyx"
    built = Path(module.__file__)
    if built.parent == source.parent:  # an in-place (editable) build, beside its source
        assert built.stat().st_mtime >= source.stat().st_mtime, \
            f"{built.name} is older than {source.name}: rebuild it (make, or pip install -e '.[dev]')"


def test_leveret_no_extensions_selects_the_pure_codec_everywhere() -> None:
    seen = run_check("1")
    assert seen == {
        "active": False, "codec": "pure-python", "loaded": False, "reader_parser": "protocol.frames",
        "parser_is_pure": True, "fastcodec": ["protocol.fastcodec"], "pure_untouched": True,
        "publish_args": "protocol.fastcodec", "assembler": "protocol.fastcodec",
    }


@pytest.mark.parametrize("no_extensions", [None, ""], ids=["unset", "empty"])
def test_the_compiled_codec_runs_by_default(no_extensions: str | None) -> None:
    codec_impls.compiled_module()  # fails where it should have been built, skips where it cannot be
    seen = run_check(no_extensions)
    assert seen == {
        "active": True, "codec": "compiled", "loaded": True, "reader_parser": "protocol._codec",
        "parser_is_pure": False, "fastcodec": ["protocol._codec"], "pure_untouched": True,
        "publish_args": "protocol._codec", "assembler": "protocol._codec",
    }


def _free_port() -> int:
    from worker_resources import free_port as worker_port

    return worker_port()


@pytest.mark.parametrize("no_extensions, codec", [("1", "pure-python"), (None, "compiled")])
def test_the_start_up_banner_names_the_codec(tmp_path: Path, no_extensions: str | None, codec: str) -> None:
    if codec == "compiled":
        codec_impls.compiled_module()
    env = {k: v for k, v in os.environ.items() if k != "LEVERET_NO_EXTENSIONS"}
    env["LEVERET_LOG_FORMAT"] = "json"
    if no_extensions is not None:
        env["LEVERET_NO_EXTENSIONS"] = no_extensions
    cmd = [sys.executable, "-m", "broker", "serve", "--bind", "127.0.0.1", "--port", str(_free_port()),
           "--management-port", str(_free_port()), "--prometheus-port", str(_free_port()),
           "--data-dir", str(tmp_path / "data")]
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        banner = None
        deadline = time.monotonic() + 60
        while banner is None and time.monotonic() < deadline and proc.poll() is None:
            for line in log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "Leveret started":
                    banner = json.loads(line)
            time.sleep(0.1)
        assert banner is not None, log.read_text()[-3000:]
        assert banner["codec"] == codec
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
