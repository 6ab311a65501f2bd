"""``python -m broker.healthcheck``: exit 0 if the local broker answers its health check, 1 otherwise.

The container's HEALTHCHECK runs it. It asks the HTTP API's ``/api/health/checks/virtual-hosts`` (RabbitMQ's
path: 200 when the node runs and serves its vhosts) on the loopback address, where the default ``guest``
user may log in. Another user, port or check: ``LEVERET_HEALTHCHECK_URL``, ``LEVERET_HEALTHCHECK_USER``,
``LEVERET_HEALTHCHECK_PASSWORD``.
"""

from __future__ import annotations

import base64
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:15672/api/health/checks/virtual-hosts"


def check(url: str, user: str, password: str, timeout: float = 4.0) -> tuple[bool, str]:
    """Whether the health check at ``url`` passes, and what it answered."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200, f"{response.status} {response.read(200).decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return False, f"{e.code} {e.read(200).decode(errors='replace')}"
    except OSError as e:
        return False, str(e)


def main() -> int:
    env = os.environ
    healthy, answer = check(env.get("LEVERET_HEALTHCHECK_URL", DEFAULT_URL),
                            env.get("LEVERET_HEALTHCHECK_USER", "guest"),
                            env.get("LEVERET_HEALTHCHECK_PASSWORD", "guest"))
    print(answer)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
