"""Data directories as Leveret wrote them before the metadata store held everything: users, vhosts,
permissions, policies and parameters in ``metadata.json`` (compact, sorted JSON of the definitions
export without queues, exchanges and bindings, plus ``operator_policies``), and ``metadata.sqlite``
holding the durable exchanges, queues and bindings, its ``node``/``storage`` row and the
``node``/``metadata.json`` row that recorded that the JSON file had been written.

Also a tiny HTTP API client for the tests of the metadata store.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
from pamqp import encode as amqp_encode

from storage.metadata_store import row_crc

SEP = "\x1f"
# Kinds the node's metadata is kept under since the migration (broker/persistence.py).
NODE_METADATA_KINDS = ("vhost", "user", "permission", "topic_permission", "policy", "operator_policy", "parameter",
                       "global_parameter")


def rabbit_hash(password: str, salt: bytes = b"\x01\x02\x03\x04") -> str:
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def old_document(users: list[dict[str, Any]], vhosts: list[dict[str, Any]], permissions: list[dict[str, Any]],
                 **sections: list[dict[str, Any]]) -> dict[str, Any]:
    """A metadata.json document as ``definitions.save_metadata`` wrote it (``export(node, schema=False)``)."""
    doc: dict[str, Any] = {"rabbit_version": "3.13.7", "rabbitmq_version": "3.13.7", "product_name": "Leveret",
                           "product_version": "0.1.0", "users": users, "permissions": permissions,
                           "topic_permissions": [], "parameters": [], "global_parameters": [], "policies": [],
                           "operator_policies": []}
    doc["vhosts"] = [{"name": v["name"], "description": v.get("description", ""), "tags": v.get("tags", []),
                      "default_queue_type": "classic", "limits": v.get("limits", []),
                      "metadata": {"description": v.get("description", ""), "tags": v.get("tags", []),
                                   "default_queue_type": "classic"}} for v in vhosts]
    doc.update(sections)
    return doc


def write_old_json(data_dir: Path, doc: dict[str, Any]) -> None:
    (data_dir / "metadata.json").write_text(json.dumps(doc, sort_keys=True))


def _key(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else SEP.join(key)


def _put(db: sqlite3.Connection, kind: str, key: str | tuple[str, ...], value: Any) -> None:
    """One row, as the node writes it: in a table with the ``crc`` column (a database this node wrote, turned
    back by ``downgrade``) with its checksum, which the store checks at every read (storage/metadata_store.py)."""
    packed = msgpack.packb(value, use_bin_type=True)
    if any(r[1] == "crc" for r in db.execute("PRAGMA table_info(defs)")):
        db.execute("INSERT OR REPLACE INTO defs (kind, key, value, crc) VALUES (?, ?, ?, ?)",
                   (kind, _key(key), packed, row_crc(kind, _key(key), packed)))
        return
    db.execute("INSERT OR REPLACE INTO defs (kind, key, value) VALUES (?, ?, ?)", (kind, _key(key), packed))


def new_old_sqlite(data_dir: Path, queues: list[tuple[str, str]] = (),
                   exchanges: list[tuple[str, str, str]] = (),
                   bindings: list[tuple[str, str, str, str]] = ()) -> None:
    """A metadata.sqlite as the older node left it: durable ``queues`` (vhost, name), ``exchanges``
    (vhost, name, type) and queue ``bindings`` (vhost, exchange, queue, routing key), no arguments."""
    data_dir.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(data_dir / "metadata.sqlite")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE defs (kind TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
               "PRIMARY KEY (kind, key)) WITHOUT ROWID")
    _put(db, "node", "storage", {"format": 1})
    _put(db, "node", "metadata.json", True)
    empty = amqp_encode.field_table({})
    for vhost, name, type_name in exchanges:
        _put(db, "exchange", (vhost, name), {"type": type_name, "auto_delete": False, "internal": False,
                                             "arguments": empty})
    for vhost, name in queues:
        _put(db, "queue", (vhost, name), {"auto_delete": False, "arguments": empty})
    for vhost, source, queue, key in bindings:
        _put(db, "binding", (vhost, source, "queue", queue, key, hashlib.sha1(empty).hexdigest()),
             {"arguments": empty})
    db.commit()
    db.close()


def downgrade(data_dir: Path, doc: dict[str, Any]) -> None:
    """Turn a stopped node's data directory back into the older layout: its users, vhosts, ... out of the
    store and into metadata.json (``doc``), and the row saying the JSON file was written."""
    db = sqlite3.connect(data_dir / "metadata.sqlite")
    for kind in NODE_METADATA_KINDS:
        db.execute("DELETE FROM defs WHERE kind = ?", (kind,))
    db.execute("DELETE FROM defs WHERE kind = 'node' AND key = 'metadata'")
    _put(db, "node", "metadata.json", True)
    db.commit()
    db.close()
    write_old_json(data_dir, doc)


def api(b, method: str, path: str, body: Any = None, user: str = "guest", password: str = "guest"
        ) -> tuple[int, Any]:
    """One HTTP API call to broker ``b``: (status, decoded JSON body or None)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{b.management_port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    deadline = time.monotonic() + 10  # the HTTP listener starts just after the AMQP one
    while True:
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError:
            break
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw) if raw else None
        except ValueError:
            return exc.code, raw.decode(errors="replace")
