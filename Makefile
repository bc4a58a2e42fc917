# The two commands: `make demo` (plan a small GPT on this machine) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
PYTEST_ARGS ?=

.PHONY: install demo test lint format postgres chromium bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/stageprof plan --zoo gpt --hosts 1 --devices-per-host 4 --report stageprof-report.html

postgres:
	@bash scripts/ensure_postgres.sh

chromium:
	@bash scripts/ensure_chromium.sh

test: install chromium
	bash scripts/run_tests.sh $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy schemas programs store planner workers server client cli migrations examples
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/python bench/planner_bench.py
	$(BIN)/python bench/time_to_plan.py

clean:
	rm -rf $(VENV) stageprof.db build *.egg-info
