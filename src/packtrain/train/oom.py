"""Out of device memory: the error that names the planned and observed peaks and what to change.

    oom_error(step, device, shape, model_cfg, train_cfg, plan_cfg) -> TrainOutOfMemory
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from packtrain.errors import PacktrainError
from packtrain.planner.micro_batch import Shape

if TYPE_CHECKING:
    from packtrain.config import ModelConfig, PlanConfig, TrainConfig


class TrainOutOfMemory(PacktrainError):
    """Training ran out of device memory; the message names planned and observed peaks and what to change."""

    exit_code = 1


def oom_error(step: int, device, shape: Shape, model_cfg: ModelConfig, train_cfg: TrainConfig,
              plan_cfg: PlanConfig | None, vocab_size: int | None = None) -> TrainOutOfMemory:
    """Name the observed peak (max_memory_allocated), the planner's predicted peak and its suggestion."""
    from packtrain.telemetry.memory import cuda_memory_stats

    mem = cuda_memory_stats(device)
    total = None
    with contextlib.suppress(Exception):
        import torch

        total = torch.cuda.get_device_properties(device).total_memory / (1 << 30)
    plan, planned, hint = None, None, None
    with contextlib.suppress(Exception):   # the plan of the shape that actually ran
        from packtrain.planner import plan_shape

        plan = plan_shape(model_cfg, train_cfg, shape, plan_cfg, vocab_size, device=device, device_memory_gib=total)
    if plan is not None:
        planned = plan.peak_gib
        hint = plan.suggestion or None
    planned_s = f"{planned:.1f} GiB" if isinstance(planned, (int, float)) else "unavailable (no planner result)"
    total_s = f" of {total:.1f} GiB" if total else ""
    return TrainOutOfMemory(
        f"out of device memory at step {step} on {device}: observed peak {mem['peak_alloc_gib']:.1f} GiB "
        f"allocated ({mem['peak_reserved_gib']:.1f} GiB reserved){total_s}; planned peak {planned_s} for "
        f"{shape.rows} rows × {shape.budget} tokens, grad_accum {shape.grad_accum}, "
        f"precision {train_cfg.precision}, activation_checkpointing {train_cfg.activation_checkpointing}."
        + (f" Planner: {hint}." if hint else "")
        + " Lower train.rows (or set train.rows=auto), set train.activation_checkpointing=full,"
          " train.loss=chunked, or train.engine=deepspeed with train.deepspeed.offload_optimizer=true.")
