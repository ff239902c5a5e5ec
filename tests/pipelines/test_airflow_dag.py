"""The Airflow DAG `packtrain_retrain` under `dag.test()`, in .venv-airflow (Airflow destabilises the main
venv), on a migrated sqlite AIRFLOW_HOME in tmp. Three runs in one Airflow process:

1. new data → detect, validate, run the pipeline on the worker (in process; restored from the `tiny_pipeline`
   stage cache), report the registered version + alias;
2. same data → detect skips, nothing else runs;
3. new data that fails validation → validate_data fails, the pipeline never runs, the version is not
   recorded (so the next schedule retries).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from pipeline_helpers import PINNED_CODE, REPO

pytestmark = pytest.mark.slow

AF_PYTHON = REPO / ".venv-airflow" / "bin" / "python"

SCRIPT = r'''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("packtrain_airflow_dag", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dag = mod.packtrain_retrain_dag
from airflow.models import TaskInstance
from airflow.utils.session import create_session
for conf in json.loads(sys.argv[2]):
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
    for var in ("MLFLOW_TRACKING_URI", "PACKTRAIN_PARENT_RUN_ID", "VIRTUAL_ENV"):
        env.pop(var, None)
    r = subprocess.run([str(AF_PYTHON), "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {"home": home, "dag": dags / "airflow_dag.py", "env": env}


def test_dag_runs_skips_and_stops_on_bad_data(airflow_env, tiny_pipeline, tmp_path):
    assert tiny_pipeline["result"].returncode == 0
    settings = tiny_pipeline["settings"]
    bad = tmp_path / "corpus_v2"
    shutil.copytree(tiny_pipeline["corpus"], bad)
    (bad / "new.txt").write_text("A new document arrived this week.\n")
    bad_settings = [s for s in settings if not s.startswith("ingest.source=")] + [
        f"ingest.source={bad}", "validate.min_rows=10000"]
    # tiny-cpu, not the DAG's default retrain-cpu: this test is about skipping/validation, not warm start
    confs = [{"recipe": "tiny-cpu", "overrides": s} for s in (settings, settings, bad_settings)]
    r = subprocess.run([str(AF_PYTHON), "-c", SCRIPT, str(airflow_env["dag"]), json.dumps(confs)],
                       env=airflow_env["env"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    results = [json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 3, log[-5000:]
    first, second, third = results
    tasks = ["detect_data_version", "validate_data", "run_pipeline", "report"]
    assert first == dict.fromkeys(tasks, "success"), log[-5000:]
    assert second == dict.fromkeys(tasks, "skipped"), log[-5000:]
    assert third["detect_data_version"] == "success" and third["validate_data"] == "failed", log[-5000:]
    assert third["run_pipeline"] == third["report"] == "upstream_failed"

    state = json.loads((tiny_pipeline["workdir"] / "airflow" / "last_data_version.json").read_text())
    # a scheduled run turns register.gate on (docs/gate.md): a register config the session's run did not have, so
    # its register stage reruns on the restored model — the same loss, so challenger, nothing to gate
    assert state["registered"] == {"model_name": "packtrain-lm", "version": "2", "alias": "challenger"}, log[-8000:]
    assert state["version"].endswith(".dir")  # the DVC md5 of the (first) corpus folder
    from packtrain.versioning import data_md5

    assert state["version"] == data_md5(tiny_pipeline["corpus"])
    assert "registered packtrain-lm v2 alias=challenger" in log
