"""Issue 32, defect 7's smaller things as a newcomer met them: every start of the same data directory logged
"vhost created" (a restart creates nothing), the shipped config file still named metadata.json (the store is
metadata.sqlite), README did not mention ``leveret diagnostics`` nor how to run one test file."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.conftest import ROOT, wait_http

pytestmark = pytest.mark.leveret_only


def created_vhosts(log: str) -> list[str]:
    found = []
    for line in log.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "vhost created":
            found.append(event.get("vhost"))
    return found


def put_vhost(b, name: str) -> None:
    import base64

    wait_http([b])  # the HTTP API starts just after AMQP
    token = base64.b64encode(b"guest:guest").decode()
    req = urllib.request.Request(f"http://127.0.0.1:{b.management_port}/api/vhosts/{name}", method="PUT",
                                 data=b"{}", headers={"Authorization": f"Basic {token}",
                                                      "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (201, 204)


def test_vhost_created_is_logged_when_a_vhost_is_created_not_at_every_start(start_broker, tmp_path):
    data = tmp_path / "data"
    first = start_broker(data_dir=data)
    put_vhost(first, "made-by-an-operator")
    assert first.stop() == 0
    assert created_vhosts(first.log_text()) == ["/", "made-by-an-operator"]
    second = start_broker(data_dir=data)  # the same data directory: nothing is created
    put_vhost(second, "made-after-the-restart")
    assert second.stop() == 0
    assert created_vhosts(second.log_text()) == ["made-after-the-restart"], second.log_text()[-3000:]


def test_the_shipped_config_names_the_metadata_store_it_has():
    text = (ROOT / "config" / "leveret.conf").read_text()
    assert "metadata.json" not in text and "metadata.sqlite" in text


def test_readme_documents_diagnostics_and_running_one_test_file():
    readme = (ROOT / "README.md").read_text()
    assert "leveret diagnostics" in readme
    assert re.search(r"python -m pytest tests/\S+\.py", readme), "README says how to run one test file"
