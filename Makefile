# Two entry points (see README): `make demo` runs the main job on the embedded defaults,
# `make test` runs ruff and pytest. Both create .venv and install what is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,peers]'
	touch $(STAMP)

# The main job: pipetune serve on SQLite with local workers (cupy when a GPU is present,
# else simulated), one operator tuned through the CLI, then a clean SIGTERM stop.
demo: $(STAMP)
	$(BIN)/python -m clients.demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_model.py --write

clean:
	rm -rf $(VENV) build *.egg-info
