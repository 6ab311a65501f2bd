"""The runtime families RabbitMQ's stock Erlang dashboards read ("Erlang-BEAM", "Erlang-Memory-Allocators",
"Erlang-Distribution") and the Raft families of "RabbitMQ-Quorum-Queues-Raft", as Leveret can honestly
fill them: Leveret is one Python process, not an Erlang VM, so each help text says what the figure is here.

Everything is read when Prometheus scrapes (broker/prometheus/metrics.py calls :func:`runtime_families` and
:func:`raft_families`), from /proc, ``resource``, ``gc`` and glibc's ``malloc_info``; nothing is counted
per message, and tracemalloc stays off.

Runtime (every endpoint, one unlabelled series each; names and labels of prometheus.erl's VM collectors):

- ``erlang_vm_process_count``: asyncio tasks alive; ``erlang_vm_statistics_run_queues_length`` (and
  ``_total``): the process's threads that are running or runnable; ``erlang_vm_statistics_context_switches``
  and ``erlang_vm_statistics_runtime_milliseconds`` from ``getrusage``;
  ``erlang_vm_statistics_bytes_output_total`` / ``_received_total``: bytes written and read through system
  calls (/proc/self/io ``wchar`` / ``rchar``: sockets and files, as Erlang's ports count both);
  ``erlang_vm_statistics_garbage_collection_number_of_gcs``: the collections of Python's cyclic collector.
- ``erlang_vm_memory_bytes_total{kind}``: ``processes`` is the resident anonymous memory (the Python heap:
  objects, message bodies), ``system`` the resident file-backed and shared memory;
  ``erlang_vm_memory_system_bytes_total{usage}``: ``code`` (resident file-backed pages: the interpreter and
  its libraries) and ``binary`` (message bodies the queues hold in RAM).
- ``erlang_vm_port_count`` / ``erlang_vm_port_limit`` and ``process_open_fds`` / ``process_max_fds``: open
  file descriptors (sockets, files, pipes: what Erlang's ports are) and their limit.
- ``erlang_vm_allocators{alloc="glibc_malloc", kind, usage}``: glibc's heaps as Erlang's multiblock carriers
  (``mbcs``: carriers = heaps, sizes = bytes the heaps hold / bytes in use) and its mmapped chunks as
  single-block carriers (``sbcs``: one block per carrier). Python's small-object arenas are mapped by
  CPython itself and are not in these figures (they are in the resident memory).

Not exported, as nothing in Leveret measures them: ``erlang_vm_process_limit`` (no task limit), reductions,
dirty run queues, ETS/DETS tables, bytes reclaimed by GC (Python counts objects, not bytes), the ``blocks``
count of ``mbcs`` (glibc does not count the chunks in use) and ``mbcs_pool`` (glibc has no pool). The
``erlang_vm_dist_*`` families have no series: Leveret nodes have no links to each other (cluster members
meet in PostgreSQL, broker/clustering/cluster.py), and a single node has no peers.

Raft (per quorum queue on ``/metrics/per-object``, labels ``vhost``, ``queue``; summed on ``/metrics``, as
RabbitMQ's aggregated endpoint summed ``rabbitmq_raft_log_*``): Leveret's quorum queues keep no Raft log
(their messages are in the node's store, or in PostgreSQL in a cluster), so the indexes count what would be
its entries: the queue's publishes plus its acknowledgements since the node started. Both RabbitMQ's
names before 4.2 (``rabbitmq_raft_log_*_index``) and since (``rabbitmq_raft_*_index``, ``_last_applied``).
``rabbitmq_raft_term`` is 1: there is no leader election. The commit latency is not exported (Leveret does
not time its fsyncs or PostgreSQL commits).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import re
import resource
import threading
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from broker.resources.os_probes import max_fds, open_fds


class RaftFigures(NamedTuple):
    """One quorum queue's figures the Raft families are made of (read by broker/prometheus/metrics.py)."""

    vhost: str
    queue: str
    published: int  # messages published to the queue since the node started
    acked: int  # acknowledgements it took since the node started
    unconfirmed: int  # confirmed publishes still waiting for their fsync (or PostgreSQL commit)
    messages: int  # messages it holds (ready and unacknowledged)


# -- runtime -------------------------------------------------------------------------------------------
def runtime_families(ram_body_bytes: int) -> Iterator[Metric]:
    """The erlang_vm_* and process_* families; ``ram_body_bytes``: message bodies the queues hold in RAM."""
    tasks = _task_count()
    if tasks is not None:
        yield _gauge("erlang_vm_process_count", "The number of processes currently existing (Leveret: "
                     "asyncio tasks alive in the broker's event loop)", tasks)
    runnable = _runnable_threads()
    for name in ("erlang_vm_statistics_run_queues_length", "erlang_vm_statistics_run_queues_length_total"):
        yield _gauge(name, "The total length of the run-queues (Leveret: threads of the broker process that "
                     "are running or runnable, state R in /proc/self/task)", runnable)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    yield _untyped("erlang_vm_statistics_context_switches", "Total number of context switches (Leveret: the "
                   "process's voluntary and involuntary context switches, getrusage; a counter)",
                   usage.ru_nvcsw + usage.ru_nivcsw)
    yield _untyped("erlang_vm_statistics_runtime_milliseconds", "The sum of the runtime for all threads "
                   "(Leveret: CPU time, user and system, of all the process's threads, in milliseconds; a "
                   "counter)",
                   round((usage.ru_utime + usage.ru_stime) * 1000))
    io = _proc_io()
    if io:
        yield _counter("erlang_vm_statistics_bytes_output", "Total number of bytes output to ports (Leveret: "
                       "bytes the process wrote through system calls, to sockets and files; /proc/self/io "
                       "wchar)", io.get("wchar", 0))
        yield _counter("erlang_vm_statistics_bytes_received", "Total number of bytes received through ports "
                       "(Leveret: bytes the process read through system calls, from sockets and files; "
                       "/proc/self/io rchar)", io.get("rchar", 0))
    yield _untyped("erlang_vm_statistics_garbage_collection_number_of_gcs", "Garbage collection: number of "
                   "GCs (Leveret: collections of Python's cyclic garbage collector, all generations; a "
                   "counter)",
                   sum(g["collections"] for g in gc.get_stats()))
    yield from _memory(ram_body_bytes)
    fds, fd_limit = open_fds(), max_fds()
    yield _gauge("process_open_fds", "Number of open file descriptors", fds)
    yield _gauge("process_max_fds", "Maximum number of open file descriptors", fd_limit)
    yield _gauge("erlang_vm_port_count", "The number of ports currently existing (Leveret: open file "
                 "descriptors: sockets, files, pipes)", fds)
    yield _gauge("erlang_vm_port_limit", "The maximum number of simultaneously existing ports (Leveret: the "
                 "open file descriptors limit)", fd_limit)
    yield from _allocators()


def _task_count() -> int | None:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (a render outside the broker, in a unit test)
        return None


def _runnable_threads() -> int:
    count = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return threading.active_count()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        # The state follows the parenthesised name, which may itself contain parentheses.
        if stat[stat.rfind(b")") + 2: stat.rfind(b")") + 3] == b"R":
            count += 1
    return count


def _proc_io() -> dict[str, int]:
    try:
        with open("/proc/self/io", "rb") as f:
            lines = f.read().decode().splitlines()
    except OSError:
        return {}
    return {k: int(v) for k, _, v in (line.partition(": ") for line in lines) if v.strip().isdigit()}


def _proc_status_kb(*keys: str) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f.read().decode().splitlines():
                key, _, value = line.partition(":")
                if key in keys:
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def _memory(ram_body_bytes: int) -> Iterator[Metric]:
    rss = _proc_status_kb("RssAnon", "RssFile", "RssShmem")
    if not rss:
        return
    kinds = GaugeMetricFamily("erlang_vm_memory_bytes_total", "The total amount of memory currently "
                              "allocated (Leveret: resident memory; processes = anonymous memory, the Python "
                              "heap with its objects and message bodies; system = file-backed and shared "
                              "memory)", labels=["kind"])
    kinds.add_metric(["processes"], rss.get("RssAnon", 0))
    kinds.add_metric(["system"], rss.get("RssFile", 0) + rss.get("RssShmem", 0))
    yield kinds
    system = GaugeMetricFamily("erlang_vm_memory_system_bytes_total", "The total amount of memory "
                               "currently allocated for the emulator (Leveret: code = resident file-backed "
                               "pages, the interpreter and its libraries; binary = message bodies the queues "
                               "hold in RAM)", labels=["usage"])
    system.add_metric(["code"], rss.get("RssFile", 0))
    system.add_metric(["binary"], ram_body_bytes)
    yield system


# glibc's malloc_info(3) writes XML; the totals follow the last <heap>.
_HEAP = re.compile(rb'<heap nr="\d+">')
_TOTAL = re.compile(rb'<total type="(\w+)" count="(\d+)" size="(\d+)"/>')
_SYSTEM = re.compile(rb'<system type="current" size="(\d+)"/>')


def malloc_info() -> bytes:
    """glibc's ``malloc_info(0, …)`` report (about 100 µs); empty where glibc is not the C library."""
    try:
        libc = ctypes.CDLL(None)
        open_memstream, info, fclose, free = libc.open_memstream, libc.malloc_info, libc.fclose, libc.free
    except (OSError, AttributeError):
        return b""
    open_memstream.restype = ctypes.c_void_p
    open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fclose.argtypes = [ctypes.c_void_p]
    free.argtypes = [ctypes.c_void_p]
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return b""
    info(0, stream)
    fclose(stream)
    try:
        return ctypes.string_at(buf, size.value)
    finally:
        free(buf)


def _allocators() -> Iterator[Metric]:
    report = malloc_info()
    tail = report[report.rfind(b"</heap>"):]
    totals = {m[1]: (int(m[2]), int(m[3])) for m in _TOTAL.finditer(tail)}
    current = _SYSTEM.search(tail)
    if current is None or b"mmap" not in totals:
        return
    free = totals.get(b"fast", (0, 0))[1] + totals.get(b"rest", (0, 0))[1]
    held = int(current[1])
    mmaps, mmapped = totals[b"mmap"]
    family = GaugeMetricFamily("erlang_vm_allocators", "Allocated (carriers_size) and used (blocks_size) "
                               "memory for the different allocators in the VM (Leveret: glibc's malloc; mbcs "
                               "= its heaps (carriers = heaps), sbcs = its mmapped chunks, one block each; "
                               "from malloc_info(3))", labels=["alloc", "instance_no", "kind", "usage"])
    for kind, usage, value in (("mbcs", "carriers", len(_HEAP.findall(report))),
                               ("mbcs", "carriers_size", held), ("mbcs", "blocks_size", held - free),
                               ("sbcs", "carriers", mmaps), ("sbcs", "carriers_size", mmapped),
                               ("sbcs", "blocks", mmaps), ("sbcs", "blocks_size", mmapped)):
        family.add_metric(["glibc_malloc", "0", kind, usage], value)
    yield family


# -- Raft ----------------------------------------------------------------------------------------------
RAFT_HELP = ("(Leveret keeps no Raft log: an entry here is one publish or acknowledgement the quorum queue "
             "took since the node started)")


def raft_families(queues: Iterable[RaftFigures], per_object: bool) -> Iterator[Metric]:
    """rabbitmq_raft_* of the quorum queues: per queue (labels vhost, queue), or summed over the node."""
    labels = ["vhost", "queue"] if per_object else []
    names = {
        "written": (("rabbitmq_raft_log_last_written_index", "rabbitmq_raft_last_written_index"),
                    "Raft log last written index " + RAFT_HELP),
        "committed": (("rabbitmq_raft_log_commit_index", "rabbitmq_raft_commit_index"),
                      "Raft log commit index " + RAFT_HELP + "; the last written index less the confirmed "
                      "publishes still waiting for their fsync or PostgreSQL commit"),
        "applied": (("rabbitmq_raft_log_last_applied_index", "rabbitmq_raft_last_applied"),
                    "Raft log last applied index " + RAFT_HELP + "; the commit index: a queue applies an "
                    "entry when it takes it"),
        "snapshot": (("rabbitmq_raft_log_snapshot_index", "rabbitmq_raft_snapshot_index"),
                     "Raft log snapshot index " + RAFT_HELP + "; the last written index less the messages "
                     "the queue still holds, which are the entries a log would have to keep"),
    }
    families = {key: [GaugeMetricFamily(name, help_, labels=labels) for name in pair]
                for key, (pair, help_) in names.items()}
    term = GaugeMetricFamily("rabbitmq_raft_term", "Current Raft term number (Leveret: always 1, a quorum "
                             "queue has no leader election)", labels=labels)
    sums = dict.fromkeys(families, 0)
    for q in queues:
        written = q.published + q.acked
        committed = max(0, written - q.unconfirmed)
        values = {"written": written, "committed": committed, "applied": committed,
                  "snapshot": max(0, min(committed, written - q.messages))}
        if per_object:
            for key, value in values.items():
                for family in families[key]:
                    family.add_metric([q.vhost, q.queue], value)
            term.add_metric([q.vhost, q.queue], 1)
        else:
            for key, value in values.items():
                sums[key] += value
    if not per_object:
        for key, value in sums.items():
            for family in families[key]:
                family.add_metric([], value)
        term.add_metric([], 1)
    for pair in families.values():
        yield from pair
    yield term


def _gauge(name: str, help_: str, value: float) -> Metric:
    g = GaugeMetricFamily(name, help_)
    g.add_metric([], value)
    return g


def _counter(name: str, help_: str, value: float) -> Metric:
    c = CounterMetricFamily(name, help_)
    c.add_metric([], value)
    return c


def _untyped(name: str, help_: str, value: float) -> Metric:
    """A family exposed under exactly ``name`` (prometheus.erl's counters have no ``_total``, which
    prometheus-client would add to a counter): typed untyped, its help saying it is a counter."""
    m = Metric(name, help_, "unknown")
    m.add_sample(name, {}, value)
    return m
