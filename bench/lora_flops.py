"""LoRA's trainable parameters and FLOPs per real token, for the lora suites (bench/suites/lora.py, lora_budget.py)
and their variants (bench/lora_variants.py).

Useful FLOPs of LoRA (no weight gradients for the frozen base), per real token and per document of length s:

    4·N + 4·h·V      frozen matmuls: forward 2, input-gradient 2 (N = non-embedding params, h·V the LM head)
    + 6·N_adapter    the adapter trains: forward, input- and weight-gradient
    + 12·L·w·Σ s²    attention within documents (w = heads·head_dim), fwd + bwd, the packtrain convention
                     (telemetry.mfu: full s², not halved for causality)
"""

from __future__ import annotations

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def nonembedding_params(spec: dict) -> int:
    """Decoder parameters (attention, MLP, norms) + the final norm; Llama-3-8B → 6,979,588,096."""
    h, i, L = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    kv = h // spec["num_attention_heads"] * spec["num_key_value_heads"]
    return L * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h


def adapter_params(spec: dict, r: int) -> int:
    """LoRA A (r × in) + B (out × r) on the seven linears of every layer; Llama-3-8B at r=16 → 41,943,040."""
    h, i, L = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    kv = h // spec["num_attention_heads"] * spec["num_key_value_heads"]
    per_layer = (h + h) + (h + kv) + (h + kv) + (h + h) + 2 * (h + i) + (i + h)
    return L * r * per_layer


def flops_per_real_token(spec: dict, r: int, seq_lens: list[int]) -> tuple[float, float]:
    """(useful, with_recompute) FLOPs per real token of LoRA training over documents of `seq_lens`."""
    h, L, V = spec["hidden_size"], spec["num_hidden_layers"], spec["vocab_size"]
    n, na = nonembedding_params(spec), adapter_params(spec, r)
    real = sum(seq_lens)
    sq = sum(s * s for s in seq_lens)
    attn_fwd = 4.0 * L * h * sq / real          # w = heads·head_dim = h for Llama
    useful = 4.0 * n + 4.0 * h * V + 6.0 * na + 3 * attn_fwd
    return useful, useful + 2.0 * n + attn_fwd  # recompute: the decoder's forward once more
