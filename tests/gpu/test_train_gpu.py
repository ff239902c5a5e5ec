"""Train-stage checks that need CUDA (skipped without it). Run on the GPU machine with
`python -m pytest -q -s tests/gpu/test_train_gpu.py` — `-s` shows the JSON lines (tokens/s, peak memory).

- isolation in bf16 for every backend available there (sdpa, eager, flex, varlen)
- a few steps of the 350m-h200 recipe per backend (torch engine, recipe precision + compile): finite loss,
  no recompiles with the fixed budget
- activation checkpointing and the chunked loss lower peak memory
- DeepSpeed ZeRO-2 and ZeRO-3 + CPU offload, each in a fresh process (python -m bench.suites.train_smoke --run-one)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ["sdpa", "eager", "flex", "varlen"]


def _available(backend: str) -> bool:
    from packtrain.model.attention import available_backends

    return backend in available_backends("cuda", "bf16")


@pytest.fixture(scope="module")
def recipe():
    from packtrain.config import load_run_config

    return load_run_config("350m-h200")


@pytest.fixture(scope="module")
def data(recipe, tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("gpu_data")
    make_synthetic_inputs(root, n_docs=1500, vocab_size=recipe.tokenize.vocab_size, budget=recipe.pack.budget)
    return root


@pytest.mark.parametrize("backend", BACKENDS)
def test_isolation_in_bf16(backend):
    if not _available(backend):
        pytest.skip(f"{backend} not available on this torch/GPU")
    from packtrain.testing.gpu_smoke import isolation_error

    r = isolation_error(backend, "cuda", "bf16")
    print(json.dumps({"test": "isolation_bf16", **r}))
    assert r["max_abs_err"] <= 0.05, r
    assert r["max_abs_err"] < 0.1 * r["leak_abs_err"], r


@pytest.mark.parametrize("backend", ["sdpa", "flex", "varlen"])
def test_350m_recipe_trains_with_each_backend(recipe, data, tmp_path, backend):
    if not _available(backend):
        pytest.skip(f"{backend} not available on this torch/GPU")
    from packtrain.testing.gpu_smoke import smoke_run

    r = smoke_run(recipe, data / "tokenize", data / "pack", tmp_path, backend, steps=8, warmup_steps=3)
    print(json.dumps({"test": "350m_backend", **r}))
    assert math.isfinite(r["final_loss"]) and r["final_loss"] < r["first_loss"]
    assert r["peak_alloc_gib"] > 0 and r["real_tokens_per_s"] > 0
    if r["compile"]:
        assert r["recompiles"] == 0, r


@pytest.mark.parametrize("change", [{"activation_checkpointing": "full"}, {"loss": "chunked"}])
def test_memory_techniques_lower_the_peak(recipe, data, tmp_path, change):
    from packtrain.testing.gpu_smoke import smoke_run

    # the baseline holds full logits and every layer's activations (the recipe's fused loss is chunked here
    # when liger-kernel is absent, so it would be the "chunked" case itself)
    base = recipe.model_copy(update={"train": recipe.train.model_copy(update={"compile": False, "rows": 4,
                                                                             "loss": "standard"})})
    tried = recipe.model_copy(update={"train": base.train.model_copy(update=change)})
    a = smoke_run(base, data / "tokenize", data / "pack", tmp_path / "a", "sdpa", steps=3, warmup_steps=0)
    b = smoke_run(tried, data / "tokenize", data / "pack", tmp_path / "b", "sdpa", steps=3, warmup_steps=0)
    print(json.dumps({"test": "memory", "change": change, "base_gib": a["peak_alloc_gib"],
                      "with_gib": b["peak_alloc_gib"], "base_tok_s": a["real_tokens_per_s"],
                      "with_tok_s": b["real_tokens_per_s"]}))
    assert b["peak_alloc_gib"] < a["peak_alloc_gib"]
    assert b["first_loss"] == pytest.approx(a["first_loss"], rel=1e-2)


@pytest.mark.parametrize("stage, offload", [(2, False), (3, True)])
def test_deepspeed_paths(data, tmp_path, stage, offload):
    pytest.importorskip("deepspeed")
    attention = "varlen" if _available("varlen") else "sdpa"
    spec = {"kind": "run", "recipe": "350m-h200", "data": str(data), "out": str(tmp_path / "run"),
            "attention": attention, "steps": 4, "engine": "deepspeed", "zero_stage": stage, "offload": offload,
            "compile": False}
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "bench.suites.train_smoke", "--run-one", json.dumps(spec),
                           "--result", str(result)], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(result.read_text())
    print(json.dumps({"test": "deepspeed", **r}))
    assert r["engine"] == "deepspeed" and r["steps"] == 4 and math.isfinite(r["final_loss"])
    assert (tmp_path / "run" / "deepspeed_config.json").is_file()
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_compile_cache_second_run_hits(data, tmp_path):
    """`packtrain train` twice into one workdir, each as on a fresh host (its own TMPDIR: inductor's default cache
    /tmp/torchinductor_<user> empty; no TORCHINDUCTOR_CACHE_DIR): the second loads the first's compiled graphs and
    kernels from <workdir>/compile-cache (packtrain.train.compile_cache)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    runs = []
    for k in range(2):
        host, out = tmp_path / f"host{k}", tmp_path / f"train{k}"
        host.mkdir()
        sets = [f"workdir={tmp_path / 'work'}", "tracking.enabled=false", "train.max_steps=4", "train.warmup_steps=1",
                "train.compile=true"]
        cmd = [sys.executable, "-m", "packtrain.cli", "train", "--recipe", "350m-h200", "--packs", str(data / "pack"),
               "--tokens", str(data / "tokenize"), "--out", str(out), *[x for s in sets for x in ("--set", s)]]
        proc = subprocess.run(cmd, env={**env, "TMPDIR": str(host)}, capture_output=True, text=True, timeout=900,
                              cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads((out / "train_result.json").read_text())["timings"])
        assert "compile cache" in proc.stderr and str(tmp_path / "work") in runs[-1]["compile_cache_dir"]
    print(json.dumps({"test": "compile_cache", **{k: [r.get(k) for r in runs] for k in
                      ("compile_cache", "first_step_s", "compile_s", "compile_cache_check_s")}}))
    assert [r["compile_cache"] for r in runs] == ["miss", "hit"]
