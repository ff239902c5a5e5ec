"""`python -m bench gpu-pipeline`: a repeated step count is refused before anything runs or is written; a run
whose train (or evaluate, register) stage was a stage-cache hit is a flagged row without numbers, and no goal is
met from it; every row is judged against the goals of its length."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suites import gpu_pipeline

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("steps", ["60,60", "2,3,2", "a,b", "0,5"])
def test_repeated_or_bad_step_counts_are_refused_before_anything_is_written(tmp_path, steps):
    out = tmp_path / "out" / "gp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "bench", "gpu-pipeline", "--smoke", "--steps", steps, "--out",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"--steps {steps!r}" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def _stats(cache: dict[str, str]) -> dict:
    timings = {"train_s": 20.0, "checkpoint_s": 5.0}
    return {"train": {"cache": cache.get("train", "miss"), "timings": timings,
                      "throughput": {"real_tokens_per_s": 1000.0}},
            "evaluate": {"cache": cache.get("evaluate", "miss"), "seconds": 1.0, "tokens_per_s": 3000.0,
                         "timings": {"suites_text_forward_s": 1.0}},
            "register": {"cache": cache.get("register", "miss")}}


WALLS = {"train": 25.0, "evaluate": 12.0, "register": 2.0}


def test_a_row_whose_train_stage_was_a_cache_hit_has_no_numbers():
    row = gpu_pipeline.run_row(60, 30.0, WALLS, _stats({"train": "hit", "evaluate": "hit"}), "done\n")
    assert row["cached_stages"] == ["train", "evaluate"] and "earlier run's" in row["stale"]
    assert not {"efficiency", "train_steps_s", "evaluate_non_step_s", "train_timings"} & set(row)
    fresh = gpu_pipeline.run_row(90, 40.0, WALLS, _stats({}), "done\n")
    assert "stale" not in fresh and fresh["train_steps_s"] == 15.0 and fresh["evaluate_non_step_s"] == 10.0
    assert fresh["efficiency"] == round((15.0 + 2.0) / 39.0, 4)


def test_the_compile_the_first_step_waits_for_is_non_step_time():
    stats = _stats({})
    stats["train"]["timings"] = {"train_s": 20.0, "checkpoint_s": 5.0, "compile_s": 11.0}
    row = gpu_pipeline.run_row(60, 40.0, WALLS, stats, "done\n")
    assert (row["train_steps_s"], row["compile_s"], row["train_non_step_s"]) == (4.0, 11.0, 21.0)
    assert row["efficiency"] == round((4.0 + 2.0) / 39.0, 4)   # a compile-cache hit can only raise it


def test_no_goal_is_met_from_a_stale_row(tmp_path, monkeypatch):
    rows = iter([gpu_pipeline.run_row(2, 9.0, WALLS, _stats({}), ""),
                 gpu_pipeline.run_row(3, 9.0, WALLS, _stats({"train": "hit"}), "")])
    monkeypatch.setattr(gpu_pipeline, "one_run", lambda *a: next(rows))
    args = argparse.Namespace(recipe="tiny-cpu", set=[], steps="2,3", smoke=True, keep=False, shared_tmp=True,
                              command="test")
    record = gpu_pipeline.run(args, tmp_path)
    assert [r.get("stale") is not None for r in record.rows] == [False, True]
    assert set(record.goal_met) == set(gpu_pipeline.GOALS) and not any(record.goal_met.values())


@pytest.mark.parametrize("steps,goal", [(2, 0.65), (60, 0.65), (90, 0.65), (1999, 0.65), (2000, 0.90), (5000, 0.90)])
def test_the_efficiency_goal_follows_the_run_length(steps, goal):
    assert gpu_pipeline.efficiency_goal(steps) == goal


def test_each_row_is_judged_against_its_own_goals(tmp_path, monkeypatch):
    # the 60-step run: (15 + 2) / 39 = 0.436 < 0.65; the 2,000-step run: (95 + 2) / 105 = 0.924 ≥ 0.90
    short = gpu_pipeline.run_row(60, 40.0, WALLS, _stats({}), "")
    long = gpu_pipeline.run_row(2000, 40.0, {"train": 100.0, "evaluate": 3.0, "register": 2.0},
                                {**_stats({}), "train": {"cache": "miss", "timings": {"train_s": 95.0},
                                                         "throughput": {"real_tokens_per_s": 1000.0}}}, "")
    rows = iter([short, long])
    monkeypatch.setattr(gpu_pipeline, "one_run", lambda *a: next(rows))
    args = argparse.Namespace(recipe="tiny-cpu", set=[], steps="60,2000", smoke=True, keep=False, shared_tmp=True,
                              command="test")
    record = gpu_pipeline.run(args, tmp_path)
    first, second = record.rows
    assert (first["goals"]["efficiency"], second["goals"]["efficiency"]) == (0.65, 0.90)
    assert second["efficiency"] == round((95.0 + 2.0) / 105.0, 4)
    assert first["goal_met"]["efficiency"] is False and second["goal_met"]["efficiency"] is True
    assert first["goal_met"]["evaluate_non_step_s"] is True   # 12 − 2 = 10 s: at the goal
    assert record.goal_met["efficiency"] is False and record.goal_met["register_s"] is True
