"""Micro-batch shape (train.budget None | int | auto), the OOM message, the multi-GPU launch command."""

from __future__ import annotations

import argparse
import sys

import pytest

from packtrain.config import load_run_config
from packtrain.errors import ConfigError
from packtrain.train.runtime import Shape, choose_shape, dist_info, oom_error


@pytest.mark.parametrize("budget, rows, expect", [
    (None, 4, (512, 4, "pack")),      # the packs' budget
    (512, 4, (512, 4, "train")),
    (1024, 4, (512, 8, "train")),     # 1024 × 4 tokens = 8 packs of 512
    (768, 2, (512, 3, "train")),      # floor(768 × 2 / 512)
    (256, 4, (512, 2, "train")),
])
def test_shape_from_train_budget(budget, rows, expect):
    cfg = load_run_config("tiny-cpu", [f"train.rows={rows}"] + ([f"train.budget={budget}"] if budget else []))
    s = choose_shape(cfg.model, cfg.train, 512, cfg.plan)
    assert (s.budget, s.rows, s.source) == expect and s.tokens == s.budget * s.rows


def test_budget_below_one_pack_is_a_config_error():
    cfg = load_run_config("tiny-cpu", ["train.rows=1", "train.budget=128"])
    with pytest.raises(ConfigError, match=r"train.budget 128 × train.rows 1 = 128 tokens is less than one pack"):
        choose_shape(cfg.model, cfg.train, 512, cfg.plan)


def test_auto_budget_asks_the_planner():
    cfg = load_run_config("350m-h200", ["train.budget=auto", "plan.device_memory_gib=141"])
    s = choose_shape(cfg.model, cfg.train, 2048, cfg.plan, vocab_size=32768)
    assert s.source == "auto" and s.plan is not None and s.plan.fits
    assert s.tokens == s.plan.tokens   # the planned micro-batch, as whole packs of 2048
    small = load_run_config("350m-h200", ["train.budget=auto", "plan.device_memory_gib=24"])
    s24 = choose_shape(small.model, small.train, 2048, small.plan, vocab_size=32768)
    assert s24.tokens < s.tokens   # 16,384 vs 32,768 (the compiled recipe fits 32k tokens in 33 GiB)


def test_oom_error_names_planned_and_observed_peaks():
    cfg = load_run_config("350m-h200")
    err = oom_error(7, "cpu", Shape(2048, 8, 1, "pack"), cfg.model, cfg.train, cfg.plan, vocab_size=32768)
    msg = str(err)
    assert err.exit_code == 1
    assert "out of device memory at step 7" in msg and "observed peak 0.0 GiB allocated" in msg
    assert "planned peak " in msg and "unavailable" not in msg and "8 rows × 2048 tokens" in msg
    assert "train.activation_checkpointing=full" in msg


def test_launch_command_and_rank_env(monkeypatch):
    from packtrain.commands.train import launcher_command

    args = argparse.Namespace(gpus=4, recipe="1b-h200", overrides=["train.engine=deepspeed"], packs="p",
                              tokens=None, out="o", resume=True)
    assert launcher_command(args) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "packtrain.cli",
        "train", "--recipe", "1b-h200", "--set", "train.engine=deepspeed", "--packs", "p", "--out", "o", "--resume"]
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert (dist_info().rank, dist_info().world_size, dist_info().is_main) == (0, 1, True)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    d = dist_info()
    assert (d.rank, d.local_rank, d.world_size, d.is_main) == (3, 1, 4, False)
