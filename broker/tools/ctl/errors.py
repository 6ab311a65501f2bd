"""How ``leveret ctl`` and ``leveret diagnostics`` fail: rabbitmqctl's exit codes (sysexits), the one-line error
that carries one, and an argument parser whose usage errors exit with rabbitmqctl's 64 rather than argparse's 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EX_USAGE = 64  # rabbitmqctl's exit code for a usage error such as an unknown info column (sysexits' EX_USAGE)
EX_DATAERR = 65
EX_NOUSER = 67
EX_UNAVAILABLE = 69
EX_CONFIG = 78  # sysexits' EX_CONFIG: the configuration read for the defaults has an error


class CtlError(Exception):
    """One line for the operator and the exit code; ``status``: the HTTP status the broker answered, if any."""

    def __init__(self, message: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class UsageParser(argparse.ArgumentParser):
    """rabbitmqctl and rabbitmq-diagnostics exit 64 (EX_USAGE) on a usage error, not argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EX_USAGE)
