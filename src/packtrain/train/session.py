"""`TrainSession`: the built parts the loop needs, plus per-step records, checks and the end of a run.

Setup order (each step is one call into a builder; parts.py holds the builders):
  allocator env (before CUDA) → seeds/threads → device + process group → DataParts (pack store shape, loader)
  → ModelParts (attention backend → model → loss wrapper → activation checkpointing → compile → optimizer +
  LR schedule → engine: torch/DDP or DeepSpeed, sharding last) → Telemetry → Checkpointing (resume.py).

Every attribute is a declared slot: the session and its parts reject any attribute not declared here
(tests/unit/test_train_session.py), so what the loop may read or change is listed in one place.

Outputs under `out_dir` (rank 0 writes): train_log.jsonl (one line per optimizer step: step, loss, lr,
grad_norm, tokens), checkpoints/, deepspeed_config.json (engine: deepspeed), model/ (at the end).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import MissingDataError, TrainingDiverged
from packtrain.faults import kill_point
from packtrain.model.saving import save_pretrained
from packtrain.publish import replace_dir
from packtrain.train import resume as resume_mod
from packtrain.train.distributed import (
    DistInfo,
    dist_info,
    gather_floats,
    global_sum,
    init_distributed,
    resolve_device,
)
from packtrain.train.oom import oom_error
from packtrain.train.parts import (
    DataParts,
    ModelParts,
    Telemetry,
    build_data_parts,
    build_model_parts,
    build_telemetry,
)
from packtrain.train.resume import Checkpointing

if TYPE_CHECKING:
    import torch

    from packtrain.config import ModelConfig, PackConfig, PlanConfig, TelemetryConfig, TrainConfig
    from packtrain.packing.batches import PackedBatch
    from packtrain.train.oom import TrainOutOfMemory
    from packtrain.train.torch_engine import StepInfo


@dataclass(slots=True, init=False, eq=False, repr=False)
class TrainSession:
    model_cfg: ModelConfig
    cfg: TrainConfig
    plan_cfg: PlanConfig | None
    out_dir: Path
    tokenizer_dir: Path
    tracker: Any                        # packtrain.tracking.StageRun or None
    allocator_env: bool                 # expandable_segments set by this run
    dist: DistInfo
    device: torch.device
    data: DataParts
    parts: ModelParts
    telemetry: Telemetry
    checkpoints: Checkpointing
    timings: dict[str, float]           # setup_s, checkpoint_s (the loop adds train_s, save_s, total_s)
    _undo: contextlib.ExitStack         # close(): stop prefetch/sampler/compile counter, restore torch threads

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, pack_cfg: PackConfig,
                 telemetry_cfg: TelemetryConfig, packs_dir: Path | str, tokenizer_dir: Path | str | None,
                 out_dir: Path | str, tracker: Any = None, plan_cfg: PlanConfig | None = None) -> None:
        t0 = time.perf_counter()
        import numpy as np
        import torch

        from packtrain.train import techniques as tq

        self.model_cfg, self.cfg, self.plan_cfg, self.tracker = model_cfg, train_cfg, plan_cfg, tracker
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tok = Path(tokenizer_dir) if tokenizer_dir else None
        if tok is None or not tok.is_dir():
            raise MissingDataError(f"tokenizer directory {tok} does not exist: run "
                                   "`packtrain tokenize` first (its output holds tokenizer/)")
        self.tokenizer_dir = tok
        # a failed setup leaves no sampler/prefetch thread, no compile counter, no changed thread count behind
        with contextlib.ExitStack() as undo:
            undo.callback(torch.set_num_threads, torch.get_num_threads())
            self.allocator_env = tq.set_allocator_env(train_cfg)          # before anything touches CUDA
            self.dist = dist_info()
            if train_cfg.threads:
                torch.set_num_threads(train_cfg.threads)
            random.seed(train_cfg.seed)
            np.random.seed(train_cfg.seed)
            torch.manual_seed(train_cfg.seed)
            self.device = resolve_device(train_cfg.device, self.dist)
            init_distributed(self.dist, self.device)
            self.data = build_data_parts(Path(packs_dir) / "train", model_cfg, train_cfg, plan_cfg, self.dist,
                                         self.device)
            undo.callback(self.data.close)
            self.parts = build_model_parts(model_cfg, train_cfg, self.data, self.dist, self.device, self.out_dir,
                                           undo)
            self.telemetry = build_telemetry(telemetry_cfg, train_cfg.precision, self.parts, self.dist, self.device)
            undo.callback(self.telemetry.stop)
            self.checkpoints = Checkpointing.under(self.out_dir)
            self.timings = {"setup_s": time.perf_counter() - t0, "checkpoint_s": 0.0}
            self._undo = undo.pop_all()

    @property
    def model(self) -> Any:
        """The transformers CausalLM being trained (fp32 parameters)."""
        return self.parts.model

    def __enter__(self) -> TrainSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sampler and prefetch threads and the compile counter, restore torch's thread count
        (idempotent)."""
        self._undo.close()

    def on_close(self, fn: Any) -> None:
        """Call `fn()` when the session closes (before what setup registered: last in, first out)."""
        self._undo.callback(fn)

    def release_setup_memory(self) -> None:
        """Set-up is over (model built, optimizer made, checkpoint restored): give its cached blocks back to
        the device and restart the peak counters, so the recorded peak and its fragmentation are the training
        steps' own, not what loading or a previous run in this process left reserved. No-op on the CPU."""
        from packtrain.telemetry.memory import reset_peak_memory

        if self.device.type == "cuda":
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
            reset_peak_memory(self.device)

    def end_steady_state(self) -> None:
        """Training steps are over: stop sampling so saving the model does not count as idle GPU time; probe a
        measured peak once more, now that this run's steps no longer hold the cores."""
        self.data.close()
        self.telemetry.stop()
        self.telemetry.reprobe()

    # ------------------------------------------------------------------------------------------ start, save
    def restore(self, resume: bool, overwrite: bool = False) -> int:
        """The first step of this run (resume.restore: refuses, resumes or starts at 0; deletes nothing
        implicitly)."""
        return resume_mod.restore(self, resume, overwrite)

    def checkpoint_due(self, step: int) -> bool:
        every = self.cfg.checkpoint.every_steps
        return (every > 0 and step % every == 0) or step == self.cfg.max_steps

    def save_checkpoint(self, step: int) -> None:
        resume_mod.save_checkpoint(self, step)

    # ------------------------------------------------------------------------------------------ per step
    def record(self, step: int, window: list[PackedBatch], n_labels: float, loss: float, lr: float,
               info: StepInfo, step_time: float, data_wait: float, extra: dict | None = None) -> dict:
        """Meter + history + train_log.jsonl + tracker for optimizer step `step` (1-based).
        Throughput metrics are per GPU (this rank); token counts in the history are summed over ranks.
        `extra`: more keys of this step's record (the held-out evaluation: eval_loss, ...)."""
        c = self.checkpoints
        real = sum(b.n_real_tokens for b in window)     # this rank's
        slot = sum(b.rows * b.budget for b in window)
        m = self.telemetry.measure(step, window, step_time, data_wait, real, slot)   # per GPU
        h = {"step": step, "loss": loss, "lr": lr, "grad_norm": info.grad_norm, "skipped": info.skipped,
             "loss_scale": info.loss_scale, "real_tokens": int(self.global_sum(real)),
             "label_tokens": int(n_labels), "slot_tokens": slot * self.dist.world_size, "step_time_s": step_time}
        if extra:
            h.update(extra)
        c.history.append(h)
        if self.dist.is_main:
            with open(c.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(h) + "\n")
            if self.tracker is not None and (step % self.cfg.log_every == 0 or step == self.cfg.max_steps):
                # the charts (packtrain.tracking.layout.STEP_CHARTS: loss, tokens/s, MFU); lr, grad_norm and
                # the other per-step numbers are in train_log.jsonl and telemetry.json, not charts of their own
                from packtrain.tracking.layout import STEP_CHARTS

                values = {**m, "loss": loss}
                log = getattr(self.tracker, "log_step", None) or self.tracker.log_metrics   # batched when available
                log({k: values[k] for k in STEP_CHARTS if k in values}, step=step)
        self.telemetry.mark(step, c.start_step)   # system summary over the steady state only
        return m

    def check_step_finite(self, step: int, loss: float, grad_norm: float | None, skipped: bool) -> None:
        """Stop (TrainingDiverged, exit 8) when step `step`'s loss or gradient norm is not finite. An fp16 step
        the loss scaler skipped is fine: its update was not applied."""
        bad = [] if skipped else [f"{k} {v}" for k, v in (("loss", loss), ("grad_norm", grad_norm))
                                  if v is not None and not math.isfinite(v)]
        if bad:
            raise self._diverged(step, " and ".join(bad))

    def check_finite_weights(self, step: int) -> None:
        """Before a checkpoint or the final save: every local parameter is finite (one host sync)."""
        import torch

        params = [p.detach() for p in self.parts.model.parameters() if p.numel() > 0]
        if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
            raise self._diverged(step, "the weights after this step are not finite")

    def _diverged(self, step: int, what: str) -> TrainingDiverged:
        last = self.checkpoints.last
        kept = (f"the last good checkpoint {last} is kept (`--resume` continues from it; lower "
                "train.lr or use bf16/fp32)") if last else "no checkpoint was saved before it"
        lr = self.parts.scheduler.get_last_lr()[0]
        return TrainingDiverged(f"training diverged at step {step}: {what} (lr {lr:g}); "
                                f"stopped without saving the model; {kept}")

    def oom(self, step: int) -> TrainOutOfMemory:
        return oom_error(step, self.device, self.data.shape, self.model_cfg, self.cfg, self.plan_cfg,
                         self.data.vocab_size)

    def global_sum(self, x: float) -> float:
        return global_sum(x, self.dist)

    # ------------------------------------------------------------------------------------------ the end
    def save_model(self) -> Path | None:
        """model/ = save_pretrained (safetensors, attention reset to sdpa) + the tokenizer; atomic."""
        state = self.parts.stepper.full_state_dict()
        if not self.dist.is_main:
            return None
        final = self.out_dir / "model"
        tmp = self.out_dir / ".model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        lm = self.parts.model
        targets = [tmp]
        if self.parts.adapted is not None:   # LoRA: the adapter + what loads it (model.lora.save_adapter_model)
            targets += self._save_adapter(tmp)
        else:
            impl = lm.config._attn_implementation
            lm.config._attn_implementation = "sdpa"   # plain transformers must load it without our registry
            if self.cfg.loss_on != "all":   # evaluation scores the same tokens (evaluate.loading.model_loss_on)
                lm.config.packtrain_loss_on = self.cfg.loss_on
            try:
                save_pretrained(lm, tmp, state_dict=state, safe_serialization=True)
            finally:
                lm.config._attn_implementation = impl
        src = self.tokenizer_dir / "tokenizer" if (self.tokenizer_dir / "tokenizer").is_dir() else self.tokenizer_dir
        for dst in targets:
            for f in src.iterdir():
                if f.is_file():
                    shutil.copy2(f, dst / f.name)
        kill_point("model.saved")
        replace_dir(tmp, final)
        return final

    def _save_adapter(self, tmp: Path) -> list[Path]:
        """model/ of a LoRA run: adapter_config.json + adapter_model.safetensors (peft), packtrain_adapter.json
        (base location, init_from, loss_on), base/ when the base was a scratch init, merged/ with
        train.adapter.save_merged. Returns the extra directories that get the tokenizer (base/, merged/)."""
        from packtrain.model.init_from import init_from_value, resolve_init_source
        from packtrain.model.lora import save_adapter_model

        a = self.cfg.adapter
        meta = save_adapter_model(self.parts.adapted, tmp, init_from=init_from_value(self.model_cfg),
                                  base_dir=resolve_init_source(self.model_cfg), loss_on=self.cfg.loss_on,
                                  merged=a.save_merged)
        return [tmp / d for d in ("base", "merged") if (tmp / d).is_dir() and (d == "base" or meta["merged"])]

    def telemetry_report(self) -> tuple[Any, dict, dict]:
        """Stop sampling; rank 0 writes out_dir/telemetry.json (+ system.png, throughput.png when `plots`) via
        packtrain.telemetry.report. Returns (report or None, memory stats, sampler summary)."""
        from packtrain.telemetry.memory import cuda_memory_stats

        t = self.telemetry
        memory = cuda_memory_stats(self.device if self.device.type == "cuda" else None)
        if self.dist.world_size > 1:   # every rank's peak and throughput, not just rank 0's (all ranks call this)
            tok_s = t.meter.summary().get("real_tokens_per_s") or 0.0
            per = gather_floats([memory["peak_alloc_gib"], memory["peak_reserved_gib"], tok_s], self.dist)
            memory["per_rank"] = [{"rank": r, "peak_alloc_gib": a, "peak_reserved_gib": b, "real_tokens_per_s": v}
                                  for r, (a, b, v) in enumerate(per)]
            memory["max_peak_alloc_gib"] = max(a for a, _, _ in per)
        system = t.sampler.stop().summary(t.steady_since, t.steady_until) if t.sampler else {}
        if not self.dist.is_main:
            return None, memory, system
        from packtrain.telemetry.report import build_report

        plots = bool(getattr(self.tracker, "enabled", False))   # PNGs are for the MLflow run
        peak = {k: v for k, v in t.summary().items() if k.startswith("peak_")}   # the peak the MFU is against
        report = build_report(self.out_dir, t.cfg, meter=t.meter, sampler=t.sampler, memory=memory,
                              extra=peak, since_t=t.steady_since, plots=plots, until_t=t.steady_until)
        return report, memory, system
