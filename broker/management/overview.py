"""``/api/overview``, ``/api/nodes``, ``/api/whoami``, ``/api/cluster-name`` and the small endpoints the
RabbitMQ UI and tools ask for (``/api/auth``, ``/api/extensions``, ``/api/feature-flags``)."""

from __future__ import annotations

import os
import platform
import resource
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker import PRODUCT, VERSION
from broker.amqp.reader import open_connections
from broker.clustering.cluster_errors import CannotForget, ClusterError
from broker.exchanges.exchange_types import EXCHANGE_TYPES
from broker.management import redact
from broker.management.common import (
    MONITOR_TAGS,
    bad_request,
    body_of,
    node_of,
    not_found,
    require_admin,
    require_tags,
    respond,
    sees_all,
    unavailable,
    user_of,
    visible_vhosts,
)
from broker.management.presenters.cluster import cluster_view
from broker.management.presenters.overview import churn_counts, overview_message_stats
from broker.management.presenters.rates import with_details
from broker.management.presenters.vhosts import vhost_message_rates, vhost_message_totals
from broker.resources.os_probes import disk_free, open_fds, resident_memory

if TYPE_CHECKING:
    from broker.node import Node


def _listeners(node: Node) -> list[dict[str, Any]]:
    return [{"node": node.name, "protocol": entry["protocol"], "ip_address": entry["ip_address"],
             "port": entry["port"], "socket_opts": {}} for entry in node.listeners]


async def get_overview(request: web.Request) -> web.Response:
    node = node_of(request)
    sampler = request.app["sampler"]
    vhs = visible_vhosts(request)
    user = user_of(request)
    all_visible = sees_all(user)
    totals = {"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0}
    rates = dict.fromkeys(totals, 0.0)
    view = await cluster_view(node)  # a cluster member's totals and rates: the cluster's (presenters/cluster.py)
    for vh in vhs:
        for name, value in vhost_message_totals(vh, view).items():
            totals[name] += value
        for name, rate in vhost_message_rates(vh, sampler, view).items():
            rates[name] += rate
    names = {vh.name for vh in vhs}
    # Counted over the visible connections themselves: a membership test of each channel's connection in a
    # list of them took 5 s at 19,000 connections.
    conns = [c for c in open_connections(node) if all_visible or c.user.name == user.name]
    channels = sum(len(c.channels) for c in conns)
    consumers = sum(len(ch.consumers) for c in conns for ch in list(c.channels.values()))
    queue_totals: dict[str, Any] = {}
    for name, value in totals.items():  # the rate of the visible vhosts' totals: the sum of theirs
        queue_totals[name] = value
        queue_totals[name + "_details"] = {"rate": round(rates[name], 1)}
    return respond({
        "management_version": VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400], "basic": [600, 3600],
                                      "detailed": [600]},
        "exchange_types": [{"name": t, "description": EXCHANGE_TYPES[t].description, "enabled": True}
                           for t in sorted(EXCHANGE_TYPES)],
        "product_version": VERSION,
        "product_name": PRODUCT,
        "rabbitmq_version": node.rabbitmq_version,
        "cluster_name": node.cluster_name,
        "erlang_version": "none",
        "erlang_full_version": f"none (Leveret on Python {platform.python_version()})",
        "release_series_support_status": "supported",
        "disable_stats": False,
        "is_op_policy_updating_enabled": True,
        "enable_queue_totals": True,
        "message_stats": overview_message_stats(node, sampler, view.shared if view is not None else None),
        "churn_rates": with_details(churn_counts(node), sampler, "global"),
        "queue_totals": queue_totals,
        "object_totals": {
            "channels": channels,
            "connections": len(conns),
            "consumers": consumers,
            "exchanges": sum(len(vh.exchanges) + 1 for vh in vhs),
            # (a cluster member's: every queue of the cluster once, the other members' node-local ones too)
            "queues": sum(len(vh.queues) for vh in vhs)
            + sum(1 for other in (view.others if view is not None else ()) if other.vhost.name in names),
        },
        "statistics_db_event_queue": 0,
        "node": node.name,
        "listeners": _listeners(node),
        "contexts": [{"node": node.name, "description": "RabbitMQ Management", "path": "/",
                      "port": str(node.settings.management_port)}],
        "vhosts": sorted(names),
    })


def node_info(node: Node) -> dict[str, Any]:
    s = node.settings
    mem = resident_memory()
    mem_limit = node.memory_limit
    disk = disk_free(s.data_dir)
    fd_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    alarms = node.alarms()
    return {
        "name": node.name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "os_pid": str(os.getpid()),
        "uptime": int((time.time() - node.started_at) * 1000),
        "mem_used": mem,
        "mem_limit": mem_limit,
        "mem_alarm": "memory" in alarms,
        "disk_free": disk,
        "disk_free_limit": node.disk_free_limit,
        "disk_free_alarm": "disk" in alarms,
        "fd_used": open_fds(),
        "fd_total": fd_soft,
        "sockets_used": len(node.connections),
        "sockets_total": fd_soft,
        "proc_used": 1,
        "proc_total": 1,
        "run_queue": 0,
        "processors": os.cpu_count() or 1,
        "rates_mode": "basic",
        "net_ticktime": 60,
        "partitions": [],
        "applications": [{"name": "leveret", "description": "Leveret AMQP 0-9-1 broker", "version": VERSION}],
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "config_files": [],
        "log_files": [str(s.log_file)] if s.log_file else ["<stderr>"],
        "db_dir": str(s.data_dir),
        "exchange_types": [{"name": t, "enabled": True} for t in sorted(EXCHANGE_TYPES)],
        "auth_mechanisms": [{"name": "PLAIN", "enabled": True}, {"name": "AMQPLAIN", "enabled": True}],
        "listeners": _listeners(node),
    }


def member_info(member: dict[str, Any]) -> dict[str, Any]:
    """Another cluster member, as the cluster's table knows it (its own figures are on its own API)."""
    return {"name": member["name"], "type": "disc", "running": bool(member["alive"]), "being_drained": False,
            "uptime": int((time.time() - member["started_at"].timestamp()) * 1000) if member["alive"] else 0,
            "partitions": [], "cluster_epoch": member["epoch"]}


async def all_nodes(node: Node) -> list[dict[str, Any]]:
    """This node, then every other member of its cluster (the newest start of each name), by name."""
    out = [node_info(node)]
    if node.cluster is not None:
        latest: dict[str, dict[str, Any]] = {}
        for member in await node.cluster.members():
            if member["name"] != node.name:
                latest[member["name"]] = member  # members() is by epoch: the last one is the newest
        out += [member_info(latest[name]) for name in sorted(latest)]
    return out


async def get_nodes(request: web.Request) -> web.Response:
    """Needs the monitoring tag, as RabbitMQ's rabbit_mgmt_wm_nodes: the data directory, pid, listeners and
    log files are not a management user's to see."""
    require_tags(request, MONITOR_TAGS, "monitoring")
    return respond(await all_nodes(node_of(request)))


async def get_node(request: web.Request) -> web.Response:
    require_tags(request, MONITOR_TAGS, "monitoring")
    for info in await all_nodes(node_of(request)):
        if info["name"] == request.match_info["node"]:
            return respond(info)
    raise not_found()


async def forget_node(request: web.Request) -> web.Response:
    """Leveret's ``DELETE /api/leveret/nodes/{node}`` (behind ``leveret ctl forget_cluster_node``): remove a
    cluster member that is not running, with its node-local queues (broker/clustering/cluster.py ``Cluster.forget``).
    404 for a name that never joined; 400 for a running member, this node, or a node not in a cluster; 503
    while PostgreSQL is out of reach."""
    require_admin(request)
    node = node_of(request)
    name = request.match_info["node"]
    if node.cluster is None:
        raise bad_request(f"node {node.name} is not a cluster member (cluster.postgres.dsn is not set)")
    try:
        gone = await node.cluster.forget(name)
    except CannotForget as exc:
        raise (not_found(str(exc)) if exc.unknown else bad_request(str(exc))) from None
    except ClusterError as exc:
        raise unavailable(str(exc)) from None
    return respond({"name": name, "runs": gone.runs, "queues": gone.queues,
                    "forwarded_messages_dropped": gone.forwarded, "reservations_requeued": gone.requeued})


async def get_environment(request: web.Request) -> web.Response:
    """Leveret's ``/api/leveret/environment``: the settings in force (behind ``leveret ctl environment``, as
    ``rabbitmqctl environment`` shows the application environment), secrets hidden (broker/management/redact.py)."""
    require_admin(request)
    return respond(redact.settings_view(node_of(request).settings))


async def get_whoami(request: web.Request) -> web.Response:
    user = user_of(request)
    return respond({"name": user.name, "tags": list(user.tags), "is_internal_user": True})


async def get_cluster_name(request: web.Request) -> web.Response:
    return respond({"name": node_of(request).cluster_name})


async def put_cluster_name(request: web.Request) -> web.Response:
    require_admin(request)
    body = await body_of(request)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("name must be a non-empty string")
    node = node_of(request)
    if node.cluster is not None:  # one name for the cluster, in its database (broker/clustering/cluster.py)
        try:
            await node.cluster.set_cluster_name(name)
        except ClusterError as exc:
            raise unavailable(str(exc)) from None
    node.cluster_name = name
    return web.Response(status=204)


async def get_auth(request: web.Request) -> web.Response:
    return respond({"oauth_enabled": False})


async def get_empty_list(request: web.Request) -> web.Response:
    return respond([])


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/overview", get_overview)
    router.add_get("/api/nodes", get_nodes)
    router.add_get("/api/nodes/{node}", get_node)
    router.add_delete("/api/leveret/nodes/{node}", forget_node)
    router.add_get("/api/whoami", get_whoami)
    router.add_get("/api/leveret/environment", get_environment)
    router.add_get("/api/cluster-name", get_cluster_name)
    router.add_put("/api/cluster-name", put_cluster_name)
    router.add_get("/api/auth", get_auth)
    router.add_get("/api/extensions", get_empty_list)
    router.add_get("/api/feature-flags", get_empty_list)
    router.add_get("/api/deprecated-features", get_empty_list)
