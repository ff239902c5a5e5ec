"""DeepSpeed: the generated config passes DeepSpeed's own parser for every stage/offload/precision, and one
ZeRO-2 run on the CPU (DS_ACCELERATOR=cpu, client torch AdamW) trains like the plain torch engine."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from packtrain.config import TrainConfig
from packtrain.errors import ConfigError

pytest.importorskip("deepspeed")

from packtrain.train.deepspeed_engine import build_deepspeed_config, validate_deepspeed_config  # noqa: E402

COMBOS = [(st, oo, op, prec) for st, oo, op, prec in itertools.product([0, 1, 2, 3], [False, True], [False, True],
                                                                       ["fp32", "bf16", "fp16"])
          if not (op and st != 3) and not (oo and st == 0)]


@pytest.mark.parametrize("stage, offload_opt, offload_params, precision", COMBOS)
def test_every_combination_passes_deepspeeds_parser(stage, offload_opt, offload_params, precision):
    tc = TrainConfig(precision=precision, rows=4, grad_accum=3, grad_clip=0.5,
                     deepspeed={"zero_stage": stage, "offload_optimizer": offload_opt,
                                "offload_params": offload_params})
    raw = build_deepspeed_config(tc)
    parsed = validate_deepspeed_config(raw)
    assert parsed.zero_optimization_stage == stage
    assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) \
        == (12, 4, 3)
    assert parsed.gradient_clipping == 0.5
    assert parsed.bfloat16_config.enabled == (precision == "bf16") and parsed.float16_config.enabled == (precision == "fp16")
    zc = parsed.zero_config
    assert (zc.offload_optimizer is not None and zc.offload_optimizer.device == "cpu") == offload_opt
    assert (zc.offload_param is not None and zc.offload_param.device == "cpu") == offload_params
    assert json.loads(json.dumps(raw)) == raw   # saved beside the run as JSON


def test_world_size_scales_the_global_batch_and_bad_combinations_fail():
    assert len(COMBOS) == 27
    assert build_deepspeed_config(TrainConfig(rows=8, grad_accum=2), world_size=4)["train_batch_size"] == 64
    with pytest.raises(ConfigError, match="offload_optimizer: needs train.deepspeed.zero_stage ≥ 1"):
        build_deepspeed_config(TrainConfig(deepspeed={"zero_stage": 0, "offload_optimizer": True}))
    with pytest.raises(ValueError, match="offload_params needs zero_stage 3"):
        TrainConfig(deepspeed={"zero_stage": 2, "offload_params": True})
    bad = {**build_deepspeed_config(TrainConfig()), "train_batch_size": 7}
    with pytest.raises(ConfigError, match="DeepSpeed rejected"):
        validate_deepspeed_config(bad)


@pytest.mark.slow
def test_zero2_on_cpu_trains_like_the_torch_engine(tmp_path):
    """One CLI process with engine=deepspeed (ZeRO-2, grad_accum 2) vs the torch engine in this process.

    One CPU process does not build DeepSpeed's shm_comm op (packtrain.train.deepspeed_engine.skip_shm_comm; with the
    build this test took 108-360 s on a 2-core machine, each new venv path compiling it again)."""
    from packtrain.cli import main
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    make_synthetic_inputs(tmp_path, n_docs=120, vocab_size=96, budget=64, seed=2)
    common = ["train", "--packs", str(tmp_path / "pack"), "--tokens", str(tmp_path / "tokenize")]
    for s in ("tracking.enabled=false", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
              "train.rows=2", "train.grad_accum=2", "train.max_steps=3", "train.warmup_steps=1", "train.threads=1",
              "telemetry.peak_tflops=1",   # no matmul probes for the MFU's peak (MFU is not checked here)
              f"workdir={tmp_path / 'work'}", "train.deepspeed.zero_stage=2"):
        common += ["--set", s]
    ds = subprocess.run([sys.executable, "-m", "packtrain.cli", *common, "--out", str(tmp_path / "ds"),
                         "--set", "train.engine=deepspeed"], capture_output=True, text=True, timeout=600)
    assert ds.returncode == 0, ds.stderr[-3000:]
    assert "shm_comm" not in ds.stdout + ds.stderr   # one process: nothing JIT-built
    assert main([*common, "--out", str(tmp_path / "torch")]) == 0
    r_ds = json.loads((tmp_path / "ds" / "train_result.json").read_text())
    r_torch = json.loads((tmp_path / "torch" / "train_result.json").read_text())
    assert r_ds["setup"]["engine"] == "deepspeed" and r_ds["steps"] == 3
    assert r_ds["loss_curve"] == pytest.approx(r_torch["loss_curve"], rel=1e-5)
    saved = json.loads((tmp_path / "ds" / "deepspeed_config.json").read_text())
    assert saved["zero_optimization"]["stage"] == 2 and saved["gradient_accumulation_steps"] == 2
    assert (tmp_path / "ds" / "checkpoints" / "step_000003" / "deepspeed").is_dir()
    assert (tmp_path / "ds" / "model" / "model.safetensors").is_file()
