"""MFU is never reported above 100%, and a peak estimate that cannot be trusted says so: literal inputs for the
meter's bound, the reliability note and the summary line; one real re-probe of the CPU peak."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.config import TelemetryConfig
from packtrain.telemetry.meter import ThroughputMeter
from packtrain.telemetry.mfu import PeakEstimate, peak_note

DIMS = {"n_layers": 2, "hidden_size": 8, "vocab_size": 10, "attn_width": 8, "windows": (None, None)}


def _step(m: ThroughputMeter, i: int, useful_per_s: float, peak: float = 1e12) -> dict:
    return m.record(i, 1.0, 0.0, 100, 128, useful_flops=useful_per_s, dense_flops=useful_per_s * 1.1,
                    peak_flops=peak)


def test_steps_faster_than_the_peak_raise_the_peak_instead_of_reporting_over_100_percent():
    m = ThroughputMeter(warmup_steps=0)
    per_step = [_step(m, i, r)["useful_mfu"] for i, r in enumerate([0.9e12, 1.3e12, 1.2e12])]
    assert per_step == pytest.approx([0.9, 1.0, 1.0])               # each capped at 1 on its own
    s = m.summary()
    assert s["peak_scale"] == pytest.approx(1.2) and m.fastest == pytest.approx(1.3)   # the median step's rate
    assert s["useful_mfu"] == pytest.approx(1.0)                    # median(0.9, 1.3, 1.2) / 1.2
    assert s["dense_mfu"] == pytest.approx(1.1)


def test_one_short_step_after_a_long_one_does_not_move_the_summary():
    """The H200 record: the loop reads each step's numbers one step late, so a host hiccup shows as a 0.47 s
    step followed by a 0.02 s one around steps of 0.15 s. Scaling by the short step's rate divided a 43% MFU by
    3.2; the median step's rate leaves it alone."""
    m = ThroughputMeter(warmup_steps=0)
    times = [0.153] * 18 + [0.47, 0.02]
    for i, dt in enumerate(times):
        m.record(i, dt, 0.0, 16384, 16384, useful_flops=0.43 * 790e12 * 0.153, dense_flops=0.0, peak_flops=790e12)
    s = m.summary()
    assert s["peak_scale"] == 1.0 and s["useful_mfu"] == pytest.approx(0.43)
    assert m.records[-1]["useful_mfu"] == 1.0                       # the fictitious step, capped at 1


def test_the_reported_102_79_percent_run_is_bounded_and_flagged():
    """The user's CPU run: the peak measured 0.0672 TFLOP/s while the machine was loaded; its steady steps then ran
    at 1.0279 × that. Main reported MFU 102.79%; now ≤ 100% with a note saying why the peak is unreliable."""
    from packtrain.train.parts import Telemetry

    peak = 0.0672e12
    est = PeakEstimate(peak, "measured", (0.0650e12, 0.0672e12, 0.0668e12, 0.0671e12, 0.0660e12), 0.4, "cpu", "fp32")
    t = Telemetry(TelemetryConfig(), ThroughputMeter(2), peak, DIMS, 1000, None, estimate=est)
    for i, rate in enumerate([0.03, 0.05, 1.0279, 1.0279, 1.0279, 1.02]):
        _step(t.meter, i, rate * peak, peak)
    s = t.summary()
    assert s["useful_mfu"] <= 1.0 and s["useful_mfu"] == pytest.approx(1.0)
    assert all(r["useful_mfu"] <= 1.0 for r in t.meter.records)
    assert s["peak_tflops"] == pytest.approx(1.0279 * 0.0672) and s["peak_source"] == "measured"
    assert s["peak_reliable"] is False
    assert s["peak_note"] == ("peak measured under contention: the median training step ran 1.03x faster than "
                              "the measured peak (0.0672 TFLOP/s); MFU is against that rate")


def test_a_faster_probe_after_training_rebases_the_summary():
    from packtrain.train.parts import Telemetry

    est = PeakEstimate(1e12, "measured", (0.8e12, 1e12), 0.2, "cpu", "fp32")
    t = Telemetry(TelemetryConfig(), ThroughputMeter(0), 1e12, DIMS, 1000, None, estimate=est)
    _step(t.meter, 0, 0.6e12)
    t.meter.raise_peak(1.5)                                          # what reprobe() does with a 1.5e12 probe
    t.estimate = PeakEstimate(1.5e12, "measured", (0.8e12, 1e12, 1.5e12), 0.2, "cpu", "fp32")
    s = t.summary()
    assert s["useful_mfu"] == pytest.approx(0.4) and s["peak_tflops"] == pytest.approx(1.5)
    assert s["peak_note"] == ("peak measured under contention: matmul probes 0.8-1.5 TFLOP/s disagree by 88%")


def test_a_reliable_peak_has_no_note():
    from packtrain.train.parts import Telemetry

    for est in (PeakEstimate(1e12, "datasheet"), PeakEstimate(1e12, "measured", (0.98e12, 1e12), 0.3)):
        t = Telemetry(TelemetryConfig(), ThroughputMeter(0), 1e12, DIMS, 1000, None, estimate=est)
        _step(t.meter, 0, 0.5e12)
        s = t.summary()
        assert s["peak_reliable"] is True and "peak_note" not in s and s["useful_mfu"] == pytest.approx(0.5)


@pytest.mark.parametrize("est, fastest, cpus, note", [
    (PeakEstimate(1e11, "measured", (1e11, 0.99e11), 0.5), 0.9, 2, None),
    (PeakEstimate(1e11, "measured", (0.6e11, 1e11), 0.5), 0.9, 2,
     "peak measured under contention: matmul probes 0.06-0.1 TFLOP/s disagree by 67%"),
    (PeakEstimate(1e11, "measured", (1e11, 1e11), 2.5), 0.9, 2,
     "peak measured under contention: load 5.0 on 2 cores while probing"),
    (PeakEstimate(1e11, "measured", (1e11,), 0.5), 1.5, 2,
     "peak measured under contention: the median training step ran 1.5x faster than the measured peak "
     "(0.1 TFLOP/s); MFU is against that rate"),
    (PeakEstimate(50e12, "config"), 1.2, 2,
     "telemetry.peak_tflops too low: the median training step ran 1.2x faster than the config peak "
     "(50 TFLOP/s); MFU is against that rate"),
    (PeakEstimate(989.4e12, "datasheet"), 0.62, 8, None),
    (PeakEstimate(989.4e12, "datasheet", (), 9.0), 0.62, 8, None),   # load matters only for a measured peak
])
def test_peak_note_table(est, fastest, cpus, note):
    assert peak_note(est, fastest, cpus=cpus) == note


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.0, 5.0)), min_size=1, max_size=25), st.integers(0, 4),
       st.floats(1.0, 3.0))
def test_useful_mfu_never_exceeds_one(steps, warmup, reprobe):
    m = ThroughputMeter(warmup)
    for i, (t, ratio) in enumerate(steps):
        out = m.record(i, t, 0.0, 10, 10, useful_flops=ratio * t * 1e12, dense_flops=ratio * t * 1e12,
                       peak_flops=1e12)
        assert out["useful_mfu"] <= 1.0 + 1e-12
    m.raise_peak(reprobe)
    assert m.summary()["useful_mfu"] <= 1.0 + 1e-12


def test_reprobe_measures_the_cpu_again_and_keeps_the_fastest():
    low = PeakEstimate(1.0, "measured", (1.0,), 0.5, "cpu", "fp32")   # 1 FLOP/s: any real probe beats it
    again = low.reprobe()
    assert len(again.probes) == 6 and again.flops == max(again.probes) > 1e8
    assert again.load_per_core == 0.5 and PeakEstimate(1e12, "datasheet").reprobe() == PeakEstimate(1e12, "datasheet")


def test_the_run_summary_says_when_the_peak_is_unreliable():
    from packtrain.pipeline.summary import format_summary

    note = "peak measured under contention: load 5.0 on 2 cores while probing"
    lines = format_summary("tiny-cpu", {"mfu": 0.972, "mfu_note": note}, 1.0, 7, None).splitlines()[1:]
    assert lines == ["  train      MFU 97.20%", f"             MFU unreliable: {note}"]
    assert format_summary("tiny-cpu", {"mfu": 0.004}, 1.0, 7, None).splitlines()[1:] == ["  train      MFU 0.40%"]
