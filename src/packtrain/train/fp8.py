"""FP8 training (`train.precision: fp8`): the decoder's linear layers run FP8 matmuls through torchao's float8
training; everything else (attention, norms, embeddings, the LM head, the loss) runs under bf16 autocast.

    check_fp8_support(device)       ConfigError unless `device` is a CUDA GPU with FP8 tensor cores (compute
                                    capability ≥ 8.9: Ada L4/L40S/RTX 4090, Hopper H100/H200, Blackwell) and
                                    torchao imports
    apply_fp8(model, fp8_cfg)       swap the decoder layers' nn.Linear for torchao Float8Linear in place
                                    → the converted module names
    fp8_param_count(model, names)   parameters in those layers: the N_fp8 of MFU's 6·N_fp8 share

How a converted linear computes (torchao 0.18, `Float8LinearConfig.from_recipe_name(train.fp8.recipe)`): the
fp32 master weight and the bf16 input are cast to float8 e4m3 on the fly with a dynamic scale — one per tensor
(tensorwise: amax of the whole tensor) or one per row (rowwise: amax per row, scales rounded to powers of two) —
and `torch._scaled_mm` multiplies them at FP8 tensor-core rate (H200: 1,979 vs 989 TFLOP/s dense, datasheet),
accumulating in fp32 and returning bf16. The backward does the same for grad_input and grad_weight (grad_output
in e4m3 too in both recipes). Parameters, gradients and Adam states stay fp32, so the module tree, the
state_dict keys and `save_pretrained` are exactly those of the bf16 run: checkpoints and model/ do not change.
No loss scaler: FP8's range problem is solved by the per-tensor/per-row scales, and the rest is bf16.

Measured (one H200, torch 2.11, torchao 0.18.0, Llama-3.2-3B shape, 8×2048 packed varlen, the 1b-h200 recipe's
settings; bench/results/fp8_bench_3b.json + fp8_bench_3b.log): bf16 26,252 → tensorwise 29,572 tok/s (1.126×; the
1.25× goal is not met — docs/fp8.md says where the rest goes).

Which linears (torchtitan's float8 converter picks the same set with `filter_fqns=["output"]`): every
`nn.Linear` inside a decoder layer (q/k/v/o, gate/up/down) whose in- and out-features are multiples of 16
(`_scaled_mm` needs 16-aligned dimensions; torchao's own auto filter uses the same rule) — NOT the LM head (its
logits feed the cross-entropy directly: FP8 error there moves the loss, and the fused loss reads its weight
itself; it stays bf16), NOT the embeddings, and NOT LoRA adapters (peft's lora_A/lora_B: r ≤ 64 columns is too
small for FP8 to pay and their fp32 updates are the whole point of the adapter). Under train.adapter=lora the
frozen base linears (peft's `base_layer`) are converted: their forward and input gradient run in FP8 (torchao
also computes the weight gradient autograd then drops, 1/3 of their FP8 work).

Order in train/parts.build_model_parts: model → adapter → **fp8 conversion** → loss wrapper → activation
checkpointing → compile → engine. torchao's docs: convert first, then compile (the compiled layer graph then
contains the float8 casts, which inductor fuses with the amax reductions); activation checkpointing wraps the
layer's forward, so the recompute re-runs the casts; FSDP2's fully_shard comes after, as for bf16.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from packtrain.config.train import Fp8Options

MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.0+). A100 (8.0) and older have none."""
PIP_EXTRA = "pip install 'packtrain[fp8]'   (torchao==0.18.0)"
ALIGN = 16
"""torch._scaled_mm needs both matmul dimensions to be multiples of 16."""


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    """Import torchao (directly, or through peft, which imports it when installed) without its CPU-build noise.

    On a machine without CUDA kernels torchao 0.18 logs "Failed to load …/_C_mxfp8…so" twice and torch warns that
    its KernelPreference enum no longer needs registering: harmless, but three scary stderr lines in every LoRA
    run. Those two loggers are raised to ERROR for the import only; nothing else is silenced."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def check_fp8_support(device: torch.device | str) -> None:
    """Raise ConfigError unless `device` can run FP8 training: CUDA, compute capability ≥ 8.9, torchao present.

    >>> check_fp8_support("cpu")
    Traceback (most recent call last):
    ...
    packtrain.errors.ConfigError: train.precision=fp8 needs an NVIDIA GPU with FP8 tensor cores (compute capability ≥ 8.9: ...
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(
            f"train.precision=fp8 needs an NVIDIA GPU with FP8 tensor cores (compute capability ≥ 8.9: Ada L4/L40S, "
            f"Hopper H100/H200, Blackwell), but this run's device is {dev.type} "
            f"({'no CUDA device is available' if not torch.cuda.is_available() else 'train.device=cpu'}): "
            "use train.precision=bf16 here")
    major, minor = torch.cuda.get_device_capability(dev)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(dev)
        raise ConfigError(
            f"train.precision=fp8 needs compute capability ≥ {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (FP8 tensor "
            f"cores: Ada, Hopper, Blackwell), but {dev} ({name}) has {major}.{minor}: use train.precision=bf16 "
            "on this GPU")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"train.precision=fp8 trains through torchao's float8 training, which is not installed: "
                          f"{PIP_EXTRA}; or use train.precision=bf16")


def _decoder_prefixes(model: Any) -> list[str]:
    """The fqn prefixes ('model.layers.3.') of the decoder layers of `model` (techniques.decoder_layers)."""
    from packtrain.train.techniques import decoder_layers

    ids = {id(layer) for layer in decoder_layers(model)}
    return [f"{name}." for name, mod in model.named_modules() if id(mod) in ids]


def fp8_linear_filter(model: Any):
    """The `module_filter_fn(module, fqn) -> bool` of `apply_fp8`: a 16-aligned nn.Linear inside a decoder
    layer, not a LoRA adapter, not already converted (module doc)."""
    import torch

    prefixes = tuple(_decoder_prefixes(model))

    def keep(mod: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Float8Linear":
            return False
        if not fqn.startswith(prefixes):          # lm_head, embeddings, anything outside the decoder layers
            return False
        if any(part.startswith("lora_") for part in fqn.split(".")):   # peft's lora_A / lora_B / lora_dropout
            return False
        return mod.in_features % ALIGN == 0 and mod.out_features % ALIGN == 0

    return keep


def apply_fp8(model: Any, fp8_cfg: Fp8Options) -> list[str]:
    """Swap the decoder layers' linears for FP8 ones in place — frozen ones (LoRA's base, train.fp8.lora_base=static)
    for fp8_frozen.Fp8FrozenLinear, the rest for torchao `Float8Linear` (`convert_to_float8_training` with
    `Float8LinearConfig.from_recipe_name(fp8_cfg.recipe)`); returns the converted names, in module order.

    `fp8_cfg.mix_order_reduction` false turns inductor's mix-order reductions off for the process.
    Not converted: lm_head, embeddings, linears whose in/out features are not multiples of 16, LoRA adapters
    (module doc says why). Weights keep their dtype, Parameter objects and names (state_dict unchanged).
    A Llama with hidden 64, intermediate 88 (not 16-aligned), 2 layers → the 8 attention projections only:

        ['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj', 'model.layers.0.self_attn.v_proj',
         'model.layers.0.self_attn.o_proj', 'model.layers.1.self_attn.q_proj', ..., 'model.layers.1.self_attn.o_proj']
    """
    try:
        with quiet_torchao_import():
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise ConfigError(f"train.precision=fp8 needs torchao's float8 training ({e}): {PIP_EXTRA}; "
                          "or use train.precision=bf16") from None
    keep = fp8_linear_filter(model)
    frozen: list[str] = []
    if fp8_cfg.lora_base == "static" and any(p.requires_grad for p in model.parameters()):
        # LoRA (or any frozen base): the frozen linears get static e4m3 weights (train/fp8_frozen.py); linears
        # that still train (none under LoRA: the adapters are filtered out) go through torchao below
        from packtrain.train.fp8_frozen import apply_fp8_frozen_base

        frozen = apply_fp8_frozen_base(model, keep)
    names: list[str] = list(frozen)

    def record(mod, fqn: str) -> bool:
        ok = keep(mod, fqn)
        if ok:
            names.append(fqn)
        return ok

    convert_to_float8_training(model, module_filter_fn=record,
                               config=Float8LinearConfig.from_recipe_name(fp8_cfg.recipe))
    if not fp8_cfg.mix_order_reduction:   # read when the model compiles, later in this (training) process
        import torch._inductor.config as inductor_config

        inductor_config.triton.mix_order_reduction = False
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(names, key=lambda n: order.get(n, len(order)))   # torchao visits children before parents


def fp8_param_count(model: Any, names: list[str]) -> int:
    """Parameters (weights + biases) of the converted linears: N_fp8 in the 6·N_fp8 FLOPs per token that run
    at the FP8 peak (telemetry.mfu.time_weighted_peak). Llama-3B shape (h 3072, i 8192, 24/8 heads, 28 layers):
    28 · (2·3072² + 2·3072·1024 + 3·3072·8192) = 2,818,572,288."""
    total = 0
    for name in names:
        mod = model.get_submodule(name)
        weight = mod.weight_fp8 if hasattr(mod, "weight_fp8") else mod.weight      # fp8_frozen.Fp8FrozenLinear
        total += weight.numel() + (mod.bias.numel() if getattr(mod, "bias", None) is not None else 0)
    return total
