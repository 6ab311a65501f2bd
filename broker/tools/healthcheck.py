"""``python -m broker.tools.healthcheck``: exit 0 if the local broker answers its health check, 1 otherwise.

The container's HEALTHCHECK runs it. It asks the HTTP API's ``/api/health/checks/virtual-hosts`` (RabbitMQ's
path: 200 when the node runs and serves its vhosts) where the broker's own configuration puts it, as the
broker's default user: it reads the same settings ``leveret serve`` reads (``LEVERET_*`` variables, the file of
``LEVERET_CONFIG_FILE``), so a container configured with ``LEVERET_DEFAULT_USER`` / ``_PASS`` (as
docker/compose.yaml does) or other ports is checked as configured, without variables of its own. (A guest
that was removed, or a port moved, once left the container "unhealthy" forever.) Over HTTPS when only
``management.ssl.*`` is configured; the certificate is not checked, since the check talks to its own host.
With the HTTP API turned off (``management.tcp.port = 0``) the AMQP port must accept a connection.

``LEVERET_HEALTHCHECK_URL``, ``LEVERET_HEALTHCHECK_USER`` and ``LEVERET_HEALTHCHECK_PASSWORD`` still override
each part (for a default user whose password was changed after the first start, for instance).
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request

from broker.config import ConfigError, Settings, load_settings, management_url

CHECK_PATH = "/api/health/checks/virtual-hosts"


def check(url: str, user: str, password: str, timeout: float = 4.0) -> tuple[bool, str]:
    """Whether the health check at ``url`` passes, and what it answered."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    # Its own host over HTTPS: the certificate names the service, not 127.0.0.1, so it is not checked.
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status == 200, f"{response.status} {response.read(200).decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return False, f"{url}: {e.code} {e.read(200).decode(errors='replace')}"
    except urllib.error.URLError as e:  # (a refused or unreachable port: its reason is the OSError)
        return False, f"{url}: {e.reason}"
    except OSError as e:
        return False, f"{url}: {e}"


def check_amqp_port(settings: Settings, timeout: float = 4.0) -> tuple[bool, str]:
    """With the HTTP API off: whether the AMQP port accepts a TCP connection."""
    host = "127.0.0.1" if settings.bind in ("0.0.0.0", "::", "*", "localhost") else settings.bind
    try:
        with socket.create_connection((host, settings.port), timeout=timeout):
            return True, f"AMQP port {host}:{settings.port} accepts connections (the HTTP API is off)"
    except OSError as e:
        return False, f"AMQP port {host}:{settings.port}: {e.strerror or e}"


def main() -> int:
    env = os.environ
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"the broker's configuration cannot be read: {exc}")
        return 1
    url = env.get("LEVERET_HEALTHCHECK_URL")
    if url is None:
        base = management_url(settings)
        if base is None:
            healthy, answer = check_amqp_port(settings)
            print(answer)
            return 0 if healthy else 1
        url = base + CHECK_PATH
    healthy, answer = check(url, env.get("LEVERET_HEALTHCHECK_USER", settings.default_user),
                            env.get("LEVERET_HEALTHCHECK_PASSWORD", settings.default_pass))
    print(answer)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
