"""The planner and MFU know every family's shapes: exact parameter counts against the real transformers models
(meta device), the released Qwen2 sizes, `packtrain plan` on a checkpoint directory, and the FLOP count's
attention width and sliding windows."""

from __future__ import annotations

import json

import pytest
import torch

from packtrain.cli import main
from packtrain.config import load_run_config
from packtrain.planner import model_shape, plan_memory
from packtrain.planner.shapes import shape_of_config
from packtrain.telemetry.mfu import model_flop_dims, step_flops
from packtrain.testing.tiny_families import FAMILY_NAMES, tiny_family_config

QWEN2 = {  # the released Qwen2 configs' sizes (151,936-token vocabulary, tied, GQA with 2 KV heads)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960),
}


def _real_params(cfg) -> tuple[int, int]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return sum(p.numel() for p in model.parameters()), linear


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False}, {"attention_bias": True}])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_param_count_matches_the_model(family, overrides):
    cfg = tiny_family_config(family, 97, **overrides)
    shape = shape_of_config(cfg)
    total, linear = _real_params(cfg)
    assert shape.n_params == total, (family, overrides, shape)
    assert shape.linear_params == linear   # every matmul weight, the LM head included (tied or not)
    assert shape.family == family


@pytest.mark.parametrize("size,params", [("0.5b", 494_032_768), ("1.5b", 1_543_714_304)])
def test_family_qwen2_released_sizes(size, params):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("qwen2", vocab_size=151_936, tie_word_embeddings=True, rope_theta=1e6, **QWEN2[size])
    shape = shape_of_config(cfg)
    assert shape.n_params == params == _real_params(cfg)[0]
    assert (shape.kv_heads, shape.head_dim, shape.tied, shape.qkv_bias) == (2, shape.hidden // shape.heads, True, True)


def test_family_plan_cli_reads_the_checkpoint(tmp_path, capsys):
    """`packtrain plan` with model.init_from=<dir>: shapes come from its config.json (a config without weights is
    enough to plan)."""
    from transformers import AutoConfig

    AutoConfig.for_model("qwen2", vocab_size=151_936, tie_word_embeddings=True, max_position_embeddings=8192,
                         **QWEN2["0.5b"]).save_pretrained(tmp_path)
    argv = ["plan", "--recipe", "350m-h200", "--set", f"model.init_from={tmp_path}", "--device-memory-gib", "80"]
    assert main([*argv, "--json", "--budget", "2048"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["shape"]["family"] == "qwen2" and plan["shape"]["n_params"] == 494_032_768
    assert plan["shape"]["vocab"] == 151_936 and plan["budget"] == 2048
    assert main([*argv, "--rows", "auto", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["shape"]["family"] == "qwen2" and chosen["fits"] and chosen["rows"] >= 1


def test_family_plan_logits_grow_with_the_vocabulary(tmp_path):
    """The 151,936-token vocabulary's logits dominate: the standard loss needs far more than the chunked one."""
    from transformers import AutoConfig

    AutoConfig.for_model("qwen2", vocab_size=151_936, tie_word_embeddings=True, **QWEN2["0.5b"]).save_pretrained(
        tmp_path)
    cfg = load_run_config("350m-h200", [f"model.init_from={tmp_path}", "train.rows=8"])
    std = plan_memory(cfg.model, cfg.train.model_copy(update={"loss": "standard"}), 2048, cfg.plan, 139)
    chunked = plan_memory(cfg.model, cfg.train.model_copy(update={"loss": "chunked"}), 2048, cfg.plan, 139)
    assert std.components["logits_loss"] > 5 * chunked.components["logits_loss"]   # 27.8 vs 3.5 GiB
    assert model_shape(cfg.model).n_params == 494_032_768


def test_family_flops_attention_width_and_windows():
    # N=1000, 2 layers, h=8, V=10, attention width 16, layer 1 sliding with W=4; documents of 3 and 5 tokens
    # per token: 6·1000 + 6·8·10 = 6480; attention 12·16 = 192 per unit
    # useful: 6480·8 + 192·(3²+5²) [full layer] + 192·(3·3 + 5·4) [window 4] = 51840 + 6528 + 5568
    # dense:  6480·16 + 192·2·8·8 [full] + 192·2·8·4 [window 4] = 103680 + 24576 + 12288
    assert step_flops(1000, 2, 8, [3, 5], 16, 8, 10, attn_width=16, windows=(None, 4)) == (63936.0, 140544.0)
    assert step_flops(1000, 2, 8, [3, 5], 16, 8, 10) == step_flops(1000, 2, 8, [3, 5], 16, 8, 10, attn_width=8,
                                                                   windows=(None, None))
    with pytest.raises(ValueError, match="windows has 1 entries for 2 layers"):
        step_flops(1000, 2, 8, [3, 5], 16, 8, 10, windows=(4,))


@pytest.mark.parametrize("family,width,windows", [
    ("llama", 32, (None, None)), ("mistral", 32, (4, 4)), ("qwen2", 32, (None, 4)), ("qwen3", 64, (None, 4)),
    ("gemma2", 64, (4, None)), ("gemma3_text", 64, (4, None)), ("phi3", 32, (4, 4))])
def test_family_flop_dims(family, width, windows):
    dims = model_flop_dims(tiny_family_config(family))
    assert (dims["attn_width"], dims["windows"], dims["hidden_size"], dims["n_layers"]) == (width, windows, 32, 2)
