"""bench fp8's pure parts on the CPU: the shape every variant shares (rows and activation checkpointing from a
device's memory and the planner's predictions), the loss-curve comparison, the verdicts and the plot."""

from __future__ import annotations

import argparse

import pytest

from bench import workload
from bench.fp8_compare import (
    GOALS,
    compare_one,
    compare_variants,
    loss_agreement,
    plot_curves,
    settings_mismatch,
)
from bench.shared_shape import choose_shared_shape, planner_predictor
from packtrain.errors import ConfigError


def linear_peaks(per_row: dict[str, dict[str, tuple[float, float]]]):
    """predict(mode, rows) = base + slope × rows per variant and mode: {mode: {variant: (base, slope)}}."""
    return lambda mode, rows: {v: b + s * rows for v, (b, s) in per_row[mode].items()}


PEAKS = linear_peaks({"none": {"bf16": (18.0, 15.0), "fp8": (13.0, 15.0)},
                      "selective": {"bf16": (18.0, 9.0), "fp8": (13.0, 9.0)},
                      "full": {"bf16": (18.0, 2.0), "fp8": (13.0, 2.0)}})


@pytest.mark.parametrize(("device_gib", "mode", "rows"), [
    (80.0, "none", 3),        # 0.85 × 80 = 68: bf16 18 + 15·3 = 63; 4 rows 78
    (141.0, "none", 6),       # 119.85: 6 rows 108, 7 rows 123
    (1000.0, "none", 8),      # the cap
    (32.0, "selective", 1),   # 27.2: none at 1 row 33 > 27.2; selective 1 row 27 fits
    (24.0, "full", 1),        # 20.4: only full recompute, 1 row (20)
])
def test_shared_shape_comes_from_the_device_memory(device_gib, mode, rows):
    s = choose_shared_shape(PEAKS, 0.85 * device_gib, rows=range(8, 0, -1))
    assert (s.activation_checkpointing, s.rows) == (mode, rows)
    assert s.binding == "bf16" and max(s.peaks_gib.values()) <= 0.85 * device_gib
    if rows < 8:   # one row more would not fit the largest variant
        assert max(s.next_rows_peaks_gib.values()) > 0.85 * device_gib
    assert [t["mode"] for t in s.tried] == ["none", "selective", "full"][: ["none", "selective", "full"].index(mode)]


def test_the_largest_variant_binds_whichever_it_is():
    peaks = linear_peaks({"none": {"bf16": (10.0, 5.0), "fp8": (10.0, 9.0)}})
    s = choose_shared_shape(peaks, 50.0, modes=["none"], rows=range(8, 0, -1))
    assert (s.rows, s.binding) == (4, "fp8")   # bf16 alone would fit 8 rows
    assert "4 rows, activation checkpointing none" in s.describe() and "fp8 binds" in s.describe()


def test_fixed_rows_take_the_least_recomputation_that_fits_them():
    s = choose_shared_shape(PEAKS, 68.0, rows=[5])
    assert (s.activation_checkpointing, s.rows, s.next_rows_peaks_gib) == ("selective", 5, None)


def test_nothing_fits_names_the_variant_and_the_peak():
    with pytest.raises(ConfigError, match=r"at 1 row\(s\) with activation checkpointing full, bf16 needs 20.0 GiB"):
        choose_shared_shape(PEAKS, 15.0, rows=range(8, 0, -1))


def _planner_cfgs(names: list[str]) -> dict:
    from bench.suites import fp8

    p = argparse.ArgumentParser()
    fp8.add_arguments(p)
    args = p.parse_args([])
    args.smoke, args.rows, args.ac = False, 1, "none"
    return {n: workload.load_recipe("1b-h200", fp8.overrides(args, n)) for n in names}


def test_the_3b_shape_on_80_and_141_gb_from_packtrains_planner():
    """The planner (pure arithmetic) with the suite's own configs: bf16's peak binds on both cards, FP8's is lower
    (no bf16 weight copies), the 80 GB card fits fewer rows, and neither 6 nor 8 rows (the earlier record's OOMs)
    fits bf16 there without recomputation."""
    cfgs = _planner_cfgs(["bf16", "fp8", "fp8_nomix"])
    shapes = {}
    for gib in (79.18, 139.8):   # torch's total_memory of an H100 80GB HBM3 and an H200, GiB
        predict = planner_predictor(cfgs, 2048, 128_256, "cuda", gib)
        shapes[gib] = s = choose_shared_shape(predict, 0.85 * gib)
        assert s.activation_checkpointing == "none" and s.binding == "bf16"
        assert s.peaks_gib["fp8"] == s.peaks_gib["fp8_nomix"] < s.peaks_gib["bf16"]
    assert 1 <= shapes[79.18].rows < shapes[139.8].rows == 8
    predict = planner_predictor(cfgs, 2048, 128_256, "cuda", 79.18)
    assert all(predict("none", r)["bf16"] > 0.85 * 79.18 for r in (6, 8))


def test_loss_agreement_over_the_last_steps():
    base, other = [5.0, 4.0, 3.0, 2.0, 2.0], [5.0, 4.4, 3.03, 2.02, 1.99]
    a = loss_agreement(base, other, last=3)
    assert a["last_n"] == 3
    assert a["loss_rel_diff_last_n_max"] == pytest.approx(0.01)
    assert a["loss_rel_diff_final"] == pytest.approx(0.005)
    assert a["loss_rel_diff_last_n_mean"] == pytest.approx((0.01 + 0.01 + 0.005) / 3)
    assert loss_agreement(base, other[:2], last=50)["last_n"] == 2   # only the steps both have
    assert loss_agreement([], other) == {"last_n": 0}


def row(tok: float, curve: list[float], rows: int = 3, ac: str = "none", planner_error: float | None = 0.05) -> dict:
    return {"real_tokens_per_s": tok, "loss_curve": curve, "planner_error": planner_error,
            "setup": {"rows": rows, "budget": 2048, "grad_accum": 1, "activation_checkpointing": ac,
                      "checkpointed_layers": 0, "attention": "varlen", "compile": True, "loss": "fused",
                      "engine": "torch"}}


CURVE = [12.0 - 0.01 * i for i in range(200)]


def test_no_ratio_from_mismatched_settings_or_failed_rows():
    base = row(20_000.0, CURVE)
    assert settings_mismatch(base, row(25_000.0, CURVE, rows=4, ac="full")) == [
        "rows: 3 vs 4", "activation_checkpointing: none vs full"]
    c = compare_one(base, row(25_000.0, CURVE, rows=4), "fp8")
    assert c == {"skipped": "settings differ from bf16's: rows: 3 vs 4"}
    oom = {"error": "OutOfMemoryError: CUDA out of memory", "oom": True}
    assert compare_one(oom, row(25_000.0, CURVE), "fp8") == {"skipped": "bf16: OutOfMemoryError: CUDA out of memory"}
    assert compare_one(base, None, "fp8_nomix") == {"skipped": "fp8_nomix: not run"}


def test_verdicts_name_the_faster_fp8_variant_and_each_goal():
    near = [x * 1.001 for x in CURVE]
    rows = {"bf16": row(20_000.0, CURVE), "fp8": row(24_000.0, near),
            "fp8_nomix": row(26_000.0, near, planner_error=-0.12)}
    comparisons, faster, met = compare_variants(rows, ["bf16", "fp8", "fp8_nomix"])
    assert faster["variant"] == "fp8_nomix" and faster["tok_s_ratio"] == pytest.approx(1.3)
    assert faster["over_other_fp8"] == {"fp8": pytest.approx(26_000 / 24_000)}
    assert comparisons["fp8"]["tok_s_ratio"] == pytest.approx(1.2)
    assert comparisons["fp8"]["loss_rel_diff_last_n_max"] == pytest.approx(0.001)
    assert met == {"speedup": True, "loss": True, "steps": True, "planner_bf16": True, "planner_fp8": True,
                   "planner_fp8_nomix": False}


def test_verdicts_when_a_variant_fails_or_drifts():
    drift = CURVE[:150] + [x * 1.02 for x in CURVE[150:]]
    rows = {"bf16": row(20_000.0, CURVE), "fp8": row(26_000.0, drift),
            "fp8_nomix": {"error": "OutOfMemoryError: CUDA out of memory", "oom": True}}
    comparisons, faster, met = compare_variants(rows, ["bf16", "fp8", "fp8_nomix"])
    assert "skipped" in comparisons["fp8_nomix"] and faster["variant"] == "fp8"
    assert met["speedup"] and not met["loss"] and not met["steps"] and not met["planner_fp8_nomix"]
    _, faster, met = compare_variants({"bf16": row(20_000.0, CURVE[:3])}, ["bf16", "fp8"])
    assert faster is None
    assert met == {"speedup": False, "loss": False, "steps": False, "planner_bf16": True, "planner_fp8": False}


def test_plot_is_written_beside_the_record(tmp_path):
    rows = {"bf16": row(20_000.0, CURVE), "fp8": row(24_000.0, [x * 1.001 for x in CURVE]),
            "fp8_nomix": {"error": "OutOfMemoryError"}}
    comparisons, _, _ = compare_variants(rows, list(rows))
    path = plot_curves(rows, list(rows), tmp_path / "fp8.png", comparisons, "test", GOALS)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))


def _smoke_args(*argv: str) -> argparse.Namespace:
    from bench.suites import fp8

    p = argparse.ArgumentParser()
    fp8.add_arguments(p)
    args = p.parse_args(list(argv))
    args.smoke = True
    return args


@pytest.mark.parametrize(("argv", "expected"), [
    ((), ("none", 2, True)),                                                      # the planner's 80 GiB default
    (("--packtrain-set", "plan.device_memory_gib=0.005"), ("selective", 1, True)),   # tiny model, tiny "device"
    (("--rows", "2", "--ac", "none", "--packtrain-set", "plan.device_memory_gib=0.005"), ("none", 2, False)),
])
def test_the_suite_takes_its_shape_from_the_device_memory(argv, expected):
    """bench fp8's own resolution at --smoke sizes (no training): the device memory (here plan.device_memory_gib)
    decides the rows and checkpointing; --rows N --ac MODE run as asked, with the planner's verdict recorded."""
    from bench.suites import fp8

    args = _smoke_args(*argv)
    names = fp8._settle(args)
    choice = fp8.resolve_shape(args, names, 512)
    assert (args.ac, args.rows, choice["fits"]) == expected
    assert (choice["activation_checkpointing"], choice["rows"]) == expected[:2]
    assert set(choice["peaks_gib"]) == set(names) == {"bf16", "fp8", "fp8_nomix", "bf16_repeat"}
