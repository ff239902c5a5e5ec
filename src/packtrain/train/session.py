"""`TrainSession`: everything the loop needs, built in order, plus per-step records, checkpoints, the end.

Setup order (each step is one call into a builder):
  allocator env (before CUDA) → seeds/threads → device + process group → pack store shape → attention backend
  → model (meta init) → loss wrapper → activation checkpointing → compile → optimizer + LR schedule
  → engine (torch/DDP or DeepSpeed: sharding last) → telemetry → resume from the newest valid checkpoint.

Outputs under `out_dir` (rank 0 writes): train_log.jsonl (one line per optimizer step: step, loss, lr,
grad_norm, tokens), checkpoints/, deepspeed_config.json (engine: deepspeed), model/ (at the end).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import sys
import time
import warnings
from pathlib import Path

from packtrain.errors import ConfigError, MissingDataError, TrainingDiverged
from packtrain.faults import kill_point
from packtrain.paths import replace_dir
from packtrain.train import checkpoint as ckpt
from packtrain.train.runtime import (
    DistInfo,
    barrier,
    broadcast_object,
    choose_shape,
    dist_info,
    gather_floats,
    global_sum,
    init_distributed,
    oom_error,
    resolve_device,
)


class TrainSession:
    def __init__(self, model_cfg, train_cfg, pack_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir,
                 tracker=None, plan_cfg=None):
        import torch

        self.sampler, self.compile_counter, self._threads_before = None, None, torch.get_num_threads()
        self._batches = None   # the loop's batch iterator (a Prefetcher on CUDA), set by batches()
        try:
            self._setup(model_cfg, train_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir, tracker, plan_cfg)
        except BaseException:
            self.close()   # a failed setup leaves no sampler thread and no changed thread count behind
            raise

    def _setup(self, model_cfg, train_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir, tracker, plan_cfg):
        t0 = time.perf_counter()
        import numpy as np
        import torch

        from packtrain.model.attention import resolve_attention
        from packtrain.model.build import build_model, count_params
        from packtrain.packing.batches import PackedLoader
        from packtrain.packing.store import PackStore
        from packtrain.telemetry.mfu import model_flop_dims
        from packtrain.train import techniques as tq
        from packtrain.train.loss import packed_causal_lm

        self.model_cfg, self.cfg, self.tel_cfg, self.plan_cfg = model_cfg, train_cfg, telemetry_cfg, plan_cfg
        self.out_dir, self.tracker = Path(out_dir), tracker
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else None
        if self.tokenizer_dir is None or not self.tokenizer_dir.is_dir():
            raise MissingDataError(f"tokenizer directory {self.tokenizer_dir} does not exist: run "
                                   "`packtrain tokenize` first (its output holds tokenizer/)")
        self.allocator_env = tq.set_allocator_env(train_cfg)          # before anything touches CUDA
        self.dist: DistInfo = dist_info()
        if train_cfg.threads:
            torch.set_num_threads(train_cfg.threads)
        random.seed(train_cfg.seed)
        np.random.seed(train_cfg.seed)
        torch.manual_seed(train_cfg.seed)
        self.device = resolve_device(train_cfg.device, self.dist)
        init_distributed(self.dist, self.device)

        split = Path(packs_dir) / "train"
        store = PackStore.open(split, verify=False)
        self.vocab_size = int(store.meta["vocab_size"])
        self.shape = choose_shape(model_cfg, train_cfg, store.budget, plan_cfg, self.vocab_size)
        self.loader = PackedLoader(split, rows=self.shape.rows, seed=train_cfg.seed, rank=self.dist.rank,
                                   world_size=self.dist.world_size, pin_memory=self.device.type == "cuda")
        self.backend = resolve_attention(train_cfg.attention, self.device, train_cfg.precision)
        self.model = build_model(model_cfg, self.vocab_size, self.backend, self.device, torch.float32,
                                 pad_token_id=store.meta.get("pad_id"), eos_token_id=store.meta.get("eos_id"),
                                 training=True)   # any family: model.init_from (packtrain.model.families)
        self.params = count_params(self.model)
        self.flop_dims = model_flop_dims(self.model.config)   # layers, attention width, windows of the family
        module = packed_causal_lm(self.model, train_cfg.loss, train_cfg.loss_chunk_tokens)
        # Order: activation checkpointing, then compile, then sharding (DDP/DeepSpeed) — techniques.py says why.
        self.ac_layers = tq.apply_activation_checkpointing(self.model, train_cfg)
        self.compile_counter = tq.apply_compile(self.model, train_cfg)
        self.optimizer = tq.build_optimizer(self.model, train_cfg, self.device.type)
        self.scheduler = tq.build_scheduler(self.optimizer, train_cfg)
        if train_cfg.engine == "deepspeed":
            from packtrain.train.deepspeed_engine import DeepSpeedStepper

            self.stepper = DeepSpeedStepper(module, self.optimizer, train_cfg, self.device, self.dist.world_size,
                                            self.shape.rows, self.shape.grad_accum, self.out_dir)
            self.autocast = contextlib.nullcontext   # DeepSpeed casts the module to bf16/fp16 itself
        else:
            from packtrain.train.runtime import TorchStepper

            scaler = tq.make_grad_scaler(train_cfg.precision, self.device.type)
            self.stepper = TorchStepper(module, self.optimizer, scaler, train_cfg, self.dist, self.device)
            self.autocast = lambda: tq.autocast(train_cfg.precision, self.device.type)
        self.module = self.stepper.module
        self._init_telemetry()
        self.ckpt_root = self.out_dir / "checkpoints"
        self.log_path = self.out_dir / "train_log.jsonl"
        self.history: list[dict] = []      # one record per optimizer step (also in train_log.jsonl)
        self.start_step, self.resumed_from, self.last_ckpt = 0, None, None
        self.timings = {"setup_s": time.perf_counter() - t0, "checkpoint_s": 0.0}

    def __enter__(self) -> TrainSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sampler thread and the compile counter, restore torch's thread count (idempotent)."""
        import torch

        self.end_steady_state()
        if self.compile_counter is not None:
            self.compile_counter.stop()
        torch.set_num_threads(self._threads_before)

    # ------------------------------------------------------------------------------------------ telemetry
    def _init_telemetry(self) -> None:
        from packtrain.telemetry.meter import ThroughputMeter
        from packtrain.telemetry.mfu import device_name, peak_flops
        from packtrain.telemetry.sampler import SystemSampler

        self.meter = ThroughputMeter(self.tel_cfg.warmup_steps)
        prec = self.cfg.precision if self.device.type == "cuda" else "fp32"
        self.peak = peak_flops(device_name(self.device), prec, self.tel_cfg.peak_tflops)
        self.sampler, self.steady_since, self.steady_until = None, 0.0, None
        if self.dist.is_main:
            gpus = list(range(self.dist.local_world_size)) if self.device.type == "cuda" else None   # this node
            try:
                self.sampler = SystemSampler(self.tel_cfg.interval_s, gpu_indices=gpus).start()
            except ImportError as e:   # neither nvidia-ml-py nor psutil installed: train without sampling
                warnings.warn(f"system sampling off: {e}", RuntimeWarning, stacklevel=2)

    def window_flops(self, window) -> tuple[float, float]:
        from packtrain.telemetry.mfu import step_flops

        f, useful, dense = self.flop_dims, 0.0, 0.0   # the built model's own shape (any family)
        for b in window:
            u, d = step_flops(self.params.non_embedding, f["n_layers"], f["hidden_size"], b.seq_lens,
                              b.rows * b.budget, b.budget, f["vocab_size"], attn_width=f["attn_width"],
                              windows=f["windows"])
            useful, dense = useful + u, dense + d
        return useful, dense

    # ------------------------------------------------------------------------------------------ resume
    def restore(self, resume: bool, overwrite: bool = False) -> int:
        """Where this run starts; returns the first step. Nothing is deleted implicitly:

        - resume: the newest checkpoint that verifies (broken newer ones are quarantined and named); no
          checkpoint at all → step 0;
        - fresh (no resume) into a directory that holds checkpoints: refused (ConfigError, exit 2) unless
          `overwrite`, which removes them and train_log.jsonl, saying so.
        """
        if resume:
            return self._resume()

        def decide() -> None:
            found = ckpt.existing_run(self.ckpt_root)
            if found and not overwrite:
                steps = ", ".join(p.name for p in found[:6]) + (" ..." if len(found) > 6 else "")
                raise ConfigError(f"{self.ckpt_root} already holds {len(found)} checkpoint(s) ({steps}) from an "
                                  "earlier run: pass --resume to continue it, or --overwrite to delete them and start "
                                  "from step 0 (or train into another --out)")
            if found:
                print(f"--overwrite: removing {len(found)} checkpoint(s) under {self.ckpt_root}", file=sys.stderr)
                shutil.rmtree(self.ckpt_root, ignore_errors=True)
            self._keep_old_log(0)   # a log without checkpoints (killed before the first save) is kept, renamed

        self._on_main(decide)
        return 0

    def _on_main(self, fn):
        """Run `fn` on rank 0 and hand its result — or its PacktrainError/OSError, as the same PacktrainError —
        to every rank, so no rank is left waiting in a collective while rank 0 has failed."""
        from packtrain.errors import PacktrainError

        out, err = None, None
        if self.dist.is_main:
            try:
                out = fn()
            except PacktrainError as e:
                err = (type(e).__name__, str(e), e.exit_code)
            except OSError as e:
                err = ("PacktrainError", f"checkpoints under {self.ckpt_root}: {e}", 1)
        out, err = broadcast_object((out, err), self.dist)
        if err:
            name, msg, code = err
            cls = {"ConfigError": ConfigError}.get(name, PacktrainError)
            raise cls(msg, exit_code=code)
        return out

    def _resume(self) -> int:
        path = self._on_main(lambda: ckpt.find_latest_checkpoint(self.ckpt_root, quarantine=True))
        if path is None:
            kept = self.ckpt_root / ckpt.QUARANTINE
            note = f" (quarantined checkpoints kept in {kept})" if kept.is_dir() else ""
            warnings.warn(f"--resume: no valid checkpoint under {self.ckpt_root}{note}; starting from step 0",
                          RuntimeWarning, stacklevel=3)
            if self.dist.is_main:
                self._keep_old_log(0)
            barrier(self.dist)
            return 0
        self.stepper.load(path)
        state = ckpt.read_state(path)
        self.scheduler.load_state_dict(state["scheduler"])
        self.stepper.load_scaler_state(state.get("scaler"))
        self.loader.load_state_dict(state["loader"])
        self.history = list(state["history"])
        self.start_step = self.resumed_from = int(state["step"])
        self.last_ckpt = path
        if self.dist.is_main:   # the log may hold steps past the checkpoint from the killed run
            self._keep_old_log(self.start_step)
            self.log_path.write_text("".join(json.dumps(h) + "\n" for h in self.history))
        print(f"resumed from {path} (step {self.start_step})", file=sys.stderr)
        return self.start_step

    def _keep_old_log(self, step: int) -> None:
        """The killed run's train_log.jsonl, when it holds steps past `step`, is kept as
        train_log.before-resume-<step>[-k].jsonl (the resumed run recomputes those steps)."""
        if not self.log_path.exists() or self.log_path.stat().st_size == 0:
            return
        dst, k = self.out_dir / f"train_log.before-resume-{step}.jsonl", 1
        while dst.exists():
            k += 1
            dst = self.out_dir / f"train_log.before-resume-{step}-{k}.jsonl"
        self.log_path.rename(dst)

    # ------------------------------------------------------------------------------------------ per step
    def record(self, step: int, window, n_labels: float, loss: float, lr: float, info, step_time: float,
               data_wait: float) -> dict:
        """Meter + history + train_log.jsonl + tracker for optimizer step `step` (1-based).
        Throughput metrics are per GPU (this rank); token counts in the history are summed over ranks."""
        real = sum(b.n_real_tokens for b in window)     # this rank's
        slot = sum(b.rows * b.budget for b in window)
        useful, dense = self.window_flops(window)
        m = self.meter.record(step, step_time, data_wait, real, slot, useful, dense, self.peak)   # per GPU
        h = {"step": step, "loss": loss, "lr": lr, "grad_norm": info.grad_norm, "skipped": info.skipped,
             "loss_scale": info.loss_scale, "real_tokens": int(self.global_sum(real)),
             "label_tokens": int(n_labels), "slot_tokens": slot * self.dist.world_size, "step_time_s": step_time}
        self.history.append(h)
        if self.dist.is_main:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(h) + "\n")
            if self.tracker is not None and (step % self.cfg.log_every == 0 or step == self.cfg.max_steps):
                extra = {"loss": loss, "lr": lr, "skipped": float(info.skipped)}
                if info.grad_norm is not None:
                    extra["grad_norm"] = info.grad_norm
                if info.loss_scale is not None:
                    extra["loss_scale"] = info.loss_scale
                log = getattr(self.tracker, "log_step", None) or self.tracker.log_metrics   # batched when available
                log({**m, **extra}, step=step)
        if self.sampler is not None:
            if step == self.start_step + self.tel_cfg.warmup_steps:
                self.steady_since = self.sampler.elapsed()   # system summary over the steady state only
            self.steady_until = self.sampler.elapsed()       # ... up to the last step (not the final save)
        return m

    def checkpoint_due(self, step: int) -> bool:
        every = self.cfg.checkpoint.every_steps
        return (every > 0 and step % every == 0) or step == self.cfg.max_steps

    def stepper_is_async(self) -> bool:
        """True when a step needs no host sync (plain torch engine, no fp16 loss scaler): the loop may then
        read each step's numbers one step late."""
        from packtrain.train.runtime import TorchStepper

        return isinstance(self.stepper, TorchStepper) and self.stepper.scaler is None

    def batches(self):
        """The micro-batch iterator: prefetched in a thread on CUDA (collate + pin overlap the GPU's step),
        the loader itself on CPU (nothing to overlap with)."""
        from packtrain.train.runtime import Prefetcher

        self._batches = Prefetcher(self.loader) if self.device.type == "cuda" else iter(self.loader)
        return self._batches

    def loader_state(self) -> dict:
        """Loader position after the last batch the loop consumed (not the prefetch thread's position)."""
        b = self._batches
        return b.state_dict() if hasattr(b, "state_dict") else self.loader.state_dict()

    def end_steady_state(self) -> None:
        """Training steps are over: stop sampling so saving the model does not count as idle GPU time."""
        if hasattr(self._batches, "close"):
            self._batches.close()
        if self.sampler is not None:
            self.sampler.stop()

    def save_checkpoint(self, step: int) -> None:
        """Checkpoint `step` (atomic, verified on resume) after checking the weights are finite, so the newest
        checkpoint is always one training can continue from; then the retention policy (checkpoint.py)."""
        t0 = time.perf_counter()
        self.check_finite_weights(step)
        deepspeed = self.cfg.engine == "deepspeed"
        tmp = ckpt.begin_checkpoint(self.ckpt_root, step) if self.dist.is_main else None
        barrier(self.dist)
        tmp = tmp or self.ckpt_root / f".tmp-{ckpt.step_dir_name(step)}"
        if deepspeed or self.dist.is_main:
            self.stepper.save(tmp)
        barrier(self.dist)
        if self.dist.is_main:
            state = {"scheduler": self.scheduler.state_dict(), "scaler": self.stepper.scaler_state(),
                     "loader": self.loader_state(), "history": self.history}
            prev = int(self.last_ckpt.name.split("_")[1]) if self.last_ckpt else 0
            self.last_ckpt = ckpt.commit_checkpoint(self.ckpt_root, tmp, step, state, self.cfg.checkpoint.keep_last,
                                                    self.cfg.checkpoint.keep_best, after_step=prev)
        barrier(self.dist)
        self.timings["checkpoint_s"] += time.perf_counter() - t0

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

        params = [p.detach() for p in self.model.parameters() if p.numel() > 0]
        if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
            raise self._diverged(step, "the weights after this step are not finite")

    def _diverged(self, step: int, what: str) -> TrainingDiverged:
        kept = (f"the last good checkpoint {self.last_ckpt} is kept (`--resume` continues from it; lower "
                "train.lr or use bf16/fp32)") if self.last_ckpt else "no checkpoint was saved before it"
        return TrainingDiverged(f"training diverged at step {step}: {what} (lr {self.scheduler.get_last_lr()[0]:g}); "
                                f"stopped without saving the model; {kept}")

    def oom(self, step: int):
        return oom_error(step, self.device, self.shape, self.model_cfg, self.cfg, self.plan_cfg, self.vocab_size)

    def global_sum(self, x):
        return global_sum(x, self.dist)

    # ------------------------------------------------------------------------------------------ the end
    def save_model(self) -> Path | None:
        """model/ = save_pretrained (safetensors, attention reset to sdpa) + the tokenizer; atomic."""
        state = self.stepper.full_state_dict()
        if not self.dist.is_main:
            return None
        final = self.out_dir / "model"
        tmp = self.out_dir / ".model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        lm = self.model
        impl = lm.config._attn_implementation
        lm.config._attn_implementation = "sdpa"   # plain transformers must load it without our registry
        try:
            lm.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        finally:
            lm.config._attn_implementation = impl
        src = self.tokenizer_dir / "tokenizer" if (self.tokenizer_dir / "tokenizer").is_dir() else self.tokenizer_dir
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        kill_point("model.saved")
        replace_dir(tmp, final)
        return final

    def telemetry_report(self):
        """Stop sampling; rank 0 writes out_dir/telemetry.json (+ system.png, throughput.png when `plots`) via
        packtrain.telemetry.report. Returns (report or None, memory stats, sampler summary)."""
        from packtrain.telemetry.memory import cuda_memory_stats

        memory = cuda_memory_stats(self.device if self.device.type == "cuda" else None)
        if self.dist.world_size > 1:   # every rank's peak and throughput, not just rank 0's (all ranks call this)
            tok_s = self.meter.summary().get("real_tokens_per_s") or 0.0
            per = gather_floats([memory["peak_alloc_gib"], memory["peak_reserved_gib"], tok_s], self.dist)
            memory["per_rank"] = [{"rank": r, "peak_alloc_gib": a, "peak_reserved_gib": b, "real_tokens_per_s": v}
                                  for r, (a, b, v) in enumerate(per)]
            memory["max_peak_alloc_gib"] = max(a for a, _, _ in per)
        system = self.sampler.stop().summary(self.steady_since, self.steady_until) if self.sampler else {}
        if not self.dist.is_main:
            return None, memory, system
        from packtrain.telemetry.report import build_report

        plots = bool(getattr(self.tracker, "enabled", False))   # PNGs are for the MLflow run
        report = build_report(self.out_dir, self.tel_cfg, meter=self.meter, sampler=self.sampler, memory=memory,
                              extra={"peak_tflops": self.peak / 1e12}, since_t=self.steady_since, plots=plots,
                              until_t=self.steady_until)
        return report, memory, system
