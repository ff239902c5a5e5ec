"""`compare_runs`: pipeline runs side by side — their train stages' curves, the params that differ, the gate.

    comp = compare_runs(["01943b11", "75d35eb2"], tracking_uri=uri)     # ids, ≥6-char prefixes, NAME@ALIAS
    comp = compare_runs(experiment="packtrain", tracking_uri=uri)       # its pipeline runs (stage_runs=True: stages)
    print(format_table(comp))                                           # packtrain.gate.report
    paths = write_report(comp, Path("compare"))                         # packtrain.gate.report: compare.html, .json, .md
    log_report(comp, paths, uri)                                        # a new run named "compare"

What a user has is a pipeline run id (`packtrain run` prints it); the numbers live in its stage runs. Each
compared run is resolved through the MLflow run tree (packtrain.tracking.refs.stage_run_of: tag
mlflow.parentRunId, run name = stage name) to its `train` stage run, whose metric histories are the curves:

    loss         loss                                   x = optimizer step
    eval loss    eval_loss (train.eval_every_steps)     x = optimizer step
    tokens/s     real_tokens_per_s                      x = optimizer step
    MFU          useful_mfu                             x = optimizer step
    utilization  system/train_utilization_percentage    x = seconds since the first sample (its timestamp)
                 (NVML or CPU)
    memory       system/train_memory_used_gib, ...      x = seconds

Runs logged before the layout of docs/tracking.md ("The MLflow layout") are read under their names too:
slot_tokens_per_s, dense_mfu, and packtrain's system.utilization_pct / system.memory_used_gib (step = ms since
the sampler started).

Numbers (headline table, compare.json "metrics") are each run tree read as `packtrain gate` reads it
(packtrain.gate.metric_sources.load_run: the train, pack and evaluate stage runs under the canonical names of
packtrain.gate.metrics, e.g. `train.throughput.real_tokens_per_s`). Params: only those that differ, grouped
by stage (the first dotted part: `train.lr` → train); a pipeline run holds the whole flattened config, a
stage run its own section. Gate: the first run is the baseline, every other run a candidate, judged by
packtrain.gate.evaluate_gate on those trees — the verdict `packtrain gate` gives (compare itself exits 0:
it reports, it does not block). Compared runs are never modified: the report goes to a
NEW run named "compare" (tag packtrain.compare.runs lists the ids).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packtrain.errors import ConfigError
from packtrain.gate.metric_sources import _client, _short, missing

PIPELINE_FILTER = "tags.packtrain.kind = 'pipeline'"
STAGE_FILTER = "tags.packtrain.kind = 'stage'"
# (title, metric-name pattern, preferred names first); ≤ MAX_CURVES metrics per group, each a subplot
CURVES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("loss", r"(^|[./])loss$", ("loss",)),
    ("eval loss", r"(^|[./])eval_loss$", ("eval_loss",)),
    ("tokens/s", r"tokens?_per_s$", ("real_tokens_per_s", "slot_tokens_per_s")),
    ("MFU", r"mfu$", ("useful_mfu", "dense_mfu")),
    ("utilization", r"util", ("system/train_utilization_percentage", "system.utilization_pct")),
    # memory, not disk or network: MLflow's system/disk_* series are disk space, system/network_* traffic
    ("memory", r"^(?!.*(disk|network)).*(gib$|megabytes$|memory)", ("system/train_memory_used_gib",
                                                                   "system/train_allocated_gib",
                                                                   "system/train_reserved_gib", "system.memory_used_gib",
                                                                   "system.allocated_gib", "system.reserved_gib")),
    ("network", r"^system/network_", ("system/network_receive_megabytes", "system/network_transmit_megabytes")),
)
OPTIONAL_CURVES = ("network",)
"""Groups drawn only when a compared run has such a series (MLflow's own monitor, tracking.system_metrics)."""
MAX_CURVES = 3
# single values logged once per run (a "curve" of one point); never fetched as histories
SUMMARY_PREFIXES = ("summary.", "throughput.", "memory.", "timings.", "init_", "final_")
# (label, names tried in order): the gate's canonical names (packtrain.gate.metrics: a run tree read as the gate
# reads it), then the names of runs packtrain did not make
HEADLINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss, last step", ("train.final_loss", "final_loss", "train.loss", "loss")),
    ("eval loss", ("evaluate.eval_loss", "eval_loss")),
    ("real tokens/s, median", ("train.throughput.real_tokens_per_s", "train.tokens_per_s")),
    ("useful MFU, median", ("train.throughput.useful_mfu", "train.useful_mfu")),
    ("utilization, median", ("train.system.utilization", "train.gpu_utilization")),
    ("utilization, mean", ("train.system.utilization_mean",)),
    ("peak allocated GiB", ("train.memory.peak_alloc_gib", "train.peak_alloc_gib")),
    ("peak RSS GiB", ("train.memory.cpu_peak_rss_gib",)),
    ("step time p50 s", ("train.throughput.step_time_p50_s",)),
    ("padding", ("train.throughput.padding", "pack.padding_fraction")),
    ("pack fill", ("pack.fill",)),
)


@dataclass
class ComparedRun:
    """One column: the run the user named (or listed) and the train stage run its curves come from."""

    ref: str                     # as given ("01943b11", "packtrain-lm@champion") or the id when listed
    run_id: str
    name: str                    # MLflow run name: "tiny-cpu · data 791d2730" (a pipeline run) | train | ...
    kind: str                    # packtrain.kind tag: pipeline | stage | "" (not a packtrain run)
    experiment: str
    status: str
    start_time: int | None
    train_run_id: str | None     # None: no train stage in its tree (failed before train, or not a pipeline)

    @property
    def label(self) -> str:
        """'pipeline·01943b11' — the kind of a pipeline run, else the run name (train, ...), and the 8-character
        short id `packtrain run` prints; a pipeline run's name (recipe · data version) is the table's `name` row."""
        return f"{'pipeline' if self.kind == 'pipeline' else self.name or 'run'}·{self.run_id[:8]}"


@dataclass
class Comparison:
    runs: list[ComparedRun]
    params_differ: dict[str, dict[str, list[str | None]]]   # stage → param → value per run (differing only)
    n_params: int                                            # distinct param names over all runs
    metrics: dict[str, list[float | None]]                   # latest values, the gate's names (whole run tree)
    headline: list[tuple[str, str, list[float | None]]]      # (label, metric name, value per run)
    curves: dict[str, list[str]]                             # group title → metrics drawn (may be empty)
    histories: dict[str, list[list[tuple[float, float]]]] = field(default_factory=dict)   # metric → per run (x, y)
    gates: list[Any] = field(default_factory=list)           # GateResult per candidate (runs[1:]) vs runs[0]
    notes: list[str] = field(default_factory=list)           # what could not be shown, and why

    @property
    def n_differ(self) -> int:
        return sum(len(v) for v in self.params_differ.values())

    def to_dict(self) -> dict:
        return {"runs": [asdict(r) | {"label": r.label} for r in self.runs], "params_differ": self.params_differ,
                "n_params": self.n_params, "headline": [{"label": lab, "metric": m, "values": v}
                                                        for lab, m, v in self.headline],
                "curves": self.curves, "histories": self.histories, "metrics": self.metrics,
                "gates": [g.to_dict() for g in self.gates], "notes": self.notes}


def compare_runs(run_refs: list[str] | None = None, experiment: str | None = None, filter_string: str | None = None,
                 tracking_uri: str | None = None, max_runs: int = 20, *, stage_runs: bool = False,
                 rules=None) -> Comparison:
    """Resolve the runs (refs, or the pipeline runs of `experiment` matching `filter_string`, oldest first),
    walk each to its train stage run, and line them up (see the module docstring)."""
    from packtrain.gate.metric_sources import load_run
    from packtrain.tracking.refs import resolve_run_ref

    client = _client(tracking_uri)
    if run_refs:
        pairs = lift_to_pipelines(client, [(ref, client.get_run(resolve_run_ref(client, ref))) for ref in run_refs])
    else:
        pairs = [(r.info.run_id, r) for r in list_runs(client, experiment, filter_string, max_runs, stage_runs)]
    runs = [_compared(client, ref, r) for ref, r in pairs]
    trains = {c.train_run_id: client.get_run(c.train_run_id) for c in runs
              if c.train_run_id and c.train_run_id != c.run_id}
    raw = {c.run_id: r for c, (_, r) in zip(runs, pairs, strict=True)}
    curve_runs = [trains.get(c.train_run_id or "") or raw[c.run_id] for c in runs]
    notes = [f"{c.label}: no train stage run in its MLflow run tree (no curves; metrics are the run's own)"
             for c in runs if c.kind == "pipeline" and not c.train_run_id]

    params = [dict(raw[c.run_id].data.params) for c in runs]
    names = sorted(set().union(*params))
    differ: dict[str, dict[str, list[str | None]]] = {}
    for k in names:
        vals = [p.get(k) for p in params]
        if len(set(vals)) > 1:
            differ.setdefault(stage_of(k), {})[k] = vals
    sources = [load_run(client, c.run_id) for c in runs]   # the run trees as `packtrain gate` reads them
    all_names = sorted(set().union(*(src.metrics for src in sources)))
    metrics = {k: [_float(src.metrics.get(k)) for src in sources] for k in all_names}
    curves, histories, curve_notes = fetch_curves(client, curve_runs)
    notes += curve_notes
    return Comparison(runs=runs, params_differ=_stage_order(differ), n_params=len(names), metrics=metrics,
                      headline=headline_rows(metrics), curves=curves, histories=histories,
                      gates=gate_runs(sources, rules), notes=notes)


def list_runs(client, experiment: str | None, filter_string: str | None, max_runs: int, stage_runs: bool) -> list:
    """The newest `max_runs` pipeline runs (stage runs with `stage_runs`) of an experiment, oldest first."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(experiment or "")
    if exp is None:
        names = ", ".join(e.name for e in client.search_experiments(max_results=20))
        raise missing(f"--experiment {experiment!r}: no such experiment (experiments: {names or 'none'})")
    kind = STAGE_FILTER if stage_runs else PIPELINE_FILTER
    full = kind + (f" and {filter_string}" if filter_string else "")
    try:
        runs = client.search_runs([exp.experiment_id], filter_string=full, max_results=max_runs,
                                  order_by=["attributes.start_time DESC"])
    except MlflowException as e:
        raise ConfigError(f"--filter {filter_string!r}: {_short(e)} (MLflow search syntax, e.g. "
                          "\"params.`train.lr` = '0.001'\" or \"attributes.status = 'FINISHED'\")") from None
    if not runs:
        what = "stage" if stage_runs else "pipeline"
        hint = "" if stage_runs else " (--stage-runs compares stage runs)"
        raise missing(f"experiment {experiment!r}: no {what} runs ({kind})"
                      + (f" match --filter {filter_string!r}" if filter_string else "") + hint)
    return runs[::-1]


def lift_to_pipelines(client, pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """A stage run given by a model reference (NAME@ALIAS → the version's source run, a register or train
    run), or next to pipeline runs, is replaced by its pipeline (parent) run, so every column holds the whole
    config: `compare packtrain-lm@champion 75d35eb2` diffs the champion's pipeline against that pipeline."""
    kinds = {r.data.tags.get("packtrain.kind") for _, r in pairs}
    out = []
    for ref, run in pairs:
        parent = run.data.tags.get("mlflow.parentRunId")
        if parent and run.data.tags.get("packtrain.kind") == "stage" and ("@" in ref or ref.startswith("models:/")
                                                                          or "pipeline" in kinds):
            top = client.get_run(parent)
            if top.data.tags.get("packtrain.kind") == "pipeline":
                run = top
        out.append((ref, run))
    return out


def stage_of(param: str) -> str:
    """The group a param is shown under: its first dotted part ('train.lr' → 'train'); 'workdir' → 'run'."""
    return param.split(".", 1)[0] if "." in param else "run"


def _stage_order(differ: dict[str, dict]) -> dict[str, dict]:
    """Pipeline order (ingest … register), then other sections alphabetically."""
    from packtrain import STAGES

    rank = {s: i for i, s in enumerate(STAGES)}
    return {k: differ[k] for k in sorted(differ, key=lambda s: (rank.get(s, len(rank)), s))}


def _compared(client, ref: str, run) -> ComparedRun:
    from packtrain.tracking.refs import stage_run_of

    tags = run.data.tags
    exp = client.get_experiment(run.info.experiment_id)
    return ComparedRun(ref=ref, run_id=run.info.run_id, name=tags.get("mlflow.runName") or run.info.run_name or "",
                       kind=tags.get("packtrain.kind", ""), experiment=exp.name if exp else run.info.experiment_id,
                       status=run.info.status, start_time=run.info.start_time,
                       train_run_id=stage_run_of(client, run.info.run_id, "train"))


def _float(v) -> float | None:
    return None if v is None else float(v)


def curve_metrics(names: set[str]) -> dict[str, list[str]]:
    """Group title → the metric names to draw (preferred first, ≤ MAX_CURVES after fetching).

    >>> curve_metrics({"loss", "final_loss", "summary.useful_mfu", "useful_mfu", "system.utilization_pct"})
    {'loss': ['loss'], 'eval loss': [], 'tokens/s': [], 'MFU': ['useful_mfu'], 'utilization': ['system.utilization_pct'], 'memory': [], 'network': []}
    """
    out = {}
    for title, pattern, preferred in CURVES:
        hits = [n for n in names if re.search(pattern, n, re.I) and not n.startswith(SUMMARY_PREFIXES)]
        out[title] = sorted(hits, key=lambda n: (preferred.index(n) if n in preferred else len(preferred), n))
    return out


def fetch_curves(client, curve_runs: list) -> tuple[dict[str, list[str]], dict[str, list[list]], list[str]]:
    """Metric histories of the curve runs: (group → drawn metrics, metric → per run [(x, y)], notes).

    A metric is drawn when some run has ≥ 2 points of it. A group with none falls back to its first preferred
    metric with one point (a train stage shorter than two telemetry samples: `telemetry.interval_s`, 1 s,
    against a 2-step CPU run), drawn as dots and said in a note. packtrain's system.* series are logged at
    step = milliseconds since the sampler started, so their x is converted to seconds."""
    names = set().union(*(r.data.metrics for r in curve_runs)) if curve_runs else set()
    curves: dict[str, list[str]] = {}
    histories: dict[str, list[list]] = {}
    notes: list[str] = []
    preferred = {title: pref for title, _, pref in CURVES}
    for title, candidates in curve_metrics(names).items():
        drawn: list[str] = []
        fetched: dict[str, list[list]] = {}
        for name in candidates:
            if len(drawn) == MAX_CURVES:
                break
            per_run = [history(client, r.info.run_id, name) if name in r.data.metrics else [] for r in curve_runs]
            fetched[name] = per_run
            if any(len(h) > 1 for h in per_run):
                drawn.append(name)
                histories[name] = per_run
        single = next((n for n in preferred[title] if any(fetched.get(n, []))), None)
        if not drawn and single is not None:
            drawn, histories[single] = [single], fetched[single]
            notes.append(f"{title}: one {single} point per run (the train stage took less than two telemetry "
                         "samples, telemetry.interval_s)")
        elif not drawn and title in OPTIONAL_CURVES:
            continue
        elif not drawn:
            notes.append(f"no {title} series in the compared runs' metric histories")
        curves[title] = drawn
    return curves, histories, notes


def history(client, run_id: str, name: str) -> list[tuple[float, float]]:
    """[(x, value)] in step order; x = step for training series, seconds for system series: packtrain's
    system.* (step = ms since its sampler started) and MLflow's own system/* (step = sample index, so x is the
    sample's timestamp in seconds since the first one), so both kinds of system plot share one x."""
    hist = sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp))
    if name.startswith("system/network_"):
        return network_traffic([((m.timestamp - hist[0].timestamp) / 1000.0, float(m.value)) for m in hist])
    if name.startswith("system/") and hist:
        t0 = hist[0].timestamp
        return [((m.timestamp - t0) / 1000.0, float(m.value)) for m in hist]
    scale = 1e-3 if name.startswith("system.") else 1.0
    return [(m.step * scale, float(m.value)) for m in hist]


def network_traffic(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """MLflow's system/network_* series as traffic since the run started: never negative, never falling.

    MLflow logs the host's network bytes summed over every interface (psutil.net_io_counters) minus that sum at
    the run's start. When an interface goes away during the run (a container's veth: podman, a KFP local
    run), its bytes leave the sum and the series falls, below zero (−62 MB seen on a shared host). Here each
    fall counts as no traffic, so the curve adds up the rises only:

    >>> network_traffic([(0, 0.0), (1, 5.0), (2, -62.0), (3, -60.0)])
    [(0, 0.0), (1, 5.0), (2, 5.0), (3, 7.0)]
    """
    out, total, prev = [], 0.0, None
    for x, v in points:
        if prev is not None:
            total += max(0.0, v - prev)
        else:
            total = max(0.0, v)
        prev = v
        out.append((x, total))
    return out


def x_label(name: str) -> str:
    """The x axis of a curve: 'step' for training series, 'seconds' for system series."""
    return "seconds" if name.startswith(("system.", "system/")) else "step"


def y_label(name: str) -> str:
    """The y axis (the quantity and its unit) from the metric's name.

    >>> [y_label(n) for n in ("loss", "eval_loss", "real_tokens_per_s", "useful_mfu", "system.utilization_pct",
    ...                       "system.memory_used_gib", "system/system_memory_usage_megabytes")]
    ['loss (nats/token)', 'eval loss (nats/token)', 'tokens/s', 'MFU (fraction of peak)', 'utilization (%)', 'GiB', 'MB']
    """
    n = name.lower()
    if n.endswith("eval_loss"):
        return "eval loss (nats/token)"
    if n.endswith("loss"):
        return "loss (nats/token)"
    if re.search(r"tokens?_per_s$", n):
        return "tokens/s"
    if n.endswith("mfu"):
        return "MFU (fraction of peak)"
    if "util" in n:
        return "utilization (%)" if n.endswith(("pct", "percentage")) else "utilization (fraction)"
    if n.endswith("gib"):
        return "GiB"
    if n.endswith("megabytes"):
        return "MB"
    return name


def headline_rows(metrics: dict[str, list[float | None]]) -> list[tuple[str, str, list[float | None]]]:
    """The numbers people ask about first, by a fixed list (HEADLINE, not alphabetically): per entry the
    first name some run has, with its value per run."""
    rows = []
    for label, names in HEADLINE:
        name = next((n for n in names if any(v is not None for v in metrics.get(n, []))), None)
        if name is not None:
            rows.append((label, name, metrics[name]))
    return rows


def gate_runs(sources: list, rules=None) -> list:
    """packtrain.gate.evaluate_gate of every run after the first (candidate) against the first (baseline):
    the verdict `packtrain gate --candidate RUN --baseline FIRST` gives (default rules unless `rules`)."""
    from packtrain.gate import evaluate_gate

    return [evaluate_gate(cand, sources[0], rules) for cand in sources[1:]]


def log_report(comp: Comparison, paths: dict[str, Path], tracking_uri: str | None,
               experiment: str | None = None) -> str:
    """Log the report files to a new run named "compare"; returns its run id."""
    client = _client(tracking_uri)
    name = experiment or (comp.runs[0].experiment if comp.runs else "packtrain")
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    ids = ",".join(r.run_id for r in comp.runs)
    run = client.create_run(exp_id, run_name="compare", tags={
        "packtrain.kind": "compare", "packtrain.stage": "compare", "packtrain.compare.runs": ids[:5000]})
    try:
        for p in paths.values():
            client.log_artifact(run.info.run_id, str(p), artifact_path="compare")
    except Exception:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id
