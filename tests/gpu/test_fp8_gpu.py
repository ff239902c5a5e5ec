"""FP8 training on the GPU (skipped without CUDA; the FP8 runs need compute capability ≥ 8.9 and torchao). Run on
the GPU machine with `python -m pytest -q -s tests/gpu/test_fp8_gpu.py` — `-s` shows the JSON lines.

- the 350m-h200 recipe (varlen, compile, fused loss) in bf16 and in FP8 (tensorwise), same seed and data: the FP8
  run (24 layers × 7 linears in FP8) compiles without recompiles, and its loss follows bf16's (within 2%
  after 30 steps); its MFU is counted against the time-weighted FP8/bf16 peak (docs/fp8.md)
- FP8 composes with full activation checkpointing
- a GPU without FP8 tensor cores (capability < 8.9) is refused with the ConfigError
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _fp8_capable() -> bool:
    import importlib.util

    return torch.cuda.get_device_capability(0) >= (8, 9) and importlib.util.find_spec("torchao") is not None


@pytest.fixture(scope="module")
def recipe():
    from packtrain.config import load_run_config

    return load_run_config("350m-h200")


@pytest.fixture(scope="module")
def data(recipe, tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("fp8_data")
    make_synthetic_inputs(root, n_docs=1200, vocab_size=recipe.tokenize.vocab_size, budget=recipe.pack.budget)
    return root


def _with(recipe, **train):
    return recipe.model_copy(update={"train": recipe.train.model_copy(update=train)})


def _attention() -> str:
    from packtrain.model.attention import available_backends

    return "varlen" if "varlen" in available_backends("cuda", "fp8") else "sdpa"


def test_fp8_follows_bf16_on_the_350m_recipe(recipe, data, tmp_path):
    if not _fp8_capable():
        pytest.skip("needs compute capability ≥ 8.9 and torchao")
    from packtrain.testing.gpu_smoke import smoke_run

    runs = {}
    for precision in ("bf16", "fp8"):
        cfg = _with(recipe, precision=precision)
        runs[precision] = smoke_run(cfg, data / "tokenize", data / "pack", tmp_path / precision, _attention(),
                                    steps=30, warmup_steps=8)
        print(json.dumps({"test": "fp8_vs_bf16", **runs[precision]}))
    b, f = runs["bf16"], runs["fp8"]
    assert f["precision"] == "fp8" and math.isfinite(f["final_loss"]) and f["final_loss"] < f["first_loss"]
    assert f["final_loss"] == pytest.approx(b["final_loss"], rel=0.02)
    assert f["recompiles"] == 0, f
    assert 0 < f["useful_mfu"] < 1 and 0 < f["dense_mfu"] < 1
    print(json.dumps({"test": "fp8_speedup", "speedup": f["real_tokens_per_s"] / b["real_tokens_per_s"],
                      "peak_gib": [b["peak_alloc_gib"], f["peak_alloc_gib"]]}))


def test_fp8_with_activation_checkpointing(recipe, data, tmp_path):
    if not _fp8_capable():
        pytest.skip("needs compute capability ≥ 8.9 and torchao")
    from packtrain.testing.gpu_smoke import smoke_run

    cfg = _with(recipe, precision="fp8", activation_checkpointing="full", fp8=recipe.train.fp8.model_copy(
        update={"recipe": "rowwise"}))
    r = smoke_run(cfg, data / "tokenize", data / "pack", tmp_path, _attention(), steps=8, warmup_steps=3)
    print(json.dumps({"test": "fp8_rowwise_ac", **r}))
    assert math.isfinite(r["final_loss"]) and r["final_loss"] < r["first_loss"] and r["recompiles"] == 0


def test_fp8_refused_below_capability_8_9():
    if torch.cuda.get_device_capability(0) >= (8, 9):
        pytest.skip("this GPU has FP8 tensor cores")
    from packtrain.errors import ConfigError
    from packtrain.train.fp8 import check_fp8_support

    with pytest.raises(ConfigError, match="compute capability"):
        check_fp8_support("cuda")
