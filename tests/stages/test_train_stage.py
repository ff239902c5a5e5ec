"""`packtrain train` through the real CLI: MLflow tracking, a loadable model, exact resume after SIGKILL,
a corrupt newest checkpoint skipped, bad input rejected with the input untouched."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packtrain.cli import main

V = 128
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=4",
        "train.max_steps=20", "train.warmup_steps=2", "train.checkpoint.every_steps=5",
        "train.checkpoint.keep_last=2", "train.threads=1", "telemetry.interval_s=5"]
PACKTRAIN = [sys.executable, "-m", "packtrain.cli"]


def _args(data: Path, out: Path, *extra: str, tracking: bool = False) -> list[str]:
    sets = [*TINY, f"workdir={data / 'work'}", f"tracking.enabled={str(tracking).lower()}"]
    return ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
            *[x for s in sets for x in ("--set", s)], *extra]


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory, seed_mlflow_store):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("train_data")
    make_synthetic_inputs(root, n_docs=200, vocab_size=V, budget=128, seed=1)
    seed_mlflow_store(root / "work" / "mlflow.db")   # the tracked runs' store, empty (its creation: not the subject)
    return root


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory):
    """20 steps without interruption, tracked in MLflow (sqlite in tmp)."""
    out = tmp_path_factory.mktemp("straight") / "train"
    assert main(_args(data, out, tracking=True)) == 0
    return out


def _losses(out: Path) -> list[float]:
    return json.loads((out / "train_result.json").read_text())["loss_curve"]


def test_run_writes_result_log_model_and_mlflow_metrics(data, straight):
    result = json.loads((straight / "train_result.json").read_text())
    assert result["steps"] == 20 and len(result["loss_curve"]) == 20
    assert result["loss_curve"][-1] < result["loss_curve"][0] - 0.1   # the Markov data is learnable
    assert result["setup"]["attention"] == "sdpa" and result["setup"]["budget"] == 128
    from packtrain.config import load_run_config
    from packtrain.evaluate.recipe_identity import recipe_identity

    assert result["recipe"] == recipe_identity(load_run_config("tiny-cpu", TINY))   # what made these weights
    assert result["tokens"] <= result["slot_tokens"] == 20 * 4 * 128
    compile_cache = data / "work" / "compile-cache"   # compile off: nothing compiled, nothing cached
    assert result["timings"]["compile_cache"] == "off"
    assert result["timings"]["compile_cache_dir"].startswith(str(compile_cache.resolve()))
    assert not any(p.is_file() for p in compile_cache.rglob("*"))
    log = [json.loads(line) for line in (straight / "train_log.jsonl").read_text().splitlines()]
    assert [h["step"] for h in log] == list(range(1, 21)) and [h["loss"] for h in log] == result["loss_curve"]
    assert [p.name for p in sorted((straight / "checkpoints").iterdir())] == ["step_000015", "step_000020"]

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{data / 'work' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])[0]
    assert run.info.run_name == "train" and run.info.status == "FINISHED"
    assert run.data.params["train.attention"] == "auto" and run.data.params["model.hidden_size"] == "32"
    hist = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in hist] == list(range(1, 21))
    assert [m.value for m in hist] == pytest.approx(result["loss_curve"], rel=1e-12)
    # charts: loss, tokens/s, MFU per step; lr, grad_norm, step time ... are in train_log.jsonl / telemetry.json
    series = {k for k in run.data.metrics if len(client.get_metric_history(run.info.run_id, k)) > 1}
    assert {k for k in series if not k.startswith("system/")} == {"loss", "real_tokens_per_s", "useful_mfu"}
    assert not {"lr", "grad_norm", "step_time_s", "dense_mfu"} & set(run.data.metrics)
    # a train run of its own (no pipeline run) keeps its final numbers as metrics, each once
    assert run.data.metrics["throughput.real_tokens_per_s"] == result["throughput"]["real_tokens_per_s"]
    assert run.data.metrics["final_loss"] == result["final_loss"]
    assert not [k for k in run.data.metrics if k.startswith("summary.")]
    # the sampler's records as MLflow system metrics (CPU here: process utilization and RSS) at their sample time
    telemetry = json.loads((straight / "telemetry.json").read_text())
    util = sorted(client.get_metric_history(run.info.run_id, "system/train_utilization_percentage"),
                  key=lambda m: m.step)
    assert len(util) == len(telemetry["samples"]) > 0
    assert [m.value for m in util] == [r["util"] for r in telemetry["samples"]]
    assert [m.timestamp for m in util] == [round((telemetry["samples_t0_unix"] + r["t"]) * 1000)
                                           for r in telemetry["samples"]]


def test_saved_model_loads_with_plain_transformers(straight):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((straight / "model" / "config.json").read_text())
    assert "packtrain" not in json.dumps(cfg)
    model = AutoModelForCausalLM.from_pretrained(straight / "model")
    tok = AutoTokenizer.from_pretrained(straight / "model")
    assert model.config.vocab_size == V == len(tok)
    ids = tok("t5 t6 t7", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)


def test_sigkill_then_resume_gives_bitwise_identical_losses(data, straight, tmp_path, capfd):
    """The killed run is a process of its own (SIGKILL is the subject); the resume runs in this process, as the
    corrupt-checkpoint test's does (a CLI process more would only add its ~6 CPU-s of imports)."""
    out = tmp_path / "killed"
    kill_after = random.randint(7, 13)   # some step after the first checkpoint (every 5)
    proc = subprocess.Popen(PACKTRAIN + _args(data, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log, deadline = out / "train_log.jsonl", time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        lines = log.read_text().splitlines() if log.exists() else []
        if lines and json.loads(lines[-1])["step"] >= kill_after:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"the run ended before step {kill_after}: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    killed_at = len(log.read_text().splitlines())
    assert killed_at < 20

    capfd.readouterr()
    assert main(_args(data, out, "--resume")) == 0
    resumed_from = json.loads((out / "train_result.json").read_text())["setup"]["resumed_from"]
    assert resumed_from in (5, 10) and resumed_from <= killed_at, (resumed_from, killed_at)
    assert f"resumed from {out / 'checkpoints' / f'step_{resumed_from:06d}'}" in capfd.readouterr().err
    assert _losses(out) == _losses(straight)   # every step, to the last bit
    from safetensors.torch import load_file

    a, b = load_file(out / "model" / "model.safetensors"), load_file(straight / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_corrupt_newest_checkpoint_is_skipped_on_resume(data, straight, tmp_path):
    import shutil

    out = tmp_path / "train"
    shutil.copytree(straight, out)
    weights = out / "checkpoints" / "step_000020" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-10] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="step_000020.*model.safetensors fails its sha256"):
        assert main(_args(data, out, "--resume")) == 0
    result = json.loads((out / "train_result.json").read_text())
    assert result["setup"]["resumed_from"] == 15 and result["loss_curve"] == _losses(straight)


@pytest.mark.parametrize("extra, code, message", [
    (["--set", "train.attention=varlen"], 2, "train.attention: 'varlen' is not available on cpu"),
    (["--gpus", "0"], 2, "--gpus 0: must be ≥ 1"),
    (["--set", "train.budget=auto"], 2, "train.budget: removed: set train.rows instead"),
])
def test_bad_config_fails_cleanly(data, tmp_path, capsys, extra, code, message):
    before = _tree_digest(data / "pack")
    assert main(_args(data, tmp_path / "out", *extra)) == code
    assert message in capsys.readouterr().err
    assert _tree_digest(data / "pack") == before
    assert not (tmp_path / "out" / "model").exists()


def test_missing_and_corrupt_inputs_fail_cleanly(data, tmp_path, capsys):
    import shutil

    args = _args(data, tmp_path / "o1")
    args[args.index("--packs") + 1] = str(tmp_path / "nope")
    assert main(args) == 5
    assert "run `packtrain pack` first" in capsys.readouterr().err
    args = _args(data, tmp_path / "o1")
    args[args.index("--tokens") + 1] = str(tmp_path / "nope")
    assert main(args) == 5
    assert "run `packtrain tokenize` first" in capsys.readouterr().err
    broken = tmp_path / "pack"
    shutil.copytree(data / "pack", broken)
    (broken / "train" / "meta.json").write_text("{not json")
    before = _tree_digest(broken)
    args = _args(data, tmp_path / "o2")
    args[args.index("--packs") + 1] = str(broken)
    assert main(args) == 3
    assert "meta.json is corrupt" in capsys.readouterr().err
    assert _tree_digest(broken) == before


def test_more_gpus_than_the_machine_has_is_a_config_error(data, tmp_path, capsys, monkeypatch):
    """Asking torchrun for more processes than CUDA devices would crash every rank on set_device: refuse first."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = _args(data, tmp_path / "o", "--gpus", "2", "--set", "train.device=auto")   # (the CPU recipe says cpu)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "train.gpus=2: this machine has 1 CUDA device(s)" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_two_processes_match_one_with_the_same_global_batch(data, straight, tmp_path, seed_mlflow_store):
    """`--gpus 2` on the CPU: torchrun + gloo DDP, rows 2 per rank = the straight run's 4 rows per step. The
    loss is the token mean over both ranks; only rank 0 opens an MLflow run and writes the outputs.
    The CLI runs in this process (its launch_ranks starts torchrun and the ranks as processes, as from a shell);
    telemetry.peak_tflops spares each rank its matmul probes (MFU is not checked here)."""
    out = tmp_path / "ddp"
    seed_mlflow_store(tmp_path / "work" / "mlflow.db")   # the workdir's store, empty (its creation: not the subject)
    args = _args(data, out, "--gpus", "2", "--set", "train.rows=2", "--set", "train.max_steps=3",
                 "--set", f"workdir={tmp_path / 'work'}", "--set", "telemetry.peak_tflops=1", tracking=True)
    assert main(args) == 0
    result = json.loads((out / "train_result.json").read_text())
    assert result["setup"]["world_size"] == 2 and result["setup"]["rows"] == 2
    # steps 1-3 see only warmup learning rates (warmup 2), identical in both runs
    assert result["loss_curve"] == pytest.approx(_losses(straight)[:3], rel=1e-5)
    assert result["slot_tokens"] == 3 * 2 * 2 * 128
    per_rank = result["memory"]["per_rank"]   # both ranks report, not only rank 0
    assert [r["rank"] for r in per_rank] == [0, 1] and all(r["real_tokens_per_s"] > 0 for r in per_rank)

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])
    assert [r.info.run_name for r in runs] == ["train"]
