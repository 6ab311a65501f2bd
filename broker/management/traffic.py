"""The traffic pictures of the Spark pipeline (a Leveret extension; RabbitMQ has no such page).

``leveret-pipeline traffic --out DIR`` (pipeline/leveret_pipeline/) draws ``DIR/traffic.png`` and appends one
JSON line per micro-batch to ``DIR/_batches.jsonl``; with ``leveret.traffic_dir = DIR`` the broker serves them
as they are. The broker only reads those two files: it never starts Spark, and never reads the parquet tables
(pyarrow is the pipeline's dependency, not the broker's).

    GET /api/leveret/traffic       {"configured", "directory", "picture": {"url", "modified", "size"} | null,
                                    "last_batch": the pipeline's last _batches.jsonl record | null, "hint"}
    GET /api/leveret/traffic.png   the picture (404 when there is none)

Both need the monitoring or administrator tag: the picture shows every vhost's queues."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from broker.management.common import MONITOR_TAGS, node_of, not_found, require_tags, respond
from broker.management.presenters.times import format_timestamp

PICTURE = "traffic.png"
BATCHES = "_batches.jsonl"
PICTURE_URL = "/api/leveret/traffic.png"
# The last record is found in the file's tail: a long run appends a line every few seconds for days.
TAIL_BYTES = 64 * 1024
SETTING = "leveret.traffic_dir"


def _hint(directory: Path | None) -> str:
    if directory is None:
        return f"No traffic pictures: run leveret-pipeline traffic --out DIR and set {SETTING} = DIR."
    return f"No traffic picture in {directory} yet: run leveret-pipeline traffic --out {directory}."


def last_batch(path: Path) -> dict[str, Any] | None:
    """The last whole JSON object line of ``path`` (the pipeline appends them), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by the tail's start, or one being written
        if isinstance(record, dict):
            return record
    return None


def traffic_info(directory: Path | None) -> dict[str, Any]:
    """What the pipeline has left in ``directory`` (blocking file reads: run in a thread)."""
    picture: dict[str, Any] | None = None
    batch: dict[str, Any] | None = None
    if directory is not None:
        try:
            st = (directory / PICTURE).stat()
        except OSError:
            st = None
        if st is not None:
            # The version in the URL changes when the pipeline draws again, so the page reloads the image.
            picture = {"url": f"{PICTURE_URL}?v={st.st_mtime_ns}", "modified": format_timestamp(st.st_mtime),
                       "size": st.st_size}
        batch = last_batch(directory / BATCHES)
    return {"configured": directory is not None, "directory": str(directory) if directory is not None else None,
            "picture": picture, "last_batch": batch, "hint": None if picture is not None else _hint(directory)}


async def get_traffic(request: web.Request) -> web.Response:
    require_tags(request, MONITOR_TAGS, "monitoring")
    directory = node_of(request).settings.traffic_dir
    return respond(await asyncio.to_thread(traffic_info, directory))


async def get_picture(request: web.Request) -> web.StreamResponse:
    require_tags(request, MONITOR_TAGS, "monitoring")
    directory = node_of(request).settings.traffic_dir
    if directory is None:
        raise not_found(_hint(None))
    path = directory / PICTURE
    if not await asyncio.to_thread(path.is_file):
        raise not_found(_hint(directory))
    return web.FileResponse(path, headers={"Cache-Control": "no-cache", "Content-Type": "image/png"})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/leveret/traffic", get_traffic)
    router.add_get(PICTURE_URL, get_picture)
