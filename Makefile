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

.PHONY: run test setup setup-airflow lint clean bench-pack lock repro

# `dvc repro` with the venv's packtrain on PATH (dvc.yaml calls the CLI)
repro: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/dvc repro

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev,deepspeed]'
	@touch $(STAMP)

setup-airflow: $(AF_STAMP)

# constraints-airflow.txt: the Airflow venv's resolved set, installed as it is (pip would otherwise backtrack for
# minutes over fastapi/cadwyn). Its third-party part can build while .venv builds (`make -j2`, as .ci/run does);
# the editable install of packtrain waits for .venv's, so the two never write src/*.egg-info at once.
AF_DEPS := $(AF_VENV)/.deps-installed

$(AF_DEPS): constraints-airflow.txt
	@test -x $(AF_VENV)/bin/python || $(PYTHON) -m venv $(AF_VENV)
	$(AF_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(AF_VENV)/bin/python -m pip install -q -r constraints-airflow.txt
	@touch $(AF_DEPS)

$(AF_STAMP): pyproject.toml $(AF_DEPS) $(STAMP)
	$(AF_VENV)/bin/python -m pip install -q --no-deps -e .
	@touch $(AF_STAMP)

run: $(STAMP)
	$(VENV)/bin/packtrain run --recipe $(RECIPE)

# two workers (one per core of the CI machine), whole files per worker so module fixtures are built once, in
# collection order (tests/conftest.py puts the slowest files first)
test: $(STAMP) $(AF_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests
	$(PY) bench/ci_gate.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests components pipelines bench

bench-pack: $(STAMP)
	$(PY) bench/pack_speed_suite.py

# Refresh the committed constraints from the current venv (after a deliberate upgrade).
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^torch==' > $(CONSTRAINTS)
	$(AF_VENV)/bin/python -m pip freeze --exclude-editable | grep -v '^torch==' > constraints-airflow.txt

clean:
	rm -rf $(VENV) $(AF_VENV) .packtrain
