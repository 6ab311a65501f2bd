"""Issue 31, findings 2 and 4: no state change from another site, whatever the credentials; ``/api/nodes`` needs
the monitoring tag; secrets are never shown.

Before: with HTTP Basic credentials, a ``text/plain`` or form-encoded body holding JSON and
``Origin: http://evil.example`` created a user (201), imported definitions (204) and deleted a queue (204); a
user tagged only ``management`` read ``/api/nodes``; ``ssl_options.password`` was in ``/api/leveret/environment``.
The browser side (a page on another origin, credentials cached) is tests/ui/test_ui_cross_site.py."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import BrokerProcess

from broker.management.redact import dsn_without_password
from tests.integration.management.test_management_api import Http, start_mgmt_broker

pytestmark = pytest.mark.leveret_only

SSL_PASSWORD = "ssl-key-s3cret-31"


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[BrokerProcess, Http]]:
    tmp = tmp_path_factory.mktemp("cross-site")
    b, mport, _ = start_mgmt_broker(tmp, "--set", f"ssl_options.password={SSL_PASSWORD}")
    try:
        yield b, Http(mport)
    finally:
        b.stop()
        assert "Traceback" not in b.log_text()


@pytest.fixture
def api(node) -> Http:
    return node[1]


def users(api: Http) -> set[str]:
    return {u["name"] for u in api("GET", "/api/users")[1]}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_a_change_with_a_body_that_is_not_json_is_415(api, uid, content_type):
    body = json.dumps({"password": "pw", "tags": "administrator"}).encode()
    status, answer, _ = api("PUT", f"/api/users/{uid}", raw=body, headers={"Content-Type": content_type})
    assert status == 415, (status, answer)
    assert answer["error"] == "unsupported_media_type"
    status, _, _ = api("POST", "/api/definitions", raw=json.dumps({"users": [
        {"name": uid, "password": "pw", "tags": "administrator"}]}).encode(), headers={"Content-Type": content_type})
    assert status == 415
    assert uid not in users(api)


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                                     {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"}])
def test_a_change_from_another_site_is_403_with_basic_credentials(api, uid, headers):
    assert api("PUT", f"/api/queues/%2F/{uid}-q", {"durable": False})[0] in (201, 204)
    status, answer, _ = api("PUT", f"/api/users/{uid}", {"password": "pw", "tags": "administrator"}, headers=headers)
    assert status == 403 and answer["reason"] == "cross-site request refused"
    assert api("POST", "/api/definitions", {"users": [{"name": uid, "password": "pw", "tags": ""}]},
               headers=headers)[0] == 403
    assert api("DELETE", f"/api/queues/%2F/{uid}-q", headers=headers)[0] == 403
    assert uid not in users(api)
    assert api("GET", f"/api/queues/%2F/{uid}-q")[0] == 200
    assert api("DELETE", f"/api/queues/%2F/{uid}-q")[0] == 204


def test_a_login_from_another_site_is_403(api):
    status, _, _ = api("POST", "/api/login", {"username": "guest", "password": "guest"}, auth=None,
                       headers={"Origin": "http://evil.example"})
    assert status == 403


def test_same_origin_json_and_bodiless_changes_keep_working(api, uid):
    own = api.base  # what a browser on the UI's own page sends
    assert api("PUT", f"/api/users/{uid}", {"password": "pw", "tags": ""},
               headers={"Origin": own, "Sec-Fetch-Site": "same-origin"})[0] in (201, 204)
    # a bodiless PUT (curl -X PUT, the UI's add-vhost) and rabbitmqadmin's deletes send no Content-Type
    assert bare(api, "PUT", f"/api/vhosts/{uid}") in (201, 204)
    assert bare(api, "DELETE", f"/api/users/{uid}") == 204
    assert bare(api, "DELETE", f"/api/vhosts/{uid}") == 204
    # charset parameters are fine
    assert api("PUT", f"/api/users/{uid}", raw=json.dumps({"password": "pw", "tags": ""}).encode(),
               headers={"Content-Type": "application/json; charset=utf-8"})[0] in (201, 204)
    assert api("DELETE", f"/api/users/{uid}")[0] == 204


def bare(api: Http, method: str, path: str) -> int:
    """A request with Basic credentials and nothing else: no body, no Content-Type."""
    req = urllib.request.Request(api.base + path, method=method, headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def test_nodes_need_the_monitoring_tag(api, uid):
    for name, tags in ((f"{uid}-mgmt", "management"), (f"{uid}-mon", "monitoring")):
        assert api("PUT", f"/api/users/{name}", {"password": "pw", "tags": tags})[0] in (201, 204)
    node_name = api("GET", "/api/overview")[1]["node"]
    quoted = urllib.parse.quote(node_name, safe="")
    for path in ("/api/nodes", f"/api/nodes/{quoted}"):
        status, answer, _ = api("GET", path, auth=(f"{uid}-mgmt", "pw"))
        assert status == 401 and answer["reason"] == "Not monitoring user", (path, answer)
        assert api("GET", path, auth=(f"{uid}-mon", "pw"))[0] == 200
    assert api("GET", "/api/overview", auth=(f"{uid}-mgmt", "pw"))[0] == 200


def test_secrets_are_never_shown(api, node):
    status, env, _ = api("GET", "/api/leveret/environment")
    assert status == 200
    text = json.dumps(env)
    assert SSL_PASSWORD not in text
    assert env["ssl_password"] == "[hidden]"
    assert "default_pass" not in env
    assert env["management_max_body_size"] == 20_000_000
    assert SSL_PASSWORD not in node[0].log_text()


def test_dsn_passwords_are_taken_out():
    assert dsn_without_password("postgresql://lev:pw@db:5432/leveret") == "postgresql://lev@db:5432/leveret"
    assert dsn_without_password("postgresql://lev@db/x?password=pw&sslmode=require") == \
        "postgresql://lev@db/x?sslmode=require"
    assert dsn_without_password("postgres://db/x?password=pw") == "postgres://db/x"
