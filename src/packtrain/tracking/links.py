"""Where to look at a run, for every kind of tracking store, with credentials redacted.

    mlflow_hint("http://alice:pw@127.0.0.1:5000", "1", "3f2a…")
      → 'open http://127.0.0.1:5000/#/experiments/1/runs/3f2a…?workflowType=machine_learning'
                                                                    (the browser asks for the login)
    mlflow_hint("sqlite:////abs/data/mlflow.db", "1", "3f2a…")
      → '.venv/bin/mlflow ui --backend-store-uri sqlite:////abs/data/mlflow.db, then open
         http://127.0.0.1:5000/#/experiments/1/runs/3f2a…?workflowType=machine_learning'
    mlflow_hint("postgresql://u:pw@db/mlflow", ...)
      → '.venv/bin/mlflow ui --backend-store-uri postgresql://u:***@db/mlflow (put the password back), then …'
    mlflow_hint("databricks", "1", "3f2a…")
      → 'open experiment 1, run 3f2a… in your Databricks workspace'

A tracking server serves the UI itself (`mlflow ui --backend-store-uri http://…` cannot open one: `mlflow ui`
wants a database or a directory). Anything else is a store `mlflow ui` can serve on its default port 5000.

Every link carries `?workflowType=machine_learning` (TRAINING_VIEW): MLflow 3.17's UI picks an experiment's
view from its sidebar switch "GenAI | Model training" — the URL's `workflowType`, else the browser's remembered
choice (localStorage `mlflow.workflowType`), GenAI by default — and not from the experiment's
`mlflow.experimentKind` tag. Without it a fresh browser opens a run's experiment on the GenAI "Overview" (traces,
a "Detect Issues" popup) and the run page's breadcrumb reads "Evaluations"; with it, the Runs table and "Runs".
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

UI_PORT = 5000
TRAINING_VIEW = "?workflowType=machine_learning"
"""The MLflow UI's query that opens the training ("Model training") view whatever the browser remembers."""


def run_path(experiment_id: str | None, run_id: str | None) -> str:
    """The MLflow UI's fragment for a run (or an experiment's runs table; '' without one), in the training view.

    >>> run_path("1", "3f2a")
    '/#/experiments/1/runs/3f2a?workflowType=machine_learning'
    >>> run_path("1", None)
    '/#/experiments/1/runs?workflowType=machine_learning'
    """
    if not experiment_id:
        return ""
    return f"/#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "") + TRAINING_VIEW


def mlflow_exe() -> str:
    """`mlflow` of this venv, relative to the current directory when under it (`.venv/bin/mlflow`)."""
    exe = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    try:
        return str(Path(exe).relative_to(Path.cwd()))
    except ValueError:
        return exe


def mlflow_hint(tracking_uri: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """One copy-pasteable line that shows the run: see the module docstring. Never holds a password."""
    from packtrain.secrets import redact_uri

    shown = redact_uri(tracking_uri) or ""
    where = run_path(experiment_id, run_id)
    if shown.startswith(("http://", "https://")):   # the browser asks for the login itself
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(shown)
        bare = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
        return f"open {bare.rstrip('/')}{where}"
    if shown.startswith("databricks"):
        return (f"open experiment {experiment_id}, run {run_id} in your Databricks workspace" if run_id
                else "open the experiment in your Databricks workspace")
    note = " (put the password back)" if "***" in shown else ""
    then = f", then open http://127.0.0.1:{UI_PORT}{where}" if where else ""
    return f"{mlflow_exe()} ui --backend-store-uri {shown}{note}{then}"


def store_args(cfg, from_env: bool) -> str:
    """The `packtrain` arguments that reach this run's store again (appended to the printed compare/gate
    lines): none when MLFLOW_TRACKING_URI is set (the shell keeps it); `--set tracking.tracking_uri=…` when
    the config names a store; else the workdir (its mlflow.db) when it is not the recipe's default.
    """
    if from_env:
        return ""
    if cfg.tracking.tracking_uri:
        return f" --set tracking.tracking_uri={cfg.tracking.tracking_uri}"   # never holds a password (refused)
    recipe = "" if cfg.name == "tiny-cpu" else f" --recipe {cfg.name}"
    try:
        from packtrain.config import load_run_config

        default = Path(load_run_config(cfg.name).workdir).resolve()
    except Exception:  # a recipe given as a path: name the workdir
        default = None
    return recipe + ("" if default == Path(cfg.workdir).resolve() else f" --set workdir={cfg.workdir}")


def run_footer(tracking_uri: str, experiment_id: str | None, run_id: str | None, *, previous: str | None,
               model: str, champion: bool, extra_args: str = "") -> list[str]:
    """The lines `packtrain run` ends with: where to look, the run id, what to type next.

        MLflow     open http://127.0.0.1:5000/#/experiments/1/runs/3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f?workflowType=machine_learning
        run id     3f2a9c0e (pipeline run 3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f)
        compare    packtrain compare 77c1d2e3 3f2a9c0e
        gate       packtrain gate --candidate 3f2a9c0e --baseline packtrain-lm@champion

    compare: the previous pipeline run of the experiment (compare's baseline is its first run), then this
    one (alone without one). gate: against the champion, or against the previous run when this run just
    became the champion.
    """
    from packtrain.tracking.refs import short_id

    lines = [f"  MLflow     {mlflow_hint(tracking_uri, experiment_id, run_id)}"]
    if not run_id or run_id.startswith("pending-"):
        if run_id:
            lines.append(f"  run id     {run_id} (the MLflow store was unreachable: the run gets its id when the "
                         f"buffer is replayed, `packtrain mlflow replay`)")
        return lines
    short = short_id(run_id)
    lines.append(f"  run id     {short} (pipeline run {run_id})")
    prev = short_id(previous) if previous else None
    lines.append(f"  compare    packtrain compare {prev + ' ' if prev else ''}{short}{extra_args}")   # baseline first
    baseline = prev if champion and prev else f"{model}@champion"
    if baseline != f"{model}@champion" or not champion:
        lines.append(f"  gate       packtrain gate --candidate {short} --baseline {baseline}{extra_args}")
    return lines
