"""The utilization guard over two gloo ranks on the CPU (`--gpus 2`: torchrun, as on a GPU node): interval numbers are
all-gathered so both ranks decide alike, a rank with a throttled loader is named as the straggler, and a rank stuck in
a step is named from the watchdogs' heartbeats (the other one waits in "sync"); that run checkpoints, exits 6 on
both ranks, and `--resume` ends with the loss curve of the run that was never stopped, to the last bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtrain.cli import main

pytestmark = pytest.mark.slow   # three torchrun launches of two ranks (~25 s each here)

TWO = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=2", "train.max_steps=16",
       "train.warmup_steps=2", "train.checkpoint.every_steps=5", "train.threads=1", "telemetry.interval_s=5",
       "telemetry.peak_tflops=1", "telemetry.guard.interval_steps=2", "telemetry.guard.window=2",
       "telemetry.guard.hang_s=1", "telemetry.guard.actions.hang=checkpoint_and_stop",
       "tracking.enabled=false"]


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    sets = [*TWO, f"workdir={out.parent / 'work'}"]
    return ["train", "--gpus", "2", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out",
            str(out), *[x for s in sets for x in ("--set", s)], *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("guard_ranks")
    make_synthetic_inputs(root, n_docs=200, vocab_size=128, budget=128, seed=1)
    return root


def test_two_ranks_name_the_straggler_and_the_stuck_rank_and_resume_exactly(data, tmp_path, monkeypatch, capfd):
    slow = tmp_path / "slow"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.slow_data_rank1@9-=0.05")   # rank 1's loader, from step 9 on
    assert main(_args(data, slow)) == 0
    r = json.loads((slow / "train_result.json").read_text())
    lag = [e for e in r["guard"]["events"] if e["signal"] == "straggler"]
    assert len(lag) == 1 and lag[0]["rank"] == 1 and lag[0]["step"] in (10, 12), r["guard"]["events"]
    assert lag[0]["detail"].startswith("rank 1 waits 0.05") and lag[0]["measured"]["others_wait_s"] < 0.02

    stuck = tmp_path / "stuck"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.slow_step_rank1@10=1.5")    # rank 1 stalls inside step 10
    capfd.readouterr()
    assert main(_args(data, stuck)) == 6
    err = capfd.readouterr().err                                               # the ranks' stderr too
    assert "guard: step 10 rank 1 hang (slow_step)" in err
    assert "rank 1 in step at step 10" in err and "last step done 9 (ranks 0 in sync 10)" in err
    assert sorted(p.name for p in (stuck / "checkpoints").iterdir()) == ["step_000005", "step_000010"]
    assert not (stuck / ".guard").exists()                                    # heartbeats gone with the ranks
    monkeypatch.delenv("PACKTRAIN_FAULT")
    assert main(_args(data, stuck, "--resume")) == 0
    resumed = json.loads((stuck / "train_result.json").read_text())
    assert resumed["setup"]["resumed_from"] == 10 and resumed["loss_curve"] == r["loss_curve"]
    # the first attempt's hang is kept (a throughput dip on a loaded machine may precede it, so look it up)
    hangs = [e for e in resumed["guard"]["events"] if e["signal"] == "hang"]
    assert [(e["step"], e["rank"]) for e in hangs] == [(10, 1)], resumed["guard"]["events"]
