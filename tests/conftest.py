"""Shared fixtures. Real parts only: MLflow on sqlite in tmp, real DVC repos, real GX, real transformers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
# bytecode is written on first import (the venvs are installed without precompiling it); a machine-wide
# PYTHONDONTWRITEBYTECODE would make every test process parse every module from source
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# as packtrain.cli sets it: CPU matmuls independent of buffer alignment, so "an unchanged rerun gives the same loss,
# bit for bit" holds for trainings run in this process too
os.environ.setdefault("MKL_CBWR", "AUTO")
# one torch/OpenMP thread per process (inherited by the CLI, kfp-component and Airflow processes the tests start), as
# `python -m bench all --smoke` runs: `make test`'s two xdist workers have a core each, and two threads per worker
# spin on the other's core (a tiny train_tiny of tests/promotion_models.py: 6.8 CPU-s with 2 threads, 0.7 s with 1,
# on the shared 2-core machine). Set before anything imports torch; a developer's OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests: random exploration on developer machines; in CI (.ci/run sets HYPOTHESIS_PROFILE=ci) the same
# examples every run, so a counterexample found by chance fails a developer's run, not an unrelated merge.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True, print_blob=True)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a dev extra
    pass


@pytest.fixture(autouse=True)
def _isolated_mlflow(monkeypatch, tmp_path):
    """No test writes to a shared MLflow store or inherits a parent run by accident."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PACKTRAIN_PARENT_RUN_ID", raising=False)
    yield
    try:
        import sys

        if "mlflow" in sys.modules:
            import mlflow

            while mlflow.active_run() is not None:
                mlflow.end_run()
    except Exception:
        pass


def _session_dir(tmp_path_factory) -> Path:
    """The base temp dir of the whole session: the same for every xdist worker and for the controller."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


_STARTED: list = []


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real `mlflow server` (sqlite backend, proxied artifacts, free local port; tests/mlflow_server.py) for
    the whole session, shared by every xdist worker: the first test that needs it starts it under a file lock,
    the others reuse it, and the session's end stops it (pytest_sessionfinish below). One start instead of one
    per module saves ~6-10 s of CPU each (MLflow import, a fresh sqlite schema, a uvicorn worker).

    Modules keep apart by names: each uses its own experiment (tracking.experiment) and registered model
    names, so no test sees another module's runs; only tests/pipelines/test_run_server.py keeps the defaults
    ("packtrain", "packtrain-lm"). Returns an object with `.uri` ("http://127.0.0.1:PORT") and `.root`.
    """
    import fcntl
    import types

    from mlflow_server import Server, free_port

    shared = _session_dir(tmp_path_factory)
    root = shared / "mlflow_server"
    root.mkdir(exist_ok=True)
    with open(shared / "mlflow_server.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = root / "record.json"
        if not record.exists():
            from packtrain.tracking.store_creation import copy_template

            db = root / "server.db"
            copy_template(db)   # its empty store: the template's copy (no Default experiment yet: the server makes
            srv = Server(root, free_port(), db=db)   # it), not ~70 migrations in the server's CLI process
            srv.start()
            _STARTED.append(srv)   # alive until this worker exits (no "still running" warning from its Popen)
            record.write_text(json.dumps({"uri": srv.uri, "pid": srv.proc.pid}))
        rec = json.loads(record.read_text())
    return types.SimpleNamespace(uri=rec["uri"], root=root)


@pytest.fixture(scope="session")
def seed_mlflow_store():
    """`seed_mlflow_store(path)` puts an empty MLflow sqlite store (schema at MLflow's head, no experiment, no
    registered model) at `path`: a copy of the product's store template (packtrain.tracking.store_creation, made
    once per MLflow version under the user cache), as `ensure_store` makes every fresh store a packtrain stage
    opens, then opened once from its folder (the Default experiment's artifact location there, not in the checkout).
    For a store whose first opener is not packtrain (a raw MlflowClient in the test, an `mlflow server`), which would
    otherwise run MLflow's ~70 schema migrations (1.5-2.7 CPU-s a store; a copy opens in ~0.1 s).
    Not for tests whose subject is the creation of a store (tests/faults/test_store_creation_race.py's is)."""
    from mlflow import MlflowClient

    from packtrain.tracking.store_creation import copy_template

    def seed(path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        copy_template(path)   # False without a cache: the client below migrates a fresh store
        uri = f"sqlite:///{path}"
        with pytest.MonkeyPatch.context() as mp:   # the Default experiment's artifacts beside the store, in tmp
            mp.chdir(path.parent)
            MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()
        return path
    return seed


# Nothing a test writes may land in the checkout (a leaked `other.db` was committed once): the controller (or a run
# without xdist) lists the checkout's untracked and git-ignored paths before the session and fails the session
# when one appeared by its end (interpreter and tool caches aside). `git status` takes ~30 ms.
_REPO = Path(__file__).resolve().parents[1]
_CACHES = {"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}
_BEFORE: list = []


def _checkout_extras() -> set[str] | None:
    """Untracked and ignored paths of the checkout (`git status`: ignored folders as one entry), None outside git."""
    import subprocess

    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored=matching"],
                           cwd=_REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    paths = {line[3:] for line in r.stdout.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not _CACHES & set(p.rstrip("/").split("/")) and not p.endswith(".pyc")}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        _BEFORE.append(_checkout_extras())


def _check_checkout(session) -> None:
    before = _BEFORE[0] if _BEFORE else None
    after = _checkout_extras() if before is not None else None
    new = sorted(after - before) if after is not None and before is not None else []
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"tests wrote into the checkout {_REPO} (write under tmp_path instead): " + ", ".join(new))
        if reporter is not None:
            reporter.write("\n")
            reporter.write_sep("=", "files left in the checkout", red=True)
            reporter.write_line(message)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_sessionfinish(session):
    """Stop the shared `mlflow_server` once the whole session is done: in the xdist controller (after every
    worker) or in a run without xdist; never in a worker, whose peer may still use it. Then fail the session if a
    test left a file in the checkout (`_check_checkout`)."""
    if hasattr(session.config, "workerinput"):
        return
    _check_checkout(session)
    base = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)   # None: no tmp dir made
    record = Path(base) / "mlflow_server" / "record.json" if base is not None else None
    if record is not None and record.exists():
        from mlflow_server import stop_group

        stop_group(json.loads(record.read_text())["pid"])


# Under pytest-xdist (`make test` runs `-n 2 --dist loadfile`) the slowest files start first, so the two workers
# finish together instead of one waiting out a long file at the end: longest first (wall seconds of each file in a
# whole `-n 2` run on the 2-core machine, 2026-12-01 12:05: warm_start_run 173, local_pipeline 150, sft_lora 117,
# dvc 105, wheel_ir 69, secrets_full_run 58, gate_champion 51, run_server 46, airflow 43, train_stage 40,
# train_faults 39, fsdp2_train 28, ...; the ~1,500 other tests ~100 s together), except that local_pipeline leads:
# it runs the session's `tiny_pipeline`, which run_server, dvc_one_repo and airflow wait for (file lock). Replaying
# that run's per-test times through xdist's loadfile scheduler: this order ends the workers at 591/590 s, the
# previous one at 604/576 s. dvc_one_repo came later (16 s alone, 2026-12-02), placed by that time.
_SLOW_FIRST = ("test_kfp_runner.py", "test_promotion.py", "test_local_pipeline.py", "test_champion_domain.py", "test_bench_suites.py",
               "test_local_task.py", "test_warm_start_run.py", "test_sft_lora.py", "test_dvc.py",
               "test_wheel_ir.py", "test_secrets_full_run.py", "test_gate_champion.py", "test_run_server.py",
               "test_airflow_dag.py", "test_train_stage.py", "test_train_faults.py", "test_fsdp2_train.py",
               "test_dvc_one_repo.py", "test_cache_content_keys.py", "test_disk_full.py",
               "test_store_creation_race.py", "test_gate_memory_per_stage.py", "test_orphaned_pipeline_run.py",
               "test_publish_stages.py", "test_compare_mlflow.py", "test_replay_idempotent.py",
               "test_tracking_server.py", "test_component_runtime.py", "test_train_deepspeed.py",
               "test_kfp_compile.py", "test_secrets_outage.py", "test_lora_train.py", "test_family_isolation.py",
               "test_orphaned_runs.py", "test_train_eval.py", "test_registry_no_pickle.py",
               "test_family_attention_stages.py", "test_contamination_stages.py", "test_data_record_rules.py")


def pytest_collection_modifyitems(config, items):
    """Slowest files first (`_SLOW_FIRST`), each file's tests in their order. PACKTRAIN_TEST_ORDER:

        reverse       the files the other way round, the slowest still first but among themselves reversed too:
                      `make test` (every file, tests/pipelines' included, in the reverse of a developer's plain
                      `pytest`, at little cost to the workers' balance: the slow group still precedes the rest)
        reverse-all   every file the other way round, the slowest last: `make test-reverse` (tests/pipelines)

    Either shows that no file depends on another running first: the session's shared runs are read-only
    (tests/pipelines/conftest.py: `tiny_pipeline_copy` for a test that writes, and a check after each test)."""
    order = os.environ.get("PACKTRAIN_TEST_ORDER", "")
    if order not in ("", "reverse", "reverse-all"):
        raise pytest.UsageError(f"PACKTRAIN_TEST_ORDER={order!r}: 'reverse', 'reverse-all' or unset")
    if order:
        files = list(dict.fromkeys(item.path for item in items))[::-1]
        place = {path: i for i, path in enumerate(files)}
        items.sort(key=lambda item: place[item.path])
    rank = {name: i for i, name in enumerate(_SLOW_FIRST)}
    if order == "reverse":   # the slow files still first, but in the reverse of their listed order too
        items.sort(key=lambda item: -rank[item.path.name] if item.path.name in rank else len(rank))
    else:
        sign = -1 if order == "reverse-all" else 1
        items.sort(key=lambda item: sign * rank.get(item.path.name, len(rank)))   # stable: file order kept otherwise
