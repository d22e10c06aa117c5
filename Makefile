# One entry point for users and CI. `make test` is exactly what .ci/run runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: venv test test-fast test-pure lint docs demo bench clean system-deps

# setup.py builds the one compiled module (metaq._speedups): a change to its C source reinstalls (rebuilds) it.
$(STAMP): pyproject.toml setup.py src/metaq/_speedups.c src/metaq/_kafka_speedups.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,docs,spark,postgres,zookeeper,peers,kafka,kafka-clients]'
	touch $(STAMP)

venv: $(STAMP)

# System packages the tests need (PostgreSQL, ZooKeeper); installed only when missing.
system-deps:
	@bash scripts/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

# The Python API reference (docs/api: autodoc over the docstrings) in docs/_build/html; a warning fails it.
docs: $(STAMP)
	$(BIN)/sphinx-build -q -W --keep-going -b html docs/api docs/_build/html

test: $(STAMP) system-deps lint docs
	$(BIN)/pytest -q --durations=20
	$(MAKE) test-pure

# The unit tests again without the compiled module (metaq/_compiled.py): the Python references alone, as an install
# without a C compiler runs them.
test-pure: $(STAMP)
	METAQ_NO_EXTENSIONS=1 $(BIN)/pytest -q tests/unit

test-fast: $(STAMP) lint
	$(BIN)/pytest -q -m "not slow"

demo: $(STAMP)
	$(BIN)/python -m metaq.demo

bench: $(STAMP)
	$(BIN)/metaq bench produce --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build docs/_build src/*.egg-info src/metaq/*.so
