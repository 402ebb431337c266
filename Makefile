# The two commands of the README:
#   make demo   set everything up, run the sample incremental pipeline twice on the local store
#   make test   set everything up, run the whole test suite (what .ci/run calls)
SHELL := /bin/bash
# The interpreter of the virtualenvs (.venv, .tools/): the distribution's own Python 3.11 or
# newer where there is one, else python3 on PATH; PYTHON=... chooses another. A distribution
# builds its Python with profile-guided and link-time optimisation, a source build (pyenv's,
# say) does not by default: measured on 2026-12-03, Debian's 3.11 took 6% less CPU for a
# quarter of the suite and a quarter less to import Meltano than pyenv's 3.11. uv itself is
# installed with python3 on PATH (a distribution's Python refuses pip installs, PEP 668).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(or $(shell for p in /usr/bin/python3 python3; do \
	  "$$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	  && { command -v "$$p"; break; }; done),python3)
endif
export PYTHON
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Python here may run with PYTHONDONTWRITEBYTECODE set (containers often do): then every
# process compiles every module it imports, and a Meltano command spends three seconds of
# CPU before it starts. Installs compile their bytecode, and the tests may cache theirs.
export UV_COMPILE_BYTECODE := 1
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast test-e2e test-wheel test-meltano-versions chaos simulate bench lint format reference dist image setup tools clean mutants

$(STAMP): pyproject.toml examples/tap-sample/pyproject.toml
	@command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
	@test -x $(BIN)/python || uv venv --quiet --python $(PYTHON) $(VENV)
	uv pip install --quiet --python $(BIN)/python -e '.[all,dev]' -e examples/tap-sample
	@touch $(STAMP)

setup: $(STAMP)

# The tools need no project virtualenv (install-tools.sh finds or makes its own uv), so
# .ci/run installs them while `make setup` runs.
tools:
	@scripts/install-system.sh
	@scripts/install-tools.sh
	@scripts/install-meltano-versions.sh
	@scripts/install-emulators.sh

demo: setup
	@scripts/install-tools.sh
	@examples/demo.sh

# Four workers on two cores: much of the suite waits on leases expiring and servers
# answering. Measured from clean clones on 2026-12-03, 996 tests: three workers 12 min 1 s
# to 12 min 29 s of pytest with the cores 75-77% busy; four 10 min 59 s, 86% busy, about
# the same CPU; five 11 min 17 s, 89% busy but 6% more CPU (each worker starts its own
# servers, proxies and Meltano fork servers). Earlier, before the fault proxies were
# reused and the meltano commands forked, four took longer than three. The longest tests
# start first, the mostly waiting ones spread among the rest, dealt among the workers
# (tests/conftest.py). PYTEST_WORKERS=0 runs it in one process; PYTEST_ARGS adds pytest
# options (e.g. PYTEST_ARGS=--durations=30).
PYTEST_WORKERS ?= 4
test: setup tools
	$(BIN)/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/pytest -q -m "not e2e and not cloud"

test-e2e: setup tools
	$(BIN)/pytest -q -m e2e

test-wheel: setup tools
	$(BIN)/pytest -q -m wheel

# Every Meltano minor the add-on supports (tests/e2e/meltano_versions.txt, the newest patch of
# each): the end-to-end tests of the add-on, the whole-run lease and the mapper plugin once
# per minor (MAPPER_STATE_MELTANO chooses the Meltano of tests/e2e/tools.py), then
# tests/e2e/test_meltano_versions.py across every minor. `make test` runs that module on the
# oldest minor and everything else on the newest. Meltano's own state tests run from the
# newest sdist only (tests/e2e/test_meltano_own_tests.py pins it with its hash).
MELTANO_VERSION_TESTS := tests/e2e/test_meltano_backend.py tests/e2e/test_meltano_run_lease.py \
  tests/e2e/test_meltano_plugin.py tests/e2e/test_meltano.py tests/e2e/test_meltano_uri.py
test-meltano-versions: setup tools
	@scripts/install-meltano-versions.sh --all
	@set -e; for minor in $$(grep -v '^#' tests/e2e/meltano_versions.txt | awk 'NF {print $$1}'); do \
	  echo "== Meltano $$minor"; \
	  MAPPER_STATE_MELTANO=$$minor $(BIN)/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) \
	    --dist worksteal $(PYTEST_ARGS) $(MELTANO_VERSION_TESTS); \
	done
	MAPPER_STATE_MELTANO_VERSIONS=all $(BIN)/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) \
	  --dist worksteal $(PYTEST_ARGS) tests/e2e/test_meltano_versions.py

# The chaos suite at its full budget (tests/chaos/conftest.py): 8 holders x 200 rounds per
# store, 50 SIGKILL rounds, 2,000 examples per property; the figures go to output/chaos.jsonl
# and are printed as the README's table. `make test` runs the same suite at a small budget.
# STORE=<file|s3|rgw|azure|gcs|postgres|s3rver> runs one store's part (its own report file);
# CHAOS_ARGS passes pytest options through (CHAOS_ARGS="-k kills": the SIGKILL rounds only).
CHAOS_REPORT ?= output/chaos$(if $(STORE),-$(STORE)).jsonl
CHAOS_ARGS ?=
chaos: setup tools
	@mkdir -p $(dir $(CHAOS_REPORT)) && rm -f $(CHAOS_REPORT)
	MAPPER_STATE_CHAOS=full MAPPER_STATE_CHAOS_STORE=$(STORE) \
	  MAPPER_STATE_CHAOS_REPORT=$(CURDIR)/$(CHAOS_REPORT) \
	  $(BIN)/pytest -q -p no:cacheprovider -m chaos --timeout 3600 $(CHAOS_ARGS) tests/chaos
	$(BIN)/python -m tests.chaos.report $(CHAOS_REPORT)

# The deterministic simulation of the lease (tests/simulation, docs/reliability.md):
# `make simulate SEED=S` replays one schedule and prints its trace (SHRINK=1: a failing one
# shrunk to the smallest world that still fails the same way; VARIANT=NAME: under one of
# the broken variants of tests/simulation/variants.py); `SEEDS=N` runs seeds
# 0..N-1; alone, the long budget: fresh seeds for SIM_SECONDS of CPU (two hours by
# default), with a figure per fault class, then every broken variant over its stated
# seeds. Each exits non-zero, printing the failing seed, when an invariant breaks.
# `make test` runs a budget of 1,750 schedules and the variants.
SIM_SECONDS ?= 7200
simulate: setup
ifneq ($(SEED),)
	$(BIN)/python -m tests.simulation --seed $(SEED) $(if $(VARIANT),--variant $(VARIANT)) \
	  $(if $(SHRINK),--shrink)
else ifneq ($(SEEDS),)
	$(BIN)/python -m tests.simulation --seeds $(SEEDS)
else
	$(BIN)/python -m tests.simulation --seconds $(SIM_SECONDS)
	$(BIN)/python -m tests.simulation --variants
endif

# The scoreboard (benchmarks/run.py): BENCH_TEN_MILLION=1 adds a 10M-line stream,
# BENCH_ARGS="--publish" also refreshes the README's figures and docs/images/.
bench: setup tools
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/gen-reference.py --check
	$(BIN)/python scripts/gen-backend-entry-points.py --check

# the mutation study (scripts/mutants.py): break each safety line in a scratch copy and
# run the tests that must notice; not part of `make test` (it reruns test files per mutant)
mutants: setup
	$(BIN)/python scripts/mutants.py

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# the files generated from the settings declarations: docs/settings.md, the Meltano plugin definition
reference: setup
	$(BIN)/python scripts/gen-reference.py

# the sdist and the wheel, in dist/ (what the Dockerfile installs); the same sources give
# the same wheel (its dates are the last commit's), so an image rebuild reuses its layers
dist: setup
	rm -f dist/mapper_state-*
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) uv build --out-dir dist

# the image mapper-state:dev from that wheel (docs/container.md): docker where it works, else
# podman with the project's settings (scripts/container.sh); EXTRAS=s3 etc. as the build argument
image: dist
	scripts/container.sh build mapper-state:dev

clean:
	rm -rf $(VENV) .tools .mapper-state output .containers
