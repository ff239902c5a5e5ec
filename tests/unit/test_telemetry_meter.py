"""ThroughputMeter: per-step metrics, warmup exclusion, medians and percentiles; thresholds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.config import TelemetryConfig
from packtrain.telemetry.meter import ThroughputMeter, percentile
from packtrain.telemetry.thresholds import TelemetryWarning, check_thresholds, violation_tags

PEAK = 1e12


def _feed(meter: ThroughputMeter, times: list[float], real: int = 4000, slot: int = 4096, wait: float = 0.0):
    for i, t in enumerate(times):
        meter.record(i, t, wait, real, slot, useful_flops=real * 1e6, dense_flops=slot * 1e6, peak_flops=PEAK)


def test_per_step_metrics():
    m = ThroughputMeter(warmup_steps=0)
    out = m.record(0, 0.5, 0.1, real_tokens=3000, slot_tokens=4000, useful_flops=2e11, dense_flops=3e11,
                   peak_flops=PEAK)
    # 3000/0.5 = 6000 tok/s; 4000/0.5 = 8000; padding 1 - 3000/4000 = 0.25; wait 0.1/0.5 = 0.2
    # useful MFU 2e11/0.5/1e12 = 0.4; dense 3e11/0.5/1e12 = 0.6; useful TFLOP/s 0.4
    assert out == pytest.approx({"step_time_s": 0.5, "data_wait_frac": 0.2, "real_tokens_per_s": 6000.0,
                                 "slot_tokens_per_s": 8000.0, "padding": 0.25, "useful_tflops": 0.4,
                                 "useful_mfu": 0.4, "dense_mfu": 0.6})


def test_summary_excludes_warmup_and_uses_medians():
    m = ThroughputMeter(warmup_steps=2)
    # two slow warmup steps (compile) then 0.10, 0.12, 0.10, 0.11 s at 4,000 real tokens
    _feed(m, [1.0, 1.0, 0.10, 0.12, 0.10, 0.11], wait=0.01)
    s = m.summary()
    assert s["steps"] == 6 and s["steady_steps"] == 4 and s["steady_state"] is True
    assert s["step_time_p50_s"] == pytest.approx(0.105)           # median of 0.10 0.10 0.11 0.12
    assert s["step_time_p90_s"] == pytest.approx(0.117)           # 0.11 + 0.7*(0.12-0.11)
    # tokens/s per step: 40000, 33333.3, 40000, 36363.6 → median (36363.6 + 40000)/2 = 38181.8
    assert s["real_tokens_per_s"] == pytest.approx(38181.818, rel=1e-6)
    assert s["data_wait_frac"] == pytest.approx(0.04 / 0.43)
    assert s["padding"] == pytest.approx(1 - 4000 / 4096)
    # useful MFU = 4000e6 / t / 1e12 → median over steady steps = 0.004 / median-ish of 1/t
    assert s["useful_mfu"] == pytest.approx(38181.818 * 1e6 / PEAK, rel=1e-6)
    assert s["real_tokens"] == 6 * 4000 and s["slot_tokens"] == 6 * 4096


def test_summary_when_every_step_is_warmup():
    m = ThroughputMeter(warmup_steps=5)
    _feed(m, [0.2, 0.4])
    s = m.summary()
    assert s["steady_state"] is False and s["steady_steps"] == 0
    assert s["step_time_p50_s"] == pytest.approx(0.3)
    assert ThroughputMeter(1).summary() == {}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=30), st.integers(0, 5))
def test_summary_equals_summary_of_steady_records(times, warmup):
    with_warmup = ThroughputMeter(warmup)
    _feed(with_warmup, times)
    steady_only = ThroughputMeter(0)
    _feed(steady_only, times[warmup:] or times)
    a, b = with_warmup.summary(), steady_only.summary()
    for key in ("step_time_p50_s", "step_time_p90_s", "real_tokens_per_s", "useful_mfu", "padding"):
        assert a[key] == pytest.approx(b[key])


@pytest.mark.parametrize("values, q, expected", [([1, 2, 3, 4], 90, 3.7), ([5], 50, 5), ([1, 3], 50, 2.0),
                                                 ([4, 1, 3, 2], 0, 1), ([4, 1, 3, 2], 100, 4)])
def test_percentile(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_record_rejects_bad_values():
    m = ThroughputMeter()
    with pytest.raises(ValueError, match="step_time_s"):
        m.record(0, 0.0, 0.0, 1, 2, 1.0, 1.0, PEAK)
    with pytest.raises(ValueError, match="real_tokens"):
        m.record(0, 1.0, 0.0, 3, 2, 1.0, 1.0, PEAK)


@pytest.mark.parametrize(
    "summary, names",
    [
        ({"utilization": 0.95, "fragmentation": 0.05, "padding": 0.01}, []),
        ({"utilization": 0.72, "fragmentation": 0.05, "padding": 0.01}, ["utilization"]),
        ({"utilization": 0.95, "fragmentation": 0.10, "padding": 0.01}, ["fragmentation"]),  # limit excluded
        ({"utilization": 0.90, "fragmentation": 0.0, "padding": 0.05}, ["padding"]),  # 0.90 passes ≥
        ({"utilization": 0.1, "fragmentation": 0.5, "padding": 0.5}, ["utilization", "fragmentation", "padding"]),
        ({"utilization": None, "fragmentation": None}, []),  # CPU runs: not measured, not checked
    ],
)
def test_thresholds(summary, names):
    if names:
        with pytest.warns(TelemetryWarning):
            got = check_thresholds(summary, TelemetryConfig())
    else:
        got = check_thresholds(summary, TelemetryConfig())
    assert [v.split(":")[0] for v in got] == names
    tags = violation_tags(got)
    assert sorted(tags) == sorted(f"packtrain.violation.{n}" for n in names)


def test_threshold_message_and_configured_limits():
    cfg = TelemetryConfig(min_utilization=0.5, max_padding=0.2)
    with pytest.warns(TelemetryWarning, match="padding: 0.250 >= 0.200"):
        got = check_thresholds({"utilization": 0.6, "padding": 0.25}, cfg)
    assert got == ["padding: 0.250 >= 0.200 (telemetry.max_padding)"]
    assert violation_tags(got) == {"packtrain.violation.padding": "0.250 >= 0.200 (telemetry.max_padding)"}
