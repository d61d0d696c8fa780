# The commands of the README: `make demo`, `make test` and `make bench`. Each sets up only what
# it needs in a virtual environment in .venv, on a fresh machine: `make demo` the package with
# its runtime dependencies (the simulator included, about 45 MB), `make test` and the rest also
# every extra and the development tools (several hundred MB). One .venv serves both: the full
# install is the runtime one plus more.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS := dev,pubsub,eventhubs,kafka,windows,postgres,otel

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
# The floors (pyproject's [tool.importlinter] contracts; docs/architecture.md draws them).
	$(BIN)/lint-imports

# checkov (the manifests' policy checks, tests/test_deploy.py) pins libraries older than the
# development tools need (cyclonedx-python-lib, packaging): a virtual environment of its own.
CHECKOV_VENV := $(VENV)/checkov
$(CHECKOV_VENV)/bin/checkov:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet checkov==3.3.30

test: lint $(CHECKOV_VENV)/bin/checkov
	$(BIN)/pytest

# The benchmark suite (5 to 6 minutes on 2 cores): bench/results/report.md and latency.png.
bench: $(BIN)/.installed
	$(BIN)/python -m bench

# The fleet service: HTTP batch ingest into SQLite and API latency at 10,000 instances.
.PHONY: bench-fleet
bench-fleet: $(BIN)/.installed
	$(BIN)/python -m bench.fleet

# The fleet at 100,000 VMs and 1,000,000 events, SQLite and PostgreSQL side by side (issue 33;
# about 10 minutes on 2 cores): bench/results/fleet-scale.md and fleet-scale.png. Smaller:
# `python -m bench.fleet_scale --instances 20000 --events 200000`.
.PHONY: bench-fleet-scale
bench-fleet-scale: $(BIN)/.installed
	$(BIN)/python -m bench.fleet_scale --instances 100000 --events 1000000

# Two fleet replicas on one PostgreSQL: each replica's and PostgreSQL's CPU seconds per
# 1,000 events and per 1,000 reads (issue 33; a few minutes): bench/results/fleet-replicas.md,
# the figures of docs/fleet.md's scaling guide.
.PHONY: bench-fleet-replicas
bench-fleet-replicas: $(BIN)/.installed
	$(BIN)/python -m bench.fleet_replicas

# A retention pass over a backlog of 100,000 old events while ingest and reads go on, SQLite
# and PostgreSQL (issue 33; a few minutes): bench/results/fleet-retention.md.
.PHONY: bench-fleet-retention
bench-fleet-retention: $(BIN)/.installed
	$(BIN)/python -m bench.fleet_retention

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

# The software bills of materials of a release (CycloneDX JSON, committed in sbom/): the wheel
# with its runtime dependencies, and the virtual environment the container build installs,
# made the way deploy/container/Dockerfile makes it (the same build context, `python -m venv`,
# `pip install "/src[EXTRAS]"`) in a temporary directory, since no container engine runs here.
# Check them against the advisories with pip-audit (docs/operations.md, "Rolling out").
# cyclonedx-py leaves the root component's version out (pyproject's is dynamic): the release.
export SBOM_STAMP := import json, sys; from bridge import __version__ as v; \
  path = sys.argv[1]; bom = json.load(open(path)); root = bom["metadata"]["component"]; \
  root.update(version=v, purl=f"pkg:pypi/maintenance-bridge@{v}"); \
  open(path, "w").write(json.dumps(bom, indent=2) + "\n")
.PHONY: sbom
sbom: $(BIN)/.installed
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; mkdir -p sbom; \
	$(PYTHON) -m venv --without-pip "$$tmp/wheel"; \
	$(BIN)/python -m pip --python "$$tmp/wheel/bin/python" install --quiet .; \
	$(BIN)/cyclonedx-py environment --pyproject pyproject.toml --output-reproducible \
		-o sbom/maintenance-bridge-wheel.cdx.json "$$tmp/wheel/bin/python"; \
	mkdir "$$tmp/src"; cp -R pyproject.toml README.md bridge sinks "$$tmp/src/"; \
	find "$$tmp/src" -name __pycache__ -prune -exec rm -rf {} +; rm -f "$$tmp/src/bridge/_build.py"; \
	$(PYTHON) -m venv "$$tmp/container"; \
	"$$tmp/container/bin/pip" install --quiet --no-cache-dir "$$tmp/src$${EXTRAS:+[$$EXTRAS]}"; \
	$(BIN)/cyclonedx-py environment --pyproject pyproject.toml --output-reproducible \
		-o sbom/container-venv$${EXTRAS:+-$$EXTRAS}.cdx.json "$$tmp/container/bin/python"; \
	for file in sbom/*.cdx.json; do $(BIN)/python -c "$$SBOM_STAMP" "$$file"; done; \
	echo "sbom/: $$(ls sbom | tr '\n' ' ')"
