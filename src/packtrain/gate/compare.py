"""`compare_runs`: MLflow runs side by side — the params that differ, key metrics, metric histories.

    comp = compare_runs(["1a2b…", "3c4d…"], tracking_uri=uri)          # or experiment="packtrain", filter_string=
    print(comp.table())
    paths = write_report(comp, Path("compare"))                          # compare.html (+ .json, .md)
    log_report(comp, paths, uri)                                         # a new run named "compare"

The report is logged to a NEW run named "compare" (tag `packtrain.compare.runs` lists the ids) rather than
to each compared run: compared runs stay untouched (inputs are never modified), and one artifact holds the
comparison of all of them. Key metrics are the names matching KEY_PATTERNS (loss, throughput, MFU,
utilization, memory, fill, padding); the others are in compare.json.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from packtrain.errors import ConfigError
from packtrain.gate.sources import _client, _short, missing
from packtrain.paths import atomic_write_text, write_json

KEY_PATTERNS = (r"loss", r"perplexity", r"tok.*per_s|throughput", r"mfu", r"util", r"fill", r"padding",
                r"peak|gib|memory|fragmentation", r"step_time")
CURVE_GROUPS = {
    "loss": r"loss|perplexity",
    "tokens/s": r"tok.*per_s|throughput",
    "utilization": r"util|mfu",
    "memory": r"gib|memory|alloc|reserved|fragmentation",
}


@dataclass
class RunSummary:
    run_id: str
    name: str
    experiment: str
    status: str

    @property
    def label(self) -> str:
        return f"{self.name or 'run'}·{self.run_id[:8]}"


@dataclass
class Comparison:
    runs: list[RunSummary]
    params_differ: dict[str, list[str | None]]           # param → value per run (only params that differ)
    n_params_same: int
    metrics: dict[str, list[float | None]]               # every metric → latest value per run
    key_metrics: list[str]
    histories: dict[str, list[list[tuple[int, float]]]] = field(default_factory=dict)   # metric → per run

    def _rows(self) -> list[list[str]]:
        rows = [["run"] + [r.label for r in self.runs]]
        rows += [[f"param {k}"] + [("–" if v is None else str(v))[:40] for v in vals]
                 for k, vals in sorted(self.params_differ.items())]
        rows += [[k] + ["–" if v is None else f"{v:.5g}" for v in self.metrics[k]] for k in self.key_metrics]
        return rows

    def table(self) -> str:
        rows = self._rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out = ["  ".join(v.ljust(widths[i]) for i, v in enumerate(r)).rstrip() for r in rows]
        out.insert(1, "  ".join("-" * w for w in widths))
        out.append(f"({len(self.params_differ)} params differ, {self.n_params_same} equal; "
                   f"{len(self.metrics)} metrics, {len(self.key_metrics)} shown)")
        return "\n".join(out)

    def markdown(self) -> str:
        rows = self._rows()
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {"runs": [r.__dict__ for r in self.runs], "params_differ": self.params_differ,
                "n_params_same": self.n_params_same, "key_metrics": self.key_metrics, "metrics": self.metrics}


def compare_runs(run_ids: list[str] | None = None, experiment: str | None = None, filter_string: str | None = None,
                 tracking_uri: str | None = None, max_runs: int = 20) -> Comparison:
    """Fetch runs (by id, or every run of `experiment` matching the MLflow `filter_string`) and line them up."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    runs = []
    if run_ids:
        for rid in run_ids:
            try:
                runs.append(client.get_run(rid))
            except MlflowException as e:
                raise missing(f"MLflow run {rid!r}: not found ({_short(e)})") from None
    else:
        exp = client.get_experiment_by_name(experiment or "")
        if exp is None:
            names = ", ".join(e.name for e in client.search_experiments(max_results=20))
            raise missing(f"--experiment {experiment!r}: no such experiment (experiments: {names or 'none'})")
        try:
            runs = client.search_runs([exp.experiment_id], filter_string=filter_string or "",
                                      max_results=max_runs, order_by=["attributes.start_time DESC"])
        except MlflowException as e:
            raise ConfigError(f"--filter {filter_string!r}: {_short(e)} (MLflow search syntax, e.g. "
                              "\"params.`train.precision` = 'bf16'\" or \"attributes.run_name = 'train'\")") from None
        if not runs:
            raise missing(f"experiment {experiment!r}: no runs match --filter {filter_string!r}")
    exp_names = {}
    summaries = []
    for r in runs:
        eid = r.info.experiment_id
        if eid not in exp_names:
            exp_names[eid] = client.get_experiment(eid).name
        summaries.append(RunSummary(r.info.run_id, r.data.tags.get("mlflow.runName") or r.info.run_name or "",
                                    exp_names[eid], r.info.status))
    params = [dict(r.data.params) for r in runs]
    keys = sorted(set().union(*params)) if params else []
    differ = {k: [p.get(k) for p in params] for k in keys if len({p.get(k) for p in params}) > 1}
    names = sorted(set().union(*(r.data.metrics for r in runs)))
    metrics = {k: [(float(r.data.metrics[k]) if k in r.data.metrics else None) for r in runs] for k in names}
    key = [k for k in names if any(re.search(p, k, re.I) for p in KEY_PATTERNS)] or names[:20]
    histories = {}
    for k in names:
        if not any(re.search(p, k, re.I) for p in CURVE_GROUPS.values()):
            continue
        per_run = []
        for r in runs:
            if k in r.data.metrics:
                hist = sorted(client.get_metric_history(r.info.run_id, k), key=lambda m: (m.step, m.timestamp))
                per_run.append([(int(m.step), float(m.value)) for m in hist])
            else:
                per_run.append([])
        if any(len(h) > 1 for h in per_run):
            histories[k] = per_run
    return Comparison(runs=summaries, params_differ=differ, n_params_same=len(keys) - len(differ),
                      metrics=metrics, key_metrics=key, histories=histories)


def write_report(comp: Comparison, out_dir: Path) -> dict[str, Path]:
    """compare.html (self-contained: PNGs base64-embedded), compare.json and compare.md in `out_dir`."""
    from packtrain.gate.report import render_html

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / "compare.html", "json": out_dir / "compare.json", "md": out_dir / "compare.md"}
    atomic_write_text(paths["html"], render_html(comp))
    write_json(paths["json"], comp.to_dict())
    atomic_write_text(paths["md"], comp.markdown())
    return paths


def log_report(comp: Comparison, paths: dict[str, Path], tracking_uri: str | None,
               experiment: str | None = None) -> str:
    """Log the report files to a new run named "compare"; returns its run id."""
    client = _client(tracking_uri)
    name = experiment or (comp.runs[0].experiment if comp.runs else "packtrain")
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    ids = ",".join(r.run_id for r in comp.runs)
    run = client.create_run(exp_id, run_name="compare",
                            tags={"packtrain.stage": "compare", "packtrain.compare.runs": ids[:5000]})
    try:
        for p in paths.values():
            client.log_artifact(run.info.run_id, str(p), artifact_path="compare")
    except Exception:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id
