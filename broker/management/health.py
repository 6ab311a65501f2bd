"""Health checks (``/api/health/checks/...``) and ``/api/aliveness-test/{vhost}``, with RabbitMQ's
answers: 200 ``{"status":"ok"}``, or 503 ``{"status":"failed","reason":...}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.management.common import body_of, node_of, require_admin, respond, vhost_for_write
from broker.management.exchanges import make_message
from broker.publish import ROUTED
from broker.resources.os_probes import total_memory
from broker.topology import answered_call

if TYPE_CHECKING:
    from broker.queues.queue_types import Queue
    from broker.vhost import VHost

ALIVENESS_QUEUE = "aliveness-test"
# RabbitMQ's aliases in protocol-listener checks (rabbit_mgmt_wm_health_check_protocol_listener's
# normalize_protocol) → the listener protocol; any other name is looked up as it is (amqp/ssl, https,
# http/prometheus, https/prometheus, ...).
PROTOCOLS = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp", "amqps": "amqp/ssl",
             "http1": "http", "http1.1": "http", "http_api": "http", "management": "http", "management_ui": "http",
             "ui": "http", "prometheus": "http/prometheus"}


def ok() -> web.Response:
    return respond({"status": "ok"})


def failed(reason: str, **extra: Any) -> web.Response:
    return respond({"status": "failed", "reason": reason, **extra}, status=503)


async def alarms(request: web.Request) -> web.Response:
    node = node_of(request)
    active = sorted(node.alarms())
    if active:
        resource = {"memory": "memory", "disk": "disk"}
        return failed("There are alarms in effect in the cluster",
                      alarms=[{"node": node.name, "resource": resource.get(a, a)} for a in active])
    return ok()


async def virtual_hosts(request: web.Request) -> web.Response:
    return ok()  # every vhost of a single node runs as long as the node does


async def port_listener(request: web.Request) -> web.Response:
    node = node_of(request)
    try:
        port = int(request.match_info["port"])
    except ValueError:
        return respond({"status": "failed", "reason": "port must be an integer"}, status=400)
    ports = [entry["port"] for entry in node.listeners]
    if port in ports:
        return ok()
    return failed(f"No active listener on port {port}", missing=port, ports=ports)


async def protocol_listener(request: web.Request) -> web.Response:
    node = node_of(request)
    name = request.match_info["protocol"].lower()
    protocol = PROTOCOLS.get(name, name)
    protocols = sorted({entry["protocol"] for entry in node.listeners})
    if protocol in protocols:
        return respond({"status": "ok", "protocol": protocol})
    return failed("No active listener", missing=protocol, protocols=protocols)


async def in_service(request: web.Request) -> web.Response:
    node = node_of(request)
    if node.stopping:
        return failed("the node is shutting down")
    return ok()


async def _declare_own(vh: VHost, name: str) -> Queue | None:
    """Declare the non-durable queue ``name`` and answer it if it is this member's; None if another cluster
    member holds the name (a name is one queue cluster-wide). A cluster member's claim of the name in the
    directory is awaited (broker/topology.py answered_call)."""
    queue, _created = await answered_call(lambda: vh.queues.declare(name, False, False, False, False, {}, None))
    return None if queue.remote else vh.queues.get(name)


async def aliveness_test(request: web.Request) -> web.Response:
    """Declare ``aliveness-test``, publish a message to it through the default exchange and get it back. On a
    cluster member whose vhost's ``aliveness-test`` another member holds (a name is one queue cluster-wide),
    the test runs on this member's own ``aliveness-test.<node name>``."""
    vh = vhost_for_write(request)
    name = ALIVENESS_QUEUE
    queue = await _declare_own(vh, name)
    if queue is None:
        name = f"{ALIVENESS_QUEUE}.{node_of(request).name}"
        queue = await _declare_own(vh, name)
        if queue is None:
            return failed(f"queue '{name}' is held by another cluster member")
    queue.purge()
    msg = make_message("", name, b"test_message", {})
    routed = vh.publish(vh.default_exchange, msg, False) & ROUTED
    got = queue.basic_get(True) if routed else None
    if got is None or got[1].body != b"test_message":
        return failed("aliveness test message was not routed back")
    return ok()


async def set_resource_limits(request: web.Request) -> web.Response:
    """Leveret's endpoint behind ``leveret ctl set_disk_free_limit`` / ``set_vm_memory_high_watermark``
    (rabbitmqctl's verbs; RabbitMQ's HTTP API has no equivalent). Body: ``{"disk_free_limit": bytes}``
    and/or ``{"vm_memory_high_watermark": bytes}``, or the relative forms ``vm_memory_high_watermark_relative``
    (a fraction of this machine's RAM, 0 < f <= 1) and ``disk_free_limit_relative`` (a multiple of its RAM,
    rabbitmqctl's ``mem_relative``). The alarms are re-evaluated at once."""
    require_admin(request)
    node = node_of(request)
    try:
        body = await body_of(request)
        disk = body.get("disk_free_limit")
        memory = body.get("vm_memory_high_watermark")
        if (disk is not None and (not isinstance(disk, int) or disk < 0)) or \
                (memory is not None and (not isinstance(memory, int) or memory <= 0)):
            raise ValueError
        memory_rel, disk_rel = body.get("vm_memory_high_watermark_relative"), body.get("disk_free_limit_relative")
        for rel, top in ((memory_rel, 1.0), (disk_rel, None)):
            if rel is not None and (isinstance(rel, bool) or not isinstance(rel, (int, float)) or rel <= 0
                                    or (top is not None and rel > top)):
                raise ValueError
    except (ValueError, AttributeError):
        return respond({"error": "bad_request", "reason": "limits must be non-negative integers (bytes), or "
                        "fractions of the RAM (vm_memory_high_watermark_relative: 0 < f <= 1)"}, status=400)
    if memory_rel is not None:
        memory = int(memory_rel * total_memory())
    if disk_rel is not None:
        disk = int(disk_rel * total_memory())
    node.set_resource_limits(disk_free_limit=disk, memory_limit=memory)
    return respond({"disk_free_limit": node.disk_free_limit, "vm_memory_high_watermark": node.memory_limit})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_put("/api/leveret/resource-limits", set_resource_limits)
    router.add_get("/api/health/checks/alarms", alarms)
    router.add_get("/api/health/checks/local-alarms", alarms)
    router.add_get("/api/health/checks/virtual-hosts", virtual_hosts)
    router.add_get("/api/health/checks/port-listener/{port}", port_listener)
    router.add_get("/api/health/checks/protocol-listener/{protocol}", protocol_listener)
    router.add_get("/api/health/checks/node-is-quorum-critical", virtual_hosts)
    router.add_get("/api/health/checks/node-is-mirror-sync-critical", virtual_hosts)
    router.add_get("/api/health/checks/certificate-expiration/{within}/{unit}", virtual_hosts)
    router.add_get("/api/health/checks/is-in-service", in_service)
    router.add_get("/api/health/checks/ready-to-serve-clients", in_service)
    router.add_get("/api/aliveness-test/{vhost}", aliveness_test)
