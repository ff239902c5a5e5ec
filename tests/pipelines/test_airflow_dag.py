"""The Airflow DAG `packtrain_retrain` under `dag.test()`, in .venv-airflow (Airflow destabilises the main
venv; `make setup-airflow` installs it), on a sqlite AIRFLOW_HOME in tmp that `airflow db migrate` migrates (the
CLI's own entry point, first thing in the test's one Airflow process: one Airflow start instead of two, ~3 CPU-s).
Four runs in that process, on a cold workdir (no stage cache: every stage really runs in the Airflow venv) with
the DAG's default recipe (retrain-cpu, its lm-eval task suite included) at the tiny test sizes:

1. new data → detect, validate, run the pipeline on the worker (in process: ingest … train, evaluate with the
   wordorder task, register), report the registered version + alias and the warm start's fallback;
2. same data → detect skips, nothing else runs;
3. new data that fails validation → validate_data fails, the pipeline never runs, the version is not
   recorded (so the next schedule retries).

4. the same recipe in a fresh workdir, with `import lm_eval` failing in that process from then on (a finder on
   sys.meta_path, as if lm-eval were not installed): the first task refuses the recipe naming the package, and
   nothing after it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from pipeline_helpers import PINNED_CODE, REPO, tiny_corpus, tiny_settings

pytestmark = pytest.mark.slow

AF_PYTHON = REPO / ".venv-airflow" / "bin" / "python"

SCRIPT = r'''
import importlib.util, json, sys, time
dag_file, items = sys.argv[1], json.loads(sys.argv[2])
from airflow.__main__ import main as airflow_cli
sys.argv = ["airflow", "db", "migrate"]   # `airflow db migrate`, the CLI's entry point in this process
airflow_cli()
print("MIGRATED", flush=True)
spec = importlib.util.spec_from_file_location("packtrain_airflow_dag", dag_file)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dag = mod.packtrain_retrain_dag
from airflow.models import TaskInstance
from airflow.utils.session import create_session


class NoModule:
    """On sys.meta_path: `import <name>` fails as if the package were not installed."""

    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


for item in items:   # {"conf": trigger conf, "without": [modules taken away from here on]}
    for name in item.get("without", []):
        sys.meta_path.insert(0, NoModule(name))
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
    conf = item["conf"]
    t0 = time.perf_counter()
    try:
        dr = dag.test(run_conf=conf)
        run_id = dr.run_id
    except Exception as e:  # a failed task surfaces here in some Airflow versions
        print("DAGTEST-ERROR", type(e).__name__, e)
        run_id = None
    with create_session() as s:
        q = s.query(TaskInstance).filter(TaskInstance.dag_id == "packtrain_retrain")
        if run_id:
            q = q.filter(TaskInstance.run_id == run_id)
        else:  # the newest run
            newest = max(ti.run_id for ti in q)
            q = q.filter(TaskInstance.run_id == newest)
        print("RESULT " + json.dumps({ti.task_id: str(ti.state) for ti in q}), flush=True)
    print(f"SECONDS {time.perf_counter() - t0:.1f}", flush=True)
import gc
gc.freeze()   # no teardown collection of airflow + torch + transformers + mlflow + GX (~2 CPU-s; packtrain.cli's too)
'''


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    if not AF_PYTHON.exists():
        pytest.skip(".venv-airflow is missing: `make setup-airflow` creates it (`make test` does)")
    home = tmp_path_factory.mktemp("airflow_home")
    dags = home / "dags"
    dags.mkdir()
    shutil.copy(REPO / "pipelines" / "airflow_dag.py", dags / "airflow_dag.py")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
           "PACKTRAIN_CODE_VERSION": PINNED_CODE, "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    for var in ("MLFLOW_TRACKING_URI", "PACKTRAIN_PARENT_RUN_ID", "VIRTUAL_ENV", "PACKTRAIN_RECIPE",
                "PACKTRAIN_OVERRIDES"):
        env.pop(var, None)
    return {"home": home, "dag": dags / "airflow_dag.py", "env": env}   # migrated by SCRIPT, in its process


def test_dag_runs_cold_skips_and_stops_on_bad_data(airflow_env, tmp_path):
    corpus, workdir = tiny_corpus(tmp_path / "corpus"), tmp_path / "wd"
    # the default recipe's own suites (the wordorder task): tiny_settings' `evaluate.suites=[]` left out
    settings = [s for s in tiny_settings(workdir, corpus) if s != "evaluate.suites=[]"]
    bad = tmp_path / "corpus_v2"
    shutil.copytree(corpus, bad)
    (bad / "new.txt").write_text("A new document arrived this week.\n")
    bad_settings = [s for s in settings if not s.startswith("ingest.source=")] + [
        f"ingest.source={bad}", "validate.min_rows=10000"]
    # no "recipe": the DAG's default, retrain-cpu (warm start from the champion; none yet → scratch); the last run
    # in a fresh workdir with `import lm_eval` failing from then on (a finder on sys.meta_path of that process)
    fresh = tmp_path / "wd_no_lm_eval"
    blocked = [s for s in settings if not s.startswith("workdir=")] + [f"workdir={fresh}"]
    items = [{"conf": {"overrides": s}} for s in (settings, settings, bad_settings)]
    items.append({"conf": {"overrides": blocked}, "without": ["lm_eval"]})
    r = subprocess.run([str(AF_PYTHON), "-c", SCRIPT, str(airflow_env["dag"]), json.dumps(items)],
                       env=airflow_env["env"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    assert "MIGRATED" in r.stdout.splitlines(), log[-5000:]   # `airflow db migrate` returned
    results = [json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    print("dag.test seconds per run:", [line.split()[1] for line in r.stdout.splitlines() if line.startswith("SECONDS ")])
    assert len(results) == 4, log[-5000:]
    first, second, third, no_lm_eval = results
    tasks = ["detect_data_version", "validate_data", "run_pipeline", "report"]
    assert first == dict.fromkeys(tasks, "success"), log[-8000:]
    assert second == dict.fromkeys(tasks, "skipped"), log[-5000:]
    assert third["detect_data_version"] == "success" and third["validate_data"] == "failed", log[-5000:]
    assert third["run_pipeline"] == third["report"] == "upstream_failed"

    state = json.loads((workdir / "airflow" / "last_data_version.json").read_text())
    assert state["registered"] == {"model_name": "packtrain-lm", "version": "1", "alias": "champion"}, log[-8000:]
    from packtrain.versioning import data_md5

    assert state["version"] == data_md5(corpus) and state["version"].endswith(".dir")   # the DVC md5 of the folder
    assert "registered packtrain-lm v1 alias=champion" in log
    assert "warm start: init_from=champion → scratch" in log   # the first run: no champion to continue yet
    # every stage ran here (a cold workdir), the recipe's task suite scored by lm-eval in the Airflow venv
    (run_dir,) = (workdir / "kfp").iterdir()
    suites = json.loads((run_dir / "evaluate" / "evaluation" / "suites.json").read_text())
    assert [s["name"] for s in suites["suites"]] == ["recent", "wordorder"]
    assert [(m["suite"], m["model"], m["n"]) for m in suites["task_metrics"]] == [("wordorder", "challenger", 200)]

    # without lm_eval: the first task refuses the recipe, naming the package; nothing after it runs
    assert no_lm_eval == {"detect_data_version": "failed", **dict.fromkeys(tasks[1:], "upstream_failed")}, log[-5000:]
    assert "evaluate.suites[0] ('wordorder', @recipes/tasks/wordorder/wordorder.yaml) is an lm-eval task, which " \
           "needs package lm-eval (import lm_eval: No module named 'lm_eval')" in log, log[-5000:]
    assert not (fresh / "kfp").exists() and not (fresh / "airflow").exists()
