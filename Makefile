# queen-mp: `make run` starts the broker on 127.0.0.1:6632, `make test` runs the whole suite.
# Both work on a fresh machine: they create .venv, install the package, and (tests) install
# PostgreSQL and Chromium (the console's browser tests) from Debian's packages when missing, and
# promtool (Debian's prometheus package) for the alert rule tests; without it those tests skip
# and say why. ops/ensure-packages.sh installs whatever of them is missing in one apt-get run.
# `make test` runs the suite in PYTEST_WORKERS processes (pytest-xdist), each test module whole
# in one of them (--dist loadfile: a module's brokers and databases stay its own, and each
# process has its own session database and session broker), handed out in collection order
# (--no-loadscope-reorder: xdist's default, most tests first, leaves the slow modules of few
# tests, the wheel, failover, scale-out and chaos ones, for the end, where one of them can keep
# one process busy long after the other ran out of work; in collection order the many small
# unit modules come last). The reduced fault matrix (tests/chaos) runs after them, alone, as it
# always did: beside the other process on a loaded machine its SIGTERM fault saw two pushes cut
# (ReadError) by the graceful stop. Both runs take PYTEST_ARGS; either failing fails the target.
# Each of the PYTEST_WORKERS processes runs its tests on a PostgreSQL cluster of its own
# (QUEEN_TEST_EMBEDDED=1, tests/pgharness.py, started with pg_ctl): the brokers of two processes
# at once went past the 100 connections of the shared server on 127.0.0.1:5432 ("too many
# clients"). The fault matrix, alone, keeps using that server.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2

.PHONY: run test unit integration browser console-shots bench bench-quick lint clean pg-deps \
	promtool-deps browser-deps test-deps readme-config api-doc chaos

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# `queen-mp serve` runs at -OO (QUEEN_OPTIMIZE): its .opt-2.pyc files, which pip does not write
# (and PYTHONDONTWRITEBYTECODE keeps the broker from writing), else every start compiles its
# modules from source, about 2 s of CPU and a larger preloaded image (docs/operations.md)
OPT2PYC := $(BIN)/python -OO -m compileall -q -j 0 $(VENV)/lib queen_mp

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	bash ops/ensure-packages.sh postgres
	$(BIN)/pip install --quiet -e '.[test]'
	$(OPT2PYC)
	touch $(STAMP)

pg-deps:
	@bash ops/ensure-packages.sh postgres

# not fatal: tests/unit/test_alert_rules.py skips (saying why) when promtool is missing
promtool-deps:
	@bash ops/ensure-packages.sh promtool

browser-deps:
	@bash ops/ensure-packages.sh chromium

# all three in one apt-get run; before $(STAMP), whose own check then finds PostgreSQL there
test-deps:
	@bash ops/ensure-packages.sh postgres chromium promtool

run: $(STAMP) pg-deps
	$(BIN)/queen-mp serve

test: test-deps $(STAMP)
	$(BIN)/ruff check queen_mp tests bench
	rc=0; QUEEN_TEST_EMBEDDED=1 $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder --ignore=tests/chaos --durations=25 $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest tests/chaos --durations=6 $(PYTEST_ARGS) || rc=$$?; exit $$rc

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: $(STAMP) pg-deps
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# The console in Chromium (tests/browser); console-shots also rewrites docs/console/*.png
browser: $(STAMP) pg-deps browser-deps
	$(BIN)/python -m pytest tests/browser $(PYTEST_ARGS)

console-shots: $(STAMP) pg-deps browser-deps
	QUEEN_CONSOLE_SHOTS=docs/console $(BIN)/python -m pytest tests/browser $(PYTEST_ARGS)

# The long fuzz run (README "Fuzzing"): tests/fuzz with FUZZ_EXAMPLES hypothesis examples per
# test (make test runs them with a few dozen), schemathesis over the API document with
# SCHEMATHESIS_EXAMPLES per operation, then the seed-mutation driver for FUZZ_SECONDS.
FUZZ_EXAMPLES ?= 20000
FUZZ_SECONDS ?= 600
SCHEMATHESIS_EXAMPLES ?= 200
.PHONY: fuzz
fuzz: $(STAMP) pg-deps
	QUEEN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests/fuzz -o timeout=0 -s \
		$(PYTEST_ARGS)
	QUEEN_SCHEMATHESIS_EXAMPLES=$(SCHEMATHESIS_EXAMPLES) $(BIN)/python -m pytest \
		tests/integration/test_openapi_schemathesis.py -o timeout=0 $(PYTEST_ARGS)
	$(BIN)/python -m tests.fuzz.targets --seconds $(FUZZ_SECONDS)

# The full fault matrix (issue 29, docs/reliability.md): every fault of tests/chaos/matrix.py
# three times under load, each judged by the per-message ledger; make test runs one round of
# the reduced set (tests/chaos/test_matrix.py). The failover faults install pg_auto_failover
# (ops/ensure-pg-auto-failover.sh) when it is missing.
CHAOS_ROUNDS ?= 3
chaos: $(STAMP) pg-deps
	$(BIN)/python -m tests.chaos.matrix --rounds $(CHAOS_ROUNDS) --docs docs/reliability.md

bench: $(STAMP) pg-deps
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(OPT2PYC)
	$(BIN)/python -m bench.suite --docs docs/benchmarks.md

bench-quick: $(STAMP) pg-deps
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(OPT2PYC)
	$(BIN)/python -m bench.suite --quick

lint: $(STAMP)
	$(BIN)/ruff check queen_mp tests bench

readme-config: $(STAMP)
	$(BIN)/python -m queen_mp.processes.cli settings-table

# docs/api.md from queen_mp/http/openapi.json and the prose of queen_mp/http/apidoc.md
# (tests/unit/test_openapi.py fails when docs/api.md is stale)
api-doc: $(STAMP)
	$(BIN)/python -m queen_mp.http.apidoc > docs/api.md

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
