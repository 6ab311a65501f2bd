"""The optional compiled codec (protocol/_codec.pyx, Cython); everything else about the package is declared in
pyproject.toml, which setuptools reads as usual.

Why code rather than configuration: the extension must be optional. Where a C compiler is found (developers'
machines, CI), ``pip install .`` / ``pip install -e .`` build it (in place, for an editable install) and the
broker uses it; where none is (python:3.11-slim), the build warns and the install goes on with the pure-Python
codec, which behaves the same (protocol/__init__.py picks whichever imports). Cython comes from
pyproject.toml's [build-system] requires; a build without it (``--no-build-isolation`` in an environment that
lacks it) also falls back to pure Python.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = "protocol/_codec.pyx"


class OptionalBuildExt(build_ext):
    """setuptools skips an optional extension on a compile error, but not when the compiler itself is missing
    (an OSError, as on python:3.11-slim): this skips it then too, with a warning."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # whatever stops the build, the pure-Python codec remains
            if not ext.optional:
                raise
            print(f"warning: building {ext.name} failed ({exc}): the pure-Python codec runs", file=sys.stderr)


def extensions() -> list[Extension]:
    """protocol._codec, translated to C by Cython (into build/, so that the tree holds only the .pyx), marked
    optional: a compiler error is a warning (setuptools' build_ext skips an optional extension it cannot
    build), never a failed install."""
    ext = Extension("protocol._codec", [SOURCE], optional=True)
    try:
        from Cython.Build import cythonize
    except ImportError:
        print(f"warning: Cython is not installed: {SOURCE} is not compiled, the pure-Python codec runs",
              file=sys.stderr)
        return []
    try:
        built = cythonize([ext], build_dir="build/cython", quiet=True,
                          compiler_directives={"language_level": "3"})
    except Exception as exc:  # noqa: BLE001 - any failure to translate means: no extension, not no install
        print(f"warning: Cython failed on {SOURCE} ({exc}): the pure-Python codec runs", file=sys.stderr)
        return []
    for translated in built:
        translated.optional = True  # cythonize's copies do not keep it
    return built


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
