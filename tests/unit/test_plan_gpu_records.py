"""The planner against peaks measured on the H200 and recorded in bench/results/ (no GPU needed to check them):
compiled torch runs of the 350M recipe per attention backend, DeepSpeed ZeRO-2 / ZeRO-3 + offload, and the
1B recipe on one and two GPUs (torch DDP, ZeRO-2, ZeRO-3). Each prediction must be within ±10% of the
measured max_memory_allocated (the worst rank's on two GPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtrain.config import load_run_config
from packtrain.planner import plan_memory

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
GIB = 1024**3
VOCAB = 32768


def _predicted_gib(recipe: str, overrides: list[str], gpus: int) -> float:
    cfg = load_run_config(recipe, overrides)
    train_cfg = cfg.train.model_copy(update={"gpus": gpus})
    return plan_memory(cfg.model, train_cfg, cfg.pack.budget, cfg.plan, 141.0, vocab_size=VOCAB,
                       suggest=False).peak_allocated / GIB


def _smoke_rows():
    d = json.loads((RESULTS / "train_gpu_smoke.json").read_text())
    for r in d["runs"]:
        ov = [f"train.attention={r['attention']}", f"train.engine={r['engine']}", f"train.rows={r['rows']}",
              f"train.grad_accum={r['grad_accum']}", f"train.compile={str(r['compile']).lower()}"]
        if r["engine"] == "deepspeed":
            ov += [f"train.deepspeed.zero_stage={r['zero_stage']}",
                   f"train.deepspeed.offload_optimizer={str(r['offload']).lower()}",
                   f"train.deepspeed.offload_params={str(r['offload'] and r['zero_stage'] == 3).lower()}"]
        name = f"350m-{r['attention']}-{r['engine']}{r['zero_stage'] or ''}{'-offload' if r['offload'] else ''}"
        yield pytest.param(d["recipe"], ov, 1, r["peak_alloc_gib"], id=name)


def _scaling_rows():
    for f in ("scaling_1b_h200x2.json", "scaling_1b_h200x2_run2.json"):
        d = json.loads((RESULTS / f).read_text())
        for name, entry in d["configs"].items():
            for key in ("1gpu", f"{d['gpus']}gpu"):
                r = entry[key]
                yield pytest.param(d["recipe"], r["overrides"], r["gpus"], r["peak_alloc_gib_max"],
                                   id=f"{f.removesuffix('.json')}-{name}-{key}")


@pytest.mark.parametrize("recipe,overrides,gpus,measured", [*_smoke_rows(), *_scaling_rows()])
def test_plan_within_10_percent_of_recorded_h200_peak(recipe, overrides, gpus, measured):
    predicted = _predicted_gib(recipe, overrides, gpus)
    assert predicted == pytest.approx(measured, rel=0.10), f"predicted {predicted:.2f} GiB, measured {measured:.2f}"


def test_two_gpu_zero_peaks_fall_as_planned():
    """ZeRO-2/3 on two GPUs: the measured per-GPU peak falls, by what the planner says within 2.5 GiB. Recorded:
    ZeRO-2 fell 5.8 GiB (planned 6.6); ZeRO-3 fell 5.0 (planned 7.5: the planner is 9% high on the 1-GPU ZeRO-3
    peak, 3% on the 2-GPU one)."""
    d = json.loads((RESULTS / "scaling_1b_h200x2.json").read_text())
    for name in ("zero2", "zero3"):
        one, two = d["configs"][name]["1gpu"], d["configs"][name]["2gpu"]
        fall = one["peak_alloc_gib_max"] - two["peak_alloc_gib_max"]
        planned = (_predicted_gib(d["recipe"], one["overrides"], 1) - _predicted_gib(d["recipe"], two["overrides"], 2))
        assert fall > 0 and planned > 0
        assert fall == pytest.approx(planned, abs=2.5), (name, fall, planned)
