"""Micro-batch shape (train.rows int | auto for the packs' budget), the OOM message, the multi-GPU launch command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from packtrain.config import load_run_config
from packtrain.errors import ConfigError
from packtrain.planner.micro_batch import Shape, choose_shape
from packtrain.train.distributed import dist_info
from packtrain.train.oom import oom_error


@pytest.mark.parametrize("rows, grad_accum", [(4, 1), (1, 1), (3, 2)])
def test_shape_is_the_packs_budget_times_train_rows(rows, grad_accum):
    cfg = load_run_config("tiny-cpu", [f"train.rows={rows}", f"train.grad_accum={grad_accum}"])
    s = choose_shape(cfg.model, cfg.train, 512, cfg.plan)
    assert (s.budget, s.rows, s.grad_accum, s.source, s.plan) == (512, rows, grad_accum, "train.rows", None)
    assert s.tokens == 512 * rows and s.tokens_per_step == 512 * rows * grad_accum


def test_a_budget_that_is_not_a_pack_size_is_a_config_error():
    cfg = load_run_config("tiny-cpu")
    with pytest.raises(ConfigError, match=r"budget 1: the packs' budget must be an integer ≥ 2"):
        choose_shape(cfg.model, cfg.train, 1, cfg.plan)


def test_auto_rows_asks_the_planner():
    cfg = load_run_config("350m-h200", ["train.rows=auto", "plan.device_memory_gib=141"])
    s = choose_shape(cfg.model, cfg.train, 2048, cfg.plan, vocab_size=32768)
    assert s.source == "auto" and s.plan is not None and s.plan.fits and s.budget == 2048
    assert (s.plan.rows, s.plan.budget, s.plan.grad_accum, s.plan.tokens) == (s.rows, 2048, s.grad_accum, s.tokens)
    small = load_run_config("350m-h200", ["train.rows=auto", "plan.device_memory_gib=24"])
    s24 = choose_shape(small.model, small.train, 2048, small.plan, vocab_size=32768)
    assert 1 <= s24.rows < s.rows and s24.budget == 2048


def test_oom_error_names_planned_and_observed_peaks():
    cfg = load_run_config("350m-h200", ["train.attention=sdpa"])   # a backend this CPU resolves
    err = oom_error(7, "cpu", Shape(2048, 8, 1), cfg.model, cfg.train, cfg.plan, vocab_size=32768)
    msg = str(err)
    assert err.exit_code == 1
    assert "out of device memory at step 7" in msg and "observed peak 0.0 GiB allocated" in msg
    assert "planned peak " in msg and "unavailable" not in msg and "8 rows × 2048 tokens" in msg
    assert "train.activation_checkpointing=full" in msg


def test_launch_command_and_rank_env(monkeypatch):
    from packtrain.train.launch import torchrun_command

    assert torchrun_command(4, Path("/t/run.yaml"), Path("p"), Path("t"), Path("o"), resume=True) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m",
        "packtrain.stages.train", "--config", "/t/run.yaml", "--packs", "p", "--tokens", "t", "--out", "o", "--resume"]
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert (dist_info().rank, dist_info().world_size, dist_info().is_main) == (0, 1, True)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    d = dist_info()
    assert (d.rank, d.local_rank, d.world_size, d.is_main) == (3, 1, 4, False)
