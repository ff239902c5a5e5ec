"""`packtrain train --set train.engine=fsdp2` on the CPU (gloo): one process equals the torch engine, two ranks
through the real launcher match one process, a resume from a DCP checkpoint continues bit-exactly, and model/
loads with plain transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from packtrain.cli import main

V = 128
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=4",
        "train.max_steps=6", "train.warmup_steps=2", "train.checkpoint.every_steps=3",
        "train.checkpoint.keep_last=2", "train.threads=1", "telemetry.interval_s=5", "tracking.enabled=false",
        "telemetry.peak_tflops=1"]   # MFU is not checked here: no matmul probes (~1 CPU-s a process)


def _train(data: Path, out: Path, *sets: str, flags: tuple[str, ...] = ()) -> dict:
    args = ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
            *[x for s in [*TINY, f"workdir={data / 'work'}", *sets] for x in ("--set", s)], *flags]
    assert main(args) == 0
    return json.loads((out / "train_result.json").read_text())


def _weights(model_dir: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("fsdp2_data")
    make_synthetic_inputs(root, n_docs=200, vocab_size=V, budget=128, seed=1)
    return root


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The torch engine, one process, 4 rows a step: the trajectory FSDP2 must reproduce."""
    out = tmp_path_factory.mktemp("ref") / "train"
    return out, _train(data, out)


def test_one_process_equals_the_torch_engine(data, reference, tmp_path, capsys):
    """World size 1: train() makes its own 1-rank gloo group (gone afterwards); fp32 FSDP2 computes what the
    torch engine computes; checkpoints are DCP directories."""
    import torch.distributed as dist

    ref_out, ref = reference
    res = _train(data, tmp_path / "f", "train.engine=fsdp2")
    assert res["setup"]["engine"] == "fsdp2" and res["setup"]["world_size"] == 1
    assert res["loss_curve"] == pytest.approx(ref["loss_curve"], rel=1e-6, abs=0)
    assert not dist.is_initialized()
    ck = tmp_path / "f" / "checkpoints" / "step_000003"
    assert (ck / "dcp" / ".metadata").is_file() and not (ck / "model.safetensors").exists()
    assert "dcp/.metadata" in json.loads((ck / "manifest.json").read_text())["files"]   # verified on resume
    args = ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(tmp_path / "f"),
            "--resume", *[x for s in [*TINY, f"workdir={data / 'work'}"] for x in ("--set", s)]]
    assert main(args) == 3   # the torch engine cannot read a DCP checkpoint: refused, naming the engine
    assert "written by train.engine=fsdp2" in capsys.readouterr().err


@pytest.mark.parametrize("sets, words", [(["train.adapter.type=lora"], "not fsdp2"),
                                         (["train.precision=fp16"], "use train.precision=bf16")])
def test_refused_at_load_time(sets, words):
    from packtrain.config import load_run_config
    from packtrain.errors import ConfigError

    with pytest.raises(ConfigError, match=words):
        load_run_config("tiny-cpu", ["train.engine=fsdp2", *sets])


def test_planner_divides_states_and_gathers_params():
    """16 B/param of fp32 shards over W GPUs, plus gathered bf16 params: every layer on one GPU (reshard auto =
    false), two layers + the root on 8 (auto = true)."""
    from packtrain.config import load_run_config
    from packtrain.planner import plan_memory

    plans = {}
    for gpus in (1, 8):
        cfg = load_run_config("1b-h200", ["train.engine=fsdp2", f"train.gpus={gpus}"])
        plans[gpus] = plan_memory(cfg.model, cfg.train, cfg.pack.budget, cfg.plan, vocab_size=32768)
    s = plans[1].shape
    n, root = s.n_params, s.n_params - s.layers * s.layer_params
    assert plans[1].components["parameters"] + plans[1].components["optimizer_states"] == 12 * n
    assert plans[8].components["parameters"] + plans[8].components["optimizer_states"] == 3 * n // 2
    assert plans[1].components["zero_buffers"] == 2 * n
    assert plans[8].components["zero_buffers"] == 2 * (2 * s.layer_params + root)
    assert plans[1].components.get("weight_casts", 0) == 0   # no autocast copies


@pytest.mark.slow
def test_two_ranks_match_one_process_and_resume_exactly(data, reference, tmp_path):
    """`--gpus 2` (torchrun + gloo, 2 rows per rank = the reference's 4 per step): the loss curve of one process
    within the DDP test's tolerance, model/ (gathered on rank 0) loads with transformers; then the step-3 DCP
    checkpoint resumed on 2 ranks gives the uninterrupted run's steps 4-6 and final weights to the last bit."""
    ref_out, ref = reference
    a = tmp_path / "a"
    res = _train(data, a, "train.engine=fsdp2", "train.rows=2", flags=("--gpus", "2"))
    assert res["setup"]["world_size"] == 2 and res["setup"]["engine"] == "fsdp2"
    assert res["loss_curve"] == pytest.approx(ref["loss_curve"], rel=1e-5)
    assert sorted(p.name for p in (a / "checkpoints" / "step_000006" / "dcp").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]   # one shard file per rank
    got, want = _weights(a / "model"), _weights(ref_out / "model")
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in want) < 1e-5

    b = tmp_path / "b"   # the same run killed after step 3's checkpoint
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("step_000006", "model"))
    resumed = _train(data, b, "train.engine=fsdp2", "train.rows=2", flags=("--gpus", "2", "--resume"))
    assert resumed["start_step"] == 3 and resumed["loss_curve"] == res["loss_curve"]
    assert (b / "model" / "model.safetensors").read_bytes() == (a / "model" / "model.safetensors").read_bytes()


def test_an_fsdp2_resume_of_another_engines_checkpoint_names_that_engine(tmp_path):
    from packtrain.train.fsdp2_engine import _writer_of

    (tmp_path / "ds" / "deepspeed").mkdir(parents=True)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "model.safetensors").write_bytes(b"")
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter.safetensors").write_bytes(b"")
    assert [_writer_of(tmp_path / d) for d in ("ds", "torch", "lora")] == [
        "train.engine=deepspeed", "train.engine=torch", "train.engine=torch with train.adapter.type=lora"]
