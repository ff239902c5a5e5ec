"""Gate rules and verdicts: a literal table, rules files, aggregation, and properties (hypothesis)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.errors import ConfigError
from packtrain.gate import MetricSource, Rule, gate, load_rules
from packtrain.gate.gate import check, combined_value
from packtrain.gate.metric_sources import load_file

HI = Rule("tps", "higher", max_drop=0.05)
LO = Rule("mem", "lower", max_rise=0.05)
EQ = Rule("tok", "equal")
FLOOR = Rule("fill", "higher", max_drop=0.01, min=0.99)
ABS_ONLY = Rule("fill", "higher", min=0.99)
NOISE = Rule("pad", "lower", max_rise=0.05, abs_tol=0.001)


@pytest.mark.parametrize("rule,base,cand,verdict,change", [
    (HI, 100.0, 100.0, "pass", 0.0),
    (HI, 100.0, 95.0, "pass", -0.05),          # exactly the allowed drop
    (HI, 100.0, 94.9, "regression", -0.051),
    (HI, 100.0, 150.0, "pass", 0.5),           # improvements never fail
    (LO, 30.0, 31.5, "pass", 0.05),
    (LO, 30.0, 31.6, "regression", 0.0533),
    (LO, 30.0, 10.0, "pass", -0.6667),
    (EQ, 2048.0, 2048.0, "pass", 0.0),
    (EQ, 2048.0, 2047.0, "regression", -0.0005),
    (FLOOR, 0.995, 0.989, "regression", -0.00603),   # within 1% but below the floor
    (FLOOR, 0.995, 0.992, "pass", -0.00302),
    (ABS_ONLY, None, 0.995, "pass", None),           # no baseline needed
    (NOISE, 0.0, 0.0005, "pass", math.inf),          # below abs_tol: noise
    (NOISE, 0.0, 0.01, "regression", math.inf),
])
def test_check_table(rule, base, cand, verdict, change):
    v, ch, _ = check(rule, base, cand)
    assert v == verdict
    if change is None or math.isinf(change):
        assert ch == change
    else:
        assert ch == pytest.approx(change, abs=1e-4)


def test_aggregates_and_combination():
    a = MetricSource("a", {"x": 5.0}, series={"x": [1.0, 9.0, 3.0, 5.0]})
    b = MetricSource("b", {"x": 7.0})
    assert a.value("x", "last") == 5.0 and a.value("x", "median") == 4.0
    assert a.value("x", "min") == 1.0 and a.value("x", "max") == 9.0 and a.value("x", "mean") == 4.5
    assert combined_value([a, b], "x", "last") == 6.0           # median of (5, 7)
    assert combined_value([a, b], "y", "last") is None


def test_default_patterns_gate_only_baseline_metrics():
    base = MetricSource("base", {"pack.fill": 0.995, "train.tokens_per_s": 80000.0, "train.loss": 3.0})
    cand = MetricSource("cand", {"pack.fill": 0.81, "train.tokens_per_s": 81000.0, "new.mfu": 0.5})
    res = gate(cand, base)
    assert [(r.metric, r.verdict) for r in res.rows] == [("pack.fill", "regression"), ("train.tokens_per_s", "pass")]
    assert res.exit_code == 1 and res.verdict == "REGRESSION"


def test_missing_wins_over_regression():
    base = MetricSource("base", {"pack.fill": 0.995, "train.useful_mfu": 0.4})
    cand = MetricSource("cand", {"pack.fill": 0.5})
    res = gate(cand, base)
    assert res.exit_code == 2 and [r.metric for r in res.missing] == ["train.useful_mfu"]


def test_rules_file_defaults_and_null(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("defaults: {max_drop: 0.02, max_rise: 0.1, aggregate: median}\n"
                 "metrics:\n  a.tokens_per_s: {}\n  b.peak_gib: {}\n"
                 "  c.fill: {max_drop: null, min: 0.99}\n  d: {direction: equal, tolerance: 0.01}\n"
                 "use_default_patterns: false\n")
    rules = load_rules(p)
    assert rules.exact["a.tokens_per_s"] == Rule("a.tokens_per_s", "higher", max_drop=0.02, aggregate="median")
    assert rules.exact["b.peak_gib"].max_rise == 0.1 and rules.exact["b.peak_gib"].direction == "lower"
    assert not rules.exact["c.fill"].relative and rules.exact["c.fill"].describe() == "≥ 0.99, median"
    assert rules.exact["d"].describe() == "within ±1%, median"
    assert rules.rule_for("other.mfu") is None          # patterns off


@pytest.mark.parametrize("text,needle", [
    ("metrics:\n  x.fill: {min: 2, max: 1}\n", "min 2.0 > max 1.0"),
    ("metrics:\n  x.fill: {max_drop: -1}\n", "x.fill.max_drop"),
    ("metrics: [1, 2]\n", "metrics"),
    ("{{{", "not valid YAML"),
])
def test_rules_file_errors(tmp_path, text, needle):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="r.yaml") as e:
        load_rules(p)
    assert needle in str(e.value)


def test_metrics_file_nested_lists_and_errors(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"pack": {"fill": 0.99, "strategy": "bfd"}, "tps": [1, 3, 2], "ok": True}))
    src = load_file(p)
    assert src.metrics == {"pack.fill": 0.99, "tps": 2.0} and src.values("tps") == [1.0, 3.0, 2.0]
    p.write_text(json.dumps([{"variant": "pad", "real_tok_per_s": 18900.0},
                             {"variant": "packtrain", "real_tok_per_s": 80100.0, "useful_mfu": 0.41}]))
    assert load_file(p).metrics == {"pad.real_tok_per_s": 18900.0, "packtrain.real_tok_per_s": 80100.0,
                                    "packtrain.useful_mfu": 0.41}
    p.write_text("[1, 2]")
    with pytest.raises(Exception, match="expected a JSON object") as e:
        load_file(p)
    assert e.value.exit_code == 2


finite = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
fracs = st.floats(min_value=0.0, max_value=0.5)


@settings(max_examples=200, deadline=None)
@given(finite, fracs, st.sampled_from(["higher", "lower", "equal"]))
def test_equal_values_always_pass(x, frac, direction):
    rule = Rule("m", direction, max_drop=frac, max_rise=frac, tolerance=frac)
    assert check(rule, x, x)[0] == "pass"


@settings(max_examples=200, deadline=None)
@given(finite, fracs, st.floats(min_value=1e-4, max_value=0.4))
def test_moving_beyond_the_threshold_in_the_bad_direction_fails(x, frac, extra):
    assert check(Rule("m", "higher", max_drop=frac), x, x * (1 - frac - extra) if frac + extra < 1 else 0.0)[0] \
        == "regression"
    assert check(Rule("m", "lower", max_rise=frac), x, x * (1 + frac + extra))[0] == "regression"
    # and the good direction never fails
    assert check(Rule("m", "higher", max_drop=frac), x, x * (1 + extra))[0] == "pass"
    assert check(Rule("m", "lower", max_rise=frac), x, x * (1 - extra))[0] == "pass"
