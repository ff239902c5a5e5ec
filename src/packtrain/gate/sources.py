"""Where gate metrics come from: an MLflow run id, a registered model alias, or a committed JSON file.

    load_source("bench/baselines/ci-tiny.json")       JSON: {"metrics": {...}} or a flat/nested dict of numbers;
                                                       a list of numbers = repeats/history of that metric;
                                                       a list of row objects (bench/gpu_bench.py) → metrics
                                                       named "<variant>.<field>", e.g. packtrain.useful_mfu
    load_source("3f2a9c...", tracking_uri)            an MLflow run (also "runs:/<id>")
    load_source("models:/packtrain-lm@champion")      the run behind a registered model version's alias
    load_source("packtrain-lm@champion")              (same, short form); "models:/name/3" = version 3

Missing things raise MissingDataError with exit code 2 (the gate's "missing data"), naming what is missing.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtrain.config.base import flatten
from packtrain.errors import MissingDataError

MISSING_EXIT = 2
_ALIAS = re.compile(r"^(?:models:/)?(?P<name>[^@/\s]+)@(?P<alias>[\w.\-]+)$")
_VERSION = re.compile(r"^models:/(?P<name>[^@/\s]+)/(?P<version>\d+)$")


def missing(message: str) -> MissingDataError:
    return MissingDataError(message, exit_code=MISSING_EXIT)


@dataclass
class MetricSource:
    """Metrics of one run or file: latest values plus per-step series (MLflow history loaded on demand)."""

    label: str
    metrics: dict[str, float]
    series: dict[str, list[float]] = field(default_factory=dict)
    run_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    client: Any = None

    def values(self, name: str) -> list[float] | None:
        """All recorded values of `name` in step order (one value when only the latest is known)."""
        if name in self.series:
            return self.series[name]
        if name not in self.metrics:
            return None
        if self.client is not None and self.run_id:
            hist = sorted(self.client.get_metric_history(self.run_id, name), key=lambda m: (m.step, m.timestamp))
            vals = [float(m.value) for m in hist] or [self.metrics[name]]
        else:
            vals = [self.metrics[name]]
        self.series[name] = vals
        return vals

    def value(self, name: str, aggregate: str = "last") -> float | None:
        vals = self.values(name)
        if not vals:
            return None
        return aggregate_values(vals, aggregate)


def aggregate_values(values: list[float], aggregate: str) -> float:
    """last | median | mean | min | max of a non-empty list."""
    if aggregate == "last":
        return values[-1]
    return {"median": statistics.median, "mean": statistics.fmean, "min": min, "max": max}[aggregate](values)


def needs_mlflow(spec: str) -> bool:
    """Whether resolving `spec` reads an MLflow store (not an existing or file-like path)."""
    spec = str(spec).strip()
    path = Path(spec)
    if path.is_file() or path.suffix.lower() in (".json", ".yaml", ".yml"):
        return False
    return spec.startswith(("models:/", "runs:/")) or "/" not in spec


def load_source(spec: str, tracking_uri: str | None = None) -> MetricSource:
    """Resolve a candidate/baseline spec (file, run id, model alias) to its metrics."""
    spec = str(spec).strip()
    path = Path(spec)
    if path.is_file():
        return load_file(path)
    if not needs_mlflow(spec):
        raise missing(f"metrics file not found: {spec}")
    client = _client(tracking_uri)
    run_id, how = _resolve_run_id(client, spec)
    return load_run(client, run_id, how)


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
    return MetricSource(label=f"file {path}", metrics=metrics, series=series)


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


def _resolve_run_id(client, spec: str) -> tuple[str, str]:
    from mlflow.exceptions import MlflowException

    m_alias, m_version = _ALIAS.match(spec), _VERSION.match(spec)
    try:
        if m_alias:
            mv = client.get_model_version_by_alias(m_alias["name"], m_alias["alias"])
            how = f"{m_alias['name']}@{m_alias['alias']} → version {mv.version}"
        elif m_version:
            mv = client.get_model_version(m_version["name"], m_version["version"])
            how = f"{m_version['name']} version {mv.version}"
        else:
            return spec.removeprefix("runs:/").split("/")[0], ""
    except MlflowException as e:
        raise missing(f"registered model {spec!r}: not found ({_short(e)})") from None
    if not mv.run_id:
        raise missing(f"registered model {spec!r} ({how}) has no source run to read metrics from")
    return mv.run_id, how


def load_run(client, run_id: str, how: str = "") -> MetricSource:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        raise missing(f"MLflow run {run_id!r}: not found ({_short(e)})") from None
    name = run.data.tags.get("mlflow.runName") or run.info.run_name or ""
    label = f"run {run_id[:12]} ({name})" + (f" via {how}" if how else "")
    return MetricSource(label=label, metrics={k: float(v) for k, v in run.data.metrics.items()},
                        run_id=run_id, params=dict(run.data.params), client=client)


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
