"""Model states on each GPU: parameters, master weights, gradients, optimizer states, ZeRO buffers.

Bytes per parameter P (Adam; ZeRO paper: 16 bytes/param of model state with mixed precision):

    engine / precision          params  master  grads   Adam m,v  step workspace
    torch, fp32 or bf16 autocast  4       –       4       8         0 fused (CUDA) | 4 foreach
    DeepSpeed bf16, ZeRO-0        2       4       2 + 4   8         (BF16_Optimizer: bf16 + fp32 grads)
    DeepSpeed bf16, ZeRO-1        2       4/n     2 + 4/n 8/n
    DeepSpeed bf16, ZeRO-2        2       4/n     4/n     8/n       + reduce buckets
    DeepSpeed bf16, ZeRO-3        2/n     4/n     4/n     8/n       + reduce bucket + gathered params
    offload_optimizer             master, Adam and fp32 gradients move to CPU memory
    offload_params (ZeRO-3)       the parameter partition moves to CPU; the GPU holds only gathered params
    FSDP2 (fsdp2), any precision  4/n     –       4/n     8/n       + gathered params in the compute dtype:
                                  (fp32 shards are the master)        every layer (reshard_after_forward false,
                                                                      ZeRO-2-like) or two layers + the root (true)

LoRA (train.adapter lora, torch engine): the base is frozen — its weights only, in the autocast dtype (2 B/param
under bf16/fp16, 4 under fp32), no gradients, no optimizer states, no autocast copies; the adapter's A parameters
(A = Σ over target linears of r·(in + out), `lora_params`) are fp32 with full AdamW: 4 + 4 + 8 B each (+ 4 for
the foreach temporary, + 4 DDP buckets on n > 1 GPUs). Llama-3-8B, r 16, all linears, bf16: 16.06 GB frozen base
+ 41.9M × 16 B = 0.67 GB of adapter state (full fine-tune: 128 GB).

Reduce buckets: DeepSpeed allocates `reduce_bucket_size` elements (default 5e8 → 1 GB in bf16) per buffer,
two with overlap_comm (stage 1/2), whatever the model size. ZeRO-3 keeps gathered parameters that are reused
within stage3_max_reuse_distance (1e9) — every parameter in a training step — up to
stage3_max_live_parameters (1e9): in practice a full bf16 copy of models below 1B parameters. The torch engine on n > 1 GPUs (DDP) keeps the
gradients a second time in its reducer buckets (4 bytes/param).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packtrain.planner.shapes import ModelShape

DS_REDUCE_BUCKET = 500_000_000       # DeepSpeed default reduce_bucket_size (elements)
DS_PREFETCH_BUCKET = 50_000_000      # DeepSpeed default stage3_prefetch_bucket_size (elements)
DS_MAX_LIVE = 1_000_000_000          # DeepSpeed default stage3_max_live_parameters (elements)


@dataclass
class ModelStates:
    """Bytes on each GPU (and offloaded to CPU). `grads` are full gradients, present after backward;
    `persistent_grads` exist during forward too (ZeRO partitions, or accumulation over micro-batches)."""

    params: int
    master: int
    grads: int
    persistent_grads: int
    optimizer: int
    step_workspace: int
    zero_buffers: int
    cpu: int = 0
    notes: dict[str, str] = field(default_factory=dict)


def model_states(shape: ModelShape, engine: str, precision: str, zero_stage: int, offload_optimizer: bool,
                 offload_params: bool, gpus: int, fused: bool, grad_accum: int, overlap_comm: bool = True,
                 reduce_bucket: int = DS_REDUCE_BUCKET, prefetch_bucket: int = DS_PREFETCH_BUCKET,
                 max_live: int = DS_MAX_LIVE, reshard: bool = True) -> ModelStates:
    p, n = shape.n_params, max(1, gpus)
    if engine == "fsdp2":
        return fsdp2_states(shape, precision, n, fused, grad_accum, reshard)
    if engine != "deepspeed":
        grads = 4 * p
        ddp = 4 * p if gpus > 1 else 0
        return ModelStates(
            params=4 * p, master=0, grads=grads, persistent_grads=grads if grad_accum > 1 else 0,
            optimizer=8 * p, step_workspace=0 if fused else 4 * p, zero_buffers=ddp,
            notes={"params": f"fp32, {_m(p)} × 4 B", "optimizer": "AdamW m, v fp32 (8 B/param)",
                   "grads": "fp32 (4 B/param)",
                   "step_workspace": "fused AdamW" if fused else "foreach AdamW: one fp32 temp (sqrt v)",
                   "zero_buffers": "DDP reducer buckets (4 B/param)" if ddp else ""},
        )
    half = precision != "fp32"
    wb = 2 if half else 4
    stage = zero_stage
    params = wb * p if stage < 3 else (0 if offload_params else wb * p // n)
    master = (4 * p if stage == 0 else 4 * p // n) if half else 0
    optimizer = 8 * p if stage == 0 else 8 * p // n
    if stage == 0:
        grads = wb * p + (4 * p if half else 0)
    elif stage == 1:
        grads = wb * p + 4 * p // n
    else:
        grads = 4 * p // n
    cpu = 0
    if offload_optimizer and stage >= 1:
        cpu += master + optimizer + 4 * p // n
        master = optimizer = 0
        grads -= 4 * p // n
    if offload_params and stage == 3:
        cpu += wb * p // n
    buffers = 0
    if stage >= 1:
        buffers += reduce_bucket * wb * (2 if overlap_comm and stage < 3 else 1)
    if stage == 3:
        # gathered parameters: DeepSpeed keeps a fetched parameter while it is reused within
        # stage3_max_reuse_distance (1e9) parameters — in training every parameter is (forward → backward),
        # so up to stage3_max_live_parameters (1e9) stay gathered; never less than the largest module + prefetch
        buffers += wb * min(max(p, shape.vocab * shape.hidden + prefetch_bucket), max_live)
    step_ws = 0 if (fused or (offload_optimizer and stage >= 1)) else (4 * p if stage == 0 else 4 * p // n)
    return ModelStates(
        params=params, master=master, grads=grads, persistent_grads=grads, optimizer=optimizer,
        step_workspace=step_ws, zero_buffers=buffers, cpu=cpu,
        notes={"params": f"{'bf16' if half else 'fp32'}, ZeRO-{stage}" + (" (offloaded)" if offload_params
                                                                          and stage == 3 else ""),
               "master": f"fp32 master / {n} GPU" if master else "",
               "optimizer": f"Adam m, v / {n} GPU" if optimizer else "offloaded to CPU",
               "grads": f"ZeRO-{stage} gradient partition", "step_workspace": "",
               "zero_buffers": f"reduce bucket {reduce_bucket:.0e} el." + (" + gathered bf16 params" if stage == 3
                                                                           else "")},
    )


def fsdp2_states(shape: ModelShape, precision: str, n: int, fused: bool, grad_accum: int,
                 reshard: bool) -> ModelStates:
    """FSDP2 (train.engine fsdp2) on n GPUs: fp32 parameter, gradient and AdamW shards (16/n B/param), plus the
    gathered parameters in the compute dtype (2 B under bf16/fp8, 4 under fp32): all of them from forward to
    backward without resharding, else two layers in flight + the root (embedding, final norm, LM head) which
    stays gathered. recipes/1b-h200 (889M params, layers of 51.4M), bf16, 1 GPU, no reshard: 14.2 GB of shards +
    1.8 GB gathered; 8 GPUs, reshard: 1.8 GB of shards + 0.3 GB gathered."""
    p = shape.n_params
    wb = 4 if precision == "fp32" else 2
    root = p - shape.layers * shape.layer_params
    gathered = wb * (p if not reshard else min(p, 2 * shape.layer_params + root))
    grads = 4 * p // n
    return ModelStates(
        params=4 * p // n, master=0, grads=grads, persistent_grads=grads if grad_accum > 1 else 0,
        optimizer=8 * p // n, step_workspace=0 if fused else 4 * p // n, zero_buffers=gathered,
        notes={"params": f"fp32 shards / {n} GPU (the master copy)", "optimizer": f"AdamW m, v / {n} GPU",
               "grads": f"fp32 gradient shards / {n} GPU",
               "step_workspace": "fused AdamW" if fused else "foreach AdamW: one fp32 temp (shard)",
               "zero_buffers": ("all gathered" if not reshard else "2 layers + root gathered")
                               + f" ({'fp32' if wb == 4 else 'bf16'}; reshard_after_forward {str(reshard).lower()})"},
    )


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_params(shape: ModelShape, r: int, targets: str | list[str] = "all-linear") -> int:
    """Adapter parameters: Σ over the target linears of every layer of r·(in + out).

    >>> from packtrain.planner.shapes import ModelShape
    >>> lora_params(ModelShape(32, 64, 2, 4, 2, 8, 97), 4)       # q,o: 4·(32+32); k,v: 4·(32+16); 3 MLP: 4·(32+64)
    4096
    >>> lora_params(ModelShape(32, 64, 2, 4, 2, 8, 97), 4, ["q_proj", "v_proj"])
    896
    """
    h, q, kv, i = shape.hidden, shape.q_hidden, shape.kv_hidden, shape.intermediate
    per = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
           "gate_proj": h + i, "up_proj": h + i, "down_proj": i + h}
    names = LORA_TARGETS if targets == "all-linear" else [t.rsplit(".", 1)[-1] for t in targets]
    return shape.layers * r * sum(per[n] for n in set(names) if n in per)


def lora_states(shape: ModelShape, precision: str, r: int, targets: str | list[str], gpus: int, fused: bool,
                grad_accum: int, fp8_base: bool = False) -> ModelStates:
    """Model states of a LoRA run (torch engine): frozen base weights + an fp32 adapter with AdamW. `fp8_base`
    (train.fp8.lora_base=static): the decoder's linear weights are e4m3, 1 B/param (train/fp8_frozen.py); the
    embeddings, norms and LM head stay 2 B."""
    p, a = shape.n_params, lora_params(shape, r, targets)
    wb = 4 if precision == "fp32" else 2
    lin = shape.layers * shape.layer_linear_params if fp8_base else 0
    grads = 4 * a
    base = wb * (p - lin) + lin
    return ModelStates(
        params=base + 4 * a, master=0, grads=grads, persistent_grads=grads if grad_accum > 1 else 0,
        optimizer=8 * a, step_workspace=0 if fused else 4 * a, zero_buffers=4 * a if gpus > 1 else 0,
        notes={"params": (f"frozen base {_m(p - lin)} × {wb} B + e4m3 linears {_m(lin)} × 1 B" if fp8_base else
                          f"frozen base {_m(p)} × {wb} B") + f" + LoRA r={r} {_m(a)} × 4 B",
               "optimizer": "AdamW m, v of the adapter only (8 B/adapter param)",
               "grads": "adapter only (4 B/adapter param); the base has none",
               "step_workspace": "fused AdamW" if fused else "foreach AdamW: one fp32 temp (adapter)",
               "zero_buffers": "DDP reducer buckets (adapter)" if gpus > 1 else ""},
    )


def _m(n: int) -> str:
    return f"{n / 1e6:.1f}M"
