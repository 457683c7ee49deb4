# One command per job; each sets itself up from a fresh clone (README Quickstart).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE := $(VENV)/.compiled
# The modules mypyc compiles (tracekit/_native.py's COMPILED) and the C helpers: rebuilt when one changes.
NATIVE_SOURCES := $(patsubst %,tracekit/%.py,$(shell sed -n '/^COMPILED = (/,/^)/p' tracekit/_native.py | grep -o '"[a-z_.]*"' | tr -d '"' | tr . /)) tracekit/_core/_slicewatch.c tracekit/analysis/_otlp_attributes.c tracekit/analysis/_otlp_scan.c

.PHONY: demo test lint bench build clean

# The editable install compiles the hot path in place (setup.py) with the pinned mypyc.
# Pins: constraints.txt; on Python 3.10, constraints-py310.txt (some pins need 3.11).
$(STAMP): pyproject.toml constraints.txt constraints-py310.txt setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c "$$($(BIN)/python -c 'import sys; print("constraints-py310.txt" if sys.version_info < (3, 11) else "constraints.txt")')" -e '.[dev]'
	touch $(STAMP) $(NATIVE)

# (The install above compiles too and touches the stamp: a fresh clone compiles once.)
$(NATIVE): $(NATIVE_SOURCES) | $(STAMP)
	@if [ -e $(NATIVE) ] && [ -z "$$(find $(NATIVE_SOURCES) -newer $(NATIVE))" ]; then :; \
	else echo "compiling the request path (mypyc)"; $(BIN)/python setup.py -q build_ext --inplace; fi
	touch $(NATIVE)

build: $(NATIVE)  ## (re)compile the hot path after editing it

demo: $(NATIVE)
	$(BIN)/python examples/gateway_under_load.py

test: $(NATIVE)  ## lint (ruff), type-check (mypy strict), then the whole test suite
	bash scripts/ensure-chromium
	$(BIN)/ruff check -q tracekit integrations tests bench examples setup.py
	$(BIN)/mypy
	TRACEKIT_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check tracekit integrations tests bench examples setup.py
	$(BIN)/mypy

bench: $(NATIVE)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/analyze_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info *__mypyc*.so tracekit/*.so
