# Leveret: `make run` starts the broker with its defaults, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-tools test-rabbitmq lint clean

# Byte code is written (and then read) even where the environment says not to (PYTHONDONTWRITEBYTECODE=1, as the
# development machine's image sets): the suite starts hundreds of brokers and tools and five pytest collections, and
# without __pycache__ each broker start compiles broker/ again (~0.4 s of CPU) and each collection rewrites and
# compiles every test module again (~10 s of CPU). __pycache__ is git-ignored.
unexport PYTHONDONTWRITEBYTECODE

# `make run` installs the broker and what it needs at run time; `make test` adds the test tools (pytest, the
# client libraries, Playwright, the linters: several hundred MB more).
RUN_STAMP := $(VENV)/.installed-run
$(RUN_STAMP): pyproject.toml setup.py protocol/_codec.pyx
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

# The dev extra's requirements, read from pyproject.toml, installed as a list: `pip install -e '.[dev]'` would
# build the editable leveret again (the compiled codec: ~9 s of a fresh clone's set-up) for nothing.
$(STAMP): $(RUN_STAMP)
	$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]))' > $(VENV)/dev-requirements.txt
	$(BIN)/python -m pip install -q -r $(VENV)/dev-requirements.txt
	touch $(STAMP)

# The Spark side (pipeline/: its own distribution, pyspark 4.3, about 500 MB), which tests/pipeline drives;
# `make run` does not need it. Installed in "compat" editable mode (a path entry): Spark finds `pyspark_*` data
# source modules with pkgutil.iter_modules, which does not see setuptools' default editable import hook.
# --no-compile: pip would byte-compile all of pyspark, pandas and matplotlib (12 of the 30 s this install takes);
# the modules the tests import are compiled when first imported, into the same __pycache__.
PIPELINE_STAMP := $(VENV)/.pipeline-installed
$(PIPELINE_STAMP): $(RUN_STAMP) pipeline/pyproject.toml
	$(BIN)/python -m pip install -q --no-compile -e pipeline --config-settings editable_mode=compat
	touch $(PIPELINE_STAMP)

# `make run PORT=5673 MANAGEMENT_PORT=15673 PROMETHEUS_PORT=15693 BIND=0.0.0.0 DATA_DIR=/srv/leveret`;
# LEVERET_* environment variables (e.g. LEVERET_LISTENERS_TCP_DEFAULT) work as well.
RUN_ARGS := $(if $(PORT),--port $(PORT)) $(if $(BIND),--bind $(BIND)) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) \
	$(if $(MANAGEMENT_PORT),--management-port $(MANAGEMENT_PORT)) \
	$(if $(PROMETHEUS_PORT),--prometheus-port $(PROMETHEUS_PORT)) $(if $(CONFIG),--config $(CONFIG))

run: $(RUN_STAMP)
	$(BIN)/leveret serve $(RUN_ARGS)

# The Spark side alone, for the worked example (`leveret-pipeline`, pipeline/README.md) beside `make run`.
.PHONY: pipeline
pipeline: $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e pipeline --config-settings editable_mode=compat
	touch $(PIPELINE_STAMP)

# The system tools the tests use (network namespaces, tmpfs and loop-mounted ext4 images; Java 17 for Spark;
# libfaketime, which the faketime package brings, for the broker's wall-clock jumps; RabbitMQ 3.10, the other end
# of the shovel tests; strace, whose fault injection gives one broker a slow or failing disk), installed from
# Debian when missing (they are on the usual machine already). Installing rabbitmq-server starts Debian's own
# node on 5672: it is stopped and disabled, the tests start nodes of their own.
TEST_TOOLS := ip:iproute2 mkfs.ext4:e2fsprogs e2fsck:e2fsprogs losetup:mount mount:mount \
	java:openjdk-17-jre-headless faketime:faketime prometheus:prometheus chromium:chromium \
	rabbitmq-server:rabbitmq-server strace:strace

# PostgreSQL for the cluster tests (tests/pg_server.py starts its own server): Debian keeps initdb off PATH, in
# /usr/lib/postgresql/VERSION/bin.
test-tools:
	@missing=""; for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; fi; \
	case "$$missing" in *rabbitmq-server*) service rabbitmq-server stop >/dev/null 2>&1 || true; \
	  update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true;; esac

# The suite in parallel (pytest-xdist; tests/worker_resources.py gives each worker its own ports and subnets):
# WORKERS processes. The integration tests mostly wait on sockets, fsync and their own brokers, so more workers
# than cores win: on 2 cores, fresh-clone `bash .ci/run`s at 5c6371d took 996 s with 4 (parallel pass 862 s),
# 917 s with 5 (789 s) and 871 s with 6 up to a failure at the end of a parallel pass of 821 s (a cluster
# test's 15 s bound, under that load); with 4 the cores idled through ~60 s where every worker sat in a waiting
# test (the delayed lane's clock tests, the metadata-loss tests). Tests marked `serial`
# measure rates or timing that the parallel pass's load would distort: they run afterwards, SERIAL_WORKERS side
# by side (they mostly wait: three keep half of the 2 cores idle, 57 s; four took 69 s in a slower run; their
# figures stay far inside their bounds; 2 min 8 s one at a time).
# The lint (ruff, the import-linter layer contracts, mypy: ~20 s, mostly one core) runs beside the parallel pass,
# its output shown after it; a lint failure fails the suite. Then the quorum-queue tests again against a
# two-member cluster on PostgreSQL (tests/conftest.py, LEVERET_TEST_CLUSTER: each new connection of a test on the
# next member). Each pass ends with its time per lane.
WORKERS ?= 5
SERIAL_WORKERS ?= 3
PYTEST_PARALLEL := $(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup
LINT_LOG := .lint.log
test: $(STAMP) $(PIPELINE_STAMP) test-tools
	@$(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & lint=$$!; \
	$(PYTEST_PARALLEL) -m 'not long and not serial'; passed=$$?; \
	wait $$lint; linted=$$?; cat $(LINT_LOG); \
	[ $$linted -eq 0 ] || echo "make test: the lint failed (above)"; \
	[ $$passed -eq 0 ] && [ $$linted -eq 0 ]
	$(BIN)/python -m pytest -n $(SERIAL_WORKERS) --dist loadgroup -m 'serial and not long'
	LEVERET_TEST_CLUSTER=2 $(PYTEST_PARALLEL) -m 'quorum and not long' tests/integration

# The fast lane while you work: the unit tests and the core integration lane (tests/integration/core), in
# parallel, in about two minutes on 2 cores. One file or test: `.venv/bin/python -m pytest tests/integration/core/test_basic.py`.
test-fast: $(STAMP)
	$(PYTEST_PARALLEL) -m 'not long and not serial' tests/unit tests/integration/core

# The integration tests against a real RabbitMQ (installs and starts one on its own ports; not part of CI).
test-rabbitmq: $(STAMP)
	bash tests/rabbitmq/run-against-rabbitmq.sh

# ruff; the import layers of pyproject.toml's [tool.importlinter] (lint-imports); the types ([tool.mypy]).
# `python tests/import_graph.py` prints the import graph and any cycle the layers contract reports. The contracts
# cover pipeline/ too, so lint needs the Spark side installed.
lint: $(STAMP) $(PIPELINE_STAMP)
	$(BIN)/ruff check protocol broker storage tests pipeline
	$(BIN)/lint-imports
	$(BIN)/mypy

# The long lanes (pytest -m long: 100 kill -9 rounds, 1 M fuzzed codec inputs per target, 1 M fuzzed frames
# against a live broker), then a table of each lane's rounds, confirmed, lost and duplicated
# (tests/soak_report.py). Fails if a test failed or a lane lost or duplicated a message. SOAK_ARGS narrows it,
# e.g. `make soak SOAK_ARGS=tests/integration/test_live_fuzz.py`.
.PHONY: soak
soak: $(STAMP)
	@report=$$(mktemp); status=0; \
	LEVERET_SOAK_REPORT=$$report $(BIN)/python -m pytest -m long $(SOAK_ARGS) || status=$$?; \
	$(BIN)/python tests/soak_report.py $$report || status=1; rm -f $$report; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .import_linter_cache leveret-data

# The benchmark against RabbitMQ (bench/README.md): `make bench` runs S1–S10 in full, `make bench QUICK=1`
# in a few minutes; results go to bench/RESULTS.md.
.PHONY: bench
bench: $(STAMP)
	QUICK=$(QUICK) $(BIN)/python -m bench.run_bench $(BENCH_ARGS)

# Cost curves of issue 19 (bench/cost_curves.py): RSS/CPU per queue, connection, binding and pending message,
# start-up time against messages on disk, fan-out; `QUICK=1` for the small sizes; into bench/RESULTS.md.
.PHONY: bench-curves
bench-curves: $(STAMP)
	QUICK=$(QUICK) $(BIN)/python -m bench.cost_curves $(CURVES_ARGS)
