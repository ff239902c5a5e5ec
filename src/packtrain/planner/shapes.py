"""Model shape and exact parameter count of the model the train stage builds, for every supported family.

`ModelShape` is what the memory arithmetic needs (no torch). Its parameter count equals
`sum(p.numel() for p in model.parameters())` for the same sizes (tested for every family):

    per layer   q, o: h·h_q each (h_q = heads·head_dim); k, v: h·h_kv each (h_kv = kv_heads·head_dim);
                gate, up, down: h·I each (Phi-3 fuses qkv and gate_up: same counts);
                RMSNorm weights: h each, 2 per layer (Gemma2/3: 4, around attention and MLP)
                + q/k/v biases h_q + 2·h_kv (Qwen2; attention_bias elsewhere also o: + h)
                + q/k RMSNorm: 2·head_dim (Qwen3, Gemma3)
    model       L · per layer + final norm h + embedding V·h (+ V·h again for an untied LM head)

A scratch model's shape comes from `ModelConfig`'s sizes; a checkpoint's (`model.init_from=<dir>`) from its
config through transformers' AutoConfig, which fills the family's defaults that config.json leaves out (e.g. a
Llama config without tie_word_embeddings is untied, a Gemma one tied). Real shapes:

    model              h     L   heads kv  head_dim  I      V        tied  params
    Qwen2-0.5B         896   24  14    2   64        4864   151936   yes   494,032,768
    Qwen2-1.5B         1536  28  12    2   128       8960   151936   yes   1,543,714,304

    recipe       h     L   heads  I      V       params      non-embedding
    tiny-cpu     64    2   4      176    4096    362,816     100,672
    350m-h200    1024  24  16     2816   32768   341,885,952 308,331,520
    1b-h200      2048  16  16     5632   32768   889,260,032 822,151,168
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError

if TYPE_CHECKING:
    from packtrain.config import ModelConfig, PlanConfig


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder. `head_dim` = hidden / heads unless the checkpoint says otherwise."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    family: str = "llama"
    layer_norms: int = 2          # RMSNorm weight vectors of width h per layer
    qkv_bias: bool = False        # biases on q, k, v
    o_bias: bool = False          # bias on the output projection
    qk_norm: bool = False         # RMSNorm over q and k (head_dim each)
    windows: tuple[int | None, ...] = ()   # per layer sliding window (None: full causal); () = all full
    max_positions: int | None = None       # the checkpoint's max_position_embeddings

    @property
    def kv_hidden(self) -> int:
        """h_kv = kv_heads · head_dim: width of the k and v projections."""
        return self.kv_heads * self.head_dim

    @property
    def q_hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def layer_linear_params(self) -> int:
        """Weights of the 7 projections of one layer (what autocast casts to bf16)."""
        h = self.hidden
        return 2 * h * self.q_hidden + 2 * h * self.kv_hidden + 3 * h * self.intermediate

    @property
    def layer_params(self) -> int:
        return (self.layer_linear_params + self.layer_norms * self.hidden
                + (self.q_hidden + 2 * self.kv_hidden if self.qkv_bias else 0) + (self.hidden if self.o_bias else 0)
                + (2 * self.head_dim if self.qk_norm else 0))

    @property
    def embedding_params(self) -> int:
        """Input embedding (+ the LM head when untied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def n_params(self) -> int:
        return self.layers * self.layer_params + self.hidden + self.embedding_params

    @property
    def n_params_nonembed(self) -> int:
        return self.n_params - self.embedding_params

    @property
    def linear_params(self) -> int:
        """All matmul weights including the LM head (tied or not): what bf16 autocast keeps a copy of."""
        return self.layers * self.layer_linear_params + self.vocab * self.hidden

    def to_dict(self) -> dict:
        return {**asdict(self), "n_params": self.n_params, "n_params_nonembed": self.n_params_nonembed}


def shape_of_config(cfg: Any) -> ModelShape:
    """The ModelShape of a transformers config object of a supported family (packtrain.model.families). The
    vocabulary is the checkpoint's (a token store's may be smaller; the embedding keeps all its rows)."""
    from packtrain.model.families import attention_semantics, family_of

    fam = family_of(cfg).model_type
    heads = int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    # attention_bias switches on q/k/v/o biases where the family reads it (Mistral and Phi-3 ignore it)
    bias = bool(getattr(cfg, "attention_bias", False)) and fam in ("llama", "qwen3", "gemma2", "gemma3_text")
    return ModelShape(
        hidden=hidden,
        intermediate=int(cfg.intermediate_size),
        layers=int(cfg.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
        vocab=int(cfg.vocab_size),
        tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        family=fam,
        layer_norms=4 if fam in ("gemma2", "gemma3_text") else 2,
        qkv_bias=fam == "qwen2" or bias,
        o_bias=bias and fam != "qwen2",
        qk_norm=fam in ("qwen3", "gemma3_text"),
        windows=attention_semantics(cfg).windows,
        max_positions=int(getattr(cfg, "max_position_embeddings", 0) or 0) or None,
    )


def model_shape(model_cfg: ModelConfig, plan_cfg: PlanConfig | None = None, vocab_size: int | None = None
                ) -> ModelShape:
    """The shape of the model `model_cfg` describes (or of the checkpoint `model.init_from` names).

    Vocabulary: the checkpoint's, else the `vocab_size` argument, else `plan_cfg.vocab_size`.
    """
    from packtrain.model.init_from import resolve_init_source

    source = resolve_init_source(model_cfg)
    if source is not None:
        return checkpoint_shape(source)
    vocab = vocab_size or (plan_cfg.vocab_size if plan_cfg is not None else None)
    if not vocab:
        raise ConfigError("plan.vocab_size: unknown vocabulary size; pass vocab_size= (the tokenizer's, "
                          "tokenize.vocab_size) or set --set plan.vocab_size=N")
    return ModelShape(
        hidden=model_cfg.hidden_size,
        intermediate=model_cfg.intermediate_size,
        layers=model_cfg.num_layers,
        heads=model_cfg.num_heads,
        kv_heads=model_cfg.num_kv_heads or model_cfg.num_heads,
        head_dim=model_cfg.hidden_size // model_cfg.num_heads,
        vocab=int(vocab),
        tied=model_cfg.tie_word_embeddings,
    )


def checkpoint_shape(path: Path) -> ModelShape:
    """The shape of a save_pretrained directory (its config.json read by transformers' AutoConfig)."""
    from packtrain.model.build import read_checkpoint_config

    return shape_of_config(read_checkpoint_config(Path(path)))
