"""AMQP 0-9-1 wire protocol, sans-IO: bytes in, frames out; values in, bytes out. No asyncio, no broker state.

The frame splitter and the per-message codec exist twice: in pure Python (protocol/frames.py,
protocol/fastcodec.py: the reference) and compiled from protocol/_codec.pyx (Cython), built by ``pip install``
where a C compiler is found. Which one runs is decided once, here, when the package is imported: the compiled
one if it imports and ``LEVERET_NO_EXTENSIONS`` is empty or unset, the pure one otherwise. frames.py and
fastcodec.py then replace their public names with the compiled ones, so importers never choose.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def _load_codec_extension() -> ModuleType | None:
    """The compiled codec module, or None when it is switched off or was not built (no compiler at install
    time: the pure-Python codec then runs, slower but the same)."""
    if os.environ.get("LEVERET_NO_EXTENSIONS"):
        return None
    try:
        return importlib.import_module("protocol._codec")
    except ImportError:
        return None


codec_extension: ModuleType | None = _load_codec_extension()
# True when the compiled codec runs; CODEC names it for the start-up banner.
EXTENSIONS_ACTIVE: bool = codec_extension is not None
CODEC: str = "compiled" if EXTENSIONS_ACTIVE else "pure-python"
