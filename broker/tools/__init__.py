"""Command-line tools that ship with the broker but are not the server: ``leveret ctl`` and ``leveret
diagnostics`` (the ctl/ package: rabbitmqctl's verbs and rabbitmq-diagnostics' checks over the HTTP API), the
container's health check (healthcheck.py, ``python -m broker.tools.healthcheck``) and ``leveret perf``
(perf.py, a PerfTest-like load generator for any AMQP 0-9-1 broker, with its raw client amqp_client.py, its
fake broker perf_sink.py and its /proc sampler procstat.py). They import nothing of broker/ but its
configuration (broker/config.py). bench/, which drives perf through the benchmark scenarios, stays in the
source checkout and out of the wheel."""
