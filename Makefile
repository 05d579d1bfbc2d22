# Two commands do all the set-up: `make demo` and `make test` (each creates .venv and
# installs from pyproject.toml on first use).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-deployment test-all bench bench-route bench-deliver bench-orchestrate bench-spark bench-tracking bench-ordered bench-joined bench-failures bench-search bench-http lint format clean

$(STAMP): pyproject.toml setup.py messagebox/predicates/_native.c messagebox/_native.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/orders/demo.py

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow and not deployment" -n 3 --dist loadgroup

# real deployments built on this machine (a Spark standalone cluster, a PostgreSQL
# primary and standby): minutes each; .ci/run runs them after `make test`
test-deployment: $(STAMP)
	$(PY) -m pytest -q -m deployment

test-all: $(STAMP)
	$(PY) -m pytest -q

# `make bench ARGS=--quick` for a short run of each
bench: bench-route bench-deliver bench-orchestrate bench-spark bench-tracking bench-ordered bench-joined bench-failures bench-search bench-http

bench-route: $(STAMP)
	$(PY) -m bench.route $(ARGS)

bench-deliver: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m bench.deliver $(ARGS)

bench-orchestrate: $(STAMP)
	$(PY) -m bench.orchestrate $(ARGS)

bench-spark: $(STAMP)
	$(PY) -m bench.spark_route $(ARGS)

bench-tracking: $(STAMP)
	$(PY) -m bench.tracking $(ARGS)

bench-ordered: $(STAMP)
	$(PY) -m bench.ordered $(ARGS)

bench-http: $(STAMP)
	$(PY) -m bench.http_receive $(ARGS)

bench-joined: $(STAMP)
	$(PY) -m bench.joined $(ARGS)

bench-failures: $(STAMP)
	$(PY) -m bench.failures $(ARGS)

bench-search: $(STAMP)
	$(PY) -m bench.search $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m tests.import_cycles
	$(PY) -m tests.structure

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
