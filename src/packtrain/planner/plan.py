"""`plan_memory` predicts the peak GPU memory of a training step; `choose_rows` picks the rows that fit.

A step's memory peaks at one of five moments; the plan evaluates all and reports the largest:

    forward        end of forward, inside autocast: every weight's bf16 copy, all saved activations, logits + loss
    loss backward  the cross-entropy backward: 12·N·V bytes of fp32 (N, V) tensors on top of the activations
    layer backward last layer's backward: its gradients in flight (+ its recomputation when checkpointed)
    end backward   all gradients, the embedding's dense gradient being accumulated
    optimizer step parameters + gradients + Adam states (+ the foreach temporary)

Optimizer states exist from the second step on, so they count in every phase (the issue's "3 steps"
measurement sees them). `peak_allocated` is comparable to `torch.cuda.max_memory_allocated()`; the device
must also hold the allocator's slack and the CUDA context:

    peak = peak_allocated × (1 + plan.allocator_overhead) + plan.cuda_context_gib

Example (350m-h200: 8 × 2048 tokens, bf16 autocast, varlen, no checkpointing, vocab 32768):
`plan_memory(...)` → 31.7 GiB allocated at the loss backward (6 GiB of it logits + loss); activations
0.876 GiB per layer; 33.8 GiB with allocator overhead and CUDA context.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal, cast

from packtrain.errors import ConfigError
from packtrain.planner import step_bytes as mem
from packtrain.planner.phases import (
    component_notes,
    phase_components,
    step_activations,
    step_precision,
    step_states,
)
from packtrain.planner.shapes import ModelShape, model_shape
from packtrain.planner.states import lora_params

if TYPE_CHECKING:
    from packtrain.config import ModelConfig, PlanConfig, TrainConfig

GIB = 1 << 30
COMPONENTS = ("parameters", "master_weights", "weight_casts", "gradients", "optimizer_states",
              "optimizer_workspace", "zero_buffers", "activations", "attention_workspace", "logits_loss",
              "backward_workspace", "framework_workspace")
PHASES = ("forward", "loss backward", "layer backward", "end backward", "optimizer step")


@dataclass
class MemoryPlan:
    """Predicted memory of one training step on one GPU (bytes; `*_gib` properties for humans)."""

    budget: int                       # tokens per pack = per row (the packs' budget)
    rows: int                         # packs per micro-batch
    tokens: int                       # rows × budget per micro-batch
    grad_accum: int
    shape: ModelShape
    precision: str
    attention: str
    checkpointing: str
    checkpointed_layers: int
    engine: str
    zero_stage: int | None
    gpus: int
    components: dict[str, int]        # at the peak phase; they sum to peak_allocated
    notes: dict[str, str]
    phases: dict[str, int]            # allocated bytes at each phase
    peak_phase: str
    layer_activation_bytes: int       # one non-checkpointed layer (incl. its O(s²) attention term)
    checkpointed_layer_bytes: int     # one checkpointed layer (its saved input)
    peak_allocated: int
    allocator_overhead: int
    cuda_context: int
    peak: int
    device_memory_gib: float
    target_fraction: float
    cpu_offload: int = 0
    adapter_params: int = 0           # LoRA: trainable adapter parameters (states.lora_params); 0: full fine-tune
    device: str = "cuda"              # "cpu": one CPU process's step (no GPU, no CUDA context)
    suggestion: str = ""
    alternatives: list[dict] = field(default_factory=list)

    @property
    def peak_allocated_gib(self) -> float:
        return self.peak_allocated / GIB

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB

    @property
    def target_gib(self) -> float:
        return self.target_fraction * self.device_memory_gib

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.target_gib

    @property
    def tokens_per_step(self) -> int:
        """rows × budget × grad_accum × gpus: slot tokens per optimizer step over all GPUs."""
        return self.tokens * self.grad_accum * self.gpus

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = self.shape.to_dict()
        d.update(tokens_per_step=self.tokens_per_step,
                 peak_allocated_gib=round(self.peak_allocated_gib, 4), peak_gib=round(self.peak_gib, 4),
                 target_gib=round(self.target_gib, 4), fits=self.fits,
                 components_gib={k: round(v / GIB, 4) for k, v in self.components.items()},
                 phases_gib={k: round(v / GIB, 4) for k, v in self.phases.items()})
        return d

    def table(self) -> str:
        """The breakdown as a fixed-width text table (what `packtrain plan` prints)."""
        s = self.shape
        lines = [
            f"model: h={s.hidden} layers={s.layers} heads={s.heads}/{s.kv_heads} I={s.intermediate} V={s.vocab}"
            f" · {s.n_params / 1e6:.1f}M params ({s.n_params_nonembed / 1e6:.1f}M non-embedding)",
            f"step:  {self.rows} rows × {self.budget} = {self.tokens} tokens · grad_accum {self.grad_accum} · "
            f"{self.tokens_per_step} tokens per step · "
            f"{self.precision} · attention {self.attention} · checkpointing {self.checkpointing} "
            f"({self.checkpointed_layers}/{s.layers} layers) · {self.engine}"
            + (f" ZeRO-{self.zero_stage}" if self.zero_stage is not None else "")
            + (" · CPU" if self.device == "cpu" else f" · {self.gpus} GPU")
            + (f" · LoRA {self.adapter_params / 1e6:.2f}M trainable" if self.adapter_params else ""),
            "",
            f"{'component':<22}{'GiB':>9}  note",
            "-" * 78,
        ]
        for name in COMPONENTS:
            v = self.components.get(name, 0)
            if v:
                lines.append(f"{name.replace('_', ' '):<22}{v / GIB:9.3f}  {self.notes.get(name, '')}")
        lines += [
            "-" * 78,
            f"{'= allocated peak':<22}{self.peak_allocated_gib:9.3f}  at {self.peak_phase}"
            + ("" if self.device == "cpu" else " (≈ torch.cuda.max_memory_allocated)"),
            f"{'allocator overhead':<22}{self.allocator_overhead / GIB:9.3f}",
            *([] if self.device == "cpu" else [f"{'CUDA context':<22}{self.cuda_context / GIB:9.3f}"]),
            f"{'= predicted peak':<22}{self.peak_gib:9.3f}  of {self.device_memory_gib:.1f} GiB"
            + (" for the CPU process" if self.device == "cpu" else "") + "; target "
            f"{self.target_fraction:.2f} → {self.target_gib:.1f} GiB: " + ("fits" if self.fits else "DOES NOT FIT"),
            "",
            "phases (allocated GiB): " + " · ".join(f"{k} {v / GIB:.2f}" for k, v in self.phases.items()),
            f"activations per layer: {self.layer_activation_bytes / GIB:.3f} GiB"
            + (f"; checkpointed layer: {self.checkpointed_layer_bytes / GIB:.3f} GiB"
               if self.checkpointed_layers else ""),
        ]
        if self.cpu_offload:
            lines.append(f"offloaded to CPU memory: {self.cpu_offload / GIB:.2f} GiB")
        if self.suggestion:
            lines.append(f"suggestion: {self.suggestion}")
        return "\n".join(lines)


def _backend(train_cfg: TrainConfig, device: str) -> str:
    """`auto` as packtrain.model.attention resolves it: varlen on CUDA with bf16/fp16/fp8, flex on CUDA fp32,
    sdpa on CPU."""
    if train_cfg.attention != "auto":
        return train_cfg.attention
    if device != "cuda":
        return "sdpa"
    return "varlen" if train_cfg.precision in ("bf16", "fp16", "fp8") else "flex"


def _loss_chunk(train_cfg: TrainConfig) -> int | None:
    if train_cfg.loss not in ("chunked", "fused"):   # fused chunks too (Liger's modelled at loss_chunk_tokens)
        return None
    return int(getattr(train_cfg, "loss_chunk_tokens", None) or mem.LOSS_CHUNK_DEFAULT)


def resolve_device_memory_gib(plan_cfg: PlanConfig, device_memory_gib: float | None = None) -> float:
    """Argument > plan.device_memory_gib > the current CUDA device > 80 GiB."""
    return device_memory_source(plan_cfg, device_memory_gib)[0]


DEFAULT_DEVICE_MEMORY_GIB = 80.0
"""What the planner plans for with no argument, no plan.device_memory_gib and no CUDA device (an 80 GB GPU)."""


def device_memory_source(plan_cfg: PlanConfig, device_memory_gib: float | None = None) -> tuple[float, str]:
    """(GiB, where it came from): "--device-memory-gib", "plan.device_memory_gib", the CUDA device's name, or
    "default" (no CUDA device here: DEFAULT_DEVICE_MEMORY_GIB)."""
    if device_memory_gib:
        return float(device_memory_gib), "--device-memory-gib"
    if plan_cfg.device_memory_gib:
        return float(plan_cfg.device_memory_gib), "plan.device_memory_gib"
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return props.total_memory / GIB, f"this machine's {props.name}"
    except Exception:  # noqa: BLE001 - no usable CUDA → the documented default
        pass
    return DEFAULT_DEVICE_MEMORY_GIB, "default"


def plan_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, budget: int, plan_cfg: PlanConfig,
                device_memory_gib: float | None = None, *, vocab_size: int | None = None,
                rows: int | Literal["auto"] | None = None, grad_accum: int | None = None,
                gpus: int | None = None,
                device: str | None = None, attention: str | None = None, suggest: bool = True) -> MemoryPlan:
    """Predict the peak memory of a training step of `rows` packs × `budget` tokens per micro-batch.

    budget: tokens per pack (the packs' budget). rows, grad_accum, gpus: default train.rows (an integer;
    'auto' is resolved by packtrain.planner.choose_shape first), train.grad_accum (> 1 keeps gradients alive
    during the forward), train.gpus. device: 'cpu' or 'cuda' (default: cpu when train.device is cpu).
    attention: the backend the run resolved (default: train.attention, 'auto' as `_backend` resolves it).
    vocab_size: the tokenizer's (else plan.vocab_size, or the pretrained config's).
    """
    if not isinstance(budget, int) or budget < 2:
        raise ConfigError(f"budget {budget!r}: must be an integer ≥ 2 tokens (tokens per pack)")
    rows = rows or train_cfg.rows
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ConfigError(f"train.rows {rows!r}: plan_memory needs a number of rows; resolve 'auto' with "
                          "packtrain.planner.choose_shape")
    gpus = gpus or train_cfg.gpus
    shape = model_shape(model_cfg, plan_cfg, vocab_size)
    device = device or ("cpu" if train_cfg.device == "cpu" else "cuda")
    ga = grad_accum or train_cfg.grad_accum
    prec = step_precision(train_cfg)
    backend = cast("mem.Backend", attention or _backend(train_cfg, device))
    chunk = _loss_chunk(train_cfg)
    n_tok = rows * budget
    deepspeed = train_cfg.engine == "deepspeed"
    st = step_states(shape, train_cfg, device, ga, gpus)
    act = step_activations(shape, train_cfg, prec, backend, chunk, rows, budget, device)
    phases_c = phase_components(shape, train_cfg, prec, st, act, chunk, n_tok, ga, device)
    phases = {k: sum(v.values()) for k, v in phases_c.items()}
    peak_phase = max(PHASES, key=lambda k: phases[k])
    comps = {k: int(phases_c[peak_phase].get(k, 0)) for k in COMPONENTS}
    peak_alloc = sum(comps.values())
    dev_gib = resolve_device_memory_gib(plan_cfg, device_memory_gib)
    overhead = int(peak_alloc * plan_cfg.allocator_overhead)
    ctx = int(plan_cfg.cuda_context_gib * GIB) if device == "cuda" else 0
    adapter = train_cfg.adapter
    plan = MemoryPlan(
        budget=budget, rows=rows, tokens=n_tok, grad_accum=ga, shape=shape, precision=prec.name,
        attention=backend, checkpointing=train_cfg.activation_checkpointing, checkpointed_layers=act.checkpointed,
        engine=train_cfg.engine, zero_stage=train_cfg.deepspeed.zero_stage if deepspeed else None, gpus=gpus,
        components=comps, notes=component_notes(shape, train_cfg, prec, st, act, backend, chunk, device),
        phases={k: int(v) for k, v in phases.items()}, peak_phase=peak_phase,
        layer_activation_bytes=int(act.layer + act.quadratic), checkpointed_layer_bytes=int(act.checkpointed_layer),
        peak_allocated=int(peak_alloc), allocator_overhead=overhead, cuda_context=ctx,
        peak=int(peak_alloc + overhead + ctx), device_memory_gib=dev_gib,
        target_fraction=plan_cfg.target_fraction, cpu_offload=st.cpu,
        adapter_params=lora_params(shape, adapter.r, adapter.target_modules) if adapter.type == "lora" else 0,
        device=device,
    )
    if suggest:
        suggest_changes(plan, model_cfg, train_cfg, plan_cfg, vocab_size, device, attention)
    return plan


def suggest_changes(plan: MemoryPlan, model_cfg, train_cfg, plan_cfg, vocab_size, device: str,
                    attention: str | None = None) -> None:
    """Fill `plan.suggestion` (and `alternatives`): headroom when it fits, else what each single change buys."""
    if plan.fits:
        plan.suggestion = f"fits with {plan.target_gib - plan.peak_gib:.1f} GiB to spare under the target"
        return
    changes: list[tuple[str, dict]] = []
    if train_cfg.activation_checkpointing != "full":
        changes.append(("--set train.activation_checkpointing=full", {"activation_checkpointing": "full"}))
    if train_cfg.activation_checkpointing in ("none", "every_k", "count"):   # almost no recompute, fewer savings
        changes.append(("--set train.activation_checkpointing=selective",
                        {"activation_checkpointing": "selective"}))
    if train_cfg.loss not in ("chunked", "fused"):
        changes.append(("--set train.loss=chunked", {"loss": "chunked"}))
    if (attention or _backend(train_cfg, "cuda")) in ("sdpa", "eager") and train_cfg.precision != "fp32":
        changes.append(("--set train.attention=varlen", {"attention": "varlen"}))
    if train_cfg.engine == "deepspeed" and not (train_cfg.deepspeed.zero_stage == 3
                                                 and train_cfg.deepspeed.offload_params):
        ds = train_cfg.deepspeed.model_copy(update={"zero_stage": 3, "offload_optimizer": True,
                                                    "offload_params": True})
        changes.append(("--set train.deepspeed.zero_stage=3 (+ offload_optimizer, offload_params)",
                        {"deepspeed": ds}))
    for text, update in changes:
        backend = "varlen" if update.get("attention") == "varlen" else attention
        alt = plan_memory(model_cfg, train_cfg.model_copy(update=update), plan.budget, plan_cfg,
                          plan.device_memory_gib, vocab_size=vocab_size, rows=plan.rows, grad_accum=plan.grad_accum,
                          gpus=plan.gpus, device=device, attention=backend, suggest=False)
        plan.alternatives.append({"change": text, "peak_gib": round(alt.peak_gib, 3), "fits": alt.fits})
    fitting = [a for a in plan.alternatives if a["fits"]]
    best = min(plan.alternatives, key=lambda a: a["peak_gib"], default=None)
    parts = [f"predicted {plan.peak_gib:.1f} GiB > target {plan.target_gib:.1f} GiB"]
    if fitting:
        parts.append("fits with " + "; or ".join(f"{a['change']} ({a['peak_gib']:.1f} GiB)" for a in fitting))
    elif best:
        parts.append(f"closest single change: {best['change']} ({best['peak_gib']:.1f} GiB)")
    if plan.rows > 1:
        parts.append("or fewer rows per micro-batch: --set train.rows=auto")
    else:
        parts.append(f"or shorter packs: re-pack with --set pack.budget=N < {plan.budget}")
    plan.suggestion = "; ".join(parts)
