"""Memory planner: predict a training step's peak GPU memory and choose the token budget before training.

    plan_memory(model_cfg, train_cfg, budget, plan_cfg, device_memory_gib=None) -> MemoryPlan
    choose_budget(model_cfg, train_cfg, plan_cfg, device_memory_gib=None) -> (budget, grad_accum, MemoryPlan)
    model_shape(model_cfg, plan_cfg, vocab_size) -> ModelShape     exact parameter count of the Llama model

Pure arithmetic (no torch import unless the device memory has to be read from CUDA). See docs/planner.md.
"""

from packtrain.planner.plan import MemoryPlan, choose_budget, plan_memory, resolve_device_memory_gib
from packtrain.planner.shapes import ModelShape, model_shape

__all__ = ["MemoryPlan", "ModelShape", "choose_budget", "model_shape", "plan_memory", "resolve_device_memory_gib"]
