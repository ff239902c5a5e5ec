"""Model shape and exact parameter count of the Llama-style model the train stage builds.

`ModelShape` is what the memory arithmetic needs (no torch, no transformers). Its parameter count equals
`sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())` for the same sizes (tested on the meta device):

    per layer   q, o: h·h each; k, v: h·h_kv each (h_kv = kv_heads·head_dim); gate, up, down: h·I each;
                two RMSNorm weights: h each
    model       L · per layer + final norm h + embedding V·h (+ V·h again for an untied LM head)

    recipe       h     L   heads  I      V       params      non-embedding
    tiny-cpu     64    2   4      176    4096    362,816     100,672
    350m-h200    1024  24  16     2816   32768   341,885,952 308,331,520
    1b-h200      2048  16  16     5632   32768   889,260,032 822,151,168
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import ConfigError, MissingDataError

if TYPE_CHECKING:
    from packtrain.config import ModelConfig, PlanConfig


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a Llama decoder. `head_dim` = hidden / heads unless the checkpoint says otherwise."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

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
        return self.layer_linear_params + 2 * self.hidden

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


def model_shape(model_cfg: ModelConfig, plan_cfg: PlanConfig | None = None, vocab_size: int | None = None
                ) -> ModelShape:
    """The shape of the model `model_cfg` describes (or of `model_cfg.pretrained_dir`'s config.json).

    Vocabulary: the pretrained config's, else the `vocab_size` argument, else `plan_cfg.vocab_size`.
    """
    if model_cfg.pretrained_dir:
        return _pretrained_shape(Path(model_cfg.pretrained_dir))
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


def _pretrained_shape(path: Path) -> ModelShape:
    cfg_path = path / "config.json"
    try:
        c = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingDataError(f"model.pretrained_dir {path}: no config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{cfg_path}: not valid JSON: {e}") from None
    try:
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        return ModelShape(
            hidden=hidden,
            intermediate=int(c["intermediate_size"]),
            layers=int(c["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            vocab=int(c["vocab_size"]),
            tied=bool(c.get("tie_word_embeddings", True)),
        )
    except KeyError as e:
        raise ConfigError(f"{cfg_path}: missing key {e.args[0]!r} (a Llama config.json is needed)") from None
