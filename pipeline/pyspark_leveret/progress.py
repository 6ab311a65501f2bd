"""Kafka's lag metrics for a ``leveret`` streaming query: ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``
and ``avgOffsetsBehindLatest``, per queue the streams' next offset minus the offset the query has read to.

Spark's Kafka source puts them into each progress report's ``sources[i].metrics`` itself (its stream
implements ``ReportsSourceMetrics``). A Python data source cannot, in pyspark 4.3: the JVM side of a Python
stream (``PythonMicroBatchStream`` and its admission-control and availableNow variants) implements no
``ReportsSourceMetrics``, and the Python runner of a stream reader has no call that would ask for metrics;
so ``metrics`` stays empty. What the report does carry is enough for the same figures: ``endOffset`` (where
the batch ended: what the query has consumed) and ``latestOffset`` (the reader's ``reportLatestOffset``: each
stream's next offset when the batch was planned), exactly the two maps Kafka's source subtracts.

    def on_progress(event):  # a StreamingQueryListener's onQueryProgress
        for source in event.progress.sources:
            print(offsets_behind_latest(source))  # {"avgOffsetsBehindLatest": "7.5", ...}

Values are strings, as in Kafka's map ("7.5", "10", "5"); a report without both offset maps gives ``{}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _offsets(value: Any) -> dict[str, int] | None:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    if not isinstance(value, Mapping):
        return None
    return {str(q): int(o) for q, o in value.items()}


def _field(source: Any, name: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def offsets_behind_latest(source: Any) -> dict[str, str]:
    """The three metrics of one source's progress (a ``SourceProgress``, or its JSON as a dict): per queue of
    ``latestOffset``, its offset there minus its ``endOffset`` (0 when the end does not name it, as Kafka
    counts a partition it has not read)."""
    latest, consumed = _offsets(_field(source, "latestOffset")), _offsets(_field(source, "endOffset"))
    if not latest or consumed is None:
        return {}
    behind = [offset - consumed.get(q, 0) for q, offset in latest.items()]
    return {"minOffsetsBehindLatest": str(min(behind)), "maxOffsetsBehindLatest": str(max(behind)),
            "avgOffsetsBehindLatest": str(sum(behind) / len(behind))}
