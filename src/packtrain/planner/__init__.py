"""Memory planner: predict a training step's peak GPU memory and decide the micro-batch shape before training.

    choose_shape(model_cfg, train_cfg, budget, plan_cfg, vocab_size) -> Shape    rows × budget, grad_accum, gpus
    plan_shape(model_cfg, train_cfg, shape, plan_cfg, vocab_size) -> MemoryPlan  the plan of that shape
    plan_memory(model_cfg, train_cfg, budget, plan_cfg, device_memory_gib=None, *, rows, grad_accum, gpus)
    model_shape(model_cfg, plan_cfg, vocab_size) -> ModelShape                   exact parameter count

"budget" is always tokens per pack (pack.budget, read from the packs on disk); the planner chooses rows per
micro-batch (train.rows=auto), never the budget. Pure arithmetic (no torch import unless the device memory has to
be read from CUDA or a device's attention backend resolved). See docs/planner.md.
"""

from packtrain.planner.micro_batch import Shape, choose_rows, choose_shape, plan_shape
from packtrain.planner.plan import MemoryPlan, plan_memory, resolve_device_memory_gib
from packtrain.planner.shapes import ModelShape, model_shape

__all__ = ["MemoryPlan", "ModelShape", "Shape", "choose_rows", "choose_shape", "model_shape", "plan_memory",
           "plan_shape", "resolve_device_memory_gib"]
