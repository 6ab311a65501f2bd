"""RabbitMQ's stock Grafana dashboards for the runtime and quorum queues ("Erlang-BEAM",
"Erlang-Distribution", "Erlang-Memory-Allocators", "Erlang-Distributions-Compare",
"RabbitMQ-Quorum-Queues-Raft") against Leveret, through a real Prometheus, as
tests/integration/management/test_grafana_overview_queries.py does for "RabbitMQ-Overview".

Each dashboard's expressions are below as strings (every panel target's ``expr``, whitespace folded, an
expression a dashboard repeats listed once), from rabbitmq-server's
deps/rabbitmq_prometheus/docker/grafana/dashboards/<name>.json at the commit named beside each list. Debian's
``prometheus`` (started here) scrapes the broker's aggregated /metrics every second after known traffic on a
quorum queue; each expression must return data (a series, no NaN), except those marked with the reason they
cannot in Leveret: those must return nothing, so that the list stays true. The template variables are
resolved as Grafana does (``label_values`` through Prometheus' label API, the first value in alphabetical
order, "" when there is none; a variable the dashboard does not define stays as written), ``$__rate_interval``
as Grafana computes it for the dashboards' 15-minute range with a 1 s scrape interval.
"""

from __future__ import annotations

import math
import re
import urllib.request
from collections.abc import Iterator
from typing import NamedTuple

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.management.test_grafana_overview_queries import Prom, scraped_broker

pytestmark = pytest.mark.leveret_only

# Why an expression returns nothing in Leveret (each names what RabbitMQ has and Leveret does not).
NO_DIST = ("erlang_vm_dist_*: no distribution links; Leveret cluster members do not connect to each other "
           "(they meet in PostgreSQL) and a single node has no peers")
NO_PROCESS_LIMIT = "erlang_vm_process_limit: asyncio has no limit on tasks"
NO_REDUCTIONS = "erlang_vm_statistics_reductions_total: Python counts no reductions"
NO_DIRTY = "dirty run queues: Python has no dirty schedulers"
NO_ETS = "ETS/DETS tables: Leveret has none"
NO_GC_BYTES = "GC bytes reclaimed: Python's collector counts objects, not bytes"
NO_ATOMS = "atom memory: Python has no atom table"
NO_MB_BLOCKS = "mbcs blocks count: glibc does not count the chunks in use in its heaps"
NO_POOL = "mbcs_pool: glibc's malloc has no carrier pool"
NO_COMMIT_LATENCY = ("rabbitmq_raft_commit_latency_seconds: Leveret does not time its fsyncs or PostgreSQL "
                     "commits")
NOT_LEVERET = "not the broker's metrics: node_exporter, cAdvisor or PerfTest's exporter"
ENDPOINT_TYPO = (NO_DIST + "; besides, the dashboard's variable is $Endpoint and the query reads $endpoint, "
                 "which Grafana leaves as written: nothing matches, against RabbitMQ too")


class Query(NamedTuple):
    panel: str
    ref: str
    expr: str
    empty_because: str = ""  # set: Leveret cannot return data for it, and the test checks it returns nothing


class Dashboard(NamedTuple):
    name: str
    variables: list[tuple[str, str]]  # (name, label_values query or a fixed value), Grafana's refresh order
    queries: list[Query]


# Grafana's built-ins for the dashboards' 15-minute range (5 for Erlang-BEAM): $__interval is the range over
# ~1000 points, at least the 1 s scrape interval; $__rate_interval = max($__interval + scrape, 4 * scrape).
BUILTINS = {"__rate_interval": "4s", "__interval": "1s", "__range": "900s"}
IDENTITY_VARIABLES = [
    ("namespace", "label_values(rabbitmq_identity_info, namespace)"),
    ("rabbitmq_cluster", 'label_values(rabbitmq_identity_info{namespace="$namespace"}, rabbitmq_cluster)'),
    ("endpoint", ('label_values(rabbitmq_identity_info{namespace="$namespace", '
                  'rabbitmq_cluster="$rabbitmq_cluster", rabbitmq_endpoint!="memory-breakdown"},'
                  'rabbitmq_endpoint)')),
]

# Dashboard 'Erlang-BEAM', commit b9dc0ea3b48888703f71586741e76631789bc513:
# (panel, refId, expr[, why it is empty here]).
ERLANG_BEAM = [Query(*q) for q in [
    ('Erlang VM Run Queue Length', 'A',
     'erlang_vm_statistics_run_queues_length{instance="$node"}'),
    ('Erlang VM Run Queue Length', 'B',
     'erlang_vm_statistics_dirty_io_run_queue_length{instance="$node"}',
     NO_DIRTY),
    ('Erlang VM Run Queue Length', 'C',
     'erlang_vm_statistics_dirty_cpu_run_queue_length{instance="$node"}',
     NO_DIRTY),
    ('Load', 'B',
     'irate(erlang_vm_statistics_context_switches{instance="$node"}[$interval])'),
    ('Load', 'C',
     'irate(erlang_vm_statistics_reductions_total{instance="$node"}[$interval])',
     NO_REDUCTIONS),
    ('Load', 'D',
     'irate(erlang_vm_statistics_runtime_milliseconds{instance="$node"}[$interval])'),
    ('ETS/DETS', 'A',
     'erlang_vm_ets_limit{instance="$node"}',
     NO_ETS),
    ('ETS/DETS', 'B',
     'erlang_vm_ets_tables{instance="$node"}',
     NO_ETS),
    ('ETS/DETS', 'C',
     'erlang_vm_dets_tables{instance="$node"}',
     NO_ETS),
    ('Processes', 'A',
     'erlang_vm_process_limit{instance="$node"}',
     NO_PROCESS_LIMIT),
    ('Processes', 'B',
     'erlang_vm_process_count{instance="$node"}'),
    ('Processes', 'C',
     'erlang_vm_statistics_run_queues_length_total{instance="$node"}'),
    ('VM Memory', 'B',
     'erlang_vm_memory_bytes_total{instance="$node", kind="processes"}'),
    ('VM Memory', 'C',
     'erlang_vm_memory_system_bytes_total{instance="$node", usage="atom"}',
     NO_ATOMS),
    ('VM Memory', 'D',
     'erlang_vm_memory_system_bytes_total{instance="$node", usage="binary"}'),
    ('VM Memory', 'E',
     'erlang_vm_memory_system_bytes_total{instance="$node", usage="code"}'),
    ('VM Memory', 'F',
     'erlang_vm_memory_system_bytes_total{instance="$node", usage="ets"}',
     NO_ETS),
    ('VM IO', 'A',
     'irate(erlang_vm_statistics_bytes_output_total{instance="$node"}[$interval])'),
    ('VM IO', 'B',
     'irate(erlang_vm_statistics_bytes_received_total{instance="$node"}[$interval])'),
    ('VM GC', 'A',
     'irate(erlang_vm_statistics_garbage_collection_number_of_gcs{instance="$node"}[$interval])'),
    ('VM GC', 'B',
     'irate(erlang_vm_statistics_garbage_collection_bytes_reclaimed{instance="$node"}[$interval])',
     NO_GC_BYTES),
    ('File Descriptors & Ports', 'A',
     'process_open_fds{instance="$node"}'),
    ('File Descriptors & Ports', 'B',
     'process_max_fds{instance="$node"}'),
    ('File Descriptors & Ports', 'C',
     'erlang_vm_port_limit{instance="$node"}'),
    ('File Descriptors & Ports', 'D',
     'erlang_vm_port_count{instance="$node"}'),
]]

# Dashboard 'Erlang-Distribution', commit 669d1ed79811f654d1253416c444eac9b010a582:
# (panel, refId, expr[, why it is empty here]).
ERLANG_DISTRIBUTION = [Query(*q) for q in [
    ('All distribution links', 'A',
     ('count(erlang_vm_dist_node_state * on(instance, job) group_left(rabbitmq_cluster) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}) OR vector(0)')),
    ('Established distribution links', 'A',
     ('count(erlang_vm_dist_node_state * on(instance, job) group_left(rabbitmq_cluster) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"} == 3) OR vector(0)')),
    ('Connecting distribution links', 'A',
     ('count(erlang_vm_dist_node_state * on(instance, job) group_left(rabbitmq_cluster) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"} == 1) OR vector(0)')),
    ('Waiting distribution links', 'A',
     ('count(erlang_vm_dist_node_state * on(instance, job) group_left(rabbitmq_cluster) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"} == 2) OR vector(0)')),
    ('State of distribution links', 'A',
     ('erlang_vm_dist_node_state{peer!~"rabbitmqcli.*"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Data buffered in the distribution links queue', 'A',
     ('erlang_vm_dist_node_queue_size_bytes * on(instance, job) group_left(rabbitmq_node, '
      'rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Data sent to peer node / s', 'A',
     ('rate(erlang_vm_dist_send_bytes[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Data received from peer node / s', 'A',
     ('rate(erlang_vm_dist_recv_bytes[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Distribution messages sent to peer node / s', 'A',
     ('rate(erlang_vm_dist_send_cnt[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Distribution messages received from peer node / s', 'A',
     ('rate(erlang_vm_dist_recv_cnt[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Average inet packet size sent to peer node', 'A',
     ('(rate(erlang_vm_dist_send_bytes[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}) / (rate(erlang_vm_dist_send_cnt[$__rate_interval]) * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"})'),
     NO_DIST),
    ('Average inet packet size received from peer node', 'A',
     ('(rate(erlang_vm_dist_recv_bytes[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}) / (rate(erlang_vm_dist_recv_cnt[$__rate_interval]) * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"})'),
     NO_DIST),
    ('Memory used by the port driver', 'A',
     ('erlang_vm_dist_port_memory_bytes * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Data in the port driver buffer', 'A',
     ('erlang_vm_dist_port_queue_size_bytes * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Process state', 'A',
     ('erlang_vm_dist_proc_status{type="$erlang_vm_dist_proc_type"} * on(instance, job) '
      'group_left(rabbitmq_node, rabbitmq_cluster) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Messages in the process queue', 'A',
     ('erlang_vm_dist_proc_message_queue_len{type="$erlang_vm_dist_proc_type"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Memory used by the process', 'A',
     ('erlang_vm_dist_proc_memory_bytes{type="$erlang_vm_dist_proc_type"} * on(instance, job) '
      'group_left(rabbitmq_node, rabbitmq_cluster) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
    ('Process reductions / s', 'A',
     ('rate(erlang_vm_dist_proc_reductions{type="$erlang_vm_dist_proc_type"}[$__rate_interval]) * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     NO_DIST),
]]

# Dashboard 'Erlang-Memory-Allocators', commit c0368a0d24f7e6511a1c5aafb3375b4a44da91d3:
# (panel, refId, expr[, why it is empty here]).
ERLANG_MEMORY_ALLOCATORS = [Query(*q) for q in [
    ('Allocated Used', 'A',
     ('sum (erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_endpoint="$endpoint", '
      'rabbitmq_node="$rabbitmq_node"}) / sum (erlang_vm_allocators{usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) * 100')),
    ('Allocated Unused', 'A',
     ('( sum (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) ) / sum '
      '(erlang_vm_allocators{usage="carriers_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) * 100')),
    ('Allocated Used', 'A',
     ('sum (erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('Allocated Unused', 'A',
     ('sum (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('Allocated Total', 'A',
     ('sum (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('Resident Set Size', 'A',
     ('sum (rabbitmq_process_resident_memory_bytes * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('(untitled table in row None)', 'A',
     ('rabbitmq_process_resident_memory_bytes * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}')),
    ('(untitled table in row None)', 'B',
     ('sum (erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('(untitled table in row None)', 'C',
     ('sum (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('(untitled timeseries in row None)', 'A',
     ('rabbitmq_process_resident_memory_bytes * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}')),
    ('(untitled timeseries in row None)', 'B',
     ('sum (erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('(untitled timeseries in row None)', 'C',
     ('sum (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{usage="blocks_size"} * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace", rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('(untitled table in row Allocated by Allocator Type)', 'A',
     ('sum by(alloc) (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('(untitled timeseries in row Allocated by Allocator Type)', 'A',
     ('sum by(alloc) (erlang_vm_allocators{usage="carriers_size"} * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('Multiblock - Utilization', 'A',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="mbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{alloc=~"$memory_allocator", usage="carriers_size", kind="mbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) * 100')),
    ('MB-C', 'A',
     ('sum (erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="carriers"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('MB-B', 'A',
     ('sum (erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="blocks"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_MB_BLOCKS),
    ('Multiblock Pool - Utilization', 'A',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="mbcs_pool"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{alloc=~"$memory_allocator", usage="carriers_size", kind="mbcs_pool"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) * 100'),
     NO_POOL),
    ('MBP-C', 'A',
     ('sum (erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="carriers"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('MBP-B', 'A',
     ('sum (erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="blocks"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('Singleblock - Utilization', 'A',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="sbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{alloc=~"$memory_allocator", usage="carriers_size", kind="sbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) * 100')),
    ('SB-C', 'A',
     ('sum (erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="carriers"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('SB-B', 'A',
     ('sum (erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="blocks"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Usage', 'A',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="mbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Usage', 'B',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="carriers_size", kind="mbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="mbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Usage', 'C',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="mbcs_pool"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('$memory_allocator - Usage', 'D',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="carriers_size", kind="mbcs_pool"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="mbcs_pool"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('$memory_allocator - Usage', 'E',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="sbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Usage', 'F',
     ('sum (erlang_vm_allocators{alloc=~"$memory_allocator", usage="carriers_size", kind="sbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) - sum '
      '(erlang_vm_allocators{alloc=~"$memory_allocator", usage="blocks_size", kind="sbcs"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Average Size', 'A',
     ('sum (erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="carriers"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Average Size', 'B',
     ('sum (erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="blocks"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_MB_BLOCKS),
    ('$memory_allocator - Average Size', 'C',
     ('sum (erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="carriers"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('$memory_allocator - Average Size', 'D',
     ('sum (erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="blocks"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('$memory_allocator - Average Size', 'E',
     ('sum (erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="carriers"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Average Size', 'F',
     ('sum (erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="blocks"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Average Size', 'A',
     ('sum (erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="blocks"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_MB_BLOCKS),
    ('$memory_allocator - Average Size', 'B',
     ('sum (erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs", alloc="$memory_allocator", usage="carriers"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Average Size', 'C',
     ('sum (erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="blocks"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('$memory_allocator - Average Size', 'D',
     ('sum (erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="mbcs_pool", alloc="$memory_allocator", usage="carriers"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})'),
     NO_POOL),
    ('$memory_allocator - Average Size', 'E',
     ('sum (erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="blocks_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="blocks"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
    ('$memory_allocator - Average Size', 'F',
     ('sum (erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="carriers_size"} * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"}) / sum '
      '(erlang_vm_allocators{kind="sbcs", alloc="$memory_allocator", usage="carriers"} * on(instance, '
      'job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint", rabbitmq_node="$rabbitmq_node"})')),
]]

# Dashboard 'Erlang-Distributions-Compare', commit 669d1ed79811f654d1253416c444eac9b010a582:
# (panel, refId, expr[, why it is empty here]).
ERLANG_DISTRIBUTIONS_COMPARE = [Query(*q) for q in [
    ('Erlang Distribution outgoing traffic / s', 'A',
     ('rate(erlang_vm_dist_send_bytes[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster=~"$rabbitmq_cluster", namespace="$namespace", '
      'rabbitmq_endpoint="$endpoint"}'),
     ENDPOINT_TYPO),
    ('Network incoming traffic / s', 'A',
     'sum by(instance) (rate(node_network_receive_bytes_total{instance=~"$host"}[$__rate_interval]))',
     NOT_LEVERET),
    ('Network incoming traffic / s', 'B',
     'sum by(name) (rate(container_network_receive_bytes_total{name=~"$container"}[$__rate_interval]))',
     NOT_LEVERET),
    ('Network outgoing traffic / s', 'A',
     'sum by(instance) (rate(node_network_transmit_bytes_total{instance=~"$host"}[$__rate_interval]))',
     NOT_LEVERET),
    ('Network outgoing traffic / s', 'B',
     ('sum by(name) '
      '(rate(container_network_transmit_bytes_total{name=~"$container"}[$__rate_interval]))'),
     NOT_LEVERET),
    ('CPU', 'A',
     ('(max by (instance) (irate(node_cpu_seconds_total{job="node", mode=~"user|system|iowait|softirq", '
      'instance=~"$host"}[$__rate_interval])) * 100)'),
     NOT_LEVERET),
    ('CPU', 'B',
     ('sum by(name) (irate(container_cpu_usage_seconds_total{name=~"$container"}[$__rate_interval])) * '
      '100'),
     NOT_LEVERET),
    ('Messages published / s', 'A',
     'perftest_published{instance=~"$instance"}',
     NOT_LEVERET),
    ('Messages consumed / s', 'A',
     'perftest_consumed{instance=~"$instance"}',
     NOT_LEVERET),
    ('End-to-end message latency', 'A',
     'perftest_latency_seconds{quantile="$percentile", instance=~"$instance"}',
     NOT_LEVERET),
    ('End-to-end message latency distribution', 'A',
     'perftest_latency_seconds{quantile="$percentile", instance=~"$instance"}',
     NOT_LEVERET),
]]

# Dashboard 'RabbitMQ-Quorum-Queues-Raft', commit 669d1ed79811f654d1253416c444eac9b010a582:
# (panel, refId, expr[, why it is empty here]).
QUORUM_QUEUES_RAFT = [Query(*q) for q in [
    ('Log entries committed / s', 'A',
     ('sum(rate(rabbitmq_raft_log_commit_index[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)')),
    ('Log entries committed / s', 'RabbitMQ 4.2+',
     ('sum(rate(rabbitmq_raft_commit_index[$__rate_interval]) * on(instance, job) '
      'group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)')),
    ('Log entry commit latency', 'A',
     ('rabbitmq_raft_commit_latency_seconds * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}'),
     NO_COMMIT_LATENCY),
    ('Uncommitted log entries', 'A',
     ('sum( (rabbitmq_raft_log_last_written_index * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - (rabbitmq_raft_log_commit_index * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) ) by(rabbitmq_node)')),
    ('Uncommitted log entries', 'RabbitMQ 4.2+',
     ('sum( (rabbitmq_raft_last_written_index * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - (rabbitmq_raft_commit_index * '
      'on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) ) by(rabbitmq_node)')),
    ('Leader elections / s', 'A',
     ('sum(rate(rabbitmq_raft_term[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)')),
    ('Raft members with >5k entries in the log', 'A',
     ('sum( (rabbitmq_raft_log_last_written_index * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - (rabbitmq_raft_log_snapshot_index * '
      'on(instance) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) ) by(queue, rabbitmq_node)')),
    ('Raft members with >5k entries in the log', 'RabbitMQ 4.2+',
     ('sum( (rabbitmq_raft_last_written_index * on(instance, job) group_left(rabbitmq_cluster, '
      'rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - (rabbitmq_raft_snapshot_index * '
      'on(instance) group_left(rabbitmq_cluster, rabbitmq_node) '
      'rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
      'namespace="$namespace",rabbitmq_endpoint="$endpoint"}) ) by(queue, rabbitmq_node)')),
]]

DASHBOARDS = [
    Dashboard("Erlang-BEAM", [("node", "label_values(erlang_vm_process_count, instance)"),
                              ("interval", "5m")], ERLANG_BEAM),
    Dashboard("Erlang-Distribution", [
        *IDENTITY_VARIABLES,
        ("erlang_vm_dist_proc_type", "label_values(erlang_vm_dist_proc_status, type)")], ERLANG_DISTRIBUTION),
    Dashboard("Erlang-Memory-Allocators", [
        *IDENTITY_VARIABLES[:2],
        ("rabbitmq_node", ('label_values(rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", '
                           'namespace="$namespace"}, rabbitmq_node)')),
        IDENTITY_VARIABLES[2],
        ("memory_allocator", "label_values(erlang_vm_allocators, alloc)")], ERLANG_MEMORY_ALLOCATORS),
    Dashboard("Erlang-Distributions-Compare", [
        *IDENTITY_VARIABLES[:2],
        ("Endpoint", IDENTITY_VARIABLES[2][1]),
        ("instance", "label_values(perftest_published, instance)"),
        ("percentile", "label_values(perftest_latency_seconds, quantile)"),
        ("host", "label_values(node_network_info, instance)"),
        ("container", "label_values(container_network_receive_bytes_total, name)"),
    ], ERLANG_DISTRIBUTIONS_COMPARE),
    # The dashboard lists endpoint before rabbitmq_cluster, which it reads: Grafana refreshes it after.
    Dashboard("RabbitMQ-Quorum-Queues-Raft", IDENTITY_VARIABLES, QUORUM_QUEUES_RAFT),
]
QUORUM_QUEUE = "grafana.qq"
PUBLISHED, ACKED = 20, 8


def drive_traffic(params: pika.ConnectionParameters) -> pika.BlockingConnection:
    """Confirmed persistent publishes to a quorum queue, some fetched and acknowledged (the rest stay), and
    the same to a classic queue, which the Raft families must leave out. The connection stays open."""
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUORUM_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare("grafana.classic", durable=True)
    for q in (QUORUM_QUEUE, "grafana.classic"):
        for i in range(PUBLISHED):
            ch.basic_publish("", q, f"m{i}".encode() * 100, pika.BasicProperties(delivery_mode=2))
        for _ in range(ACKED):
            method, _props, _body = ch.basic_get(q)
            assert method is not None
            ch.basic_ack(method.delivery_tag)
    return conn


class Scraped(NamedTuple):
    prom: Prom
    metrics_port: int


@pytest.fixture(scope="module")
def scraped() -> Iterator[Scraped]:
    with scraped_broker("leveret-grafana-qq-", drive_traffic, "max(rabbitmq_raft_log_last_written_index)",
                        PUBLISHED + ACKED, timeout=20) as (p, port):
        yield Scraped(p, port)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's substitution: $name of a known variable or built-in; any other $name stays as written."""
    return re.sub(r"\$(\w+)", lambda m: values.get(m[1], m[0]), expr)


def resolve(prom: Prom, dashboard: Dashboard) -> dict[str, str]:
    values = dict(BUILTINS)
    for name, query in dashboard.variables:
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query, re.DOTALL)
        if m is None:
            values[name] = query  # an interval or custom variable: its current value
            continue
        found = prom.label_values(substitute(m[1], values), m[2])
        values[name] = found[0] if found else ""
    return values


def evaluate(prom: Prom, dashboard: Dashboard) -> tuple[list[str], list[str]]:
    """(expressions that should return data and do not, listed ones that return data after all)."""
    values = resolve(prom, dashboard)
    missing, listed_but_found = [], []
    for q in dashboard.queries:
        expr = substitute(q.expr, values)
        result = prom.query(expr)
        seen = [float(s["value"][1]) for s in result]
        where = f"{dashboard.name} / {q.panel} [{q.ref}] -> {seen or 'no series'}: {expr}"
        if q.empty_because:
            if result:
                listed_but_found.append(where)
        elif not result or any(math.isnan(v) for v in seen):
            missing.append(where)
    return missing, listed_but_found


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=[d.name for d in DASHBOARDS])
def test_dashboard_expressions_return_data(scraped, dashboard):
    missing, listed_but_found = evaluate(scraped.prom, dashboard)
    total = len(dashboard.queries)
    assert missing == [], f"{len(missing)} of {total} returned nothing:\n" + "\n".join(missing)
    assert listed_but_found == [], "listed as empty here but return data:\n" + "\n".join(listed_but_found)


def test_the_lists_cover_the_dashboards():
    # Every panel expression of each dashboard is listed (once); the counts are those of the commits named.
    counts = {d.name: (len(d.queries), sum(1 for q in d.queries if not q.empty_because)) for d in DASHBOARDS}
    assert counts == {"Erlang-BEAM": (25, 15), "Erlang-Distribution": (18, 4),
                      "Erlang-Memory-Allocators": (41, 29), "Erlang-Distributions-Compare": (11, 0),
                      "RabbitMQ-Quorum-Queues-Raft": (8, 7)}


def scrape(port: int, path: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The broker's exposition at ``path``: sample name -> {sorted labels: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        text = r.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def test_raft_indexes_count_the_quorum_queue_traffic(scraped):
    # Per quorum queue on /metrics/per-object: written = publishes + acks, all committed (every publish was
    # confirmed), the snapshot index below the messages still held, term 1; the classic queue is not there.
    per_object = scrape(scraped.metrics_port, "/metrics/per-object")
    key = (("queue", QUORUM_QUEUE), ("vhost", "/"))
    written = PUBLISHED + ACKED
    expected = {"rabbitmq_raft_log_last_written_index": written, "rabbitmq_raft_last_written_index": written,
                "rabbitmq_raft_log_commit_index": written, "rabbitmq_raft_commit_index": written,
                "rabbitmq_raft_log_last_applied_index": written, "rabbitmq_raft_last_applied": written,
                "rabbitmq_raft_log_snapshot_index": written - (PUBLISHED - ACKED),
                "rabbitmq_raft_snapshot_index": written - (PUBLISHED - ACKED), "rabbitmq_raft_term": 1}
    assert {name: per_object[name] for name in expected} == {name: {key: v} for name, v in expected.items()}
    # /metrics sums over the node's quorum queues: here the one queue.
    aggregated = scrape(scraped.metrics_port, "/metrics")
    assert {name: aggregated[name] for name in expected} == {name: {(): v} for name, v in expected.items()}


def test_runtime_figures_are_the_process_readings(scraped):
    samples = scrape(scraped.metrics_port, "/metrics")
    one = {name: next(iter(values.values())) for name, values in samples.items() if len(values) == 1}
    # Ports are file descriptors; the memory kinds add up to no more than the resident memory.
    assert one["erlang_vm_port_count"] == one["process_open_fds"] == one["rabbitmq_process_open_fds"]
    assert one["erlang_vm_port_limit"] == one["process_max_fds"] == one["rabbitmq_process_max_fds"]
    kinds = samples["erlang_vm_memory_bytes_total"]
    assert sum(kinds.values()) <= one["rabbitmq_process_resident_memory_bytes"] * 1.1
    assert kinds[(("kind", "processes"),)] > 0
    # The quorum and classic queues hold (PUBLISHED - ACKED) bodies of 200 bytes each, at least, in RAM.
    binary = samples["erlang_vm_memory_system_bytes_total"][(("usage", "binary"),)]
    assert binary >= 2 * (PUBLISHED - ACKED) * 200
    allocators = samples["erlang_vm_allocators"]
    heap = (("alloc", "glibc_malloc"), ("instance_no", "0"), ("kind", "mbcs"))
    used = allocators[(*heap, ("usage", "blocks_size"))]
    held = allocators[(*heap, ("usage", "carriers_size"))]
    assert 0 < used <= held
    assert one["erlang_vm_process_count"] >= 1  # the scrape's own handler is a task
    assert one["erlang_vm_statistics_runtime_milliseconds"] > 0
    assert one["erlang_vm_statistics_garbage_collection_number_of_gcs"] > 0
    assert one["erlang_vm_statistics_bytes_received_total"] > 0
