"""One metric naming scheme (packtrain.gate.metrics) and the noise-aware built-in rules (packtrain.gate.noise):
the docs tables are the generated ones, the noise figures are the recorded ones, and the rules they give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtrain.gate import MetricSource, evaluate_gate
from packtrain.gate.metrics import (
    BY_NAME,
    GATE_METRICS,
    canonical_name,
    is_duplicate,
    metrics_table,
    render_doc,
)
from packtrain.gate.noise import GATED, NOISE, NOISE_FILES, allowance, device_kind
from packtrain.gate.rules import BEGIN_RULES, noise_rules, rules_table

REPO = Path(__file__).resolve().parents[2]
REGEN = "python -c \"import packtrain.gate.doc_tables as m; m.main(['--write', 'docs/metrics.md'])\" (or docs/gate.md)"


def test_docs_metrics_table_is_the_generated_one():
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert render_doc(text) == text, f"docs/metrics.md differs from GATE_METRICS: regenerate with {REGEN}"
    assert metrics_table().count("\n| `") == len(GATE_METRICS)          # one row each


def test_docs_gate_rules_table_is_the_generated_one():
    text = (REPO / "docs" / "gate.md").read_text(encoding="utf-8")
    assert render_doc(text, BEGIN_RULES, rules_table()) == text, f"docs/gate.md's rules table is stale: {REGEN}"


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_noise_figures_are_the_recorded_ones(kind):
    """NOISE[kind] = bench/baselines/noise-<kind>.json `metrics.*` (noise, median) for every gated metric the
    file measured, and every session says which command produced it."""
    rec = json.loads((REPO / NOISE_FILES[kind]).read_text())
    assert rec["device_kind"] == kind and rec["sessions"]
    assert all(s["command"].startswith(("python bench/gate_noise.py", "python -m bench gate-noise"))
               for s in rec["sessions"])
    gated = {name for name, _, _ in GATED}
    measured = {n: (m["noise"], m["median"]) for n, m in rec["metrics"].items() if n in gated}
    assert set(NOISE[kind]) == set(measured)
    for n, (noise, median) in measured.items():
        assert NOISE[kind][n][0] == noise and NOISE[kind][n][1] == pytest.approx(median, rel=1e-5), n


@pytest.mark.parametrize("stage,key,name", [
    ("train", "throughput.real_tokens_per_s", "train.throughput.real_tokens_per_s"),
    ("train", "summary.real_tokens_per_s", "train.throughput.real_tokens_per_s"),
    ("train", "summary.utilization", "train.system.utilization"),
    ("train", "memory.peak_alloc_gib", "train.memory.peak_alloc_gib"),
    ("pack", "fill", "pack.fill"),
    ("pack", "train.n_packs", "pack.train.n_packs"),          # not in the table: <stage>.<name>
    ("evaluate", "eval_tokens_per_s", "evaluate.tokens_per_s"),
    ("evaluate", "eval_loss", "evaluate.eval_loss"),
])
def test_canonical_names(stage, key, name):
    assert canonical_name(stage, key) == name


def test_summary_copies_are_duplicates_and_every_name_is_stage_prefixed():
    assert is_duplicate("train", "summary.useful_mfu") and not is_duplicate("train", "throughput.useful_mfu")
    assert all(m.name.startswith(m.stage + ".") for m in GATE_METRICS)


@pytest.mark.parametrize("kind,metric,limit", [
    ("cpu", "train.throughput.real_tokens_per_s", None),      # 126% run to run: report only
    ("cpu", "train.system.utilization", None),                # never fails on a CPU, whatever the figure
    ("cpu", "train.memory.cpu_peak_rss_gib", 0.15),           # 2 × 7.4%
    ("cpu", "pack.fill", 0.005),                              # deterministic: the floor
    ("cpu", "train.throughput.padding", 0.05),
    ("gpu", "train.throughput.real_tokens_per_s", 0.05),      # 0.3% × 2 < the 5% floor
    ("gpu", "train.system.utilization", 0.05),
    ("gpu", "train.throughput.data_wait_frac", 0.10),         # 71% of 0.0003 is inside abs_tol 0.01
])
def test_noise_rules(kind, metric, limit):
    r = noise_rules(kind)[metric]
    got = r.max_drop if BY_NAME[metric].direction == "higher" else r.max_rise
    assert got == limit
    if limit is None:
        assert r.describe().startswith("report only") and not r.required


def test_allowance_rounds_up_and_caps():
    assert allowance("cpu", "train.memory.cpu_peak_rss_gib", 0.05) == 0.15
    assert allowance("nope", "x", 0.07) == 0.07


def test_device_kind_and_mismatch():
    assert (device_kind("cpu"), device_kind("NVIDIA H200"), device_kind(None)) == ("cpu", "gpu", None)
    m = {"pack.fill": 0.99, "train.throughput.real_tokens_per_s": 1000.0}
    cpu = MetricSource("run a", dict(m), scheme="packtrain", device="cpu")
    gpu = MetricSource("run b", dict(m), scheme="packtrain", device="NVIDIA H200")
    res = evaluate_gate(cpu, gpu)
    assert res.exit_code == 2 and res.missing[0].metric == "device" and "not comparable" in res.missing[0].reason
    same = evaluate_gate(MetricSource("c", {**m, "train.throughput.real_tokens_per_s": 10.0}, scheme="packtrain",
                                      device="cpu"), cpu)
    assert same.exit_code == 0 and "cpu noise" in same.rules            # tokens/s only reported on a CPU
    on_gpu = evaluate_gate(MetricSource("d", {**m, "train.throughput.real_tokens_per_s": 900.0},
                                        scheme="packtrain", device="NVIDIA H200"), gpu)
    assert on_gpu.regressions[0].metric == "train.throughput.real_tokens_per_s"


def test_run_metrics_are_not_pattern_gated():
    """On a run tree only the canonical rules apply (a pattern would gate tokenize.tokens_per_second)."""
    base = {"pack.fill": 0.99, "tokenize.tokens_per_second": 1000.0}
    res = evaluate_gate(MetricSource("c", {**base, "tokenize.tokens_per_second": 1.0}, scheme="packtrain"),
                        MetricSource("b", base, scheme="packtrain"))
    assert [r.metric for r in res.rows] == ["pack.fill"] and res.exit_code == 0


def test_last_is_the_final_value_median_is_over_the_history():
    s = MetricSource("r", {"train.throughput.real_tokens_per_s": 100.0},
                     series={"train.throughput.real_tokens_per_s": [10.0, 90.0, 95.0, 300.0]})
    assert s.value("train.throughput.real_tokens_per_s") == 100.0            # the steady-state summary
    assert s.value("train.throughput.real_tokens_per_s", "median") == 92.5   # of the per-step series


def test_the_rule_column_is_the_effective_threshold():
    """A rule with an absolute allowance says it, and a pass that only the allowance explains says why (a tiny
    data-wait share rising +61% passed under "rise ≤ 10%" with no word)."""
    from packtrain.gate.gate import check
    from packtrain.gate.rules import Rule

    rule = Rule("*data_wait*", "lower", max_rise=0.10, abs_tol=0.01, required=False)
    assert rule.describe() == "rise ≤ 10% or 0.01 absolute"
    verdict, change, reason = check(rule, 0.0031, 0.0050)
    assert verdict == "pass" and change > 0.6 and reason == "|Δ| 0.0019 ≤ 0.01 absolute"
    assert check(rule, 0.0031, 0.0032)[2] == ""   # within the relative rule: nothing to explain
