"""Configs of the model and the train stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from packtrain.config.base import StrictModel


class ModelConfig(StrictModel):
    """A Llama-style transformers model: from these sizes (random init) or a local pretrained directory."""

    pretrained_dir: str | None = None
    hidden_size: int = Field(64, ge=8)
    intermediate_size: int = Field(176, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    """Grouped-query attention; None → num_heads."""
    max_position_embeddings: int = Field(4096, ge=16)
    rope_theta: float = Field(10000.0, gt=0)
    tie_word_embeddings: bool = True
    init_std: float = Field(0.02, gt=0)

    @model_validator(mode="after")
    def _heads(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({kv})")
        return self


class CheckpointConfig(StrictModel):
    every_steps: int = Field(0, ge=0)
    """Save a resumable checkpoint every N optimizer steps (0: only at the end)."""
    keep_last: int = Field(2, ge=1)


class DeepSpeedOptions(StrictModel):
    """ZeRO options; `build_deepspeed_config(train_cfg)` turns these + the train config into DeepSpeed JSON."""

    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False
    offload_params: bool = False
    """Parameter offload needs ZeRO-3."""
    overlap_comm: bool = True
    contiguous_gradients: bool = True

    @model_validator(mode="after")
    def _offload(self):
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("offload_params needs zero_stage 3")
        return self


class TrainConfig(StrictModel):
    """The train stage: engine, precision, memory techniques, schedule."""

    engine: Literal["torch", "deepspeed"] = "torch"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    attention: Literal["auto", "sdpa", "flex", "varlen", "eager"] = "auto"
    """Isolated attention backend for packed batches; auto → fastest available (sdpa on CPU)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    activation_checkpointing: Literal["none", "full", "every_k"] = "none"
    ac_every_k: int = Field(2, ge=1)
    compile: bool = False
    fused_optimizer: bool = True
    """Fused AdamW where the device supports it (CUDA); ignored on CPU."""
    rows: int = Field(4, ge=1)
    """Packs per micro-batch: the micro-batch is rows × pack.budget tokens, always the same shape."""
    budget: int | Literal["auto"] | None = None
    """Override of tokens per row; 'auto' → the memory planner picks it; None → pack.budget."""
    grad_accum: int = Field(1, ge=1)
    max_steps: int = Field(20, ge=1)
    lr: float = Field(3e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(5, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global grad norm to this; 0 disables."""
    seed: int = 0
    loss: Literal["standard", "chunked", "fused"] = "standard"
    """chunked: LM head + cross-entropy in checkpointed chunks so full logits are never materialized;
    fused: Liger's fused linear cross-entropy on CUDA (no full logits, no recompute), else chunked."""
    loss_chunk_tokens: int = Field(2048, ge=1)
    """Tokens per chunk for loss: chunked ((chunk, vocab) fp32 logits live at a time: 2048 × 32768 → 256 MiB)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    deepspeed: DeepSpeedOptions = DeepSpeedOptions()
    log_every: int = Field(1, ge=1)
    expandable_segments: bool = True
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA initializes."""
    threads: int | None = Field(None, ge=1)
    """torch CPU threads (None → torch's default)."""
