"""Build the model: a Llama-style random init from `ModelConfig` (never materialized twice), or any supported
family's checkpoint (`model.init_from=<dir>`, loaded through AutoModelForCausalLM; packtrain.model.families).

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

from packtrain.errors import ConfigError, InputDataError
from packtrain.model.attention import HF_NAMES, register_attention_backends

if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig, PreTrainedModel

    from packtrain.config import ModelConfig


@dataclass
class ParamCount:
    total: int          # unique parameters (tied embedding counted once)
    embedding: int      # input embedding (+ LM head when untied)
    non_embedding: int  # total - embedding: the N of 6·N FLOPs per token
    trainable: int | None = None   # parameters with gradients when fewer than total (LoRA: the adapter only)

    def to_dict(self) -> dict:
        return asdict(self)


def llama_config(model_cfg: ModelConfig, vocab_size: int, attn_implementation: str = "sdpa",
                 pad_token_id: int | None = None, eos_token_id: int | None = None) -> LlamaConfig:
    """The transformers LlamaConfig for a ModelConfig (use_cache False: training on packed batches); RoPE θ and
    scaling go into `rope_parameters` (packtrain.model.rope)."""
    from transformers import LlamaConfig

    from packtrain.model.rope import rope_parameters

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
        rope_parameters=rope_parameters(model_cfg),   # θ + model.rope_scaling (packtrain.model.rope)
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
                eos_token_id: int | None = None, training: bool = True) -> PreTrainedModel:
    """A causal LM on `device` in `dtype` (default fp32: the master weights under AMP) whose attention is the
    packtrain backend `attention` (sdpa | eager | flex | varlen, already resolved from 'auto').

    `model.init_from` scratch → a LlamaForCausalLM by random init (meta device + to_empty + init_weights; the
    caller seeds torch first for reproducible weights); a directory → `load_pretrained` (any supported family,
    packtrain.model.families). `training=False` builds for a forward only (evaluation, isolation checks), where
    a family whose final logit soft-cap the packed loss cannot apply is allowed.
    """
    import torch
    from transformers import LlamaForCausalLM

    from packtrain.model.init_from import resolve_init_source

    register_attention_backends()
    if attention not in HF_NAMES:
        raise ConfigError(f"train.attention: {attention!r} is not a backend (allowed: {', '.join(HF_NAMES)})")
    impl = HF_NAMES[attention]
    dtype = dtype or torch.float32
    if training:
        from packtrain.model.rope import warn_dynamic_in_training

        warn_dynamic_in_training(model_cfg)
    source = resolve_init_source(model_cfg)
    if source is not None:
        return load_pretrained(source, vocab_size, attention, device, dtype, training, model_cfg=model_cfg)
    cfg = llama_config(model_cfg, vocab_size, impl, pad_token_id, eos_token_id)
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights()   # normal(0, init_std) linears/embeddings, ones for norms, RoPE buffers; ties lm_head
    return model


def read_checkpoint_config(path: Path):
    """The transformers config of a save_pretrained directory; an architecture transformers does not know (or
    an unreadable config.json) is a ConfigError naming the directory."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except (ValueError, KeyError, OSError) as e:   # unknown model_type: ValueError; bad JSON: OSError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"model.init_from {path}: config.json cannot be read by transformers "
                          f"{_transformers_version()}: {first[:300]}") from None


def load_pretrained(path: Path, vocab_size: int, attention: str = "sdpa", device: Any = "cpu", dtype=None,
                    training: bool = True, model_cfg: ModelConfig | None = None) -> PreTrainedModel:
    """AutoModelForCausalLM.from_pretrained(path) with packtrain's backend, use_cache off, in `dtype` (fp32
    default), after refusing what cannot be trained faithfully: an unsupported family, a (family, backend) pair
    that is not isolated or drops the family's attention semantics (families.check_attention), or a vocabulary
    smaller than the token store's. `model_cfg`'s explicit rope_theta / rope_scaling replace the checkpoint's
    (packtrain.model.rope.override_rope, said on stderr)."""
    import torch
    from transformers import AutoModelForCausalLM

    from packtrain.model.families import check_attention

    register_attention_backends()
    path = Path(path)
    cfg = read_checkpoint_config(path)
    check_attention(cfg, attention, training, where=f"model.init_from {path}")
    if cfg.vocab_size < vocab_size:
        raise ConfigError(f"model.init_from {path}: vocab_size {cfg.vocab_size} < the tokenizer's "
                          f"{vocab_size}; re-tokenize with that model's tokenizer (tokenize.tokenizer_dir)")
    extra = {}
    if model_cfg is not None:
        from packtrain.model.rope import override_rope

        if override_rope(cfg, model_cfg, where=f"model.init_from {path}"):
            extra["config"] = cfg   # the changed config; otherwise from_pretrained reads config.json itself
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation=HF_NAMES[attention],
                                                     dtype=dtype or torch.float32, **extra)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise InputDataError(f"model.init_from {path}: cannot be loaded: {str(e).strip()[:400]}") from None
    model.config.use_cache = False
    return model.to(device)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


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
