# The commands of the README: `make demo`, `make test` and `make bench`. Each sets up what it
# needs (a virtual environment in .venv with the package and its extras) on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench install clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,pubsub,eventhubs,kafka,windows,postgres]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/maintenance-bridge demo

.PHONY: demo-fleet
demo-fleet: $(BIN)/.installed
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

# The README's dashboard screenshots (docs/img/dashboard*.png), from `demo --fleet` (~1 minute).
.PHONY: screenshot
screenshot: $(BIN)/.installed
	$(BIN)/python -m bench.screenshot
