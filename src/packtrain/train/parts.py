"""The built parts a `TrainSession` holds, each a dataclass with declared fields and one small builder.

    DataParts   pack store → micro-batch shape → PackedLoader (+ the loop's batch iterator)
    ModelParts  attention backend → model (meta init) → fp8 linears → loss wrapper → activation checkpointing → compile
                → optimizer + LR schedule → engine (torch/DDP or DeepSpeed: sharding last)
    Telemetry   ThroughputMeter + peak FLOP/s + SystemSampler (rank 0) and the steady-state window

Build order matters for numerics: the loader and the model draw from RNGs seeded by the session just before,
so `TrainSession.__init__` builds data, then model, then telemetry — the order of the single `__init__` this
replaced (a bit-identical loss curve on CPU is tested in tests/stages/test_train_stage.py).
Heavy libraries (torch, transformers, deepspeed) are imported inside the builders.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.planner.micro_batch import Shape, choose_shape
from packtrain.train.distributed import DistInfo

if TYPE_CHECKING:
    import torch

    from packtrain.config import ModelConfig, PlanConfig, TelemetryConfig, TrainConfig
    from packtrain.model.build import ParamCount
    from packtrain.packing.batches import PackedBatch, PackedLoader
    from packtrain.telemetry.meter import ThroughputMeter
    from packtrain.telemetry.mfu import PeakEstimate
    from packtrain.telemetry.sampler import SystemSampler
    from packtrain.train.deepspeed_engine import DeepSpeedStepper
    from packtrain.train.fsdp2_engine import Fsdp2Stepper
    from packtrain.train.techniques import CompileCounter
    from packtrain.train.torch_engine import TorchStepper


# ---------------------------------------------------------------------------------------------------- data
@dataclass(slots=True)
class DataParts:
    """The packed training split as the loop sees it: fixed-shape micro-batches of `shape.rows` packs."""

    vocab_size: int
    pad_id: int | None
    eos_id: int | None
    shape: Shape                       # rows × budget per micro-batch, grad_accum (planner.choose_shape)
    loader: PackedLoader
    batches: Iterator[PackedBatch] | None = None   # set by start(): a Prefetcher on CUDA, iter(loader) on CPU

    def start(self, device: torch.device) -> Iterator[PackedBatch]:
        """The micro-batch iterator: prefetched in a thread on CUDA (collate + pin overlap the GPU's step),
        the loader itself on CPU (nothing to overlap with)."""
        from packtrain.train.prefetch import Prefetcher

        self.batches = Prefetcher(self.loader) if device.type == "cuda" else iter(self.loader)
        return self.batches

    def loader_state(self) -> dict:
        """Loader position after the last batch the loop consumed (not the prefetch thread's position)."""
        state = getattr(self.batches, "state_dict", None)   # a Prefetcher's; a plain iterator has none
        return state() if state is not None else self.loader.state_dict()

    def close(self) -> None:
        """Stop the prefetch thread, if any (idempotent)."""
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()


def build_data_parts(split: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, plan_cfg: PlanConfig | None,
                     dist: DistInfo, device: torch.device) -> DataParts:
    """`split` = packs_dir/train → its shape (budget from the store, rows from train/plan) and this rank's loader."""
    from packtrain.packing.batches import PackedLoader
    from packtrain.packing.store import PackStore

    store = PackStore.open(split, verify=False)
    if train_cfg.loss_on != "all" and getattr(store, "loss_mask", None) is None:
        from packtrain.errors import ConfigError

        raise ConfigError(f"train.loss_on={train_cfg.loss_on!r} but the packs in {split} hold no loss mask (they "
                          "were made from plain-text records): ingest chat (messages) or prompt/completion records, "
                          "or set train.loss_on=all")
    vocab_size = int(store.meta["vocab_size"])
    shape = choose_shape(model_cfg, train_cfg, store.budget, plan_cfg, vocab_size, gpus=dist.world_size,
                         device=device)
    loader = PackedLoader(split, rows=shape.rows, seed=train_cfg.seed, rank=dist.rank,
                          world_size=dist.world_size, pin_memory=device.type == "cuda",
                          loss_on=train_cfg.loss_on)
    return DataParts(vocab_size, store.meta.get("pad_id"), store.meta.get("eos_id"), shape, loader)


# ---------------------------------------------------------------------------------------------------- model
@dataclass(slots=True)
class ModelParts:
    """The model and everything that updates it."""

    backend: str                       # attention backend: sdpa | varlen | flex | eager
    model: Any                         # the transformers CausalLM (fp32 parameters; LoRA: layers injected, base
                                       # frozen, in the autocast dtype under bf16/fp16)
    module: Any                        # what the loop calls: the loss wrapper, DDP- or DeepSpeed-wrapped
    params: ParamCount
    flop_dims: dict[str, Any]          # layers, attention width, windows of the family (telemetry.mfu)
    ac_layers: list[int]               # decoder layers under activation checkpointing
    compile_counter: CompileCounter | None   # None: compile off
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stepper: TorchStepper | DeepSpeedStepper | Fsdp2Stepper
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    adapted: Any = None                # train.adapter lora: the peft model around `model` (save_pretrained,
                                       # merge_and_unload); None: full fine-tune
    fp8_linears: list[str] | None = None   # train.precision fp8: the linears torchao runs in FP8 (train/fp8.py)
    fp8_params: int = 0                # ... and their parameters (N_fp8 of MFU's 6·N_fp8 share)

    def step_is_async(self) -> bool:
        """True when a step needs no host sync (plain torch engine, no fp16 loss scaler): the loop may then
        read each step's numbers one step late."""
        from packtrain.train.fsdp2_engine import Fsdp2Stepper
        from packtrain.train.torch_engine import TorchStepper

        return isinstance(self.stepper, (TorchStepper, Fsdp2Stepper)) and self.stepper.scaler is None


def build_model_parts(model_cfg: ModelConfig, train_cfg: TrainConfig, data: DataParts, dist: DistInfo,
                      device: torch.device, out_dir: Path, undo: contextlib.ExitStack) -> ModelParts:
    """Model → adapter (train.adapter) → fp8 (train.precision=fp8) → loss wrapper → activation checkpointing →
    compile → optimizer/schedule → engine. `undo` gets the compile counter's stop, so a setup that fails later
    leaves no counter running."""
    import torch

    from packtrain.model.build import build_model, count_params
    from packtrain.model.families import pick_attention
    from packtrain.model.init_from import init_checkpoint_config
    from packtrain.model.lora import apply_adapter, lora_layers, set_adapter_input_casts
    from packtrain.telemetry.mfu import model_flop_dims
    from packtrain.train import techniques as tq
    from packtrain.train.loss import packed_causal_lm

    # auto → the fastest backend the family allows here (Gemma2's soft-cap: flex on CUDA, eager on the CPU)
    backend = pick_attention(train_cfg.attention, device, train_cfg.precision, init_checkpoint_config(model_cfg),
                             where=f"model.init_from {model_cfg.init_from}")
    if train_cfg.precision == "fp8":   # before building anything: a clear refusal on CPU / pre-Ada GPUs
        from packtrain.train.fp8 import check_fp8_support

        check_fp8_support(device)
    model = build_model(model_cfg, data.vocab_size, backend, device, torch.float32, pad_token_id=data.pad_id,
                        eos_token_id=data.eos_id, training=True)   # any family: model.init_from (model.families)
    params = count_params(model)
    flop_dims = model_flop_dims(model.config)
    # Order: adapter (peft injects LoRA layers into `model` in place and freezes it), fp8 (torchao swaps the
    # decoder's linears in place: convert, then compile — torchao's rule), activation checkpointing, then compile,
    # then sharding (DDP/DeepSpeed) — techniques.py says why. The loss wrapper, the attention backends and
    # AC/compile see the same transformers model; peft's own forward is never called.
    adapted = None
    if train_cfg.adapter.type != "none":
        adapted = apply_adapter(model, train_cfg.adapter, base_dtype=tq.half_dtype(train_cfg.precision))
        params.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fp8_linears, fp8_params = None, 0
    if train_cfg.precision == "fp8":   # swap modules before the loss wrapper, AC and compile see them (train/fp8.py)
        from packtrain.train.fp8 import apply_fp8, fp8_param_count

        fp8_linears = apply_fp8(model, train_cfg.fp8)
        fp8_params = fp8_param_count(model, fp8_linears)
    module = packed_causal_lm(model, train_cfg.loss, train_cfg.loss_chunk_tokens, train_cfg.loss_kernel)
    ac_layers = tq.apply_activation_checkpointing(model, train_cfg)
    counter = tq.apply_compile(model, train_cfg)
    if counter is not None:
        undo.callback(counter.stop)
    if train_cfg.engine == "fsdp2":   # before the optimizer: fully_shard swaps every parameter for a DTensor shard
        from packtrain.train.fsdp2_engine import shard_model

        shard_model(module, model, train_cfg, dist, device, undo)
    optimizer = tq.build_optimizer(model, train_cfg, device.type)
    scheduler = tq.build_scheduler(optimizer, train_cfg)
    stepper: TorchStepper | DeepSpeedStepper | Fsdp2Stepper
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    if train_cfg.engine == "deepspeed":
        from packtrain.train.deepspeed_engine import DeepSpeedStepper

        stepper = DeepSpeedStepper(module, optimizer, train_cfg, device, dist.world_size, data.shape.rows,
                                   data.shape.grad_accum, out_dir)
        autocast = contextlib.nullcontext   # DeepSpeed casts the module to bf16/fp16 itself
    elif train_cfg.engine == "fsdp2":
        from packtrain.train.fsdp2_engine import Fsdp2Stepper

        stepper = Fsdp2Stepper(module, model, optimizer, train_cfg, dist)
        autocast = contextlib.nullcontext   # its MixedPrecisionPolicy computes in bf16 params (no autocast)
    else:
        from packtrain.train.torch_engine import TorchStepper

        scaler = tq.make_grad_scaler(train_cfg.precision, device.type)
        stepper = TorchStepper(module, optimizer, scaler, train_cfg, dist, device)

        def autocast() -> contextlib.AbstractContextManager[Any]:
            return tq.autocast(train_cfg.precision, device.type)

        if adapted is not None and train_cfg.precision != "fp32":   # every training forward runs under autocast:
            set_adapter_input_casts(lora_layers(adapted), False)     # the branches share their layer's input
    return ModelParts(backend, model, stepper.module, params, flop_dims, ac_layers, counter, optimizer, scheduler,
                      stepper, autocast, adapted, fp8_linears, fp8_params)


# ---------------------------------------------------------------------------------------------------- telemetry
@dataclass(slots=True)
class Telemetry:
    """Per-step throughput/MFU (every rank) and system sampling (rank 0) over the steady state."""

    cfg: TelemetryConfig
    meter: ThroughputMeter
    peak: float                        # peak FLOP/s of this device at the run's precision (fp8: the bf16 peak)
    flop_dims: dict[str, Any]
    non_embedding: int                 # N of 6·N FLOPs per token
    sampler: SystemSampler | None      # rank 0 only; None when psutil/nvidia-ml-py are missing
    steady_since: float = 0.0          # sampler clock at the end of the warm-up steps
    steady_until: float | None = None  # ... and at the last training step (the final save is not counted)
    adapter_params: int = 0            # LoRA: trainable adapter parameters (0: full fine-tune)
    fp8_params: int = 0                # fp8: parameters of the FP8 linears (0: no FP8)
    peak_fp8: float = 0.0              # fp8: the FP8 peak FLOP/s their matmuls are counted against
    estimate: PeakEstimate | None = None   # where `peak` came from (its probes when measured)

    def window_flops(self, window: list[PackedBatch]) -> tuple[float, float]:
        """(useful, dense) FLOPs of one optimizer step's micro-batches, from the built model's own shape.

        LoRA: the frozen base and LM head compute no weight gradients, so their matmuls cost 4 FLOPs per
        parameter and token (forward 2 + input gradient 2), not 6; the adapter's A parameters cost the full 6;
        attention (no weights) is unchanged. Llama-3-8B r 16: 4·6.98e9 + 4·h·V + 6·4.19e7 per token."""
        from packtrain.telemetry.mfu import step_flops

        f, useful, dense = self.flop_dims, 0.0, 0.0
        for b in window:
            u, d = step_flops(self.non_embedding, f["n_layers"], f["hidden_size"], b.seq_lens, b.rows * b.budget,
                              b.budget, f["vocab_size"], attn_width=f["attn_width"], windows=f["windows"])
            if self.adapter_params:
                weights = self.non_embedding + f["hidden_size"] * f["vocab_size"]   # what step_flops counts ×6
                per_tok = 6.0 * self.adapter_params - 2.0 * weights
                u, d = u + per_tok * sum(b.seq_lens), d + per_tok * b.rows * b.budget
            useful, dense = useful + u, dense + d
        return useful, dense

    def measure(self, step: int, window: list[PackedBatch], step_time: float, data_wait: float, real: int,
                slot: int) -> dict:
        """Meter one optimizer step (this rank: per-GPU numbers) → the metrics dict the tracker logs.

        fp8: MFU = ideal time / step time, ideal = F_fp8/P_fp8 + (F − F_fp8)/P_bf16 with F_fp8 = 6·N_fp8 per token
        (4·N_fp8 under LoRA: frozen base) — i.e. F over a time-weighted peak, one for useful and one for dense
        FLOPs (their attention shares differ). docs/fp8.md works the 3B example."""
        useful, dense = self.window_flops(window)
        peak_useful = peak_dense = self.peak
        if self.fp8_params:
            from packtrain.telemetry.mfu import time_weighted_peak

            per_tok = (4.0 if self.adapter_params else 6.0) * self.fp8_params
            real_w = sum(sum(b.seq_lens) for b in window)
            slot_w = sum(b.rows * b.budget for b in window)
            peak_useful = time_weighted_peak(useful, per_tok * real_w, self.peak_fp8, self.peak)
            peak_dense = time_weighted_peak(dense, per_tok * slot_w, self.peak_fp8, self.peak)
        return self.meter.record(step, step_time, data_wait, real, slot, useful, dense, peak_useful,
                                 dense_peak_flops=peak_dense)

    def mark(self, step: int, start_step: int) -> None:
        """The sampler's steady window: from the end of the warm-up steps to the last step recorded."""
        if self.sampler is not None:
            if step == start_step + self.cfg.warmup_steps:
                self.steady_since = self.sampler.elapsed()
            self.steady_until = self.sampler.elapsed()

    def stop(self) -> None:
        """Stop sampling (idempotent)."""
        if self.sampler is not None:
            self.sampler.stop()

    def reprobe(self) -> None:
        """After the last step a measured peak is probed again (the cores are as free as this run leaves them):
        the estimate becomes the fastest probe of both rounds, and the meter's summary MFU is against it."""
        if self.estimate is None or self.estimate.source != "measured":
            return
        self.estimate = self.estimate.reprobe()
        self.meter.raise_peak(self.estimate.flops / self.peak)

    def summary(self) -> dict:
        """ThroughputMeter.summary() + the peak its MFU is against: peak_tflops (peak × peak_scale), peak_source,
        peak_reliable and, when unreliable, peak_note (packtrain.telemetry.mfu.peak_note)."""
        from packtrain.telemetry.mfu import PeakEstimate, peak_note

        out = self.meter.summary()
        if not out:
            return out
        est = self.estimate or PeakEstimate(self.peak, "config")
        note = peak_note(est, self.meter.typical * self.peak / est.flops)   # the median step vs the final estimate
        out.update(peak_tflops=self.peak * self.meter.peak_scale / 1e12, peak_source=est.source,
                   peak_reliable=note is None)
        if note:
            out["peak_note"] = note
        return out


def build_telemetry(cfg: TelemetryConfig, precision: str, parts: ModelParts, dist: DistInfo,
                    device: torch.device) -> Telemetry:
    from packtrain.telemetry.meter import ThroughputMeter
    from packtrain.telemetry.mfu import device_name, estimate_peak, fp8_peak_flops
    from packtrain.telemetry.sampler import SystemSampler

    meter = ThroughputMeter(cfg.warmup_steps)
    fp8 = precision == "fp8" and device.type == "cuda" and bool(parts.fp8_params)
    prec = ("bf16" if precision == "fp8" else precision) if device.type == "cuda" else "fp32"   # fp8: rest is bf16
    estimate = estimate_peak(device_name(device), prec, cfg.peak_tflops)   # before training: the cores are freest
    peak_fp8 = fp8_peak_flops(device_name(device), cfg.peak_tflops) if fp8 else 0.0
    sampler = None
    if dist.is_main:
        gpus = list(range(dist.local_world_size)) if device.type == "cuda" else None   # this node's GPUs
        try:
            sampler = SystemSampler(cfg.interval_s, gpu_indices=gpus).start()
        except ImportError as e:   # neither nvidia-ml-py nor psutil installed: train without sampling
            warnings.warn(f"system sampling off: {e}", RuntimeWarning, stacklevel=2)
    adapter = (parts.params.trainable or 0) if parts.adapted is not None else 0
    return Telemetry(cfg, meter, estimate.flops, parts.flop_dims, parts.params.non_embedding, sampler,
                     adapter_params=adapter, fp8_params=parts.fp8_params if fp8 else 0, peak_fp8=peak_fp8,
                     estimate=estimate)
