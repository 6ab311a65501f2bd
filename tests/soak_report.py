"""The soak table (``make soak``): each long lane records one row (rounds, confirmed, lost, duplicated), and
this module, run as a script, prints them as a table.

A lane calls :func:`record` when it has its numbers (pass or fail: the row is written before the asserts).
Rows go, one JSON object a line, to the file named by ``LEVERET_SOAK_REPORT``; without it (an ordinary
pytest run) :func:`record` does nothing. For lanes that are not about messages (fuzzing) "rounds" counts what
the lane iterates (inputs, frames) and confirmed/lost/duplicated are 0.

    python tests/soak_report.py REPORT   # prints the table; exit status 1 if any lane lost or duplicated
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def record(lane: str, rounds: int, confirmed: int, lost: int, duplicated: int, note: str = "") -> None:
    path = os.environ.get("LEVERET_SOAK_REPORT")
    if not path:
        return
    row = {"lane": lane, "rounds": rounds, "confirmed": confirmed, "lost": lost, "duplicated": duplicated,
           "note": note, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def table(rows: list[dict]) -> str:
    head = ("lane", "rounds", "confirmed", "lost", "duplicated", "note")
    cells = [head] + [tuple(str(r.get(k, "")) for k in head) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i in (0, 5) else c[i].rjust(widths[i]) for i in range(len(head))).rstrip()
             for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not rows:
        print(f"no soak lane recorded a row in {path}")
        return 1
    print(table(rows))
    return 1 if any(r["lost"] or r["duplicated"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
