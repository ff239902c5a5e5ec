"""Build the Llama-style model: random init from `ModelConfig` (never materialized twice) or a local directory.

Random init runs the module constructors on the `meta` device (no memory, no init kernels), allocates the
storage once on the target device with `to_empty`, then runs transformers' own `init_weights` (normal(0,
init_std) for linears and embeddings, ones for RMSNorm, RoPE inv_freq recomputed) exactly once. Eager
construction would first run torch's kaiming init in every nn.Linear and then overwrite it (2× the init
work), and building on CPU then copying to the GPU costs 2× the memory (1B params fp32: 8 GB instead of 4 GB).
The weights are a deterministic function of the torch seed.

Sizes of the recipes (tied embeddings, vocab 32768):

    recipe       hidden  layers  heads  ffn    total    non-embedding
    tiny-cpu     64      2       4      176    0.33M    0.07M   (vocab 4096)
    350m-h200    1024    24      16     2816   ~342M    ~309M
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError, MissingDataError
from packtrain.model.attention import HF_NAMES, register_attention_backends

if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from packtrain.config import ModelConfig


@dataclass
class ParamCount:
    total: int          # unique parameters (tied embedding counted once)
    embedding: int      # input embedding (+ LM head when untied)
    non_embedding: int  # total - embedding: the N of 6·N FLOPs per token

    def to_dict(self) -> dict:
        return asdict(self)


def llama_config(model_cfg: ModelConfig, vocab_size: int, attn_implementation: str = "sdpa",
                 pad_token_id: int | None = None, eos_token_id: int | None = None) -> LlamaConfig:
    """The transformers LlamaConfig for a ModelConfig (use_cache False: training on packed batches)."""
    from transformers import LlamaConfig

    if vocab_size < 2:
        raise ConfigError(f"vocab_size {vocab_size}: must be ≥ 2 (read from the token store's meta.json)")
    return LlamaConfig(
        vocab_size=int(vocab_size),
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_kv_heads or model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        rope_theta=model_cfg.rope_theta,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
        initializer_range=model_cfg.init_std,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        use_cache=False,
        attn_implementation=attn_implementation,
    )


def build_model(model_cfg: ModelConfig, vocab_size: int, attention: str = "sdpa", device: Any = "cpu",
                dtype: torch.dtype | None = None, pad_token_id: int | None = None,
                eos_token_id: int | None = None) -> LlamaForCausalLM:
    """A LlamaForCausalLM on `device` in `dtype` (default fp32: the master weights under AMP) whose attention is
    the packtrain backend `attention` (sdpa | eager | flex | varlen, already resolved from 'auto').

    `model_cfg.pretrained_dir` set → `from_pretrained` (its vocab must cover `vocab_size`); else random init
    via meta device + to_empty + init_weights. The caller seeds torch first for reproducible weights.
    """
    import torch
    from transformers import LlamaForCausalLM

    register_attention_backends()
    if attention not in HF_NAMES:
        raise ConfigError(f"train.attention: {attention!r} is not a backend (allowed: {', '.join(HF_NAMES)})")
    impl = HF_NAMES[attention]
    dtype = dtype or torch.float32
    if model_cfg.pretrained_dir:
        model = _load_pretrained(Path(model_cfg.pretrained_dir), vocab_size, impl, dtype)
        return model.to(device)
    cfg = llama_config(model_cfg, vocab_size, impl, pad_token_id, eos_token_id)
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights()   # normal(0, init_std) linears/embeddings, ones for norms, RoPE buffers; ties lm_head
    return model


def _load_pretrained(path: Path, vocab_size: int, impl: str, dtype) -> LlamaForCausalLM:
    from transformers import AutoConfig, LlamaForCausalLM

    if not (path / "config.json").is_file():
        raise MissingDataError(f"model.pretrained_dir {path}: no config.json (a save_pretrained directory is needed)")
    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != "llama":
        raise ConfigError(f"model.pretrained_dir {path}: model_type {cfg.model_type!r}; only 'llama' is supported")
    if cfg.vocab_size < vocab_size:
        raise ConfigError(f"model.pretrained_dir {path}: vocab_size {cfg.vocab_size} < the tokenizer's "
                          f"{vocab_size}; re-tokenize with that model's tokenizer (tokenize.tokenizer_dir)")
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation=impl, dtype=dtype)
    model.config.use_cache = False
    return model


def count_params(model) -> ParamCount:
    """Unique parameters; the embedding part is the input embedding plus an untied LM head.

    >>> # tiny-cpu: vocab 4096 × hidden 64 tied → embedding 262,144
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    emb = model.get_input_embeddings().weight
    embedding = emb.numel()
    head = model.get_output_embeddings()
    if head is not None and head.weight is not emb:
        embedding += head.weight.numel()
    return ParamCount(total=total, embedding=embedding, non_embedding=total - embedding)
