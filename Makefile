# packtrain — two commands on a fresh machine:
#   make run    set up .venv if missing, run the whole pipeline on embedded defaults
#   make test   set up .venv (and .venv-airflow) if missing, run the tests
PYTHON      ?= python3
TORCH_SPEC  ?= torch==2.13.0
VENV        := .venv
AF_VENV     := .venv-airflow
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.packtrain-installed
AF_STAMP    := $(AF_VENV)/.airflow-installed
CONSTRAINTS := constraints.txt
RECIPE      ?= tiny-cpu
export DVC_NO_ANALYTICS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
export TOKENIZERS_PARALLELISM := false
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-reverse typecheck setup setup-airflow lint clean bench-pack lock repro chromium wheelhouse dvc-files \
        images test-containers

# `dvc repro` with the venv's packtrain on PATH (dvc.yaml calls the CLI)
repro: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/dvc repro

# dvc.yaml from the stage table and params.yaml from recipes/tiny-cpu.yaml (packtrain.pipeline.dvc_export): after a
# change to the stage table, the recipe or a config default (tests/pipelines/test_dvc.py fails until then)
dvc-files: $(STAMP)
	$(PY) -m packtrain.pipeline.dvc_export

setup: $(STAMP)

# Installs go through uv (a PyPI package, bootstrapped once into .packtrain/uv): it resolves and installs the ~260
# pinned packages in parallel from its user cache (~/.cache/uv, as pip's ~/.cache/pip), so torch and every package
# the two venvs share are downloaded once per machine. Bytecode is not compiled at install time (uv's
# --compile-bytecode costs ~130 CPU-s per venv for ~30k modules, most never imported); instead it is written lazily
# on first import, so PYTHONDONTWRITEBYTECODE (set on some machines) is unexported here: imports are ~2x slower
# when nothing is cached.
# /opt/wheels, where a machine has it, holds the CPU torch wheel (pip.conf's find-links; uv does not read pip.conf).
UV          := .packtrain/uv/bin/uv
UV_PIP       = $(UV) pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels)

$(UV):
	@test -x .packtrain/uv/bin/python || $(PYTHON) -m venv .packtrain/uv
	.packtrain/uv/bin/python -m pip install -q "uv==0.13.9"

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(UV)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(UV_PIP) --python $(PY) -c $(CONSTRAINTS) "$(TORCH_SPEC)" -e '.[dev,deepspeed,fp8]'
	@touch $(STAMP)

setup-airflow: $(AF_STAMP)

# constraints-airflow.txt: the Airflow venv's resolved set (packtrain's own dependencies, lm-eval included: the
# default recipe's task suite runs there; plus the airflow and dev extras), installed as it is (a resolver would
# otherwise backtrack over fastapi/cadwyn). Its third-party part builds while .venv builds (`make -j3`, as .ci/run
# does); packtrain itself, '.[airflow,dev]' with its dependencies under those pins (nothing left to resolve but a
# dependency added since the last `make lock`), waits for .venv's install, so the two never write src/*.egg-info at
# once. tests/unit/test_constraints.py checks that the file pins every requirement of those extras.
AF_DEPS := $(AF_VENV)/.deps-installed

$(AF_DEPS): constraints-airflow.txt | $(UV)
	@test -x $(AF_VENV)/bin/python || $(PYTHON) -m venv $(AF_VENV)
	$(UV_PIP) --python $(AF_VENV)/bin/python "$(TORCH_SPEC)" -r constraints-airflow.txt
	@touch $(AF_DEPS)

$(AF_STAMP): pyproject.toml $(AF_DEPS) $(STAMP)
	$(UV_PIP) --python $(AF_VENV)/bin/python -c constraints-airflow.txt "$(TORCH_SPEC)" -e '.[airflow,dev]'
	@touch $(AF_STAMP)

run: $(STAMP)
	$(VENV)/bin/packtrain run --recipe $(RECIPE)

# Debian's Chromium for the HTML report's browser test (tests/stages/test_compare_html.py; it skips without it):
# installed when /usr/bin/chromium is missing, as root with apt (~30 s, 115 MB; `apt-get update` first only when
# the package lists do not know it, or after a failed install); runs next to the venv installs under `make -j3`.
CHROMIUM_STAMP := .packtrain/chromium.stamp
chromium: $(CHROMIUM_STAMP)

$(CHROMIUM_STAMP):
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-cache show chromium >/dev/null 2>&1 || apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null; \
	  install="apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 chromium"; \
	  $$install >/dev/null || { apt-get update -q >/dev/null && $$install >/dev/null; } \
	    || { echo "make chromium: apt-get install chromium failed" >&2; exit 1; }; \
	else echo "make chromium: /usr/bin/chromium missing and no root apt-get: the browser test will skip"; fi
	@if [ -x /usr/bin/chromium ]; then mkdir -p $(@D) && touch $@; fi

# two workers (one per core of the CI machine; a third, to fill the time a test waits on its subprocesses or a
# server, was slower: fresh clone 2026-12-07, `make test` with -n 3: pytest 1,146 s and 1,998 user CPU-s, where -n 2
# took 1,110 s and 1,559 the session before), whole files per worker so module fixtures are built once, in
# collection order (tests/conftest.py puts the slowest files first); one torch thread per process
# (tests/conftest.py sets OMP_NUM_THREADS=1: a second thread per worker only spins on the other worker's core;
# CPU-seconds of one file alone, 2 threads → 1, back to back on the shared machine, 2026-12-06: test_promotion
# 203 → 56, test_gate_champion 124 → 78, test_train_deepspeed 36 → 29; test_register_champion and
# test_guard_ranks, which wait on MLflow and on their own rank processes, unchanged within the noise).
# The session's shared runs (tiny_pipeline, mlflow_server) are read-only to the tests that use them: a test that
# runs again in the tiny pipeline's workdir takes a copy of its own (tiny_pipeline_copy, tests/pipelines/conftest.py)
# and a check after each test fails the one that changed it, so no file depends on another file running first
# (`make test-reverse` shows it). `make test` itself runs the files in the reverse of a plain `pytest tests`'s order
# (PACKTRAIN_TEST_ORDER=reverse: the slow group still first, itself reversed, so the check costs ~nothing): CI sees one order, developers
# the other. The session fails when a test left a file in the checkout (tests/conftest.py).
# The whole target from a clean clone on the 2-core machine: bench/results/make_test_fresh_clone.log.
# mypy runs beside pytest (one process, ~16 CPU-s from a fresh clone, in the time the workers wait on their
# subprocesses and servers: pytest keeps ~1.7 of the 2 cores busy) and fails the target after pytest when it fails.
test: $(STAMP) $(AF_STAMP) $(CHROMIUM_STAMP)
	log=$$(mktemp); $(VENV)/bin/mypy >$$log 2>&1 & typecheck=$$!; \
	PACKTRAIN_TEST_ORDER=reverse $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=40 tests; \
	tests=$$?; wait $$typecheck; typed=$$?; echo "mypy: $$(tail -n 1 $$log)"; \
	if [ $$typed != 0 ]; then cat $$log; fi; rm -f $$log; [ $$tests = 0 ] && [ $$typed = 0 ]
	$(PY) bench/ci_gate.py

# tests/pipelines with every file in reverse order, the slowest last (PACKTRAIN_TEST_ORDER=reverse-all,
# tests/conftest.py): the files that share the session's tiny pipeline run pass whichever comes first. Not in CI
# (~4 min more on 2 cores: tests/pipelines is ~40% of `make test`); `make test`'s own order is the reverse already.
test-reverse: $(STAMP) $(AF_STAMP) $(CHROMIUM_STAMP)
	PACKTRAIN_TEST_ORDER=reverse-all $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10 \
	  tests/pipelines

# The CPU and GPU images, daemonless (podman/buildah from Debian packages, installed with apt-get as root when
# missing): docker/build-images.sh — the Dockerfiles' public bases when they can be pulled, else a local Python
# base from debootstrap; the host's CA bundle as a build secret. IMAGES=cpu (or gpu) builds one. docs/install.md.
IMAGES ?= cpu gpu
images:
	IMAGES="$(IMAGES)" bash docker/build-images.sh

# The images and the container runner for real (tests/pipelines/test_container_run.py: builds the CPU image with
# cached layers, one component with the IR's command, the tiny pipeline through `--runner docker`, a failing
# component, bad input); `.ci/run` runs it after `make test`. Warm 1.5-4.4 min on the shared 2-core machine (by its
# load); cold adds 3.5-15 min for the images from an empty store (bench/results/images.json).
test-containers: $(STAMP)
	IMAGES=base bash docker/build-images.sh
	PACKTRAIN_CONTAINER_TESTS=1 $(PY) -m pytest -q -n 0 --durations=10 tests/pipelines/test_container_run.py

# mypy over src/packtrain ([tool.mypy] in pyproject.toml), zero errors: ~11 s cold on 2 cores (<1 s warm,
# .mypy_cache/); under `make -j3 test` it runs beside the Airflow venv's install
typecheck: $(STAMP)
	$(VENV)/bin/mypy

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests components pipelines bench tools

bench-pack: $(STAMP)
	$(PY) -m bench pack-speed --out bench/results/pack_speed.json

# The wheels an image lacks, for GPU hosts with no package registry (docs/install.md): IMAGE is the image's package
# list, WHEELHOUSE_ARGS e.g. --only-runtime (44 MB for the H200 image instead of 118). Needs PyPI here, none there.
# The venv only runs pip and the builds (what ships comes from constraints.txt and the source): order-only, so a
# newer pyproject.toml does not reinstall it first.
IMAGE           ?= tools/images/cuda-h200.txt
WHEELHOUSE      ?= .whl-h200
WHEELHOUSE_ARGS ?=
wheelhouse: | $(STAMP)
	$(PY) tools/wheelhouse.py --exclude $(IMAGE) --out $(WHEELHOUSE) $(WHEELHOUSE_ARGS)

# Refresh the committed constraints from the current venv (after a deliberate upgrade).
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^torch==' > $(CONSTRAINTS)
	$(AF_VENV)/bin/python -m pip freeze --exclude-editable | grep -v '^torch==' > constraints-airflow.txt

clean:
	rm -rf $(VENV) $(AF_VENV) .packtrain
