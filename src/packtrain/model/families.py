"""Model families packtrain trains, what each one's attention does, and which backends can honour it.

A family is a transformers `model_type` loaded through `AutoModelForCausalLM`. Packing is only safe when a
document inside a pack sees exactly what it would see alone AND the backend computes the family's own attention
(its sliding window, its logit soft-cap). Every (family, backend) pair is therefore either isolated — tested in
tests/unit/test_family_isolation.py (fp32 CPU, ≤ 1e-5) and tests/gpu/test_family_varlen.py — or refused at
setup with a ConfigError naming the family, the backend and why:

    family        model_type   attention quirks (tiny fixtures: window 4)       sdpa  eager  flex  varlen
    Llama         llama        none                                            yes   yes    yes   yes
    Mistral       mistral      sliding window on every layer                   yes   yes    yes   yes¹
    Qwen2         qwen2        q/k/v bias; sliding layers if use_sliding_window yes   yes    yes   yes¹
    Qwen3         qwen3        q/k RMSNorm, head_dim ≠ hidden/heads; as Qwen2  yes   yes    yes   yes¹
    Gemma2        gemma2       attention + final logit soft-cap, sliding/full   no²   yes³   yes³  no²
                               layers alternating, √h embedding scale
    Gemma3 (text) gemma3_text  sliding layers 5:1, q/k norm, local RoPE base    yes   yes    yes   yes¹
    Phi-3         phi3         fused qkv / gate_up, sliding window if set      yes   yes    yes   yes¹

    ¹ varlen_attn(window_size=(W-1, 0)): needs a torch whose varlen_attn has `window_size` (≥ 2.11).
    ² no soft-cap in torch's SDPA nor in varlen_attn: transformers' sdpa path drops `softcap` silently.
    ³ `final_logit_softcapping` is applied by the packed loss (train/loss.py) and the evaluate loss
      (evaluate/perplexity.py) exactly as the model's own forward does.

How windows are honoured: sdpa/eager — transformers' sliding-window mask combined with the packed-sequence mask
it derives from position_ids (q - kv < W inside a document); flex — a score_mod that keeps q - kv < W (and
applies cap·tanh(s/cap)) on top of the document BlockMask; varlen — FlashAttention's window (W-1 left, 0 right).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packtrain.errors import ConfigError


@dataclass(frozen=True)
class Family:
    model_type: str
    name: str
    example: str          # a released checkpoint of the family (for messages and docs)
    windows_from: str     # "layer_types": sliding layers listed in config.layer_types; "all": config.sliding_window
                          # on every layer when set; "none": the family has no sliding window


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "Llama", "meta-llama/Llama-3.2-1B", "none"),
    Family("mistral", "Mistral", "mistralai/Mistral-7B-v0.1", "all"),
    Family("qwen2", "Qwen2", "Qwen/Qwen2-0.5B", "layer_types"),
    Family("qwen3", "Qwen3", "Qwen/Qwen3-0.6B", "layer_types"),
    Family("gemma2", "Gemma2", "google/gemma-2-2b", "layer_types"),
    Family("gemma3_text", "Gemma3", "google/gemma-3-1b-pt", "layer_types"),
    Family("phi3", "Phi-3", "microsoft/Phi-3-mini-4k-instruct", "all"),
)}
SUPPORTED = tuple(FAMILIES)


@dataclass(frozen=True)
class AttentionSemantics:
    """What a family's attention computes, read from its transformers config."""

    family: str                         # model_type
    windows: tuple[int | None, ...]     # per layer: sliding window W (a token sees itself + W-1 before) or None
    attn_softcap: float | None          # scores → cap·tanh(scores/cap) before the softmax
    final_softcap: float | None         # logits → cap·tanh(logits/cap)
    attention_dropout: float

    @property
    def sliding(self) -> bool:
        return any(w is not None for w in self.windows)

    def describe(self) -> str:
        parts = []
        if self.sliding:
            ws = sorted({w for w in self.windows if w is not None})
            n = sum(w is not None for w in self.windows)
            parts.append(f"sliding window {'/'.join(map(str, ws))} on {n} of {len(self.windows)} layers")
        if self.attn_softcap:
            parts.append(f"attention soft-cap {self.attn_softcap:g}")
        if self.final_softcap:
            parts.append(f"final logit soft-cap {self.final_softcap:g}")
        return ", ".join(parts) or "plain causal attention"


def _get(cfg: Any, key: str, default=None):
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def family_of(cfg: Any, where: str = "model.init_from") -> Family:
    """The Family of a transformers config (object or config.json dict); unknown model types are refused."""
    model_type = _get(cfg, "model_type")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    hint = " (a multimodal Gemma3 checkpoint: save its text model, Gemma3ForCausalLM, whose model_type is " \
           "'gemma3_text')" if model_type == "gemma3" else ""
    raise ConfigError(f"{where}: model_type {model_type!r} is not a family packtrain trains{hint}; supported: "
                      f"{', '.join(SUPPORTED)} — other architectures are refused because their packed-document "
                      "isolation is untested")


def attention_semantics(cfg: Any) -> AttentionSemantics:
    """Per-layer windows and soft-caps of a supported family's config (object or config.json dict).

    >>> attention_semantics({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 4}).windows
    (4, 4)
    """
    fam = family_of(cfg)
    n = int(_get(cfg, "num_hidden_layers"))
    w = _get(cfg, "sliding_window")
    if fam.windows_from == "none" or w is None:
        windows: tuple[int | None, ...] = (None,) * n
    elif fam.windows_from == "all":
        windows = (int(w),) * n
    else:
        types = _get(cfg, "layer_types") or ["full_attention"] * n
        windows = tuple(int(w) if t == "sliding_attention" else None for t in types)
    return AttentionSemantics(
        family=fam.model_type, windows=windows,
        attn_softcap=_get(cfg, "attn_logit_softcapping") or None,
        final_softcap=_get(cfg, "final_logit_softcapping") or None,
        attention_dropout=float(_get(cfg, "attention_dropout", 0.0) or 0.0))


def refusal(sem: AttentionSemantics, backend: str, training: bool) -> str | None:
    """Why `backend` cannot run this family's attention isolated and faithful, or None when it can."""
    from packtrain.model.attention import varlen_supports_window

    if sem.attn_softcap and backend == "sdpa":
        return (f"attention logit soft-capping ({sem.attn_softcap:g}) cannot run on sdpa: torch's "
                "scaled_dot_product_attention has no soft-cap (transformers' sdpa path would drop it); "
                "use eager (or flex on CUDA)")
    if sem.attn_softcap and backend == "varlen":
        return (f"attention logit soft-capping ({sem.attn_softcap:g}) cannot run on varlen: torch's varlen_attn "
                "(FlashAttention varlen) has no soft-cap argument; use flex or eager")
    if sem.sliding and backend == "varlen" and not varlen_supports_window():
        return ("its sliding window cannot run on varlen: this torch's varlen_attn has no window_size argument "
                "(torch ≥ 2.11 has it) and would attend to the whole document; use flex or sdpa")
    if training and sem.attention_dropout > 0 and backend in ("flex", "varlen"):
        return (f"attention_dropout {sem.attention_dropout:g} would be silently skipped by the {backend} "
                "backend; set attention_dropout 0 in the checkpoint's config.json or use sdpa/eager")
    return None


def check_attention(cfg: Any, backend: str, training: bool = True, where: str = "model.init_from",
                    key: str | None = None) -> AttentionSemantics:
    """Raise ConfigError naming family, backend and why when the pair is refused; else the semantics.

    `key` names the setting that chose the backend (default train.attention when training, else
    evaluate.attention)."""
    family_of(cfg, where)   # an unsupported model_type is refused naming the directory
    sem = attention_semantics(cfg)
    why = refusal(sem, backend, training)
    if why:
        fam = FAMILIES[sem.family]
        key = key or ("train.attention" if training else "evaluate.attention")
        ok = [b for b in ("sdpa", "eager", "flex", "varlen") if refusal(sem, b, training) is None]
        raise ConfigError(f"{where}: family {fam.name} ({fam.model_type}) with {key}={backend} is refused: {why} "
                          f"(allowed for {fam.name}: auto, {', '.join(ok)})")
    return sem


AUTO_ORDER = {"cuda": ("varlen", "flex", "sdpa", "eager"), "cpu": ("sdpa", "eager")}
"""What `auto` tries, fastest first (packtrain.model.attention measures them); the first that runs on the device
and that the family allows wins. eager runs everywhere and honours every family, so `auto` always has an answer:
Gemma2 (soft-cap) → flex on CUDA, eager on the CPU; a checkpoint with attention_dropout > 0 trains on sdpa."""


def allowed_backends(cfg: Any, training: bool = True) -> list[str]:
    """The backends that run this family's attention isolated and faithful, whatever the device (availability
    on a device is packtrain.model.attention.available_backends).

    >>> allowed_backends({"model_type": "gemma2", "num_hidden_layers": 2, "attn_logit_softcapping": 50.0})
    ['eager', 'flex']
    """
    from packtrain.model.attention import BACKENDS

    sem = attention_semantics(cfg)
    return [b for b in BACKENDS if refusal(sem, b, training) is None]


def pick_attention(name: str, device: Any, precision: str, cfg: Any | None, training: bool = True,
                   key: str | None = None, where: str = "model.init_from") -> str:
    """The backend a stage runs for the model whose transformers config is `cfg` (object or config.json dict;
    None: a scratch Llama-style model, where every backend is faithful).

    `auto` → the first of AUTO_ORDER[device] that runs here and that the family allows; an explicit name must
    run here (attention.resolve_attention) and be allowed (check_attention), else a ConfigError naming `key`
    (default train.attention when training, else evaluate.attention), the family and the allowed values.

    >>> pick_attention("auto", "cpu", "fp32", {"model_type": "gemma2", "num_hidden_layers": 2,
    ...                                         "attn_logit_softcapping": 50.0}, training=False)
    'eager'
    """
    from packtrain.model.attention import _device_type, available_backends, resolve_attention

    key = key or ("train.attention" if training else "evaluate.attention")
    if cfg is not None and name == "auto":
        family_of(cfg, where)
        sem = attention_semantics(cfg)
        avail = available_backends(device, precision, training)
        for backend in AUTO_ORDER.get(_device_type(device), AUTO_ORDER["cpu"]):
            if backend in avail and refusal(sem, backend, training) is None:
                return backend
    backend = resolve_attention(name, device, precision, training, key=key)
    if cfg is not None:
        check_attention(cfg, backend, training, where, key)
    return backend


def checkpoint_config(path: Any) -> dict | None:
    """config.json of a save_pretrained directory as a dict (no transformers import), or None when `path` is
    None, holds none readable, or names no supported family (the loader then names the problem, as before any
    backend is picked)."""
    import json
    from pathlib import Path

    if path is None:
        return None
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) and cfg.get("model_type") in FAMILIES else None
