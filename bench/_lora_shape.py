"""The LoRA bench's model (bench/lora_bench.py): the shapes it trains, the adapter's targets, parameter and
useful-FLOP counts, the CUDA peak — shared by its two variants (_lora_baseline.py, _lora_packtrain.py).

    nonembedding_params(SHAPES["llama3-8b"])          → 6,979,588,096
    adapter_params(SHAPES["llama3-8b"], 16)           → 41,943,040
    flops_per_real_token(spec, r, seq_lens)           → (useful, with_recompute) FLOPs per real token
    peaks_gib(device)                                 → (peak allocated, peak reserved) GiB; (0.0, 0.0) off CUDA
"""

from __future__ import annotations

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128_256, rope_theta=500_000.0, tie_word_embeddings=False,
                      max_position_embeddings=8192),
    # --smoke: the same structure (GQA, untied head), small enough for a CPU in seconds
    "smoke": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, rope_theta=500_000.0, tie_word_embeddings=False,
                  max_position_embeddings=1024),
}
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


def peaks_gib(device) -> tuple[float, float]:
    """(max_memory_allocated, max_memory_reserved) in GiB since the last reset; (0.0, 0.0) off CUDA."""
    import torch

    if device.type != "cuda":
        return 0.0, 0.0
    return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30
