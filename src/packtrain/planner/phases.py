"""What one training step holds at each of its five moments; `plan.plan_memory` sums them and takes the largest.

    step_precision(train_cfg)                         dtypes of weights, activations, residual (LoRA: 16-bit base)
    step_states(shape, train_cfg, device, ga, gpus)   parameters, gradients, optimizer states (states.py)
    step_activations(shape, train_cfg, prec, ...)     what autograd saves: per layer, checkpointed, head, O(s²)
    phase_components(...)                             {phase: {component: bytes}} for the five PHASES
    component_notes(...)                              one line per component (the `packtrain plan` table's notes)

Pure byte arithmetic on the counts of memory.py; the order of the operations is the planner's (a refactor that
moves an expression here keeps it whole, so every plan stays the same to the byte).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from packtrain.planner import step_bytes as mem
from packtrain.planner.shapes import ModelShape
from packtrain.planner.states import ModelStates, lora_states, model_states

if TYPE_CHECKING:
    from packtrain.config import TrainConfig

GIB = 1 << 30


@dataclass(frozen=True)
class StepActivations:
    """What autograd keeps for backward, in bytes for a micro-batch of `rows × budget` tokens."""

    checkpointed: int          # number of checkpointed layers
    last_checkpointed: bool    # the last layer is checkpointed (recomputed first in backward)
    compiled: bool             # inductor's smaller saved tensors apply (torch/fsdp2 engine, 16-bit, CUDA)
    layer: int                 # one non-checkpointed layer (without its O(s²) term)
    quadratic: int             # one layer's O(s²) attention tensor (sdpa mask bias, eager softmax)
    checkpointed_layer: int    # one checkpointed layer (its input; selective: + matmul and attention outputs)
    recompute_overlap: int     # what the last layer's recompute re-creates that is already kept
    head: int                  # final norm + LM head's saved tensors
    total: int                 # every layer + head + the inputs shared by all layers
    attention: int             # every non-checkpointed layer's O(s²) term + the checkpointed layers' mask


def step_precision(train_cfg: TrainConfig) -> mem.Precision:
    """memory.precision_of the run; LoRA below fp32 holds its frozen base in 16 bits."""
    prec = mem.precision_of(train_cfg.engine, train_cfg.precision)
    if train_cfg.adapter.type == "lora" and train_cfg.precision != "fp32":
        # the frozen base is held in bf16/fp16, so the residual stream and every saved activation are 16-bit as
        # in a pure 16-bit module; LoRA adds only its (tokens, r) intermediates (A·x), negligible at r ≪ h
        prec = mem.Precision(f"{train_cfg.precision} autocast (LoRA: frozen {train_cfg.precision} base, fp32 "
                             "adapter)", 2, 2, False)
    return prec


def step_states(shape: ModelShape, train_cfg: TrainConfig, device: str, ga: int, gpus: int) -> ModelStates:
    """Parameters, gradients and optimizer states of the engine (LoRA: frozen base + fp32 adapter with AdamW)."""
    ds = train_cfg.deepspeed
    st = model_states(shape, train_cfg.engine, train_cfg.precision, ds.zero_stage, ds.offload_optimizer,
                      ds.offload_params, gpus,
                      # CPU: torch's default AdamW loops tensor by tensor (no whole-model temporary)
                      fused=(train_cfg.fused_optimizer and device == "cuda") or device == "cpu",
                      grad_accum=ga, overlap_comm=ds.overlap_comm,
                      reduce_bucket=int(getattr(ds, "reduce_bucket_size", 0) or 500_000_000),
                      reshard=train_cfg.fsdp.reshards(gpus))
    adapter = train_cfg.adapter
    if adapter.type == "lora":   # frozen base in the autocast dtype + fp32 adapter with AdamW (states.lora_states)
        st = lora_states(shape, train_cfg.precision, adapter.r, adapter.target_modules, gpus,
                         fused=(train_cfg.fused_optimizer and device == "cuda") or device == "cpu", grad_accum=ga,
                         fp8_base=train_cfg.precision == "fp8" and train_cfg.fp8.lora_base == "static")
    return st


def step_activations(shape: ModelShape, train_cfg: TrainConfig, prec: mem.Precision, backend: mem.Backend,
                     chunk: int | None, rows: int, budget: int, device: str) -> StepActivations:
    """The saved activations of `rows × budget` tokens under the run's checkpointing, compile and backend."""
    n_tok = rows * budget
    ck = mem.checkpointed_layers(shape.layers, train_cfg.activation_checkpointing, train_cfg.ac_every_k,
                                 train_cfg.ac_count)
    n_ck = len(ck)
    a_tok = mem.layer_activation_bytes_per_token(shape, prec, backend)
    quad = mem.attention_quadratic_bytes(shape, prec, backend, rows, budget)
    layer_bytes = a_tok * n_tok
    # measured for the torch engine under 16-bit autocast and FSDP2 in bf16 (fp32 and DeepSpeed keep eager sizes)
    compiled = (train_cfg.compile and device == "cuda" and train_cfg.engine in ("torch", "fsdp2")
                and train_cfg.precision in ("bf16", "fp16", "fp8"))   # fp8: planned as bf16 (precision_of)
    if compiled:   # inductor fuses the elementwise chains and saves fewer, smaller tensors for backward
        layer_bytes = int(layer_bytes * (mem.COMPILED_FSDP2_LAYER_ACTIVATION_FACTOR if train_cfg.engine == "fsdp2"
                                         else mem.COMPILED_LAYER_ACTIVATION_FACTOR))
    selective = train_cfg.activation_checkpointing == "selective"
    # a checkpointed layer keeps its input; a selective one also its matrix products' and attention's outputs
    ck_bytes = (mem.selective_layer_bytes_per_token(shape, prec, backend, compiled) if selective
                else prec.residual_bytes * shape.hidden) * n_tok
    # the last layer's recompute in backward re-creates what autograd saves; under selective the input and the
    # attention's outputs are cached already
    overlap = ((prec.residual_bytes * shape.hidden + (0 if backend == "eager" else prec.compute_bytes
                * shape.q_hidden + 4 * shape.heads)) * n_tok if selective
               else ck_bytes if prec.residual_bytes == 4 else 0)
    head_tok, shared_tok = mem.head_activation_bytes_per_token(shape, prec, chunk is not None)
    head_bytes = head_tok * n_tok
    acts = (shape.layers - n_ck) * layer_bytes + n_ck * ck_bytes + head_bytes + shared_tok * n_tok
    attn = (shape.layers - n_ck) * quad + (mem.checkpoint_mask_bytes(prec, backend, rows, budget) if n_ck else 0)
    return StepActivations(checkpointed=n_ck, last_checkpointed=shape.layers - 1 in ck, compiled=compiled,
                           layer=layer_bytes, quadratic=quad, checkpointed_layer=ck_bytes, recompute_overlap=overlap,
                           head=head_bytes, total=acts, attention=attn)


def _fp8_linears(train_cfg: TrainConfig) -> bool:
    """fp8 under the torch engine: torchao's float8 decoder linears (no per-layer bf16 weight copy)."""
    return train_cfg.precision == "fp8" and train_cfg.engine == "torch"


def phase_components(shape: ModelShape, train_cfg: TrainConfig, prec: mem.Precision, st: ModelStates,
                     act: StepActivations, chunk: int | None, n_tok: int, ga: int,
                     device: str) -> dict[str, dict[str, int]]:
    """{phase: {component: bytes}} at the five moments of a step (plan.PHASES)."""
    lora = train_cfg.adapter.type == "lora"
    deepspeed = train_cfg.engine == "deepspeed"
    kernel = "torch" if train_cfg.loss == "fused" and getattr(train_cfg, "loss_kernel", "liger") == "torch" else "chunked"
    loss_fwd, loss_bwd = mem.loss_bytes(shape, prec, n_tok, chunk, kernel, head_trains=not lora)
    fw = mem.CUDA_WORKSPACE_BYTES if device == "cuda" else 0

    # LoRA: the frozen base already is in the autocast dtype (no bf16 copies); the embedding/LM head get no gradient.
    # fp8 (torch engine): torchao's float8 linears save the fp32 parameter itself for backward and cast to e4m3 on
    # the fly (one linear's 1 B/param copy at a time), so the decoder keeps no per-layer weight copy; the LM head
    # stays an autocast bf16 linear (its cast is counted below)
    cast_layer = 2 * shape.layer_linear_params if prec.autocast and not lora and not _fp8_linears(train_cfg) else 0
    cast_head = 2 * shape.vocab * shape.hidden if prec.autocast and not lora else 0
    n_ck = act.checkpointed
    casts_all = shape.layers * cast_layer + cast_head
    casts_saved = (shape.layers - n_ck) * cast_layer + (cast_head if chunk is None else 0)
    last_ck = act.last_checkpointed
    head_grad = (4 if not (deepspeed or lora) else 0) * shape.vocab * shape.hidden

    base = dict(parameters=st.params, master_weights=st.master, gradients=st.persistent_grads,
                optimizer_states=st.optimizer, zero_buffers=st.zero_buffers, framework_workspace=fw)
    # ZeRO-1/2 allocate their reduce buckets and the fp32 gradient partition when the first gradient hook
    # fires and free them after the step, so neither exists before the layers' backward (calibrated on the
    # H200: 350M ZeRO-2, 4×2048, predicted 20.11 GiB with them at 'loss backward', measured 16.97 GiB).
    early = dict(base)
    if deepspeed and train_cfg.deepspeed.zero_stage in (1, 2):
        early.update(zero_buffers=0, gradients=0)
    return {
        "forward": {**early, "weight_casts": casts_all, "activations": act.total,
                    "attention_workspace": act.attention, "logits_loss": loss_fwd},
        "loss backward": {**early, "weight_casts": casts_saved, "activations": act.total,
                          "attention_workspace": act.attention, "logits_loss": loss_bwd},
        "layer backward": {**base, "weight_casts": casts_saved - (cast_head if chunk is None else 0)
                           + (cast_layer if last_ck else 0),
                           "gradients": st.persistent_grads + (head_grad if ga == 1 else 0),
                           # the recomputed layer's RMSNorm re-saves the checkpointed input itself (same
                           # storage) unless the norm keeps its own fp32 copy (pure 16-bit)
                           "activations": act.total - act.head
                           + (max(0, act.layer - act.recompute_overlap) if last_ck else 0),
                           "attention_workspace": act.attention + (act.quadratic if last_ck else 0),
                           "backward_workspace": mem.layer_backward_workspace_bytes(shape, prec, n_tok)},
        "end backward": {**base, "gradients": max(st.grads, st.persistent_grads),
                         "backward_workspace": 0 if lora else (4 if not deepspeed else prec.compute_bytes)
                         * shape.vocab * shape.hidden},
        "optimizer step": {**base, "gradients": max(st.grads, st.persistent_grads),
                           "optimizer_workspace": st.step_workspace},
    }


def component_notes(shape: ModelShape, train_cfg: TrainConfig, prec: mem.Precision, st: ModelStates,
                    act: StepActivations, backend: str, chunk: int | None, device: str) -> dict[str, str]:
    """One line per component saying what it is made of (the notes column of MemoryPlan.table)."""
    lora = train_cfg.adapter.type == "lora"
    n_ck = act.checkpointed
    return {
        "parameters": st.notes.get("params", ""), "master_weights": st.notes.get("master", ""),
        "weight_casts": ("bf16 copy of the LM head (float8 decoder linears keep no copy)"
                         if _fp8_linears(train_cfg) and not lora
                         else "bf16 copies of the matmul weights (autocast cache)" if prec.autocast else ""),
        "gradients": st.notes.get("grads", ""), "optimizer_states": st.notes.get("optimizer", ""),
        "optimizer_workspace": st.notes.get("step_workspace", ""), "zero_buffers": st.notes.get("zero_buffers", ""),
        "activations": f"{shape.layers - n_ck} layers × {act.layer / GIB:.3f} GiB"
                       + (" (compiled)" if act.compiled else "")
                       + (f" + {n_ck} checkpointed × {act.checkpointed_layer / GIB:.3f}" if n_ck else "") + " + head",
        "attention_workspace": {"sdpa": "packed-row mask → per-layer additive bias (b·s²)",
                                "eager": "softmax probabilities (b·a·s²)"}.get(backend, ""),
        "logits_loss": ("standard: (N, V) fp32" if chunk is None else f"chunked: {chunk} tokens at a time"),
        "backward_workspace": "gradients in flight",
        "framework_workspace": "cuBLAS/cuBLASLt workspaces" if device == "cuda" else "",
    }
