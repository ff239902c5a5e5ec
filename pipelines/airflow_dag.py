"""Airflow 3 DAG `packtrain_retrain`: weekly retraining when the DVC data version changed.

    detect_data_version ──► validate_data ──► run_pipeline ──► report
      (skip: unchanged)     (GX gate: fail     (pipeline.mode: local → `packtrain run` on the worker;
                             stops the run)      cluster → submit to pipeline.kfp_host, wait)

Each task calls one function of `packtrain.pipeline.retrain`; the DAG holds no logic. Parameters (trigger
conf or the UI form): `recipe` (name or path), `overrides` (list of "dotted.key=value"), `force` (run even if
the data version is unchanged). Defaults come from PACKTRAIN_RECIPE / PACKTRAIN_OVERRIDES (JSON list) in
the worker's environment; the default recipe is `retrain-cpu`.

Warm start: the default recipe sets `model.init_from: champion` — every scheduled run continues the registered
champion (models:/<register.model_name>@champion, downloaded once into <workdir>/models/<name>/v<N>/) and
tokenizes with its tokenizer; the very first run, with no champion yet, starts from `model.init_fallback`
(scratch) and says so. The new version is tagged `packtrain.parent_model_version`; `report` prints the lineage.
A recipe of your own gets the same with `model.init_from: champion` (docs/model.md, "Warm start").

Several GPUs: overrides ["train.gpus=N"]. run_pipeline's train stage (in the worker's process here, the KFP train
component's pod in cluster mode) is the stage runner, which launches the N ranks itself (packtrain.train.launch) — the same launch
as `packtrain train --gpus N`; the DAG has no launch code of its own.

Schedule: Mondays 03:00 (Airflow's 5-field cron; the KFP recurring run uses the 6-field form `0 0 3 * * 1`).
Airflow lives in .venv-airflow (`make setup-airflow`: packtrain with its dependencies, lm-eval included, and the
airflow extra, under constraints-airflow.txt), see docs/pipeline.md.
"""

from __future__ import annotations

import json
import os
from datetime import datetime

from airflow.sdk import Param, dag, task

DEFAULT_RECIPE = os.environ.get("PACKTRAIN_RECIPE", "retrain-cpu")   # warm start from the champion
DEFAULT_OVERRIDES = json.loads(os.environ.get("PACKTRAIN_OVERRIDES", "[]"))


def _config(params: dict):
    from packtrain.config import load_run_config

    return load_run_config(params.get("recipe") or DEFAULT_RECIPE, list(params.get("overrides") or []))


@dag(
    dag_id="packtrain_retrain",
    schedule="0 3 * * 1",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["packtrain", "training"],
    params={
        "recipe": Param(DEFAULT_RECIPE, type="string", description="recipe name in recipes/ or a YAML path"),
        "overrides": Param(DEFAULT_OVERRIDES, type="array", description="--set overrides, dotted.key=value"),
        "force": Param(False, type="boolean", description="retrain even when the data version is unchanged"),
    },
    doc_md=__doc__,
)
def packtrain_retrain():
    @task
    def detect_data_version(params=None) -> dict:
        """The source's DVC md5 vs the last version trained on; unchanged → skip the whole run. In local mode a
        recipe whose suites need a package this worker lacks (lm-eval for a task suite) fails here, naming it,
        before anything is ingested or trained (packtrain.config.preflight.check_suite_packages)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from packtrain.pipeline.retrain import detect_data_version as detect

        res = detect(_config(params), force=bool(params.get("force")))
        print(f"data version {res['version']} (previous {res['previous']}) from {res['source']}")
        if not res["changed"]:
            raise AirflowSkipException(f"data version {res['version']} unchanged since the last retrain")
        return res

    @task
    def validate_data(detected: dict, params=None, run_id=None) -> dict:
        """Ingest + the Great Expectations suite; a failed suite fails this task and nothing trains."""
        from pathlib import Path

        from packtrain.pipeline.retrain import validate_data as validate
        from packtrain.pipeline.retrain import validate_dir

        cfg = _config(params)
        out = validate_dir(cfg, detected["version"])
        stats = validate(cfg, out)
        return {"version": detected["version"], "report": str(Path(stats["report_dir"]) / "report.json")}

    @task
    def run_pipeline(validated: dict, params=None) -> dict:
        """The whole pipeline: on this worker (mode local) or the KFP cluster (mode cluster), waited on."""
        from packtrain.pipeline.retrain import run_pipeline as run

        return {"version": validated["version"], **run(_config(params), validated["version"])}

    @task
    def report(result: dict, params=None) -> dict:
        """Print the registered version and alias; remember the data version trained on."""
        from packtrain.pipeline.retrain import record_version

        reg = result.get("registered") or {}
        record_version(_config(params), result["version"], reg)
        print(f"registered {reg.get('model_name')} v{reg.get('version')} alias={reg.get('alias')} "
              f"(data {result['version']}, mode {result['mode']})")
        warm = result.get("warm_start") or {}
        if warm:
            why = f" ({warm['fallback_reason']})" if warm.get("fallback_reason") else ""
            print(f"warm start: init_from={warm.get('init_from')} → {warm.get('resolved') or 'scratch'}{why}")
        return reg

    report(run_pipeline(validate_data(detect_data_version())))


packtrain_retrain_dag = packtrain_retrain()
