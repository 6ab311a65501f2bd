# Leveret: `make run` starts the broker with its defaults, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-tools test-rabbitmq lint clean

$(STAMP): pyproject.toml setup.py protocol/_codec.pyx
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The Spark side (pipeline/: its own distribution, pyspark 4.3, about 500 MB), which tests/pipeline drives;
# `make run` does not need it. Installed in "compat" editable mode (a path entry): Spark finds `pyspark_*` data
# source modules with pkgutil.iter_modules, which does not see setuptools' default editable import hook.
PIPELINE_STAMP := $(VENV)/.pipeline-installed
$(PIPELINE_STAMP): $(STAMP) pipeline/pyproject.toml
	$(BIN)/python -m pip install -q -e pipeline --config-settings editable_mode=compat
	touch $(PIPELINE_STAMP)

# `make run PORT=5673 MANAGEMENT_PORT=15673 PROMETHEUS_PORT=15693 BIND=0.0.0.0 DATA_DIR=/srv/leveret`;
# LEVERET_* environment variables (e.g. LEVERET_LISTENERS_TCP_DEFAULT) work as well.
RUN_ARGS := $(if $(PORT),--port $(PORT)) $(if $(BIND),--bind $(BIND)) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) \
	$(if $(MANAGEMENT_PORT),--management-port $(MANAGEMENT_PORT)) \
	$(if $(PROMETHEUS_PORT),--prometheus-port $(PROMETHEUS_PORT)) $(if $(CONFIG),--config $(CONFIG))

run: $(STAMP)
	$(BIN)/leveret serve $(RUN_ARGS)

# The system tools the tests use (network namespaces, tmpfs and loop-mounted ext4 images; Java 17 for Spark;
# libfaketime, which the faketime package brings, for the broker's wall-clock jumps), installed from Debian when
# missing (they are on the usual machine already).
TEST_TOOLS := ip:iproute2 mkfs.ext4:e2fsprogs e2fsck:e2fsprogs losetup:mount mount:mount \
	java:openjdk-17-jre-headless faketime:faketime prometheus:prometheus chromium:chromium

# PostgreSQL for the cluster tests (tests/pg_server.py starts its own server): Debian keeps initdb off PATH, in
# /usr/lib/postgresql/VERSION/bin.
test-tools:
	@missing=""; for t in $(TEST_TOOLS); do command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then apt-get update -q && apt-get install -y -q $$missing; fi

# The lint (ruff, the import-linter layer contracts, mypy) runs first: a broken layer fails the suite. Then the
# quorum-queue tests again against a two-member cluster on PostgreSQL (tests/conftest.py, LEVERET_TEST_CLUSTER:
# each new connection of a test on the next member; about half a minute).
test: $(STAMP) $(PIPELINE_STAMP) test-tools lint
	$(BIN)/python -m pytest
	LEVERET_TEST_CLUSTER=2 $(BIN)/python -m pytest -m quorum tests/integration

# The integration tests against a real RabbitMQ (installs and starts one on its own ports; not part of CI).
test-rabbitmq: $(STAMP)
	bash tests/rabbitmq/run-against-rabbitmq.sh

# ruff; the import layers of pyproject.toml's [tool.importlinter] (lint-imports); the types ([tool.mypy]).
# `python tests/import_graph.py` prints the import graph and any cycle the layers contract reports.
lint: $(STAMP)
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
