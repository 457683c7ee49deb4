# One command per job; each sets itself up from a fresh clone (README Quickstart).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Pins: constraints.txt; on Python 3.10, constraints-py310.txt (some pins need 3.11).
PIP = $(BIN)/python -m pip install --no-build-isolation \
	-c "$$($(BIN)/python -c 'import sys; print("constraints-py310.txt" if sys.version_info < (3, 11) else "constraints.txt")')"
INSTALLED := $(VENV)/.installed
INSTALLED_DEV := $(VENV)/.installed-dev
COMPILED := $(VENV)/.compiled
# What the compiled build is made from: the modules in tracekit/_compiled_modules.txt (the one
# list: setup.py and tracekit/_native.py read it too) and the watchdog's C poll.
COMPILED_MODULES := $(shell cat tracekit/_compiled_modules.txt)
COMPILED_SOURCES := $(patsubst %,%.py,$(subst .,/,$(COMPILED_MODULES))) tracekit/_core/_slicewatch.c \
	tracekit/_compiled_modules.txt setup.py
# TRACEKIT_PURE_PYTHON=1 make ...: no compiling; tracekit runs as plain Python.
ifeq ($(filter-out 0,$(strip $(TRACEKIT_PURE_PYTHON))),)
BUILT := $(COMPILED)
else
BUILT :=
endif

# The end-to-end test's trace backend, Arize Phoenix (tests/e2e/test_phoenix.py), in its own
# venv (it pins many packages): made on the first make test, then reused.
PHOENIX_VENV := .venv-phoenix
PHOENIX_INSTALLED := $(PHOENIX_VENV)/.installed

.PHONY: demo test lint bench build clean

# mypy checks the package as it is installed: integrations/ inside tracekit/ (its package-dir
# mapping, which static checkers cannot follow in the editable install: STYLE.md), in a copy.
TYPECHECK = rm -rf build/typecheck && mkdir -p build/typecheck \
	&& cp -r tracekit build/typecheck/ && cp -r integrations build/typecheck/tracekit/ \
	&& cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml \
	--cache-dir ../../.mypy_cache tracekit

$(BIN)/python:
	@echo "== creating $(VENV)"
	@$(PY) -m venv $(VENV)
	@$(PIP) -q setuptools  # to build tracekit's editable install (no build isolation: one venv)

# The editable install itself compiles nothing (TRACEKIT_PURE_PYTHON=1 for pip): the
# compiled build is its own step below, so that each step can say what it does.
$(INSTALLED): pyproject.toml constraints.txt constraints-py310.txt setup.py | $(BIN)/python
	@echo "== installing tracekit and the demo's dependencies into $(VENV) (first run only, ~30 s)"
	@# pip says nothing while it installs: a line every 5 s
	@(while sleep 5; do echo "   ... still installing"; done) & ticker=$$!; \
	TRACEKIT_PURE_PYTHON=1 $(PIP) -q -e '.[demo]'; status=$$?; kill $$ticker; exit $$status
	@touch $@

# dev holds demo and compile: one pip run serves both stamps.
$(INSTALLED_DEV): pyproject.toml constraints.txt constraints-py310.txt setup.py | $(BIN)/python
	@echo "== installing tracekit, its test and lint tools, the demo's dependencies and mypy into $(VENV) (first run only, ~40 s)"
	TRACEKIT_PURE_PYTHON=1 $(PIP) -e '.[dev]'
	touch $@ $(INSTALLED)

$(COMPILED): $(COMPILED_SOURCES) | $(INSTALLED)
	@echo "== compiling the request path ($(words $(COMPILED_MODULES)) modules) with mypyc, and the watchdog's C poll"
	@echo "   (after a fresh clone or an edit of them, ~30 s; TRACEKIT_PURE_PYTHON=1 make ... skips it)"
	@# The compiler (the compile extra: mypy) comes with make test's tools; after make demo alone
	@# it is not there yet.
	@$(BIN)/python -c "import mypyc" 2>/dev/null || { echo "   installing mypy, the compiler, first"; \
	TRACEKIT_PURE_PYTHON=1 $(PIP) -q -e '.[compile]'; }
	@find tracekit -name '*.so' -delete; rm -f *__mypyc*.so  # no module left from an earlier list
	@# gcc says nothing while it compiles mypyc's one library (~10-15 s): a line every 5 s
	@(while sleep 5; do echo "   ... still compiling"; done) & ticker=$$!; \
	PYTHONUNBUFFERED=1 $(BIN)/python setup.py build_ext --inplace; built=$$?; kill $$ticker; exit $$built
	@# setup.py falls back to plain Python when mypyc fails (a user's install): here that is an error
	@$(BIN)/python -c "import sys, tracekit._native as n; sys.exit(0 if n.compiled() else \
	'make: the request path did not compile (the reason is above); TRACEKIT_PURE_PYTHON=1 make ... runs without it')"
	@touch $@

$(PHOENIX_INSTALLED): constraints-phoenix.txt
	@echo "== installing Arize Phoenix (pinned: constraints-phoenix.txt) into $(PHOENIX_VENV) for the"
	@echo "   end-to-end test (first run only, ~100 s, ~850 MB)"
	rm -rf $(PHOENIX_VENV)
	$(PY) -m venv $(PHOENIX_VENV)
	@# pip says nothing while it installs: a line every 10 s
	(while sleep 10; do echo "   ... still installing Phoenix"; done) & ticker=$$!; \
	$(PHOENIX_VENV)/bin/python -m pip install -q -c constraints-phoenix.txt arize-phoenix; status=$$?; kill $$ticker; exit $$status
	touch $@

build: $(COMPILED)  ## (re)compile the request path after editing it (make demo and make test do too)

# The demo runs on whatever build is there: plain Python from a fresh clone (compiling first
# would add ~30-50 s to the first run, for a tracing cost the demo's figures do not show), the
# compiled request path once make test or make build has made it.
demo: $(INSTALLED)
	@echo "== tracekit demo --out out"
	@$(BIN)/tracekit demo --out out

# Both builds are tested: the whole suite on the compiled one, then the request path's tests
# (tests/core, tests/hostile/recorder) on the plain-Python one. Two pytest-xdist workers: the
# suite waits on servers and subprocesses about as long as it computes (one worker: 5 min 52 s,
# two: 3 min 46 s, on 2 cores); the few tests marked `alone` run after, on one.
test: $(INSTALLED_DEV) $(BUILT) $(PHOENIX_INSTALLED)  ## lint (ruff), type-check (mypy strict), the suite on both builds
	bash scripts/ensure-chromium
	@echo "== ruff, mypy"
	$(BIN)/ruff check -q tracekit integrations tests bench examples setup.py
	$(TYPECHECK)
ifneq ($(BUILT),)
	@echo "== the whole suite, compiled request path (with a real Phoenix: TRACEKIT_PHOENIX)"
	TRACEKIT_PHOENIX=$(abspath $(PHOENIX_VENV))/bin/phoenix TRACEKIT_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -q -n 2 -m "not alone"
	@echo "== the tests that saturate the event loop, one at a time (-m alone: a second worker skews their timings)"
	TRACEKIT_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -q -m alone
	@echo "== the request path's tests as plain Python (TRACEKIT_PURE_PYTHON=1)"
	TRACEKIT_PURE_PYTHON=1 $(BIN)/python -m pytest -q -n 2 -m "not alone" tests/core tests/hostile/recorder tests/loop/test_spawned_tasks.py
	TRACEKIT_PURE_PYTHON=1 $(BIN)/python -m pytest -q -m alone tests/loop/test_spawned_tasks.py
else
	@echo "== the whole suite, plain Python (TRACEKIT_PURE_PYTHON=1; with a real Phoenix: TRACEKIT_PHOENIX)"
	TRACEKIT_PHOENIX=$(abspath $(PHOENIX_VENV))/bin/phoenix $(BIN)/python -m pytest -q -n 2 -m "not alone"
	@echo "== the tests that saturate the event loop, one at a time (-m alone: a second worker skews their timings)"
	$(BIN)/python -m pytest -q -m alone
endif

lint: $(INSTALLED_DEV)
	$(BIN)/ruff check tracekit integrations tests bench examples setup.py
	$(TYPECHECK)

bench: $(INSTALLED_DEV) $(BUILT)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/analyze_throughput.py

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) build *.egg-info *__mypyc*.so
	find tracekit -name '*.so' -delete
