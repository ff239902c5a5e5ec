"""RoPE settings: `model.rope_theta` and `model.rope_scaling` → transformers' `config.rope_parameters`.

transformers 5.x keeps every rotary setting in one dict, `config.rope_parameters` (5.17 on the GPU machine and
5.24 here read the same keys); the rotary module computes `inv_freq` (and an attention scaling of cos/sin) from
it with `ROPE_INIT_FUNCTIONS[rope_type]`. packtrain's `RopeScaling.type` names are transformers' rope_type names:

    model.rope_scaling                         rope_parameters (head_dim d, θ = model.rope_theta)
    None                                       {"rope_type": "default", "rope_theta": θ}      inv_freq_i = θ^(-2i/d)
    {type: linear, factor: 4}                  {"rope_type": "linear", "factor": 4, ...}     inv_freq / 4
    {type: dynamic, factor: 4}                 {"rope_type": "dynamic", "factor": 4, ...}    θ grows once a position id
                                                                                             ≥ max_position_embeddings
    {type: yarn, factor: 4, original: 8192}    {"rope_type": "yarn", "factor": 4,            per-frequency blend +
                                                "original_max_position_embeddings": 8192}     cos/sin × 0.1·ln 4 + 1
    {type: llama3, factor: 8, original: 8192,  {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
     low_freq_factor: 1, high_freq_factor: 4}   "high_freq_factor": 4, "original_max_position_embeddings": 8192}

`original_max_position_embeddings` None → the checkpoint's own value when it has one, else the model's
max_position_embeddings. Scratch models always take both settings (rope_theta None → 10,000). A checkpoint
(`model.init_from=<dir>`) keeps its own rotary settings unless the recipe sets them: `rope_theta` when it is not
None, `rope_scaling` when it is not None. (Not "when the field was set": a config is written out in full and read
back whenever it crosses a process — --gpus ranks, pipeline pods — and every field is "set" after that.) Each change is said
on stderr. Families whose rope_parameters are per layer type (Gemma3: a local θ for sliding layers) get the
change on their full-attention layers only: a sliding layer never sees more than its window.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packtrain.config import ModelConfig

DEFAULT_THETA = 10000.0
"""θ of a scratch model when model.rope_theta is None (Llama-2's; Llama-3 recipes set 500,000)."""
SCALING_KEYS = ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate",
                "short_factor", "long_factor")


def scaling_parameters(model_cfg: ModelConfig, max_positions: int, original: int | None = None) -> dict:
    """The scaling part of rope_parameters for model.rope_scaling ({"rope_type": "default"} when None).

    >>> from packtrain.config import ModelConfig
    >>> scaling_parameters(ModelConfig(rope_scaling={"type": "yarn", "factor": 4.0}), 32768)
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32768}
    """
    rs = model_cfg.rope_scaling
    if rs is None:
        return {"rope_type": "default"}
    out: dict[str, Any] = {"rope_type": rs.type, "factor": float(rs.factor)}
    if rs.type in ("yarn", "llama3"):
        out["original_max_position_embeddings"] = int(rs.original_max_position_embeddings or original
                                                      or max_positions)
    if rs.type == "llama3":
        out.update(low_freq_factor=float(rs.low_freq_factor), high_freq_factor=float(rs.high_freq_factor))
    return out


def rope_parameters(model_cfg: ModelConfig) -> dict:
    """rope_parameters of a scratch model: θ + scaling.

    >>> from packtrain.config import ModelConfig
    >>> rope_parameters(ModelConfig(rope_theta=500000.0))
    {'rope_type': 'default', 'rope_theta': 500000.0}
    """
    return {"rope_type": "default", "rope_theta": float(model_cfg.rope_theta or DEFAULT_THETA),
            **scaling_parameters(model_cfg, model_cfg.max_position_embeddings)}


def _is_nested(rp: dict) -> bool:
    """Per-layer-type rope_parameters ({"full_attention": {...}, "sliding_attention": {...}})."""
    return bool(rp) and all(isinstance(v, dict) or v is None for v in rp.values())


def _override_entry(entry: dict, model_cfg: ModelConfig, max_positions: int, set_theta: bool) -> dict:
    new = dict(entry)
    if set_theta and model_cfg.rope_theta is not None:
        new["rope_theta"] = float(model_cfg.rope_theta)
    if model_cfg.rope_scaling is not None:
        original = entry.get("original_max_position_embeddings")
        for key in SCALING_KEYS:
            new.pop(key, None)
        new.pop("type", None)
        new.update(scaling_parameters(model_cfg, max_positions, original))
    return new


def override_rope(hf_cfg: Any, model_cfg: ModelConfig, where: str = "model.init_from") -> list[str]:
    """Apply the recipe's explicit rope settings to a checkpoint's transformers config in place; returns one
    line per change (also printed on stderr). Nothing explicit → nothing changes.

    rope_theta and rope_scaling count as explicit when they are not None.
    """
    set_theta = model_cfg.rope_theta is not None
    if not set_theta and model_cfg.rope_scaling is None:
        return []
    rp = getattr(hf_cfg, "rope_parameters", None)
    if rp is None:   # a config without the dict (never in transformers 5): build it from the legacy attributes
        rp = {"rope_type": "default", "rope_theta": float(getattr(hf_cfg, "rope_theta", 10000.0))}
    rp = {k: (dict(v) if isinstance(v, dict) else v) for k, v in dict(rp).items()}
    max_positions = int(getattr(hf_cfg, "max_position_embeddings", 0) or model_cfg.max_position_embeddings)
    if _is_nested(rp):
        keys = [k for k in rp if k == "full_attention" and rp[k] is not None] or [k for k in rp if rp[k]]
    else:
        keys = [None]
    changes = []
    for key in keys:
        old = rp[key] if key else rp
        new = _override_entry(old, model_cfg, max_positions, set_theta)
        if new != old:
            label = f"rope_parameters[{key!r}]" if key else "rope_parameters"
            changes.append(f"{where}: {label} {_short(old)} → {_short(new)} (model.rope_theta/rope_scaling)")
        if key:
            rp[key] = new
        else:
            rp = new
    hf_cfg.rope_parameters = rp
    for line in changes:
        print(f"[packtrain] {line}", file=sys.stderr, flush=True)
    return changes


def warn_dynamic_in_training(model_cfg: ModelConfig) -> str | None:
    """dynamic NTK recomputes θ from the largest position id of the whole micro-batch (transformers'
    dynamic_rope_update): in a packed batch a document's frequencies then depend on its neighbours once any
    position reaches max_position_embeddings. Said on stderr when training with it; returns the line."""
    rs = model_cfg.rope_scaling
    if rs is None or rs.type != "dynamic":
        return None
    line = ("[packtrain] model.rope_scaling.type=dynamic: θ follows the micro-batch's largest position id once it "
            f"reaches max_position_embeddings ({model_cfg.max_position_embeddings}); keep pack.budget ≤ it with "
            "chunk_positions=restart (then dynamic is inert in training), or use linear/yarn (docs/long-context.md)")
    print(line, file=sys.stderr, flush=True)
    return line


def _short(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {v}" for k, v in d.items()) + "}"


def rotary_state(model, layer_type: str | None = None) -> tuple[Any, float]:
    """(inv_freq, attention_scaling) of a transformers causal LM's rotary embedding (for checks and tests);
    `layer_type` picks one of a per-layer-type rotary module's buffers (Gemma3: "full_attention")."""
    rot = getattr(model.base_model, "rotary_emb", None)
    if rot is None:
        raise ValueError(f"{type(model).__name__} has no base_model.rotary_emb")
    if layer_type is None:
        return rot.inv_freq, float(getattr(rot, "attention_scaling", 1.0))
    scaling = getattr(rot, "attention_scaling", 1.0)
    scaling = scaling[layer_type] if isinstance(scaling, dict) else getattr(rot, f"{layer_type}_attention_scaling",
                                                                            scaling)
    return getattr(rot, f"{layer_type}_inv_freq"), float(scaling)
