"""Operator policies in the web UI (RabbitMQ's /api/operator-policies): an administrator creates one on the
policies page, a queue's effective policy takes its limit (the lower of the operator's and the client's),
and deleting it from the page (after confirmation) lifts it; a policymaker's page has no operator
policies, since only administrators may see or change them."""

from __future__ import annotations

import pytest
from ui_support import login, q, shot, wait_for

pytest_plugins = ["ui_fixtures"]
pytestmark = pytest.mark.leveret_only


def test_operator_policy_created_in_the_ui_caps_a_queue_and_is_deleted(page, base, http, uid) -> None:
    queue = uid + ".capped"
    http.ok("PUT", f"/api/queues/%2F/{q(queue)}", {"durable": False, "arguments": {"x-max-length": 100}})
    try:
        login(page, base)
        page.goto(base + "/#/policies")
        page.wait_for_selector("#operator-policies")
        page.fill("#operator-policy-name", uid)
        page.fill("#operator-policy-pattern", f"^{uid}\\.")
        page.select_option("#operator-policy-apply-to", "queues")
        page.fill("#operator-policy-definition", '{"max-length": 5, "message-ttl": 60000}')
        page.click("#add-operator-policy button[type=submit]")
        page.wait_for_selector(f"#operator-policies td:has-text('{uid}')")
        page.wait_for_selector("#operator-policies-result:has-text('Operator policy')")
        assert page.locator(f"#policies td:has-text('{uid}')").count() == 0  # not a plain policy
        shot(page, "operator-policies")
        stored = http("GET", f"/api/operator-policies/%2F/{q(uid)}")[1]
        assert stored["definition"] == {"max-length": 5, "message-ttl": 60000} and stored["apply-to"] == "queues"

        def effective() -> dict:
            return http("GET", f"/api/queues/%2F/{q(queue)}")[1]

        assert wait_for(lambda: effective()["operator_policy"] == uid), effective()
        # The operator's 5 beats the client's x-max-length 100 (the lower number wins).
        assert effective()["effective_policy_definition"] == {"max-length": 5, "message-ttl": 60000}

        page.click(f"#operator-policies button[data-delete='{uid}']")
        page.click("#confirm-cancel")
        assert http("GET", f"/api/operator-policies/%2F/{q(uid)}")[0] == 200
        page.click(f"#operator-policies button[data-delete='{uid}']")
        page.click("#confirm-ok")
        page.wait_for_selector(f"#operator-policies-result:has-text('Deleted operator policy {uid}')")
        assert http("GET", f"/api/operator-policies/%2F/{q(uid)}")[0] == 404
        assert page.locator(f"#operator-policies td:has-text('{uid}')").count() == 0
        assert wait_for(lambda: effective()["operator_policy"] is None), effective()
        assert effective()["effective_policy_definition"] == {}
    finally:
        http("DELETE", f"/api/operator-policies/%2F/{q(uid)}")
        http("DELETE", f"/api/queues/%2F/{q(queue)}")


def test_policymaker_sees_policies_but_no_operator_policies(page, base, http, uid) -> None:
    user = uid + "-pm"
    http.ok("PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "policymaker"})
    http.ok("PUT", f"/api/permissions/%2F/{q(user)}", {"configure": ".*", "write": ".*", "read": ".*"})
    try:
        login(page, base, user, "pw")
        page.goto(base + "/#/policies")
        page.wait_for_selector("#policies")
        assert page.locator("#operator-policies, #add-operator-policy").count() == 0
        # ...and the server refuses it the list anyway (the page hides only what it could not do).
        assert http("GET", "/api/operator-policies", auth=(user, "pw"))[0] == 401
    finally:
        http("DELETE", f"/api/users/{q(user)}")
