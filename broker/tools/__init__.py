"""Command-line tools that ship with the broker but are not the server: ``leveret perf`` (perf.py, a
PerfTest-like load generator for any AMQP 0-9-1 broker, with its raw client amqp_client.py, its fake broker
perf_sink.py and its /proc sampler procstat.py). They import nothing else of broker/. bench/, which drives them
through the benchmark scenarios, stays in the source checkout and out of the wheel."""
