"""bench/flamegraph.py's summary of py-spy's raw stacks: only the named thread counts, and a function's own
samples are those where it is the innermost frame (whatever line of it)."""

from __future__ import annotations

from bench.flamegraph import own_samples

RAW = """\
thread (0x1): MainThread;run (uvloop/__init__.py:92);Reader._take (broker/amqp/reader.py:253);encode (x.py:3) 5
thread (0x1): MainThread;run (uvloop/__init__.py:92);Reader._take (broker/amqp/reader.py:260) 2
thread (0x1): MainThread;run (uvloop/__init__.py:92);Reader._take (broker/amqp/reader.py:253);encode (x.py:9) 1
thread (0x2): leveret-fsync;Syncer._fsync (storage/syncer.py:254) 40
"""


def test_counts_the_main_thread_and_each_functions_own_samples():
    total, top = own_samples(RAW)
    assert total == 8
    assert top == [(6, "encode (x.py)"), (2, "Reader._take (broker/amqp/reader.py)")]


def test_another_thread_by_name():
    assert own_samples(RAW, "leveret-fsync") == (40, [(40, "Syncer._fsync (storage/syncer.py)")])
