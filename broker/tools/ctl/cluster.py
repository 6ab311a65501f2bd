"""The node's cluster: rabbitmqctl's cluster_status (the node asked, then its cluster's other members from
broker/clustering/cluster.py, running or not), set_cluster_name and forget_cluster_node."""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.tools.ctl.api import Api, q
from broker.tools.ctl.arguments import need
from broker.tools.ctl.output import listener_purpose
from broker.tools.ctl.verb import Verb, VerbGroup


def cluster_status_info(api: Api) -> dict[str, Any]:
    """rabbitmqctl cluster_status's sections: the node asked first (its figures, versions and listeners are
    its own), then the other members of its cluster (broker/clustering/cluster.py), running or not, by name."""
    overview = api.get("/api/overview") or {}
    nodes = api.get("/api/nodes") or [{}]
    node = nodes[0]
    name = node.get("name", overview.get("node"))
    names = [name] + [n["name"] for n in nodes[1:]]
    running = [name] + [n["name"] for n in nodes[1:] if n.get("running")]
    alarms = [{"node": name, "resource": a} for a, on in (("memory", node.get("mem_alarm")),
                                                          ("disk", node.get("disk_free_alarm"))) if on]
    return {
        "cluster_name": overview.get("cluster_name"),
        "disk_nodes": names,
        "ram_nodes": [],
        "running_nodes": running,
        "versions": {name: {"product_name": overview.get("product_name"),
                            "product_version": overview.get("product_version"),
                            "rabbitmq_version": overview.get("rabbitmq_version"),
                            "runtime": overview.get("erlang_full_version")}},
        "cpu_cores": {name: node.get("processors")},
        "maintenance_status": {n: "not under maintenance" for n in running},
        "alarms": alarms,
        "partitions": {},
        "listeners": {name: [{"interface": lst["ip_address"], "port": lst["port"], "protocol": lst["protocol"]}
                             for lst in overview.get("listeners", [])]},
    }


def cluster_status(api: Api, args: argparse.Namespace) -> str:
    """The node asked and, in a cluster, the other members: disc nodes are every member that joined, running
    nodes those holding their lease now (rabbitmqctl cluster_status's sections); no partitions (PostgreSQL is
    the one arbiter)."""
    need(args, 0, "")
    info = cluster_status_info(api)
    if args.formatter == "json":
        return json.dumps(info, indent=1)
    name = info["running_nodes"][0]
    version = info["versions"][name]
    sections = [
        ("Basics", [f"Cluster name: {info['cluster_name']}",
                    f"Total CPU cores available cluster-wide: {info['cpu_cores'][name]}"]),
        ("Disk Nodes", info["disk_nodes"]),
        ("Running Nodes", info["running_nodes"]),
        ("Versions", [(f"{name}: {version['product_name']} {version['product_version']} "
                       f"(RabbitMQ {version['rabbitmq_version']} compatible) on {version['runtime']}")]),
        ("CPU Cores", [f"Node: {name}, available CPU cores: {info['cpu_cores'][name]}"]),
        ("Maintenance status", [f"Node: {n}, status: not under maintenance" for n in info["running_nodes"]]),
        ("Alarms", [f"{a['resource']} alarm on node {a['node']}" for a in info["alarms"]] or ["(none)"]),
        ("Network Partitions", ["(none)"]),
        ("Listeners", [f"Node: {name}, interface: {lst['interface']}, port: {lst['port']}, protocol: "
                       f"{lst['protocol']}, purpose: {listener_purpose(lst['protocol'])}"
                       for lst in info["listeners"][name]]),
    ]
    out = [] if args.quiet else [f"Cluster status of node {name} ..."]
    for title, lines in sections:
        out += [title, "", *lines, ""]
    return "\n".join(out).rstrip()


def set_cluster_name(api: Api, args: argparse.Namespace) -> str:
    """rabbitmqctl set_cluster_name: one name for the whole cluster. In a cluster of Leveret members it is kept
    in the shared database (PUT /api/cluster-name writes it there), so every member reports it at once."""
    (name,) = need(args, 1, "NAME")
    api.request("PUT", "/api/cluster-name", {"name": name})
    return "" if args.quiet else f"Setting cluster name to {name} ..."


def forget_cluster_node(api: Api, args: argparse.Namespace) -> str:
    """Remove a member that is not running from the cluster, with its node-local queues and the messages
    forwarded to them (rabbitmqctl forget_cluster_node; asked of any running member)."""
    (name,) = need(args, 1, "NODE")
    gone = api.request("DELETE", f"/api/leveret/nodes/{q(name)}") or {}
    if args.quiet:
        return ""
    return (f"Removing node {name} from the cluster\n{gone.get('queues', 0)} of its queue(s) removed, "
            f"{gone.get('forwarded_messages_dropped', 0)} message(s) forwarded to it dropped")


GROUP = VerbGroup({
    "cluster_status": Verb(cluster_status),
    "set_cluster_name": Verb(set_cluster_name),
    "forget_cluster_node": Verb(forget_cluster_node),
})
