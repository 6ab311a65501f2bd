"""Leveret's benchmark: a PerfTest-like load generator (broker.tools.perf) and the S1–S7 comparison with RabbitMQ
(bench.run_bench, ``make bench``)."""
