"""LoRA adapters through peft: `apply_adapter(model, cfg)` freezes the base and injects trainable A/B matrices.

    y = W·x + (alpha / r)·B·(A·dropout(x))      W (out × in) frozen; A (r × in) ~ kaiming, B (out × r) = 0

peft's `get_peft_model` replaces each target `nn.Linear` of the transformers model *in place* by a LoRA layer
and wraps the model in a `PeftModelForCausalLM`. packtrain never calls that wrapper's forward: the loss wrapper
(train.loss.PackedCausalLM), evaluation and the attention backends talk to `base_of(peft_model)` — the same
transformers model object, now holding LoRA layers — so `position_ids`, `cu_seq_lens_q`/`max_length_q`
(varlen) and the flex BlockMask reach the decoder exactly as without an adapter, and every isolated backend
(sdpa, eager, flex, varlen) works unchanged. Decoder layers stay at `model.model.layers`, so activation
checkpointing and per-layer `torch.compile` wrap the LoRA layers too (order: adapter → AC → compile).

Parameters (Σ over target linears of r·(in + out)); `all-linear` = q, k, v, o, gate, up, down of every layer:

    tiny-cpu (h 64, ffn 176, 2 layers, r 16)         2 · 16 · (4·128 + 3·240) = 39,424 of 0.33M
    Llama-3-8B (h 4096, kv 1024, ffn 14336, 32 layers, r 16)                     41.9M of 8.03B (0.52%)

`base_dtype` (bf16/fp16 training): the frozen base is cast to that dtype (2 B/param, no fp32 master copy —
nothing updates it), the adapter stays fp32 (peft's autocast_adapter_dtype) so AdamW updates it exactly.
Under autocast the base linears compute in bf16 either way; the residual stream follows the embedding's dtype.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError
from packtrain.model.saving import save_pretrained

if TYPE_CHECKING:
    import torch

    from packtrain.config.train import AdapterConfig

ADAPTER_META = "packtrain_adapter.json"
"""model/<this file>: {"format", "base", "init_from", "merged", "adapter", "loss_on"} beside peft's
adapter_config.json + adapter_model.safetensors (see `save_adapter_model`)."""


def is_adapted(model: Any) -> bool:
    """True for a peft-wrapped model (what `apply_adapter` returns for type lora)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_of(model: Any) -> Any:
    """The transformers CausalLM to call (LoRA layers injected in place), for a peft model or a plain one.

    >>> # base_of(apply_adapter(lm, lora_cfg)) is lm  → True (peft injects into the same object)
    """
    return model.get_base_model() if is_adapted(model) else model


def lora_config(cfg: AdapterConfig):
    """peft LoraConfig for a packtrain AdapterConfig (bias none: only A and B train)."""
    from packtrain.train.fp8 import quiet_torchao_import

    with quiet_torchao_import():   # peft imports torchao when it is installed (the fp8 extra)
        from peft import LoraConfig

    targets = cfg.target_modules if cfg.target_modules == "all-linear" else list(cfg.target_modules)
    return LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                      bias="none", task_type="CAUSAL_LM")


def apply_adapter(model: Any, cfg: AdapterConfig, *, base_dtype: torch.dtype | None = None) -> Any:
    """Freeze `model` and add a LoRA adapter (cfg.type lora) → a `PeftModelForCausalLM`; type none → `model`.

    in: a transformers CausalLM (fp32 parameters, any supported family, any packtrain attention backend);
    out: the peft model; `base_of(out) is model`, the base parameters have requires_grad False, the adapter
    (lora_A/lora_B, fp32) True. `base_dtype` casts the frozen base (not the adapter) to that dtype.
    A `target_modules` list that matches no linear of the model is a ConfigError naming the field.
    """
    if cfg.type == "none":
        return model
    if cfg.type != "lora":
        raise ConfigError(f"train.adapter.type: {cfg.type!r} (allowed: none, lora)")
    from peft import get_peft_model

    if base_dtype is not None:
        model.to(base_dtype)   # frozen: no master copy needed; the adapter is created below in fp32
    try:
        peft_model = get_peft_model(model, lora_config(cfg), autocast_adapter_dtype=True)
    except ValueError as e:   # "Target modules {...} not found in the base model"
        raise ConfigError(f"train.adapter.target_modules: {cfg.target_modules!r} — {str(e).splitlines()[0][:300]}"
                          ) from None
    return peft_model


def lora_layers(peft_model: Any) -> list:
    """The peft LoRA layers of a model (each wraps one base linear)."""
    return [m for m in peft_model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


@contextlib.contextmanager
def adapter_input_casts(layers: list, enabled: bool) -> Iterator[None]:
    """peft's cast of each LoRA branch's input to the adapter's dtype (fp32) on or off inside the block; the
    previous settings come back on exit.

    Training under bf16/fp16 autocast turns it off for the whole run (`train.parts`): peft casts x to fp32 in
    every branch and autocast casts it straight back to bf16 for the matmul, so each branch keeps its own 16-bit
    copy of its input for backward where one shared tensor would do (q, k, v share one input, gate and up
    another): on a Llama-3-8B layer that is about 15% of what autograd keeps (bench/results/lora_budget_8b.json,
    measured on the CPU in eager mode). The bf16 → fp32 → bf16 round trip is exact, so the loss and every
    gradient are bitwise unchanged (tests/unit/test_lora_adapter.py; adapter dropout 0 — with dropout each branch
    draws its own mask on its own copy anyway). Off for the whole run, not per forward, because activation
    checkpointing re-runs the forward during backward and must save the same tensors. A forward without
    autocast (the in-training evaluation in fp32) needs it on: a 16-bit input would meet the fp32 adapter."""
    before = [getattr(m, "cast_input_dtype_enabled", True) for m in layers]
    set_adapter_input_casts(layers, enabled)
    try:
        yield
    finally:
        for m, b in zip(layers, before, strict=True):
            m.cast_input_dtype_enabled = b


def set_adapter_input_casts(layers: list, enabled: bool) -> None:
    """peft's per-branch input cast on or off for good (`adapter_input_casts` says when off is right)."""
    for m in layers:
        m.cast_input_dtype_enabled = enabled


def adapter_param_count(model: Any) -> int:
    """Trainable parameters of a model (the adapter's A and B for a LoRA model)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def trainable_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """{name: tensor} of the trainable parameters only (names as in `model.named_parameters()`): what an
    adapter checkpoint holds. For the tiny-cpu LoRA (r 16): 28 tensors (2 layers × 7 linears × A, B), 39,424 values."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def save_adapter_model(peft_model: Any, out: Path, *, init_from: str, base_dir: Path | None,
                       loss_on: str = "all", merged: bool = False) -> dict:
    """Write the adapter (peft `save_pretrained`: adapter_config.json + adapter_model.safetensors) into `out`,
    the base when it has no directory of its own (`base_dir` None: a scratch base → out/base/), a merged
    plain model when asked (out/merged/: base + (alpha/r)·B·A in fp32, loads with AutoModelForCausalLM alone),
    and `packtrain_adapter.json` naming them. Returns that JSON. The live model is changed by the merge
    (call it last)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    lm = base_of(peft_model)
    impl = lm.config._attn_implementation
    lm.config._attn_implementation = "sdpa"   # plain transformers must load the configs without our registry
    try:
        if base_dir is None:   # scratch base: its frozen weights exist only here
            save_pretrained(lm, out / "base", state_dict=_base_state_dict(peft_model), safe_serialization=True)
            base_ref = "base"
        else:
            base_ref = str(Path(base_dir).resolve())
        # peft's own pointer: the base directory (absolute), or "base" for a scratch base — relative to the model
        # directory, since `out` is a temp name renamed into place afterwards (load_adapter_model resolves it)
        peft_model.peft_config["default"].base_model_name_or_path = base_ref
        peft_model.save_pretrained(out, safe_serialization=True)
        meta = {"format": "packtrain.adapter", "version": 1, "base": base_ref, "init_from": init_from,
                "merged": "merged" if merged else None, "loss_on": loss_on,
                "adapter": _adapter_summary(peft_model)}
        if merged:
            peft_model.to(torch.float32)
            plain = peft_model.merge_and_unload()
            save_pretrained(plain, out / "merged", safe_serialization=True)
    finally:
        lm.config._attn_implementation = impl
    (out / ADAPTER_META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _adapter_summary(peft_model: Any) -> dict:
    c = peft_model.peft_config["default"]
    targets = c.target_modules if isinstance(c.target_modules, str) else sorted(c.target_modules)
    return {"type": "lora", "r": c.r, "alpha": c.lora_alpha, "dropout": c.lora_dropout,
            "target_modules": targets, "trainable_params": adapter_param_count(peft_model)}


def _base_state_dict(peft_model: Any) -> dict:
    """The base model's own state_dict keys (LoRA layers' `base_layer.` unwrapped, lora_* dropped)."""
    sd = {}
    for k, v in base_of(peft_model).state_dict().items():
        if "lora_" in k:
            continue
        sd[k.replace(".base_layer.", ".")] = v
    return sd


def read_adapter_meta(model_dir: Path) -> dict | None:
    """packtrain_adapter.json of a model directory, or None when it is a plain (full) model."""
    p = Path(model_dir) / ADAPTER_META
    if not p.is_file():
        return None
    return json.loads(p.read_text())


def adapter_base_dir(model_dir: Path, meta: dict) -> Path:
    """Where the adapter's base weights are: model_dir/base (scratch base) or the directory it was trained on."""
    base = Path(meta["base"])
    return base if base.is_absolute() else Path(model_dir) / base


def load_adapter_model(model_dir: Path, attention: str = "sdpa", dtype: Any = None, merge: bool = True) -> Any:
    """Base (fp32, packtrain backend `attention`) + the adapter in `model_dir` → the merged transformers model
    (merge True: what evaluation runs — same function as the adapter, one matmul per linear) or the peft model."""
    import torch
    from transformers import AutoModelForCausalLM

    from packtrain.train.fp8 import quiet_torchao_import

    with quiet_torchao_import():   # the first peft import of an evaluate/register process
        from peft import PeftModel

    from packtrain.model.attention import HF_NAMES, register_attention_backends

    register_attention_backends()
    model_dir = Path(model_dir)
    meta = read_adapter_meta(model_dir)
    if meta is None:
        raise ConfigError(f"{model_dir} holds no {ADAPTER_META}: not a packtrain adapter directory")
    base_dir = adapter_base_dir(model_dir, meta)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), attn_implementation=HF_NAMES[attention],
                                                dtype=dtype or torch.float32)
    base.config.use_cache = False
    model = PeftModel.from_pretrained(base, str(model_dir), is_trainable=False)
    return model.merge_and_unload() if merge else model
