# One command per job; each sets itself up from a fresh clone (README Quickstart).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/gateway_under_load.py

test: $(STAMP)  ## lint (ruff), type-check (mypy strict), then the whole test suite
	bash scripts/ensure-chromium
	$(BIN)/ruff check -q tracekit integrations tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check tracekit integrations tests bench examples
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/analyze_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
