# Two entry points (see README): `make demo` runs the main job on the embedded defaults,
# `make test` sets up what the tests need beyond pip (test-env), then runs ruff, mypy on the
# public API and pytest. Both create .venv and install what is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-env lint typecheck bench gpu-kit clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,peers,plot]'
	touch $(STAMP)

# The main job: pipetune serve on SQLite with local workers (cupy when a GPU is present,
# else simulated), a GEMM and a softmax tuned through the CLI (with simulated workers also
# the GEMM on H200, warm-started from H100), then a clean SIGTERM stop.
demo: $(STAMP)
	$(BIN)/python -m pipetune.clients.demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The public API, type-checked strictly as installed: a wheel unpacked into build/typecheck
# (mypy cannot follow the editable install's import hook).
TYPECHECK_DIR := build/typecheck
PUBLIC_API := -m pipetune -p pipetune.clients.sdk -p pipetune.clients.library -p pipetune.model.workloads

typecheck: $(STAMP)
	rm -rf $(TYPECHECK_DIR)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation --target $(TYPECHECK_DIR) .
	cd $(TYPECHECK_DIR) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml $(PUBLIC_API)

# Debian's chromium and a PostgreSQL server (and python3-venv where no .venv can be made),
# installed or started only when missing: a no-op on a machine that has them. Needs root or
# sudo for what it installs; without, it names the command to run first and stops.
test-env:
	$(PYTHON) tests/provision.py

# Three pytest workers (pytest-xdist) on a 2-core machine: the suite is a long tail of short
# tests, many waiting on subprocesses and sockets: even three keep about 1.4 of the 2 cores
# busy (benchmarks/RESULTS.md, "The test suite's time"). Every test holds its own databases, ports
# and data directory, so the workers share nothing.
test: test-env lint typecheck
	$(BIN)/python -m pytest -q -n 3

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_model --write

# What a lent GPU machine needs for `pipetune campaign` (README, "GPU work"): pipetune's
# wheel and the cp312 wheels the machine lacks, in the git-ignored .gpu-kit/; prints the
# device command to run there.
gpu-kit: $(STAMP)
	$(BIN)/python -m pipetune.workers.campaign.kit --out .gpu-kit

clean:
	rm -rf $(VENV) build *.egg-info
