"""`packtrain gate` on a real sqlite MLflow store with real runs: pass, each kind of regression (exit 1),
missing metric / run (exit 2), model aliases, repeats, the JSON/Markdown outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from packtrain.cli import main

BASE = {"train.throughput.real_tokens_per_s": 80_000.0, "train.throughput.useful_mfu": 0.41, "train.system.utilization": 0.97,
        "pack.fill": 0.995, "train.memory.peak_alloc_gib": 30.0, "train.memory.fragmentation": 0.04,
        "pack.padding_fraction": 0.005, "train.throughput.step_time_p50_s": 0.20, "train.final_loss": 3.2}
RULES = """
defaults: {max_drop: 0.05, max_rise: 0.05}
metrics:
  train.throughput.real_tokens_per_s: {direction: higher, max_drop: 0.05, aggregate: median}
  train.throughput.useful_mfu: {direction: higher, max_drop: 0.05, aggregate: median}
  train.system.utilization: {direction: higher, max_drop: 0.05}
  pack.fill: {direction: higher, max_drop: 0.01, min: 0.99}
  train.memory.peak_alloc_gib: {direction: lower, max_rise: 0.05}
  train.memory.fragmentation: {direction: lower, max_rise: 0.5, abs_tol: 0.01}
  pack.padding_fraction: {direction: lower, max_rise: 0.5, abs_tol: 0.001}
  train.throughput.step_time_p50_s: {direction: lower, max_rise: 0.05, aggregate: median}
use_default_patterns: false
"""


def _log_run(client, exp_id, metrics: dict, name="train", history: dict | None = None, params=None) -> str:
    from mlflow.entities import Metric, Param

    run = client.create_run(exp_id, run_name=name)
    rid = run.info.run_id
    batch = []
    for k, v in metrics.items():
        values = (history or {}).get(k, [v])
        batch += [Metric(k, float(x), 1_700_000_000_000 + i, i) for i, x in enumerate(values)]
    client.log_batch(rid, metrics=batch, params=[Param(k, str(v)) for k, v in (params or {}).items()])
    client.set_terminated(rid)
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store: a baseline, an equal run, one run per regression kind, a run missing a metric,
    noisy repeats, and a registered model whose alias 'champion' points at the baseline."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("gate")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("packtrain", artifact_location=str(root / "artifacts"))
    ids = {"base": _log_run(c, exp, BASE, history={"train.throughput.real_tokens_per_s": [60_000, 80_000, 81_000, 79_000, 80_000]}),
           "equal": _log_run(c, exp, BASE)}
    regress = {"tokens_per_s": ("train.throughput.real_tokens_per_s", 70_000.0), "mfu": ("train.throughput.useful_mfu", 0.35),
               "utilization": ("train.system.utilization", 0.80), "fill_floor": ("pack.fill", 0.985),
               "peak_memory": ("train.memory.peak_alloc_gib", 33.0), "fragmentation": ("train.memory.fragmentation", 0.09),
               "padding": ("pack.padding_fraction", 0.02), "step_time": ("train.throughput.step_time_p50_s", 0.25)}
    for kind, (metric, value) in regress.items():
        ids[kind] = _log_run(c, exp, {**BASE, metric: value})
    ids["no_mfu"] = _log_run(c, exp, {k: v for k, v in BASE.items() if k != "train.throughput.useful_mfu"})
    # noisy: the last logged value is a dip, the median of the history is fine
    ids["noisy"] = _log_run(c, exp, BASE, history={"train.throughput.real_tokens_per_s": [80_500, 79_800, 80_200, 81_000, 60_000]})
    ids["rep1"] = _log_run(c, exp, {**BASE, "train.throughput.useful_mfu": 0.30})      # an outlier repeat
    ids["rep2"] = _log_run(c, exp, {**BASE, "train.throughput.useful_mfu": 0.41})
    ids["rep3"] = _log_run(c, exp, {**BASE, "train.throughput.useful_mfu": 0.405})
    c.create_registered_model("packtrain-lm")
    mv = c.create_model_version("packtrain-lm", source=str(root / "artifacts" / "model"), run_id=ids["base"])
    c.set_registered_model_alias("packtrain-lm", "champion", mv.version)
    rules = root / "rules.yaml"
    rules.write_text(RULES)
    return {"uri": uri, "ids": ids, "rules": rules, "root": root, "regress": regress}


def _gate(store, candidates, baseline, tmp_path, rules=True, extra=()):
    argv = ["gate", "--set", f"tracking.tracking_uri={store['uri']}", "--out", str(tmp_path / "out")]
    for c in candidates if isinstance(candidates, list) else [candidates]:
        argv += ["--candidate", c]
    argv += ["--baseline", baseline]
    if rules:
        argv += ["--rules", str(store["rules"])]
    return main(argv + list(extra))


def _result(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "gate.json").read_text())


def test_equal_runs_pass(store, tmp_path, capsys):
    assert _gate(store, store["ids"]["equal"], store["ids"]["base"], tmp_path) == 0
    res = _result(tmp_path)
    assert res["verdict"] == "PASS" and len(res["rows"]) == 8
    assert all(r["verdict"] == "pass" for r in res["rows"])
    out = capsys.readouterr().out
    for col in ("metric", "baseline", "candidate", "change", "rule", "verdict"):
        assert col in out
    md = (tmp_path / "out" / "gate.md").read_text()
    assert "PASS" in md and "| `pack.fill` |" in md


@pytest.mark.parametrize("kind", ["tokens_per_s", "mfu", "utilization", "fill_floor", "peak_memory",
                                  "fragmentation", "padding", "step_time"])
def test_each_regression_fails_with_exit_1(store, tmp_path, capsys, kind):
    metric, _ = store["regress"][kind]
    assert _gate(store, store["ids"][kind], store["ids"]["base"], tmp_path) == 1
    res = _result(tmp_path)
    assert res["regressions"] == [metric]
    row = next(r for r in res["rows"] if r["metric"] == metric)
    assert row["verdict"] == "regression" and row["reason"]
    assert "REGRESSION" in capsys.readouterr().out


def test_fill_floor_is_absolute(store, tmp_path):
    """0.985 is only -1.0% vs 0.995 (allowed) but below the 0.99 floor."""
    _gate(store, store["ids"]["fill_floor"], store["ids"]["base"], tmp_path)
    row = next(r for r in _result(tmp_path)["rows"] if r["metric"] == "pack.fill")
    assert row["reason"] == "below floor 0.99"


def test_missing_metric_exit_2_names_it(store, tmp_path, capsys):
    assert _gate(store, store["ids"]["no_mfu"], store["ids"]["base"], tmp_path) == 2
    assert _result(tmp_path)["missing"] == ["train.throughput.useful_mfu"]
    assert "missing data: train.throughput.useful_mfu (not in the candidate)" in capsys.readouterr().out


def test_missing_run_exit_2_names_it(store, tmp_path, capsys):
    assert _gate(store, "0123456789abcdef0123456789abcdef", store["ids"]["base"], tmp_path) == 2
    assert "0123456789abcdef0123456789abcdef" in capsys.readouterr().err
    assert _gate(store, store["ids"]["equal"], "packtrain-lm@nosuchalias", tmp_path) == 2
    assert "packtrain-lm@nosuchalias" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["models:/packtrain-lm@champion", "packtrain-lm@champion", "models:/packtrain-lm/1"])
def test_registered_model_alias_baseline(store, tmp_path, spec):
    assert _gate(store, store["ids"]["equal"], spec, tmp_path) == 0
    assert store["ids"]["base"][:8] in _result(tmp_path)["baseline"]


def test_median_over_history_absorbs_a_last_step_dip(store, tmp_path):
    assert _gate(store, store["ids"]["noisy"], store["ids"]["base"], tmp_path) == 0
    row = next(r for r in _result(tmp_path)["rows"] if r["metric"] == "train.throughput.real_tokens_per_s")
    assert row["candidate"] == 80_200.0 and row["baseline"] == 80_000.0   # medians of the two histories


def test_median_over_repeated_candidates(store, tmp_path):
    ids = store["ids"]
    assert _gate(store, ids["rep1"], ids["base"], tmp_path) == 1            # the outlier alone regresses
    assert _gate(store, [ids["rep1"], ids["rep2"], ids["rep3"]], ids["base"], tmp_path) == 0
    row = next(r for r in _result(tmp_path)["rows"] if r["metric"] == "train.throughput.useful_mfu")
    assert row["candidate"] == 0.405


def test_default_rules_and_file_baseline(store, tmp_path):
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps({"metrics": BASE}))
    assert _gate(store, store["ids"]["equal"], str(base), tmp_path, rules=False) == 0
    gated = {r["metric"] for r in _result(tmp_path)["rows"]}
    assert "train.throughput.real_tokens_per_s" in gated and "train.final_loss" not in gated   # loss has no built-in rule
    assert _gate(store, store["ids"]["peak_memory"], str(base), tmp_path, rules=False) == 1


@pytest.mark.parametrize("text,needle", [
    ("metrics:\n  pack.fill: {direction: up}\n", "metrics.pack.fill.direction"),
    ("metrics:\n  my.metric: {max_drop: 0.1}\n", "my.metric.direction: needed"),
    ("metrics:\n  pack.fill: {maxdrop: 0.1}\n", "unknown key"),
    ("- a\n- b\n", "top level must be a mapping"),
])
def test_bad_rules_file_exit_2(store, tmp_path, capsys, text, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    before = bad.read_text()
    assert main(["gate", "--candidate", "x.json", "--baseline", "y.json", "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(bad) in err
    assert bad.read_text() == before


def test_real_cli_process_exit_code(store, tmp_path):
    exe = Path(sys.executable).with_name("packtrain")
    proc = subprocess.run([str(exe), "gate", "--set", f"tracking.tracking_uri={store['uri']}",
                           "--candidate", store["ids"]["peak_memory"], "--baseline", "models:/packtrain-lm@champion",
                           "--rules", str(store["rules"]), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "train.memory.peak_alloc_gib" in proc.stdout and (tmp_path / "o" / "gate.md").is_file()
