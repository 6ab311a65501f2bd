"""The two implementations of the wire codec, for the tests that run the same checks against both.

``pure`` is the reference (protocol.frames.PyFrameParser and protocol.fastcodec.pure); ``compiled`` is
protocol._codec, built from protocol/_codec.pyx. Where a C compiler is on PATH (every developer machine, CI),
a missing or broken compiled module makes the compiled variant FAIL, not skip: the build is optional for
users, not for the suite. Without a compiler it is skipped.

The codec tests outside this directory (tests/unit/test_frames.py, test_fastcodec.py, test_header_splice.py)
put this directory on sys.path to import it.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass
from typing import Any

import pytest

from protocol import fastcodec
from protocol.frames import PyFrameParser

NAMES = ("pure", "compiled")


@dataclass(frozen=True)
class Codec:
    """One implementation: its frame parser class, and a namespace with the accelerated fastcodec names
    (PublishArgs, decode_basic_publish, ..., build_content_header: see fastcodec.ACCELERATED)."""

    name: str
    FrameParser: Any
    fc: Any

    def __repr__(self) -> str:
        return self.name


def c_compiler() -> str | None:
    """The C compiler setuptools would use (``$CC``, else cc / gcc on PATH), if there is one."""
    for name in (os.environ.get("CC", "").split(" ")[0], "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def compiled_module() -> Any:
    """protocol._codec; pytest.fail when it does not import although a compiler is there, skip if none is."""
    try:
        return importlib.import_module("protocol._codec")
    except ImportError as exc:
        error = exc
    compiler = c_compiler()
    if compiler:
        pytest.fail(f"protocol._codec does not import although a C compiler ({compiler}) is here: {error}. "
                    "Rebuild it: make (or .venv/bin/pip install -e '.[dev]')", pytrace=False)
    pytest.skip("no C compiler: the compiled codec cannot be built here")


def get(name: str) -> Codec:
    if name == "pure":
        return Codec("pure", PyFrameParser, fastcodec.pure)
    ext = compiled_module()
    return Codec("compiled", ext.FrameParser, ext)
