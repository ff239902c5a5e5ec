"""Config of the train stage (the model's: packtrain.config.model)."""

from __future__ import annotations

import warnings
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from packtrain.config.base import (
    Float,
    Fraction,
    NoBool,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    StrictModel,
    Word,
)

Beta = Annotated[Float, Field(ge=0, lt=1)]


class CheckpointConfig(StrictModel):
    every_steps: NonNegativeInt = 0
    """Save a resumable checkpoint every N optimizer steps (0: only at the end)."""
    keep_last: PositiveInt = 2
    """Retention: keep the newest N checkpoints (≥ 1) ..."""
    keep_best: bool = True
    """... and also the one with the lowest mean training loss over its checkpoint interval (with
    train.eval_every_steps: the lowest held-out eval_loss, kept whatever this says — it is the model exported).
    Every other step_N directory is removed after a save; quarantined (corrupt) checkpoints are never removed."""


class EarlyStoppingConfig(StrictModel):
    """Stop training when the held-out loss stops improving (needs train.eval_every_steps > 0)."""

    patience: PositiveInt = 3
    """Stop after this many evaluations in a row that did not improve on the reference by more than min_delta
    (the run then lasted at most patience × eval_every_steps steps past its last improvement)."""
    min_delta: NonNegativeFloat = 0.0
    """An evaluation improves when eval_loss < reference − min_delta (nats); the reference is the loss of the
    last evaluation that improved. The exported model is still the lowest eval_loss seen."""


class DeepSpeedOptions(StrictModel):
    """ZeRO options; `build_deepspeed_config(train_cfg)` turns these + the train config into DeepSpeed JSON."""

    zero_stage: Annotated[Literal[0, 1, 2, 3], NoBool] = 2
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


class AdapterConfig(StrictModel):
    """A parameter-efficient adapter trained instead of the full model (packtrain.model.lora, through peft).

    LoRA (Hu et al.): every target linear W (out × in) gets W + (alpha/r)·B·A with A (r × in), B (out × r);
    only A and B train — Σ r·(in + out) parameters over the targets (Llama-3-8B, r 16, all linears: 42M of
    8.0B, 0.5%). The base is frozen: no gradients, no optimizer states; under bf16/fp16 it is held in that
    dtype (2 B/param) since no update needs an fp32 master copy. Checkpoints and model/ hold the adapter only."""

    type: Literal["none", "lora"] = "none"
    """none: train every parameter (full fine-tune); lora: a LoRA adapter over a frozen base (model.init_from)."""
    r: PositiveInt = 16
    """LoRA rank: A is (r × in), B is (out × r)."""
    alpha: PositiveFloat = 32.0
    """LoRA scaling numerator: the update is (alpha / r)·B·A (alpha = 2·r is the common choice)."""
    dropout: Annotated[Float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the LoRA branch's input, 0 ≤ p < 1 (0: none)."""
    target_modules: Literal["all-linear"] | Annotated[list[Word], Field(min_length=1)] = "all-linear"
    """Which linears get an adapter: 'all-linear' (every linear in the decoder layers, not the LM head — peft's
    rule), or module-name suffixes, e.g. [q_proj, v_proj]."""
    save_merged: bool = False
    """Also write model/merged/: the adapter merged into the base (peft merge_and_unload, fp32), a plain
    save_pretrained directory that loads with AutoModelForCausalLM alone."""


class Fp8Options(StrictModel):
    """FP8 matmuls (train.precision=fp8) through torchao's float8 training (packtrain.train.fp8)."""

    recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    """Scaling granularity of the float8 casts: tensorwise (one scale per tensor; the faster on Hopper: 1.126× bf16
    at 3B in bench/results/fp8_bench_3b.json) or rowwise (one scale per row; more robust to outliers, slower —
    docs/fp8.md)."""
    mix_order_reduction: bool = True
    """Inductor's mix-order reductions (torch._inductor.config.triton.mix_order_reduction) while the FP8 model
    compiles; false turns them off for the training process. Off was the faster at 3B on one H100, the same rows
    and steps (bench/results/fp8_bench_3b_h100.json: variant fp8_nomix against fp8); on stays the default until
    an H200 says the same (docs/fp8.md)."""
    lora_base: Literal["torchao", "static"] = "torchao"
    """Under train.adapter.type=lora, how the frozen base linears run FP8. torchao: Float8Linear as for full
    training (casts the weight every call, computes the weight gradient and drops it; train.fp8.recipe). static
    (train/fp8_frozen.py, experimental): weights quantized to e4m3 once (tensorwise), 1 byte a parameter on the
    GPU (the original kept on the CPU for state_dict), FP8 forward and input gradient, no weight-gradient work —
    measured SLOWER than bf16 at 8B (8,491 vs 12,570 tok/s with full recompute, bench/results/GPU_RESULTS.md § 8)."""


class FsdpOptions(StrictModel):
    """FSDP2 (train.engine=fsdp2, torch.distributed.fsdp.fully_shard per decoder layer + the root)."""

    reshard_after_forward: bool | Literal["auto"] = "auto"
    """Free each layer's gathered parameters after its forward (ZeRO-3-like memory) and gather again in backward;
    false keeps them until backward (ZeRO-2-like: more memory, one all-gather fewer per layer); auto: true on
    several GPUs, false on one (nothing is sharded, so a re-gather would only add a cast-copy per layer)."""
    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """Dtype of the gradient reduce-scatter (fp32: exact sums; bf16: half the traffic)."""

    def reshards(self, world_size: int) -> bool:
        """reshard_after_forward with auto resolved. FsdpOptions().reshards(1), .reshards(2) → False, True"""
        return world_size > 1 if self.reshard_after_forward == "auto" else bool(self.reshard_after_forward)


class TrainConfig(StrictModel):
    """The train stage: engine, precision, memory techniques, schedule."""

    moved_fields: ClassVar[dict[str, str]] = {"budget": "train.rows"}
    """'budget' means tokens per pack only (pack.budget, fixed by the pack stage): the old train.budget (tokens
    per row, 'auto', or null) is refused at load time, naming train.rows — train.budget=auto → train.rows=auto;
    train.budget=B → train.rows=B·rows/pack.budget; null → drop it."""

    engine: Literal["torch", "deepspeed", "fsdp2"] = "torch"
    """torch: one process or DDP; deepspeed: ZeRO (train.deepspeed); fsdp2: PyTorch-native sharding (fully_shard,
    train.fsdp), composes with compile."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    gpus: PositiveInt = 1
    """Data-parallel processes on one node, one per GPU. N > 1: the train stage relaunches itself through
    torchrun as N ranks (packtrain.train.launch; gloo processes on the CPU), from the CLI, a KFP pod or Airflow
    alike; the KFP train task requests N accelerators; the planner divides ZeRO states and the global batch
    by N. `--gpus N` on `packtrain train`/`run` sets it."""
    attention: Literal["auto", "sdpa", "flex", "varlen", "eager"] = "auto"
    """Isolated attention backend for packed batches; auto → the fastest that runs on the device and that the
    model's family allows (sdpa on the CPU; eager for Gemma2, whose soft-cap sdpa drops). A backend the
    model.init_from family refuses is an error at config load (packtrain.config.preflight)."""
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    """fp8: the decoder's linear layers run FP8 matmuls (torchao float8 training, train.fp8), everything else
    bf16 autocast; needs a GPU with FP8 tensor cores (compute capability ≥ 8.9) and is refused elsewhere."""
    fp8: Fp8Options = Fp8Options()
    fsdp: FsdpOptions = FsdpOptions()
    activation_checkpointing: Literal["none", "full", "every_k", "count", "selective"] = "none"
    """Decoder layers that recompute their activations in backward: none; full (all); every_k (layers 0, k, 2k, …);
    count (train.ac_count layers, spread evenly: the knob a memory budget turns — each kept layer of a Llama-3-8B
    shape at 8 × 2048 tokens holds ~2.2 GiB, each recomputed one ~0.1 GiB and +1/3 of its matmuls); selective
    (every layer keeps its matrix products' and attention's outputs and recomputes only the element-wise ops
    between them: almost no extra FLOPs, about half a plain layer's bytes — train/selective_ac.py)."""
    ac_every_k: PositiveInt = 2
    ac_count: PositiveInt = 16
    """activation_checkpointing=count: how many decoder layers recompute (more than the model has: all)."""
    compile: bool = False
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """torch.compile backend of train.compile: inductor (the fast one); aot_eager / eager trace with dynamo only
    (no speed-up, seconds instead of a minute on a CPU): debugging, and CPU tests of the compile counter and the
    guard's recompile signal."""
    fused_optimizer: bool = True
    """Fused AdamW where the device supports it (CUDA); ignored on CPU."""
    rows: PositiveInt | Literal["auto"] = 4
    """Packs per micro-batch (rows of pack.budget tokens), or 'auto': the memory planner picks the most that fit.
    A micro-batch is always rows × pack.budget tokens, the packs' budget read from the packs on disk; 'auto'
    takes the most rows whose predicted peak ≤ plan.target_fraction × device memory (≤ plan.max_rows).
    packtrain.planner.choose_shape decides the shape for train and `packtrain plan` alike."""
    grad_accum: PositiveInt = 1
    """Micro-batches per optimizer step (with rows 'auto' and plan.global_batch_tokens set, the planner derives
    it from that global batch instead)."""
    max_steps: PositiveInt = 20
    lr: PositiveFloat = 3e-3
    min_lr_ratio: Fraction = 0.1
    warmup_steps: NonNegativeInt = 5
    weight_decay: NonNegativeFloat = 0.1
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    """AdamW betas, each 0 ≤ β < 1 (torch rejects others)."""
    grad_clip: NonNegativeFloat = 1.0
    """Clip the global grad norm to this; 0 disables."""
    seed: Seed = 0
    loss: Literal["standard", "chunked", "fused"] = "standard"
    """chunked: LM head + cross-entropy in checkpointed chunks so full logits are never materialized;
    fused: LM head + cross-entropy in one node that computes the gradients in its forward (no full logits, no
    recompute); which implementation: train.loss_kernel."""
    loss_kernel: Literal["torch", "liger"] = "torch"
    """train.loss=fused only. torch: packtrain's own (train/fused_loss.py): full-size GEMMs over loss_chunk_tokens
    rows and one compiled element-wise kernel, any device; liger: Liger's Triton kernel (CUDA + liger-kernel,
    else the chunked loss with one warning), whose chunk is N / ⌈V / H⌉ rows (128 for Qwen2-0.5B). Measured on an
    H200, head + loss forward+backward over 16,384 tokens (bench/results/loss_kernels.json): Qwen2-0.5B 28.9 ms
    (torch, C 2048) vs 54.3 (liger); Gemma-3-1B's 262k vocabulary 57.3 vs 115.0."""
    loss_chunk_tokens: PositiveInt = 2048
    """Tokens per chunk for loss: chunked ((chunk, vocab) fp32 logits live at a time: 2048 × 32768 → 256 MiB);
    fused with loss_kernel=torch ((chunk, vocab) logits and their gradient in the compute dtype)."""
    loss_on: Literal["all", "assistant", "completion"] = "all"
    """Which tokens carry the loss: all (plain text, every token after a document start); assistant (chat
    records: assistant turns incl. their end-of-turn token); completion (prompt/completion records: the
    completion). Tokens outside get label -100 in every packing layout (the token store's loss_mask), and the
    loss is the token mean over the remaining tokens of the accumulation window; evaluation uses the same."""
    adapter: AdapterConfig = AdapterConfig()
    """LoRA adapter over a frozen base (type lora), or none (full fine-tune)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval_every_steps: NonNegativeInt = 0
    """Held-out loss on the eval packs every N optimizer steps and at the last step, with the evaluate stage's
    code and evaluate.rows / max_batches / precision (packtrain.train.evaluation): `eval_loss` in
    train_log.jsonl and as an MLflow metric at its step; each new lowest eval_loss is checkpointed, and that
    checkpoint (lowest eval_loss) is what model/ holds at the end. 0: off (no evaluation, the loop unchanged).
    Each evaluation costs one pass over evaluate.max_batches eval micro-batches."""
    early_stopping: EarlyStoppingConfig | None = None
    """Stop before max_steps when eval_loss stops improving (patience, min_delta); None: off."""
    deepspeed: DeepSpeedOptions = DeepSpeedOptions()
    log_every: PositiveInt = 1
    expandable_segments: bool = True
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA initializes."""
    threads: PositiveInt | None = None
    """torch CPU threads (None → torch's default)."""

    @model_validator(mode="after")
    def _adapter_engine(self):
        if self.adapter.type != "none" and self.engine != "torch":
            raise ValueError(f"train.adapter.type=lora runs on train.engine=torch only (not {self.engine}: a frozen "
                             "base needs no sharded optimizer states): set train.engine=torch")
        if self.engine == "fsdp2" and self.precision == "fp16":
            raise ValueError("train.precision=fp16 with train.engine=fsdp2: fp16 needs a sharded loss scaler, which "
                             "packtrain does not run; use train.precision=bf16")
        return self

    @model_validator(mode="after")
    def _eval_during_training(self):
        if self.early_stopping is not None and self.eval_every_steps == 0:
            raise ValueError("train.early_stopping needs train.eval_every_steps > 0 (it stops on the held-out loss "
                             "those evaluations measure): set train.eval_every_steps=N or drop train.early_stopping")
        if self.eval_every_steps and self.engine != "torch":
            raise ValueError(f"train.eval_every_steps runs on train.engine=torch (one process or DDP), not "
                             f"{self.engine}: its parameters are sharded across ranks; set train.eval_every_steps=0 "
                             "and evaluate the saved model with `packtrain evaluate`")
        return self

    @model_validator(mode="after")
    def _fp8_engine(self):
        if self.precision == "fp8" and self.engine == "deepspeed":
            raise ValueError("train.precision=fp8 runs on train.engine=torch or fsdp2 (DeepSpeed casts the whole "
                             "module to its own bf16/fp16 and does not drive torchao's float8 linears): set "
                             "train.engine=torch, or train.precision=bf16 with DeepSpeed")
        return self

    @model_validator(mode="after")
    def _unused_options(self):
        # options of an engine/precision the run does not use would be accepted and silently ignored: say so
        unused = []
        if self.precision != "fp8" and self.fp8 != Fp8Options():
            unused.append("train.fp8 is set but ignored: train.precision is not fp8")
        if self.engine != "fsdp2" and self.fsdp != FsdpOptions():
            unused.append("train.fsdp is set but ignored: train.engine is not fsdp2")
        if self.engine != "deepspeed" and self.deepspeed != DeepSpeedOptions():
            unused.append("train.deepspeed is set but ignored: train.engine is not deepspeed")
        for line in unused:
            warnings.warn(f"{line} (train.precision={self.precision}, train.engine={self.engine})",
                          UnusedSettingWarning, stacklevel=2)
        return self


class UnusedSettingWarning(UserWarning):
    """A config option group that the chosen engine/precision does not read was changed from its defaults."""
