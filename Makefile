# One entry point for set-up, the demo and the tests. Prerequisites: Python 3.11+ and Java 17+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo dev test test-fast lint docs clean browser postgres

setup: $(STAMP)
	$(BIN)/feedapi-dagster setup-jars

# uv makes the install a matter of seconds once its cache is warm; it is bootstrapped into the venv
# so that nothing outside the repository is touched. Bytecode is compiled once here, so that every
# Dagster run process does not recompile dagster and pyspark on import.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv>=0.5"
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[test]"
	touch $@

# `setup-jars` (above) resolves the Delta jars once into .venv/share/feedapi-dagster/delta-jars (Spark
# sessions then use those files and never touch the network again) and trains the Spark server's class
# archive beside them; it returns at once when both are there.

demo: setup
	$(BIN)/feedapi-dagster demo

# Headless Chromium + chromedriver for the browser test (tests/browser); Debian packages.
browser:
	test -x /usr/bin/chromedriver || { SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends chromium chromium-driver; }

# PostgreSQL 15's server for the test of a deployment's Dagster instance on PostgreSQL
# (tests/orchestration/test_postgres_instance.py starts a throwaway cluster of it); Debian's package.
postgres:
	test -x /usr/lib/postgresql/15/bin/pg_ctl || { SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends postgresql-15; }

# Two pytest workers (pytest-xdist), a test file each at a time: much of the suite waits on other
# processes (Spark servers, the cluster, Dagster runs), and a file's module-scoped servers stay in one
# worker: the suite takes three quarters of the time of one worker (benchmarks/README.md). Files are
# handed out longest first (tests/conftest.py, LONGEST_FILES; `--no-loadscope-reorder` keeps that
# order), so that the run ends on short files on both workers.
# ruff (lint, and the formatter's check), mypy and import-linter's contracts (the layers), configured
# in pyproject.toml: no findings allowed.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

# The documentation site (mkdocs.yml, docs/): any warning (a broken link, a page left out of the nav)
# fails it. Its code blocks are run by tests/docs/test_doc_blocks.py, part of the suite.
docs: setup
	$(BIN)/mkdocs build --strict --quiet --site-dir .cache/docs-site

test: setup browser postgres lint docs
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The inner loop: the layers that need no JVM (protocols, planning, configuration, the docs'
# references to the code), their tests marked `spark` left to `make test`, which runs everything.
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 -m "not spark" tests/protocol tests/planning \
		tests/orchestration/test_config.py tests/docs/test_doc_references.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache

dev: setup
	$(BIN)/feedapi-dagster dev
