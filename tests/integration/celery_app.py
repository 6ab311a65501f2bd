"""A tiny Celery app for the end-to-end test in test_clients.py.

The worker is started as ``python -m celery -A tests.integration.celery_app worker`` with the broker URL in
``LEVERET_CELERY_BROKER_URL``; results travel back through the broker (``rpc://``). Task names are explicit so
the test process may load this file under any module name.
"""

from __future__ import annotations

import os

from celery import Celery

BROKER_URL = (os.environ.get("LEVERET_CELERY_BROKER_URL") or os.environ.get("LEVERET_TEST_AMQP_URL")
              or "amqp://guest:guest@127.0.0.1:5672//")

app = Celery("leveret_tests", broker=BROKER_URL, backend="rpc://")
app.conf.update(
    task_default_queue=os.environ.get("LEVERET_CELERY_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=3,
    worker_hijack_root_logger=False,
)


@app.task(name="leveret_tests.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, name="leveret_tests.retry_once", max_retries=2, default_retry_delay=0)
def retry_once(self, value: str) -> dict:
    """Fails the first time through and asks Celery to retry; returns how many retries it took."""
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return {"value": value, "retries": self.request.retries}
