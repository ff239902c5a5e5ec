"""Where gate metrics come from: an MLflow run (tree), a registered model, or a committed JSON file.

    load_source("bench/baselines/ci-tiny.json")       JSON: {"metrics": {...}} or a flat/nested dict of numbers;
                                                       a list of numbers = repeats/history of that metric;
                                                       a list of row objects (bench/gpu_bench.py) → metrics
                                                       named "<variant>.<field>", e.g. packtrain.useful_mfu
    load_source("3f2a9c0e", tracking_uri)             a run: full id, ≥ 6-character prefix or runs:/<id>
                                                       (packtrain.tracking.refs.resolve_run_ref)
    load_source("packtrain-lm@champion")              a registered model version (also models:/name@alias,
                                                       models:/name/3): the training run that produced it

Like with like: a packtrain run is read as its **run tree** — the pipeline run (which holds every stage's final
numbers) and its stage runs (their series; older runs and runs of their own also their finals) — and its
metrics carry the canonical names of packtrain.gate.metrics (`train.throughput.real_tokens_per_s`,
`pack.fill`, ...), whichever run of the tree was named:

    pipeline run 69930646 ──► its train stage run efa50e85 (+ the pack and evaluate stage runs)
    register run a11b422f ──► its pipeline's train stage run (the register run itself has no throughput)
    packtrain-lm@champion ──► version 1 ──► tag packtrain.train_run_id, else its run's tree (the train run
                                            that owns the model; older versions: the register run)

A lone stage run (a CLI `packtrain train` outside `packtrain run`) is read alone, its names prefixed with
its stage. Runs that packtrain did not make (no `packtrain.kind` tag) keep their own metric names.
The histories behind `aggregate: median` come from the stage run's per-step series (`real_tokens_per_s`
for `train.throughput.real_tokens_per_s`); `last` is the final value the stage logged (for throughput,
already the median over the steady-state steps).

Missing things raise MissingDataError with exit code 2 (the gate's "missing data"), naming what is missing.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtrain.config.base import flatten
from packtrain.errors import MissingDataError
from packtrain.gate.metrics import BY_NAME, canonical_name, is_duplicate, series_names

MISSING_EXIT = 2
_ALIAS = re.compile(r"^(?:models:/)?(?P<name>[^@/\s]+)@(?P<alias>[\w.\-]+)$")
_VERSION = re.compile(r"^models:/(?P<name>[^@/\s]+)/(?P<version>\d+)$")
TRAIN_RUN_TAG = "packtrain.train_run_id"
"""Model-version tag (set by the register stage): the training run that produced the version."""


def missing(message: str) -> MissingDataError:
    return MissingDataError(message, exit_code=MISSING_EXIT)


@dataclass
class MetricSource:
    """Metrics of one run tree or file: latest values plus per-step series (MLflow history read on demand).

    `where[name]` = (run id, metric key) whose history is `name`'s series; `scheme` is "packtrain" for a
    run tree (canonical names), "mlflow" for another MLflow run, "file" for JSON; `device` the
    `packtrain.gpu` tag ("cpu", "NVIDIA H200") when known."""

    label: str
    metrics: dict[str, float]
    series: dict[str, list[float]] = field(default_factory=dict)
    run_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    client: Any = None
    where: dict[str, tuple[str, str]] = field(default_factory=dict)
    scheme: str = "file"
    device: str | None = None
    model_id: str | None = None
    """The training run whose weights the source's model is: its train run, or the run that train run was restored
    from (a cached stage's run is a copy, tag packtrain.restored_from). Equal ids: the same model."""
    ref: str | None = None
    """The model reference the source was found by (`packtrain-lm@champion`), when it was."""

    def values(self, name: str) -> list[float] | None:
        """All recorded values of `name` in step order (one value when only the latest is known)."""
        if name in self.series:
            return self.series[name]
        if name not in self.metrics:
            return None
        run_id, key = self.where.get(name, (self.run_id, name))
        vals: list[float] = []
        if self.client is not None and run_id:
            hist = sorted(self.client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
            vals = [float(m.value) for m in hist]
        self.series[name] = vals or [self.metrics[name]]
        return self.series[name]

    def value(self, name: str, aggregate: str = "last") -> float | None:
        """`last`: the final logged value; otherwise the aggregate of the series."""
        if aggregate == "last":
            return self.metrics.get(name)
        vals = self.values(name)
        return aggregate_values(vals, aggregate) if vals else None


def aggregate_values(values: list[float], aggregate: str) -> float:
    """last | median | mean | min | max of a non-empty list."""
    if aggregate == "last":
        return values[-1]
    fns: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "mean": statistics.fmean,
                                                      "min": min, "max": max}
    return fns[aggregate](values)


def needs_mlflow(spec: str) -> bool:
    """Whether resolving `spec` reads an MLflow store (not an existing or file-like path)."""
    spec = str(spec).strip()
    path = Path(spec)
    if path.is_file() or path.suffix.lower() in (".json", ".yaml", ".yml"):
        return False
    return spec.startswith(("models:/", "runs:/")) or "/" not in spec


def load_source(spec: str, tracking_uri: str | None = None) -> MetricSource:
    """Resolve a candidate/baseline spec (file, run reference, registered model) to its metrics."""
    spec = str(spec).strip()
    path = Path(spec)
    if path.is_file():
        return load_file(path)
    if not needs_mlflow(spec):
        raise missing(f"metrics file not found: {spec}")
    client = _client(tracking_uri)
    run_id, how, train_run = resolve_ref(client, spec)
    return load_run(client, train_run or run_id, how, model_ref=spec if how else None)


def resolve_ref(client, spec: str) -> tuple[str, str, str | None]:
    """(run id, how it was found, the version's training run when tagged) of a run reference or model.

    >>> # resolve_ref(c, "packtrain-lm@champion") → ("a11b…", "packtrain-lm@champion → version 1", "efa5…")
    """
    from packtrain.tracking.refs import resolve_run_ref

    run_id = resolve_run_ref(client, spec)
    mv = _model_version(client, spec)
    if mv is None:
        return run_id, "", None
    how = f"{spec.removeprefix('models:/')} → version {mv.version}"
    return run_id, how, (mv.tags or {}).get(TRAIN_RUN_TAG) or None


def _model_version(client, spec: str):
    """The model version a model reference names (None for a run reference); resolve_run_ref checked it."""
    m_alias, m_version = _ALIAS.match(spec), _VERSION.match(spec)
    if m_alias:
        return client.get_model_version_by_alias(m_alias["name"], m_alias["alias"])
    if m_version:
        return client.get_model_version(m_version["name"], m_version["version"])
    return None


def load_file(path: Path) -> MetricSource:
    """A committed metrics JSON: {"metrics": {...}} or a (nested) dict; numbers or lists of numbers."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise missing(f"metrics file {path}: not valid JSON ({e})") from None
    if isinstance(raw, list) and raw and all(isinstance(r, dict) for r in raw):
        raw = {_row_key(r, i): r for i, r in enumerate(raw)}      # bench rows: "<variant>.<field>"
    if not isinstance(raw, dict):
        raise missing(f"metrics file {path}: expected a JSON object of metrics (or a list of row objects), "
                      f"got {type(raw).__name__}")
    body = raw["metrics"] if isinstance(raw.get("metrics"), dict) else raw
    metrics: dict[str, float] = {}
    series: dict[str, list[float]] = {}
    for k, v in flatten(body).items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            metrics[k] = float(v)
        elif isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            series[k] = [float(x) for x in v]
            metrics[k] = series[k][-1]
    device = raw.get("device") if isinstance(raw.get("device"), str) else None
    return MetricSource(label=f"file {path}", metrics=metrics, series=series, device=device)


def _row_key(row: dict, index: int) -> str:
    """A benchmark row's name: its variant/name/config field (bench/gpu_bench.py: "packtrain"), else its index."""
    for k in ("variant", "name", "config"):
        if isinstance(row.get(k), str) and row[k]:
            return row[k]
    return str(index)


def _client(tracking_uri: str | None):
    from mlflow.tracking import MlflowClient

    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        if not db.is_file():
            raise missing(f"MLflow store {db} does not exist (tracking URI {tracking_uri}); set "
                          "MLFLOW_TRACKING_URI or --set tracking.tracking_uri=... to the store holding the run")
    return MlflowClient(tracking_uri=tracking_uri)


def _get_run(client, run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        raise missing(f"MLflow run {run_id!r}: not found ({_short(e)})") from None


def stage_runs(client, run) -> tuple[Any, dict[str, Any]]:
    """(pipeline run or None, {stage: newest stage run}) of the run tree `run` belongs to; a lone stage
    run → (None, {its stage: it})."""
    tags = run.data.tags
    if tags.get("packtrain.kind") == "pipeline":
        parent = run
    elif tags.get("mlflow.parentRunId"):
        parent = _get_run(client, tags["mlflow.parentRunId"])
    else:
        return None, {_stage_of(run): run}
    kids = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    found: dict[str, Any] = {}
    for kid in kids:
        found.setdefault(_stage_of(kid), kid)     # newest first: a retried stage's last run wins
    return parent, found


def _stage_of(run) -> str:
    return run.data.tags.get("packtrain.stage") or run.data.tags.get("mlflow.runName") or run.info.run_name or ""


def load_run(client, run_id: str, how: str = "", model_ref: str | None = None,
             require_train: bool = False) -> MetricSource:
    """The metrics of run `run_id`: its packtrain run tree under canonical names (module doc), or, for a
    run packtrain did not make, the run's own metrics. `how` says how the run was found (in the label).
    A model reference (`model_ref`) or `require_train` needs a train stage run in the tree (else exit 2)."""
    run = _get_run(client, run_id)
    if run.data.tags.get("packtrain.kind") not in ("pipeline", "stage"):
        if require_train:
            raise missing(f"run {run_id} was not made by packtrain (no packtrain.kind tag): no train stage run")
        return _plain_run(client, run, how)
    parent, stages = stage_runs(client, run)
    train = stages.get("train")
    if (model_ref or require_train) and train is None:
        what = f"registered model {model_ref!r} ({how}) was made by run" if model_ref else "run"
        raise missing(f"{what} {run_id} ({_stage_of(run)}), which has no train stage run in its pipeline tree "
                      "(a `packtrain register` outside `packtrain run`?); pass the training run's id instead")
    metrics: dict[str, float] = {}
    where: dict[str, tuple[str, str]] = {}
    if parent is not None:
        for k, v in parent.data.metrics.items():
            metrics[k], where[k] = float(v), (parent.info.run_id, k)
    for stage, srun in stages.items():
        skip = series_names(stage)
        for k, v in srun.data.metrics.items():
            if is_duplicate(stage, k) or (k in skip and canonical_name(stage, k) == f"{stage}.{k}"):
                continue
            name = canonical_name(stage, k)
            metrics[name], where[name] = float(v), (srun.info.run_id, k)
        for m in BY_NAME.values():
            if m.stage == stage and m.series and m.name in metrics:
                where[m.name] = (srun.info.run_id, m.series)
    main = train or run
    label = f"run {main.info.run_id[:8]} ({_stage_of(main)}"
    label += f" of pipeline {parent.info.run_id[:8]})" if parent is not None else ")"
    device = next((r.data.tags["packtrain.gpu"] for r in (train, run, parent)
                   if r is not None and r.data.tags.get("packtrain.gpu")), None)
    from packtrain.tracking.restore import RESTORED_TAG

    model_id = (train.data.tags.get(RESTORED_TAG) or train.info.run_id) if train is not None else None
    return MetricSource(label=label + (f" via {how}" if how else ""), metrics=metrics, run_id=main.info.run_id,
                        params=dict(main.data.params), client=client, where=where, scheme="packtrain",
                        device=device, model_id=model_id, ref=model_ref)


def _plain_run(client, run, how: str) -> MetricSource:
    rid = run.info.run_id
    name = run.data.tags.get("mlflow.runName") or run.info.run_name or ""
    label = f"run {rid[:8]} ({name})" + (f" via {how}" if how else "")
    return MetricSource(label=label, metrics={k: float(v) for k, v in run.data.metrics.items()}, run_id=rid,
                        params=dict(run.data.params), client=client, scheme="mlflow",
                        device=run.data.tags.get("packtrain.gpu"))


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
