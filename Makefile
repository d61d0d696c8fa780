# The commands of the README: `make demo`, `make test` and `make bench`. Each sets up only what
# it needs in a virtual environment in .venv, on a fresh machine: `make demo` the package with
# its runtime dependencies (the simulator included, about 45 MB), `make test` and the rest also
# every extra and the development tools (several hundred MB). One .venv serves both: the full
# install is the runtime one plus more.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS := dev,pubsub,eventhubs,kafka,windows,postgres

.PHONY: demo test lint bench install runtime clean

# The package and its runtime dependencies: what `demo` and `demo --fleet` run with.
$(BIN)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# Everything: every extra (cloud SDKs, PostgreSQL) and the development tools.
$(BIN)/.installed: pyproject.toml $(BIN)/.runtime
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

runtime: $(BIN)/.runtime
install: $(BIN)/.installed

demo: $(BIN)/.runtime
	$(BIN)/maintenance-bridge demo

.PHONY: demo-fleet
demo-fleet: $(BIN)/.runtime
	$(BIN)/maintenance-bridge demo --fleet

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
# The same sources as Windows sees them: a POSIX-only call on a Windows path fails here.
	$(BIN)/mypy --platform win32

test: lint
	$(BIN)/pytest

# The benchmark suite (5 to 6 minutes on 2 cores): bench/results/report.md and latency.png.
bench: $(BIN)/.installed
	$(BIN)/python -m bench

# The fleet service: HTTP batch ingest into SQLite and API latency at 10,000 instances.
.PHONY: bench-fleet
bench-fleet: $(BIN)/.installed
	$(BIN)/python -m bench.fleet

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

# The fleet dashboard: server render and page load in Chromium at 10,000 instances.
.PHONY: bench-dashboard
bench-dashboard: $(BIN)/.installed
	$(BIN)/python -m bench.dashboard
