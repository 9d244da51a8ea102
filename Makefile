# distinit: one entry point for set-up, the main job, tests, lint and benchmarks.
# Every target creates .venv on first use: torch first (TORCH_SPEC), then distinit in editable mode.
# GPU users: make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" test

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.distinit-installed
PYTEST_ARGS ?=
# pytest-xdist: 3 workers on CI's 2 cores, because most integration tests wait (deadlines, late ranks,
# process start-up); more workers starve the tests' own rank processes of CPU on a loaded machine. Fixtures
# are safe side by side: ports from the kernel or from a slice per worker (tests/integration/init/
# init_launch.py), namespaces named by pid, one Slurm cluster per worker. Not --dist loadgroup: with pytest
# 9.2 it silently stops grouping (pytest-dev/pytest-xdist#1386). --maxschedchunk=1: xdist's load scheduler
# otherwise hands each worker a first chunk of a quarter of its share, in collection order, so one worker got
# the 203 heaviest integration tests (1711 s of test time) while the other two finished in 585 s and 694 s and
# then sat idle (clean clone of c002de3, DISTINIT_TEST_CPU). One test at a time keeps all three busy to the
# end, and the cheap unit tests, collected last, fill the tail. PYTEST_XDIST= runs one process.
PYTEST_XDIST ?= -n 3 --maxschedchunk=1

.PHONY: all venv system demo prepare test test-stress test-compat flakes lint unit integration bench dist dist-check clean

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[test,dev]'
	@touch $@

venv: $(STAMP)

# Slurm, munge, Open MPI, MPICH, PMIx, nftables, iproute2 for the launcher tests (root only; idempotent).
system:
	@bash scripts/install-system-deps.sh

# The main job: a local 4-process torchrun world that checks itself with `distinit doctor` (every rank's
# local checks, then the world's: versions, clocks, node ranks, host-to-host reach); rank 0 prints the
# report. `distinit env --explain` shows where every value came from.
demo: $(STAMP)
	$(BIN)/torchrun --standalone --nproc-per-node=4 --no-python $(BIN)/distinit doctor

# The package as users install it: an sdist, and a wheel built from that sdist (python -m build).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist . > dist.log 2>&1 || { cat dist.log; exit 1; }
	@rm -f dist.log

# The built wheel in a clean venv, run from outside the checkout: a file or entry point missing from the
# wheel fails here, not on a user's machine. torch comes from TORCH_SPEC as for .venv: its files are
# hard-linked from .venv (scripts/link-installed.py: seconds, where pip unpacks the cached wheel again in
# ~40 s), and pip keeps them only if they satisfy TORCH_SPEC; pip installs every dependency of torch and of
# the wheel, so a dependency the wheel forgets to declare still fails here.
DIST_VENV ?= .venv-dist
dist-check: dist
	rm -rf $(DIST_VENV)
	$(PYTHON) -m venv $(DIST_VENV)
	-$(BIN)/python scripts/link-installed.py torch $(DIST_VENV)/bin/python
	$(DIST_VENV)/bin/python -m pip install -q $(TORCH_SPEC)
	$(DIST_VENV)/bin/python -m pip install -q dist/distinit-*.whl
	cd $(DIST_VENV) && bin/python $(CURDIR)/scripts/check-installed.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q $(PYTEST_XDIST) $(PYTEST_ARGS)

integration: $(STAMP) system
	$(BIN)/python -m pytest tests/integration -q $(PYTEST_XDIST) -m "not alone" $(PYTEST_ARGS)
	$(BIN)/python -m pytest tests/integration -q -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

prepare:
	$(MAKE) --no-print-directory -j2 --output-sync=target $(STAMP) system lint dist-check

# The README's test command: system packages, venv, lint, the built wheel checked, then every test
# (the 25 slowest listed at the end, so every CI log says where the suite's time goes): side by side
# under xdist, then the few marked `alone` (tests/conftest.py) one after another (exit 5: PYTEST_ARGS
# selected none of them). The checks before the tests run two at a time (prepare): a clean clone's mypy
# (no cache, ~30 s of CPU) and the wheel's build and clean venv each keep one core busy, and there are two.
test: prepare
	$(BIN)/python -m pytest -q --durations=25 $(PYTEST_XDIST) -m "not alone" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q --durations=25 -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The suite on a busy machine: the parallel pass beside two busy loops per core (scripts/burners.py, started
# and stopped by pid), then the tests marked `alone` with nothing beside them (their reasons: tests/conftest.py).
# Every test must pass here too.
test-stress: $(STAMP) system
	$(BIN)/python scripts/burners.py --per-core 2 -- \
		$(BIN)/python -m pytest -q --durations=25 $(PYTEST_XDIST) -m "not alone" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q --durations=25 -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The two-ended torch matrix (issue 35, docs/compat.md): for each torch in COMPAT_TORCH (the oldest supported,
# the newest on the index), a venv .venv-torch-<version> with that torch and its dependencies from the index
# (skipped while the venv's stamp names it), then distinit with the test extra; in it, tests/unit and the smoke
# test tests/integration/compat, both -n 2. One line per (torch, step) with its verdict and seconds, every skip
# with its reason; exit 1 on any failure (scripts/compat.py). Not part of `make test` (so not of .ci/run) yet:
# on 2 loaded cores each torch took 6-8 min to download and install from PyPI (CUDA wheels, 5.4-5.8 GB per venv),
# then 4-5 min of tests, about 21 min on a fresh machine; it needs python3 and PyPI, neither root nor a GPU.
# COMPAT_PIP_ARGS passes pip arguments (e.g. --index-url https://download.pytorch.org/whl/cpu: CPU wheels).
COMPAT_TORCH ?= 2.4.1 2.14.1
COMPAT_PIP_ARGS ?=
test-compat:
	$(PYTHON) scripts/compat.py $(COMPAT_TORCH) --pip-args "$(COMPAT_PIP_ARGS)" --pytest-args "$(PYTEST_ARGS)"

# The flake finder: the integration tests FLAKE_ROUNDS times as test-stress runs them; every test that failed
# at least once, with its failure text, in benchmarks/results/flakes.json.
FLAKE_ROUNDS ?= 3
flakes: $(STAMP) system
	$(BIN)/python scripts/flakes.py --rounds $(FLAKE_ROUNDS)

# Every benchmark, then the plots and docs/benchmarks.md from benchmarks/results/*.json (the plots are
# rendered even when a benchmark reports a missed target; the exit status still says so).
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/run_all.py; status=$$?; $(BIN)/python benchmarks/plot.py && exit $$status

clean:
	rm -rf $(VENV) $(DIST_VENV) .venv-torch-* dist .pytest_cache .mypy_cache .ruff_cache
