"""The compare report labels what it shows: mean and median as such, a change from 0 as an absolute change (not
+inf), a Δ per candidate, units on the axes, disk space not under memory, one x for both kinds of system series."""

from __future__ import annotations

from types import SimpleNamespace

from packtrain.gate.compare import HEADLINE, curve_metrics, headline_rows, x_label, y_label
from packtrain.gate.report import delta, gate_rows


def test_mean_and_median_are_labelled_by_what_they_are():
    labels = dict(HEADLINE)
    assert labels["utilization, median"][0] == "train.system.utilization"          # the sampler's median
    assert labels["utilization, mean"] == ("train.system.utilization_mean",)
    rows = headline_rows({"train.system.utilization": [0.4995, 0.4995], "train.system.utilization_mean": [0.509, 0.531]})
    assert [(lab, v) for lab, _, v in rows] == [("utilization, median", [0.4995, 0.4995]),
                                               ("utilization, mean", [0.509, 0.531])]


def test_changes_from_zero_are_absolute_and_every_candidate_has_a_delta():
    assert delta(0.0, 0.0102) == "+0.0102 (from 0)" and delta(8000.0, 6500.0) == "-1,500 (-18.8%)"
    row = SimpleNamespace(metric="pack.padding_fraction", baseline=0.0, candidate=0.0102, change=float("inf"),
                          rule="rise ≤ 25%", verdict="regression", reason="")
    assert gate_rows(SimpleNamespace(rows=[row]))[1][3] == "+0.0102 (from 0)"


def test_axes_say_their_units_and_system_series_share_seconds():
    assert (y_label("loss"), y_label("eval_loss"), y_label("real_tokens_per_s")) == (
        "loss (nats/token)", "eval loss (nats/token)", "tokens/s")
    assert y_label("system.memory_used_gib") == "GiB" and y_label("system/system_memory_usage_megabytes") == "MB"
    assert x_label("loss") == "step" and x_label("system.utilization_pct") == x_label("system/cpu_utilization_percentage") == "seconds"
    groups = curve_metrics({"system/disk_usage_megabytes", "system/system_memory_usage_megabytes", "eval_loss"})
    assert groups["memory"] == ["system/system_memory_usage_megabytes"] and groups["eval loss"] == ["eval_loss"]
